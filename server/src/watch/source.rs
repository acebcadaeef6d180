//! Where the hub reads history from: the MVCC store behind a small trait, so the hub can be
//! tested against an in-memory model and so a snapshot install (which swaps the store) is
//! seen through [`crate::mvcc::SharedStore`].

use std::sync::Arc;

use keel_proto::mvccpb::{Event, KeyValue};

use super::key_range::WatchKeyRange;
use crate::error::EtcdError;
use crate::mvcc::SharedStore;

/// How much one catch-up read may return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryLimit {
    /// Most distinct revisions (etcd's `watchBatchMaxRevs`, 1000).
    pub max_revisions: usize,
    /// Stop after the revision at which the encoded events reach this many bytes.
    pub max_bytes: usize,
}

/// Events read from history for one watcher.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct History {
    /// Events in revision order; a revision is either entirely here or not at all.
    pub events: Vec<Event>,
    /// The last revision the read covered: the watcher continues at `last_revision + 1`.
    pub last_revision: i64,
}

/// The store as the watch hub sees it.
pub trait HistorySource: Send + Sync + 'static {
    /// The store's current revision.
    fn current_revision(&self) -> i64;

    /// The store's compact revision, -1 if never compacted (etcd's `compactMainRev`, which
    /// a watcher's start revision is compared with).
    fn compact_revision(&self) -> i64;

    /// The events of keys in `range` at revisions `from..=to` (`to` clamped to the current
    /// revision), oldest first, within `limit` (whole revisions only, at least one). PUT
    /// events carry the stored pair, DELETE events `{key, mod_revision}` (etcd). With
    /// `prev_kv`, every event that is not a key creation carries the key's version just
    /// before the event's revision.
    ///
    /// Errors: `Compacted` when `from` is below the compact revision, when a compaction
    /// removed needed records during the read, or when a needed `prev_kv` is compacted
    /// (an event at exactly the compact revision); `Internal` on storage failure.
    fn history(
        &self,
        range: &WatchKeyRange,
        from: i64,
        to: i64,
        limit: HistoryLimit,
        prev_kv: bool,
    ) -> Result<History, EtcdError>;

    /// The version of `key` visible at revision `revision - 1`, i.e. just before an event
    /// at `revision` (`None` if the key did not exist then).
    ///
    /// Errors: `Compacted` if that version was compacted; `Internal` on storage failure.
    fn prev_kv(&self, key: &[u8], revision: i64) -> Result<Option<KeyValue>, EtcdError>;
}

/// The member's current MVCC store (swapped on snapshot install).
pub struct StoreHistory(pub Arc<SharedStore>);

impl HistorySource for StoreHistory {
    fn current_revision(&self) -> i64 {
        self.0.get().current_revision()
    }

    fn compact_revision(&self) -> i64 {
        self.0.get().compact_main_revision()
    }

    fn history(
        &self,
        range: &WatchKeyRange,
        from: i64,
        to: i64,
        limit: HistoryLimit,
        prev_kv: bool,
    ) -> Result<History, EtcdError> {
        let (key, range_end) = range.as_request();
        let batch = self.0.get().watch_history(
            key,
            range_end,
            from,
            to,
            limit.max_revisions,
            limit.max_bytes,
            prev_kv,
        )?;
        Ok(History {
            events: batch.events,
            last_revision: batch.last_revision,
        })
    }

    fn prev_kv(&self, key: &[u8], revision: i64) -> Result<Option<KeyValue>, EtcdError> {
        self.0.get().prev_kv(key, revision)
    }
}

/// etcd's `IsCreateEvent`: a PUT whose `create_revision` equals its `mod_revision` (the
/// first version of a key); such an event has no `prev_kv`.
pub fn is_create(event: &Event) -> bool {
    use keel_proto::mvccpb::event::EventType;
    event.r#type == EventType::Put as i32
        && event
            .kv
            .as_ref()
            .is_some_and(|kv| kv.create_revision == kv.mod_revision)
}
