//! Watch history of one key range: how an unsynced watcher catches up from the store (etcd
//! `watchableStore.syncWatchers` + `kvsToEvents`, and `v3rpc` filling `prev_kv`).
//!
//! Two read plans give the same answer:
//! - **by key**: walk the keys of the range in the index, take their revisions in
//!   `[from, to]`, sort them, read only those records. Best for one key or a small range
//!   over a long span of revisions;
//! - **by revision**: scan the revision records `[from, to]` in sled and keep the keys in
//!   the range. Best for a wide range over a short span (a watcher that fell slightly
//!   behind).
//!
//! The plan is picked by comparing the number of keys in the range with the number of
//! revisions in the span. Either way a compaction that removes records the read needed is
//! reported as `Compacted`, never as a silent gap.

use std::sync::atomic::Ordering;

use keel_proto::mvccpb::event::EventType;
use keel_proto::mvccpb::{Event, KeyValue};
use prost::Message;

use super::codec;
use super::events::EventBatch;
use super::index::KeyRange;
use super::key_index::RevInfo;
use super::revision::{Revision, record_key_lower_bound};
use super::store::{MvccStore, View};
use crate::error::EtcdError;

/// Stops a read at a revision boundary once a limit is reached. Shared with the watch
/// hub's ring of recent revisions (`watch/ring.rs`) so both cut a read at the same place.
pub(crate) struct Collector {
    events: Vec<Event>,
    max_revisions: usize,
    max_bytes: usize,
    revisions: usize,
    bytes: usize,
    /// Main revision of the last event taken.
    last_main: Option<i64>,
}

impl Collector {
    /// An empty collector; a limit of 0 means unlimited.
    pub(crate) fn new(max_revisions: usize, max_bytes: usize) -> Collector {
        Collector {
            events: Vec::new(),
            max_revisions,
            max_bytes,
            revisions: 0,
            bytes: 0,
            last_main: None,
        }
    }

    /// Whether an event of revision `main` may still be taken.
    pub(crate) fn admits(&self, main: i64) -> bool {
        match self.last_main {
            Some(last) if main == last => true,
            Some(_) => {
                (self.max_revisions == 0 || self.revisions < self.max_revisions)
                    && (self.max_bytes == 0 || self.bytes < self.max_bytes)
            }
            None => true,
        }
    }

    /// Takes an event of revision `main` (events come in revision order).
    pub(crate) fn push(&mut self, main: i64, event: Event) {
        if self.last_main != Some(main) {
            self.revisions += 1;
            self.last_main = Some(main);
        }
        self.bytes += event.encoded_len();
        self.events.push(event);
    }

    /// The events taken and the last revision covered: `to` if the read of `..=to` was
    /// `complete`, else the revision of the last event taken.
    pub(crate) fn finish(self, complete: bool, to: i64) -> EventBatch {
        let last_revision = if complete {
            to
        } else {
            self.last_main.unwrap_or(to)
        };
        EventBatch {
            events: self.events,
            last_revision,
        }
    }
}

/// A DELETE event from a tombstone record (etcd patches in the deletion revision).
fn delete_event(mut kv: KeyValue, main: i64) -> Event {
    kv.mod_revision = main;
    Event {
        r#type: EventType::Delete as i32,
        kv: Some(kv),
        prev_kv: None,
    }
}

fn put_event(kv: KeyValue) -> Event {
    Event {
        r#type: EventType::Put as i32,
        kv: Some(kv),
        prev_kv: None,
    }
}

impl MvccStore {
    /// The watch events of keys in `key`/`range_end` (etcd Range semantics: empty
    /// `range_end` = one key, `"\0"` = every key `>= key`) at revisions `from..=to` (`to`
    /// clamped to the current revision), oldest first. A read stops at a revision boundary
    /// after `max_revisions` revisions or once the events reach `max_bytes` encoded bytes
    /// (0 = no limit); it always returns whole revisions and at least one when there is
    /// one. PUT events carry the stored pair, DELETE events `{key, mod_revision}`. With
    /// `with_prev_kv`, every event that is not a key creation carries the key's version
    /// just before the event (etcd fills it from a Range at `mod_revision - 1`).
    ///
    /// Errors: `Compacted` if `from` is below the compact revision, if a compaction removed
    /// records the read needed while it ran, or if a needed `prev_kv` is compacted (an event
    /// at exactly the compact revision); `Internal` on storage failure.
    #[allow(clippy::too_many_arguments)]
    pub fn watch_history(
        &self,
        key: &[u8],
        range_end: &[u8],
        from: i64,
        to: i64,
        max_revisions: usize,
        max_bytes: usize,
        with_prev_kv: bool,
    ) -> Result<EventBatch, EtcdError> {
        let view = self.view();
        let from = from.max(1);
        let to = to.min(view.rev);
        if from < view.compact_rev {
            return Err(EtcdError::Compacted);
        }
        if from > to {
            return Ok(EventBatch {
                events: Vec::new(),
                last_revision: from - 1,
            });
        }
        let range = KeyRange::from_request(key, range_end);
        let mut out = Collector::new(max_revisions, max_bytes);
        let span = (to - from + 1) as usize;
        let by_key =
            matches!(range, KeyRange::Single(_)) || view.index.count(&range, view.rev) <= span;
        let complete = if by_key {
            self.history_by_key(&view, &range, from, to, &mut out)?
        } else {
            self.history_by_revision(&range, from, to, &mut out)?
        };
        let mut batch = out.finish(complete, to);
        if with_prev_kv {
            for ev in &mut batch.events {
                ev.prev_kv = self.prev_kv_in(&view, ev)?;
            }
        }
        Ok(batch)
    }

    /// The version of `key` visible just before revision `revision` (at `revision - 1`),
    /// the `prev_kv` of an event at `revision`; `None` if the key did not exist then.
    ///
    /// Errors: `Compacted` if `revision - 1` is below the compact revision or the record
    /// was compacted meanwhile; `Internal` on storage failure.
    pub fn prev_kv(&self, key: &[u8], revision: i64) -> Result<Option<KeyValue>, EtcdError> {
        let view = self.view();
        self.prev_at(&view, key, revision)
    }

    fn prev_at(
        &self,
        view: &View,
        key: &[u8],
        revision: i64,
    ) -> Result<Option<KeyValue>, EtcdError> {
        let before = revision - 1;
        if before < view.compact_rev {
            return Err(EtcdError::Compacted);
        }
        match view.index.get(key).and_then(|h| h.visible_at(before)) {
            Some(r) => self.read_value(key, r, before).map(Some),
            None => Ok(None),
        }
    }

    /// `prev_kv` of a history event: none for a key creation (etcd `IsCreateEvent`).
    fn prev_kv_in(&self, view: &View, ev: &Event) -> Result<Option<KeyValue>, EtcdError> {
        let Some(kv) = ev.kv.as_ref() else {
            return Ok(None);
        };
        let create = ev.r#type == EventType::Put as i32 && kv.create_revision == kv.mod_revision;
        if create {
            return Ok(None);
        }
        self.prev_at(view, &kv.key, kv.mod_revision)
    }

    /// Plan "by key"; returns whether the whole span was read.
    fn history_by_key(
        &self,
        view: &View,
        range: &KeyRange<'_>,
        from: i64,
        to: i64,
        out: &mut Collector,
    ) -> Result<bool, EtcdError> {
        let mut hits: Vec<(Revision, &[u8], RevInfo)> = Vec::new();
        for (key, history) in view.index.iter(range) {
            for r in history.revisions().rev().take_while(|r| r.main >= from) {
                if r.main <= to {
                    hits.push((r.revision(), key, *r));
                }
            }
        }
        hits.sort_unstable_by_key(|h| h.0);
        for (rev, key, info) in hits {
            if !out.admits(rev.main) {
                return Ok(false);
            }
            let kv = self.read_value(key, &info, from)?;
            let event = if info.tombstone {
                delete_event(kv, rev.main)
            } else {
                put_event(kv)
            };
            out.push(rev.main, event);
        }
        Ok(true)
    }

    /// Plan "by revision"; returns whether the whole span was read.
    fn history_by_revision(
        &self,
        range: &KeyRange<'_>,
        from: i64,
        to: i64,
        out: &mut Collector,
    ) -> Result<bool, EtcdError> {
        let floor_before = self.compact_floor.load(Ordering::Acquire);
        let bounds = record_key_lower_bound(from)..record_key_lower_bound(to.saturating_add(1));
        let internal =
            |e: &dyn std::fmt::Display| EtcdError::Internal(format!("mvcc: watch history: {e}"));
        let mut complete = true;
        // The caller's view was taken before: its records must be in sled for the scan.
        self.persist_for_read()?;
        let generation = self.tree.get();
        for item in generation.tree().range(bounds) {
            let (rkey, value) = item.map_err(|e| internal(&e))?;
            let meta = codec::decode_meta(&rkey, &value).map_err(|e| internal(&e))?;
            if !range.contains(meta.key) {
                continue;
            }
            if !out.admits(meta.rev.main) {
                complete = false;
                break;
            }
            let kv = codec::decode_kv(&rkey, &value).map_err(|e| internal(&e))?;
            let event = if meta.tombstone {
                delete_event(kv, meta.rev.main)
            } else {
                put_event(kv)
            };
            out.push(meta.rev.main, event);
        }
        // Records at or above the compact revision are never removed; a compaction above
        // `from` that ran during the scan may have removed some we needed.
        let floor_after = self.compact_floor.load(Ordering::Acquire);
        if floor_after > floor_before && floor_after > from {
            return Err(EtcdError::Compacted);
        }
        Ok(complete)
    }
}

#[cfg(test)]
mod tests {
    use keel_proto::etcdserverpb::{DeleteRangeRequest, PutRequest};

    use super::*;

    fn store() -> MvccStore {
        let tree = crate::mvcc::test_support::temp_tree();
        MvccStore::open(tree).unwrap()
    }

    fn put(s: &MvccStore, key: &str, value: &str) -> i64 {
        let mut w = s.write();
        w.put(&PutRequest {
            key: key.into(),
            value: value.into(),
            ..Default::default()
        })
        .unwrap();
        w.commit().unwrap().revision
    }

    fn del(s: &MvccStore, key: &str) -> i64 {
        let mut w = s.write();
        w.delete_range(&DeleteRangeRequest {
            key: key.into(),
            ..Default::default()
        })
        .unwrap();
        w.commit().unwrap().revision
    }

    fn compact(s: &MvccStore, rev: i64) {
        let mut w = s.write();
        w.compact(rev).unwrap();
        w.commit().unwrap();
    }

    /// `(type, key, mod_revision, prev value)` of each event.
    fn summary(b: &EventBatch) -> Vec<(i32, String, i64, Option<String>)> {
        b.events
            .iter()
            .map(|e| {
                let kv = e.kv.as_ref().unwrap();
                let prev = e
                    .prev_kv
                    .as_ref()
                    .map(|p| String::from_utf8(p.value.clone()).unwrap());
                (
                    e.r#type,
                    String::from_utf8(kv.key.clone()).unwrap(),
                    kv.mod_revision,
                    prev,
                )
            })
            .collect()
    }

    const PUT: i32 = EventType::Put as i32;
    const DEL: i32 = EventType::Delete as i32;

    #[test]
    fn single_key_history_with_prev_kv() {
        let s = store();
        let r1 = put(&s, "k", "1");
        put(&s, "other", "x");
        let r3 = put(&s, "k", "2");
        let r4 = del(&s, "k");
        let r5 = put(&s, "k", "3");
        let b = s.watch_history(b"k", b"", r1, r5, 0, 0, true).unwrap();
        assert_eq!(
            summary(&b),
            vec![
                (PUT, "k".into(), r1, None),
                (PUT, "k".into(), r3, Some("1".into())),
                (DEL, "k".into(), r4, Some("2".into())),
                (PUT, "k".into(), r5, None),
            ]
        );
        assert_eq!(b.last_revision, r5);
        let tomb = b.events[2].kv.as_ref().unwrap();
        assert_eq!(
            (tomb.create_revision, tomb.version, tomb.value.len()),
            (0, 0, 0)
        );
    }

    #[test]
    fn both_plans_agree_on_ranges() {
        let s = store();
        let first = put(&s, "a1", "x");
        for i in 0..40 {
            put(&s, &format!("a{}", i % 7), &format!("v{i}"));
            if i % 5 == 0 {
                del(&s, &format!("a{}", i % 3));
            }
            put(&s, &format!("b{i}"), "y");
        }
        let last = s.current_revision();
        for (from, to) in [(first, last), (last - 3, last), (first + 10, first + 12)] {
            let view = s.view();
            let range = KeyRange::from_request(b"a", b"b");
            let mut by_key = Collector::new(0, 0);
            let mut by_rev = Collector::new(0, 0);
            assert!(
                s.history_by_key(&view, &range, from, to, &mut by_key)
                    .unwrap()
            );
            assert!(
                s.history_by_revision(&range, from, to, &mut by_rev)
                    .unwrap()
            );
            assert_eq!(
                by_key.events, by_rev.events,
                "plans differ for {from}..={to}"
            );
            assert!(
                by_key
                    .events
                    .iter()
                    .all(|e| e.kv.as_ref().unwrap().key.starts_with(b"a"))
            );
        }
    }

    #[test]
    fn limits_cut_at_revision_boundaries() {
        let s = store();
        let first = put(&s, "k", "1");
        for i in 2..=10 {
            put(&s, "k", &i.to_string());
        }
        let b = s
            .watch_history(b"k", b"", first, first + 100, 3, 0, false)
            .unwrap();
        assert_eq!(b.events.len(), 3);
        assert_eq!(
            b.last_revision,
            first + 2,
            "continue after the last revision returned"
        );
        let b = s
            .watch_history(b"k", b"", first + 9, first + 100, 3, 0, false)
            .unwrap();
        assert_eq!(
            (b.events.len(), b.last_revision),
            (1, first + 9),
            "span clamped to the current revision"
        );
        let b = s
            .watch_history(b"k", b"", first, first + 100, 0, 1, false)
            .unwrap();
        assert_eq!(
            (b.events.len(), b.last_revision),
            (1, first),
            "the byte limit still returns one revision"
        );
        let b = s
            .watch_history(b"k", b"", first + 20, first + 100, 3, 0, false)
            .unwrap();
        assert_eq!(
            b.last_revision,
            first + 19,
            "nothing to read: continue where asked"
        );
    }

    #[test]
    fn compaction_is_reported_not_skipped() {
        let s = store();
        let r1 = put(&s, "k", "1");
        let r2 = put(&s, "k", "2");
        let r3 = put(&s, "k", "3");
        compact(&s, r2);
        assert_eq!(
            s.watch_history(b"k", b"", r1, r3, 0, 0, false),
            Err(EtcdError::Compacted)
        );
        let b = s.watch_history(b"k", b"", r2, r3, 0, 0, false).unwrap();
        assert_eq!(
            b.events.len(),
            2,
            "the compact revision itself is still readable"
        );
        // The event at the compact revision lost its prev_kv: report, do not omit.
        assert_eq!(
            s.watch_history(b"k", b"", r2, r3, 0, 0, true),
            Err(EtcdError::Compacted)
        );
        let b = s.watch_history(b"k", b"", r3, r3, 0, 0, true).unwrap();
        assert_eq!(summary(&b), vec![(PUT, "k".into(), r3, Some("2".into()))]);
        assert_eq!(
            s.prev_kv(b"k", r3).unwrap().map(|kv| kv.value),
            Some(b"2".to_vec())
        );
        assert_eq!(s.prev_kv(b"k", r2), Err(EtcdError::Compacted));
    }

    #[test]
    fn tombstone_at_the_compact_revision_is_delivered() {
        let s = store();
        put(&s, "k", "1");
        let d = del(&s, "k");
        compact(&s, d);
        let b = s.watch_history(b"k", b"", d, d, 0, 0, false).unwrap();
        assert_eq!(summary(&b), vec![(DEL, "k".into(), d, None)]);
    }
}
