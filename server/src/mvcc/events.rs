//! Reading past changes as watch events, straight from the revision records (etcd
//! `watchableStore.syncWatchers` → `kvsToEvents`): how a watcher that fell behind, or one
//! that starts at an old revision, catches up from the store.

use std::sync::atomic::Ordering;

use keel_proto::mvccpb::Event;
use keel_proto::mvccpb::event::EventType;

use super::codec;
use super::index::Index;
use super::revision::Revision;
use super::revision::{parse_record_key, record_key_lower_bound};
use super::store::MvccStore;
use crate::error::EtcdError;

/// A run of events read from the store.
#[derive(Debug, Clone, PartialEq)]
pub struct EventBatch {
    /// Events in revision order; all events of a revision are either all here or not at all.
    pub events: Vec<Event>,
    /// The last revision this batch covers: continue from `last_revision + 1`. Equals the
    /// requested end (clamped to the current revision) when the whole span was read.
    pub last_revision: i64,
}

impl MvccStore {
    /// Events of revisions `from..=to` (`to` is clamped to the current revision), oldest
    /// first, stopping after the first revision at which at least `max_events` events were
    /// collected (0 = no limit). PUT events carry the stored `KeyValue`; DELETE events carry
    /// `{key, mod_revision}` (etcd). `prev_kv` is unset.
    ///
    /// Errors: `Compacted` if `from` < the compact revision, or a compaction reaching `from`
    /// ran during the read (the answer could miss events); `Internal` on storage failure.
    pub fn events(&self, from: i64, to: i64, max_events: usize) -> Result<EventBatch, EtcdError> {
        let view = self.view();
        let to = to.min(view.rev);
        let from = from.max(1);
        if from < view.compact_rev {
            return Err(EtcdError::Compacted);
        }
        let floor_before = self.compact_floor.load(Ordering::Acquire);
        let mut batch = EventBatch {
            events: Vec::new(),
            last_revision: to,
        };
        if from > to {
            batch.last_revision = from - 1;
            return Ok(batch);
        }
        // The records up to the view's revision must be in sled before the scan.
        self.persist_for_read()?;
        let range = record_key_lower_bound(from)..record_key_lower_bound(to.saturating_add(1));
        let internal =
            |e: &dyn std::fmt::Display| EtcdError::Internal(format!("mvcc: events: {e}"));
        let generation = self.tree.get();
        for item in generation.tree().range(range) {
            let (rkey, value) = item.map_err(|e| internal(&e))?;
            let (rev, tombstone) =
                parse_record_key(&rkey).ok_or_else(|| internal(&"malformed record key"))?;
            let last = batch
                .events
                .last()
                .and_then(|e| e.kv.as_ref())
                .map(|kv| kv.mod_revision);
            if let Some(last) =
                last.filter(|&l| max_events > 0 && batch.events.len() >= max_events && rev.main > l)
            {
                // Stop at a revision boundary: never split one revision's events.
                batch.last_revision = last;
                break;
            }
            let mut kv = codec::decode_kv(&rkey, &value).map_err(|e| internal(&e))?;
            if rev.main <= view.compact_rev && !indexed(&view.index, &kv.key, rev) {
                // Compacted away but not yet removed from sled (see compactor.rs).
                continue;
            }
            let kind = if tombstone {
                kv.mod_revision = rev.main;
                EventType::Delete
            } else {
                EventType::Put
            };
            batch.events.push(Event {
                r#type: kind as i32,
                kv: Some(kv),
                prev_kv: None,
            });
        }
        let floor_after = self.compact_floor.load(Ordering::Acquire);
        if floor_after > floor_before && floor_after >= from {
            return Err(EtcdError::Compacted);
        }
        Ok(batch)
    }
}

/// Whether the index still holds revision `rev` of `key`.
fn indexed(index: &Index, key: &[u8], rev: Revision) -> bool {
    index
        .get(key)
        .is_some_and(|h| h.revisions().any(|r| r.revision() == rev))
}
