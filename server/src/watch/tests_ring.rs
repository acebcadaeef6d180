//! Tests of the ring of recent events: its bounds and invariants on synthetic revisions,
//! and that a read from the ring equals the store's read of the same span.

use std::sync::Arc;

use keel_proto::mvccpb::event::EventType;
use keel_proto::mvccpb::{Event, KeyValue};
use proptest::prelude::*;

use super::key_range::WatchKeyRange;
use super::outbox::RevisionBatch;
use super::ring::EventRing;
use super::source::{HistoryLimit, HistorySource};
use super::tests::Harness;
use super::{StoreHistory, WatchConfig};
use crate::mvcc::SharedStore;

fn put(key: &str, revision: i64, value_len: usize) -> Event {
    Event {
        r#type: EventType::Put as i32,
        kv: Some(KeyValue {
            key: key.into(),
            create_revision: revision,
            mod_revision: revision,
            version: 1,
            value: vec![b'v'; value_len],
            lease: 0,
        }),
        prev_kv: None,
    }
}

fn batch(revision: i64, keys: &[&str]) -> Arc<RevisionBatch> {
    Arc::new(RevisionBatch {
        revision,
        events: keys.iter().map(|k| put(k, revision, 1)).collect(),
    })
}

fn range(key: &str, end: &str) -> WatchKeyRange {
    WatchKeyRange::from_request(key.as_bytes(), end.as_bytes()).unwrap()
}

const NO_LIMIT: HistoryLimit = HistoryLimit {
    max_revisions: 0,
    max_bytes: 0,
};

/// `(key, mod_revision)` of each event.
fn keys(events: &[Event]) -> Vec<(String, i64)> {
    events
        .iter()
        .map(|e| {
            let kv = e.kv.as_ref().unwrap();
            (String::from_utf8(kv.key.clone()).unwrap(), kv.mod_revision)
        })
        .collect()
}

#[test]
fn holds_contiguous_revisions_up_to_the_revision_bound() {
    let mut ring = EventRing::new(10, 3, usize::MAX);
    assert_eq!((ring.end(), ring.first()), (10, None));
    for rev in 11..=15 {
        ring.record(batch(rev, &["a"]));
        assert_eq!(ring.end(), rev);
    }
    assert_eq!((ring.first(), ring.len()), (Some(13), 3));
    assert!(ring.slice_from(12).is_none(), "evicted revision");
    let slice = ring.slice_from(13).unwrap();
    assert_eq!((slice.first(), slice.last()), (13, 15));
    assert!(ring.slice_from(16).is_none(), "beyond the end");
}

#[test]
fn the_byte_bound_evicts_whole_oldest_revisions() {
    let one = put("a", 1, 1).encoded_len_for_test();
    let mut ring = EventRing::new(0, 100, 2 * one);
    ring.record(batch(1, &["a"]));
    ring.record(batch(2, &["a"]));
    assert_eq!((ring.first(), ring.bytes()), (Some(1), 2 * one));
    ring.record(batch(3, &["a", "b"]));
    assert_eq!(
        (ring.first(), ring.len(), ring.bytes()),
        (Some(3), 1, 2 * one)
    );
    // A revision larger than the whole bound is not kept; the ring still ends at it.
    ring.record(batch(4, &["a", "b", "c"]));
    assert_eq!((ring.first(), ring.end(), ring.bytes()), (None, 4, 0));
    ring.record(batch(5, &["a"]));
    assert_eq!((ring.first(), ring.end()), (Some(5), 5));
}

#[test]
fn a_skipped_revision_empties_the_ring_instead_of_leaving_a_hole() {
    let mut ring = EventRing::new(0, 100, usize::MAX);
    ring.record(batch(1, &["a"]));
    ring.record(batch(2, &["a"]));
    ring.record(batch(5, &["a"]));
    assert_eq!((ring.first(), ring.end(), ring.len()), (Some(5), 5, 1));
    // An entry that did not move the revision changes nothing.
    ring.record(batch(5, &[]));
    assert_eq!((ring.first(), ring.len()), (Some(5), 1));
    // Events for a revision already held would duplicate: the ring empties.
    ring.record(batch(5, &["b"]));
    assert_eq!((ring.first(), ring.end()), (None, 5));
}

#[test]
fn a_disabled_ring_holds_nothing() {
    let mut ring = EventRing::new(0, 0, usize::MAX);
    ring.record(batch(1, &["a"]));
    assert_eq!((ring.first(), ring.end(), ring.len()), (None, 1, 0));
    assert!(ring.slice_from(1).is_none());
}

#[test]
fn reset_continues_at_the_new_revision() {
    let mut ring = EventRing::new(0, 100, usize::MAX);
    ring.record(batch(1, &["a"]));
    ring.reset(40);
    assert_eq!((ring.first(), ring.end(), ring.bytes()), (None, 40, 0));
    ring.record(batch(41, &["a"]));
    assert_eq!(ring.first(), Some(41));
}

#[test]
fn slice_reads_cut_at_revision_boundaries_and_filter_the_range() {
    let mut ring = EventRing::new(0, 100, usize::MAX);
    ring.record(batch(1, &["a", "b"]));
    ring.record(batch(2, &["c"]));
    ring.record(batch(3, &["b", "a"]));
    let slice = ring.slice_from(1).unwrap();
    let h = slice.history(&range("a", "c"), 1, 3, NO_LIMIT).unwrap();
    assert_eq!(
        keys(&h.events),
        [
            ("a".into(), 1),
            ("b".into(), 1),
            ("b".into(), 3),
            ("a".into(), 3)
        ]
    );
    assert_eq!(h.last_revision, 3);
    let two_revs = HistoryLimit {
        max_revisions: 1,
        max_bytes: 0,
    };
    let h = slice.history(&range("a", "c"), 1, 3, two_revs).unwrap();
    assert_eq!(keys(&h.events), [("a".into(), 1), ("b".into(), 1)]);
    assert_eq!(
        h.last_revision, 1,
        "revision 2 has no event of the range: not yet read"
    );
    let h = slice.history(&range("c", ""), 3, 3, NO_LIMIT).unwrap();
    assert_eq!((h.events.len(), h.last_revision), (0, 3));
    assert!(
        slice.history(&range("a", ""), 0, 4, NO_LIMIT).is_none(),
        "past the end"
    );
}

trait EncodedLen {
    fn encoded_len_for_test(&self) -> usize;
}

impl EncodedLen for Event {
    fn encoded_len_for_test(&self) -> usize {
        prost::Message::encoded_len(self)
    }
}

/// `(key, value or None for a delete)` of one write; several make a txn.
type Write = Vec<(usize, Option<u8>)>;

const KEYS: [&str; 5] = ["a", "ab", "b", "ba", "c"];
const RANGES: [(&str, &str); 6] = [
    ("a", ""),
    ("ab", ""),
    ("a", "b"),
    ("b", "\0"),
    ("", "\0"),
    ("b", "c"),
];

fn write() -> impl Strategy<Value = Write> {
    prop::collection::vec((0..KEYS.len(), prop::option::of(any::<u8>())), 1..4)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Every read the ring can answer equals the store's read: each range, every start the
    /// ring holds, with and without `prev_kv`, under revision and byte limits.
    #[test]
    fn a_ring_read_equals_the_store_read(
        writes in prop::collection::vec(write(), 1..30),
        max_revisions in 0usize..4,
        max_bytes in prop_oneof![Just(0usize), 1usize..120],
        compact_back in prop::option::of(0i64..10),
    ) {
        let h = Harness::new(WatchConfig { ring_revisions: 16, ..WatchConfig::default() });
        let base = h.store.current_revision();
        for w in &writes {
            let ops: Vec<(String, Option<String>)> = w
                .iter()
                .map(|(k, v)| (KEYS[*k].to_string(), v.map(|v| format!("v{v}"))))
                .collect();
            let mut seen = std::collections::HashSet::new();
            let ops: Vec<(&str, Option<&str>)> = ops
                .iter()
                .filter(|(k, _)| seen.insert(k.clone()))
                .map(|(k, v)| (k.as_str(), v.as_deref()))
                .collect();
            h.txn(&ops);
        }
        let cur = h.store.current_revision();
        if let Some(back) = compact_back {
            let rev = (cur - back).max(1);
            let mut w = h.store.write();
            w.compact(rev).unwrap();
            w.commit().unwrap();
        }
        let source = StoreHistory(Arc::new(SharedStore::new(h.store.clone())));
        let limit = HistoryLimit { max_revisions, max_bytes };
        let first = h.hub.lock().ring.first();
        prop_assert_eq!(h.hub.lock().ring.end(), cur);
        let mut compared = 0;
        for from in base + 1..=cur {
            let Some(slice) = h.hub.lock().ring.slice_from(from) else {
                prop_assert!(first.is_none_or(|f| from < f), "the ring holds {from}");
                continue;
            };
            for (key, end) in RANGES {
                let r = range(key, end);
                for prev_kv in [false, true] {
                    let ring = slice
                        .history(&r, from, cur, limit)
                        .map(|hist| h.hub.with_prev_kv(hist, prev_kv));
                    let ring = ring.expect("the slice covers the span");
                    let store = source.history(&r, from, cur, limit, prev_kv);
                    match (ring, store) {
                        (Ok(a), Ok(b)) => prop_assert_eq!(a, b, "from {} range {:?}", from, r),
                        // Reads below the compact revision are refused before the ring is
                        // asked; a prev_kv at the compact revision is refused by both.
                        (Err(a), Err(b)) => prop_assert_eq!(a.to_string(), b.to_string()),
                        (Ok(_), Err(b)) => prop_assert!(
                            from < source.compact_revision(),
                            "store refused {b} at {from}"
                        ),
                        (Err(a), Ok(_)) => prop_assert!(false, "ring refused {a} at {from}"),
                    }
                    compared += 1;
                }
            }
        }
        // The ring holds at least the last revision whenever a write moved the revision.
        prop_assert!(cur == base || compared > 0, "nothing compared");
    }
}
