//! Property test of the watch guarantees at the hub level (no gRPC).
//!
//! Random puts, deletes, txns and compactions run against a real MVCC store whose committed
//! events feed the hub, as apply does. Meanwhile random watchers start on three streams at
//! random revisions (past, present, future, compacted), clients read their streams at random
//! paces (so watchers fall behind), the sync thread's rounds run at random points, and
//! clients cancel watchers and ask for progress. A model store records every event.
//!
//! At the end every stream is drained and every watcher's responses are checked:
//! - it got exactly the model's events for its range and filters from its start revision
//!   on, in revision order, with no gap and no duplicate, each with the right `prev_kv`;
//!   or a prefix of them and then a cancel: asked for by the client, or for compaction with
//!   a compact revision the store really had and above the revision the watcher needed;
//! - the events of one revision arrive in one response, and a header revision is never
//!   below the events it carries;
//! - a progress notification (periodic, or the answer to a progress request) at revision R
//!   comes after every event at or below R of every watcher it covers.

use std::collections::{BTreeMap, HashMap};

use keel_proto::etcdserverpb::watch_create_request::FilterType;
use keel_proto::etcdserverpb::watch_request::RequestUnion;
use keel_proto::etcdserverpb::{
    WatchCancelRequest, WatchCreateRequest, WatchProgressRequest, WatchRequest, WatchResponse,
};
use keel_proto::mvccpb::event::EventType;
use keel_proto::mvccpb::{Event, KeyValue};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;

use super::key_range::{EventFilter, WatchKeyRange};
use super::sync::SyncOutcome;
use super::tests::{Harness, drain, read};
use super::{HubStats, WatchConfig, WatchOutput, WatchStream};

const KEYS: [&str; 6] = ["a", "ab", "b", "ba", "c", "d"];
/// `(key, range_end)` of the ranges watchers pick from.
const RANGES: [(&str, &str); 7] = [
    ("a", ""),
    ("b", ""),
    ("ab", ""),
    ("a", "b"),
    ("b", "d"),
    ("b", "\0"),
    ("", "\0"),
];
const STREAMS: usize = 3;

#[derive(Debug, Clone)]
enum Op {
    Put(usize, u8),
    Del(usize),
    /// Puts (`Some`) and deletes (`None`) of distinct keys in one txn.
    Txn(Vec<(usize, Option<u8>)>),
    /// Compact `back` revisions below the current one.
    Compact(u8),
    Watch {
        stream: usize,
        range: usize,
        /// 0 = from now; else start at `current + 3 - back` (from the past to the future).
        back: u8,
        prev_kv: bool,
        filter: u8,
        progress_notify: bool,
    },
    Cancel(usize, usize),
    /// The client reads up to n responses.
    Read(usize, usize),
    Sync,
    ProgressRequest(usize),
    ProgressTick(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..KEYS.len(), any::<u8>()).prop_map(|(k, v)| Op::Put(k, v)),
        2 => (0..KEYS.len()).prop_map(Op::Del),
        2 => prop::collection::vec((0..KEYS.len(), prop::option::of(any::<u8>())), 1..4).prop_map(Op::Txn),
        1 => (0u8..6).prop_map(Op::Compact),
        4 => (0..STREAMS, 0..RANGES.len(), 0u8..14, any::<bool>(), 0u8..4, any::<bool>()).prop_map(
            |(stream, range, back, prev_kv, filter, progress_notify)| Op::Watch {
                stream, range, back, prev_kv, filter, progress_notify,
            }
        ),
        1 => (0..STREAMS, 0usize..8).prop_map(|(s, p)| Op::Cancel(s, p)),
        4 => (0..STREAMS, 0usize..4).prop_map(|(s, n)| Op::Read(s, n)),
        3 => Just(Op::Sync),
        1 => (0..STREAMS).prop_map(Op::ProgressRequest),
        1 => (0..STREAMS).prop_map(Op::ProgressTick),
    ]
}

/// The store as the model sees it.
#[derive(Default)]
struct ModelStore {
    rev: i64,
    compact: i64,
    compactions: Vec<i64>,
    kvs: BTreeMap<Vec<u8>, KeyValue>,
    /// Every event, with `prev_kv` set for non-create events.
    log: Vec<Event>,
}

impl ModelStore {
    /// Applies one entry's changes (distinct keys); returns whether the revision moved.
    fn apply(&mut self, ops: &[(usize, Option<u8>)]) -> bool {
        let rev = self.rev + 1;
        let mut changed = false;
        for (k, v) in ops {
            let key = KEYS[*k].as_bytes().to_vec();
            let prev = self.kvs.get(&key).cloned();
            match v {
                Some(v) => {
                    let kv = KeyValue {
                        key: key.clone(),
                        create_revision: prev.as_ref().map_or(rev, |p| p.create_revision),
                        mod_revision: rev,
                        version: prev.as_ref().map_or(1, |p| p.version + 1),
                        value: vec![*v],
                        lease: 0,
                    };
                    self.kvs.insert(key, kv.clone());
                    self.log.push(Event {
                        r#type: EventType::Put as i32,
                        kv: Some(kv),
                        prev_kv: prev,
                    });
                    changed = true;
                }
                None => {
                    if let Some(prev) = self.kvs.remove(&key) {
                        let kv = KeyValue {
                            key,
                            mod_revision: rev,
                            ..Default::default()
                        };
                        self.log.push(Event {
                            r#type: EventType::Delete as i32,
                            kv: Some(kv),
                            prev_kv: Some(prev),
                        });
                        changed = true;
                    }
                }
            }
        }
        if changed {
            self.rev = rev;
        }
        changed
    }
}

struct ModelWatcher {
    stream: usize,
    watch_id: i64,
    range: WatchKeyRange,
    /// Effective start revision.
    start: i64,
    prev_kv: bool,
    filter: EventFilter,
}

impl ModelWatcher {
    fn expected(&self, log: &[Event]) -> Vec<Event> {
        log.iter()
            .filter(|e| {
                let kv = e.kv.as_ref().expect("kv");
                kv.mod_revision >= self.start
                    && self.range.contains(&kv.key)
                    && self.filter.passes(e)
            })
            .map(|e| Event {
                r#type: e.r#type,
                kv: e.kv.clone(),
                prev_kv: if self.prev_kv {
                    e.prev_kv.clone()
                } else {
                    None
                },
            })
            .collect()
    }
}

fn create_request(
    range: usize,
    start: i64,
    prev_kv: bool,
    filter: u8,
    progress_notify: bool,
) -> WatchRequest {
    let (key, end) = RANGES[range];
    let filters = filter_types(filter);
    WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: key.into(),
            range_end: end.into(),
            start_revision: start,
            prev_kv,
            filters,
            progress_notify,
            ..Default::default()
        })),
    }
}

/// Bit 0: NOPUT, bit 1: NODELETE.
fn filter_types(filter: u8) -> Vec<i32> {
    let mut filters = Vec::new();
    if filter & 1 != 0 {
        filters.push(FilterType::Noput as i32);
    }
    if filter & 2 != 0 {
        filters.push(FilterType::Nodelete as i32);
    }
    filters
}

/// A value byte that is also valid UTF-8 text.
fn value(v: u8) -> u8 {
    b'a' + v % 26
}

fn rev_of(e: &Event) -> i64 {
    e.kv.as_ref().map_or(0, |kv| kv.mod_revision)
}

fn header(r: &WatchResponse) -> i64 {
    r.header.as_ref().map_or(-1, |h| h.revision)
}

/// Runs `ops` and checks every guarantee (module docs); returns the hub's counts (how
/// often the ring of `ring_revisions` revisions / `ring_bytes` bytes answered).
fn run(
    ops: Vec<Op>,
    buffer_len: usize,
    batch_revs: usize,
    (ring_revisions, ring_bytes): (usize, usize),
) -> Result<HubStats, TestCaseError> {
    let h = Harness::new(WatchConfig {
        buffer_len,
        batch_max_revisions: batch_revs,
        sync_batch: 3,
        ring_revisions,
        ring_bytes,
        ..WatchConfig::default()
    });
    let mut model = ModelStore {
        rev: h.store.current_revision(),
        ..Default::default()
    };
    let mut streams: Vec<(WatchStream, WatchOutput, Vec<WatchResponse>, i64)> = (0..STREAMS)
        .map(|_| {
            let (s, o) = WatchStream::new(h.hub.clone());
            (s, o, Vec::new(), 0)
        })
        .collect();
    let mut watchers: Vec<ModelWatcher> = Vec::new();
    let mut canceled: Vec<(usize, i64)> = Vec::new();

    for op in ops {
        match op {
            Op::Put(k, v) => {
                let v = value(v);
                model.apply(&[(k, Some(v))]);
                h.put(KEYS[k], &String::from_utf8_lossy(&[v]));
            }
            Op::Del(k) => {
                model.apply(&[(k, None)]);
                h.del(KEYS[k]);
            }
            Op::Txn(mut t) => {
                t.sort_by_key(|x| x.0);
                t.dedup_by_key(|x| x.0);
                for x in &mut t {
                    x.1 = x.1.map(value);
                }
                model.apply(&t);
                let values: Vec<(String, Option<String>)> = t
                    .iter()
                    .map(|(k, v)| {
                        (
                            KEYS[*k].to_string(),
                            v.map(|b| String::from_utf8_lossy(&[b]).into()),
                        )
                    })
                    .collect();
                let ops: Vec<(&str, Option<&str>)> = values
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_deref()))
                    .collect();
                h.txn(&ops);
            }
            Op::Compact(back) => {
                let at = model.rev - i64::from(back);
                if at > model.compact && at >= 1 {
                    model.compact = at;
                    model.compactions.push(at);
                    h.compact(at);
                }
            }
            Op::Watch {
                stream,
                range,
                back,
                prev_kv,
                filter,
                progress_notify,
            } => {
                let start = if back == 0 {
                    0
                } else {
                    (model.rev + 3 - i64::from(back)).max(1)
                };
                let st = &mut streams[stream];
                let watch_id = st.3;
                st.3 += 1;
                st.0.handle(create_request(
                    range,
                    start,
                    prev_kv,
                    filter,
                    progress_notify,
                ));
                let (key, end) = RANGES[range];
                watchers.push(ModelWatcher {
                    stream,
                    watch_id,
                    range: WatchKeyRange::from_request(key.as_bytes(), end.as_bytes())
                        .expect("valid range"),
                    start: if start == 0 { model.rev + 1 } else { start },
                    prev_kv,
                    filter: EventFilter::from_request(&filter_types(filter)),
                });
            }
            Op::Cancel(stream, pick) => {
                let live: Vec<i64> = watchers
                    .iter()
                    .filter(|w| w.stream == stream && !canceled.contains(&(stream, w.watch_id)))
                    .map(|w| w.watch_id)
                    .collect();
                if let Some(&id) = live.get(pick % live.len().max(1)) {
                    streams[stream].0.handle(WatchRequest {
                        request_union: Some(RequestUnion::CancelRequest(WatchCancelRequest {
                            watch_id: id,
                        })),
                    });
                    canceled.push((stream, id));
                }
            }
            Op::Read(stream, n) => {
                let st = &mut streams[stream];
                let got = read(&mut st.1, n);
                st.2.extend(got);
            }
            Op::Sync => {
                h.hub.sync_round();
            }
            Op::ProgressRequest(stream) => streams[stream].0.handle(WatchRequest {
                request_union: Some(RequestUnion::ProgressRequest(WatchProgressRequest {})),
            }),
            Op::ProgressTick(stream) => streams[stream].0.progress_tick(),
        }
        h.hub.check_invariants();
    }
    // Settle: clients read everything, the sync thread finishes.
    for round in 0.. {
        prop_assert!(round < 10_000, "never settled");
        for st in &mut streams {
            let got = drain(&mut st.1);
            st.2.extend(got);
        }
        if h.hub.sync_round() == SyncOutcome::Idle {
            for st in &mut streams {
                let got = drain(&mut st.1);
                st.2.extend(got);
            }
            break;
        }
    }
    prop_assert_eq!(h.hub.stats().unsynced, 0);
    h.hub.check_invariants();

    for (s, st) in streams.iter().enumerate() {
        check_stream(s, &st.2, &watchers, &canceled, &model)?;
    }
    Ok(h.hub.stats())
}

/// What one watcher received, in order.
#[derive(Default)]
struct Received {
    created: Option<usize>,
    events: Vec<Event>,
    /// Position of each event's response in the stream.
    event_pos: Vec<usize>,
    ended: Option<usize>,
    compacted: Option<i64>,
    last_response_rev: i64,
}

fn check_stream(
    s: usize,
    responses: &[WatchResponse],
    watchers: &[ModelWatcher],
    canceled: &[(usize, i64)],
    model: &ModelStore,
) -> Result<(), TestCaseError> {
    let mine: Vec<&ModelWatcher> = watchers.iter().filter(|w| w.stream == s).collect();
    let mut got: HashMap<i64, Received> = HashMap::new();
    let mut progress: Vec<(usize, i64, i64)> = Vec::new(); // (position, watch_id, revision)
    for (pos, r) in responses.iter().enumerate() {
        let rec = got.entry(r.watch_id).or_default();
        if r.created {
            prop_assert!(!r.canceled, "unexpected rejected create: {:?}", r);
            prop_assert!(
                rec.created.is_none(),
                "two created responses for {}",
                r.watch_id
            );
            rec.created = Some(pos);
            continue;
        }
        if r.watch_id >= 0 {
            prop_assert!(rec.created.is_some(), "response before created: {:?}", r);
            // etcd keeps a compacted watcher's ID until the client cancels it, and answers
            // that cancel.
            let cancel_ack = r.canceled && r.compact_revision == 0 && rec.compacted.is_some();
            prop_assert!(
                rec.ended.is_none() || cancel_ack,
                "response after cancel: {:?}",
                r
            );
            if cancel_ack {
                continue;
            }
        }
        if r.canceled {
            rec.ended = Some(pos);
            if r.compact_revision > 0 {
                rec.compacted = Some(r.compact_revision);
                prop_assert_eq!(header(r), 0);
            }
            continue;
        }
        if r.events.is_empty() {
            progress.push((pos, r.watch_id, header(r)));
            continue;
        }
        let revs: Vec<i64> = r.events.iter().map(rev_of).collect();
        prop_assert!(
            revs.windows(2).all(|w| w[0] <= w[1]),
            "events out of order: {:?}",
            revs
        );
        prop_assert!(
            header(r) >= *revs.last().expect("events"),
            "header below its events"
        );
        prop_assert!(
            revs[0] > rec.last_response_rev,
            "a revision split or repeated across responses"
        );
        rec.last_response_rev = *revs.last().expect("events");
        rec.events.extend(r.events.iter().cloned());
        rec.event_pos
            .extend(std::iter::repeat_n(pos, r.events.len()));
    }
    for w in &mine {
        let rec = got.remove(&w.watch_id).unwrap_or_default();
        prop_assert!(
            rec.created.is_some(),
            "watcher {} never created",
            w.watch_id
        );
        let expected = w.expected(&model.log);
        let by_client = canceled.contains(&(s, w.watch_id));
        if let Some(c) = rec.compacted {
            prop_assert!(
                model.compactions.contains(&c),
                "compact revision {} never happened",
                c
            );
            let served_to = rec.events.last().map_or(w.start - 1, rev_of);
            prop_assert!(
                c > served_to,
                "compacted at {} but served up to {}",
                c,
                served_to
            );
            prop_assert!(
                c >= w.start,
                "compact revision {} below start {}",
                c,
                w.start
            );
        }
        if rec.compacted.is_some() || by_client {
            prop_assert!(rec.events.len() <= expected.len());
            prop_assert_eq!(
                &rec.events[..],
                &expected[..rec.events.len()],
                "not a prefix (watcher {})",
                w.watch_id
            );
        } else {
            prop_assert!(rec.ended.is_none(), "unexpected cancel of {}", w.watch_id);
            prop_assert_eq!(
                &rec.events,
                &expected,
                "watcher {} start {}",
                w.watch_id,
                w.start
            );
        }
        // Progress at revision R comes after this watcher's events <= R.
        for &(pos, id, rev) in &progress {
            let covers = (id == -1 || id == w.watch_id)
                && rec.created.is_some_and(|c| c < pos)
                && rec.ended.is_none_or(|e| e > pos);
            if !covers {
                continue;
            }
            let due = expected.iter().filter(|e| rev_of(e) <= rev).count();
            let before = rec.event_pos.iter().filter(|&&p| p < pos).count();
            prop_assert!(
                before >= due,
                "progress {} at position {} before {} events of watcher {}",
                rev,
                pos,
                due - before,
                w.watch_id
            );
        }
    }
    Ok(())
}

/// The property test; the ring is off, small (a few revisions or bytes, so reads fall off
/// its start) or large, and across the cases catch-up reads must have been answered both by
/// the ring and by the store, so neither path goes unchecked.
#[test]
fn every_watcher_sees_exactly_its_events() {
    use std::cell::Cell;
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 64,
        ..ProptestConfig::default()
    });
    let ring = prop_oneof![
        1 => Just((0usize, 0usize)),
        3 => (1usize..12, prop_oneof![Just(usize::MAX), 0usize..200]),
        1 => Just((super::ring::DEFAULT_RING_REVISIONS, super::ring::DEFAULT_RING_BYTES)),
    ];
    let strategy = (
        prop::collection::vec(op(), 1..90),
        1usize..4,
        1usize..5,
        ring,
    );
    let (hits, misses, both) = (Cell::new(0u64), Cell::new(0u64), Cell::new(0u32));
    let result = runner.run(&strategy, |(ops, buffer_len, batch_revs, ring)| {
        let stats = run(ops, buffer_len, batch_revs, ring)?;
        hits.set(hits.get() + stats.ring_hits);
        misses.set(misses.get() + stats.ring_misses);
        if stats.ring_hits > 0 && stats.ring_misses > 0 {
            both.set(both.get() + 1);
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    assert!(hits.get() > 0, "no catch-up read was served by the ring");
    assert!(misses.get() > 0, "no catch-up read went to the store");
    assert!(both.get() > 0, "no case used both the ring and the store");
}
