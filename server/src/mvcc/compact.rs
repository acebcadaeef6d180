//! Compaction: dropping history that no read at or after the compact revision can see.
//!
//! etcd semantics (`store.Compact` / `updateCompactRev`, `keyIndex.compact` of etcd
//! ≥ 3.5.16 / 3.4.34): after compacting at `C`, reads at revisions `< C` fail with
//! `Compacted`; reads at `>= C` are unchanged. For each key, compaction keeps the newest
//! revision `<= C` of the first generation not closed before `C` and everything after it;
//! older revisions and generations are removed from the index and from sled. A tombstone at
//! exactly `C` survives until a later compaction, so a watcher starting at `C` sees it.
//!
//! Unlike etcd, which deletes from its backend in background batches, Keel removes the
//! records in the same sled batch as the compaction entry: the index and sled never
//! disagree, and `physical = true` needs no waiting. The compact revision is stored under
//! `mcompact` in that batch.

use keel_proto::etcdserverpb::CompactionResponse;

use super::write_txn::{WriteTxn, header};
use crate::error::EtcdError;

impl WriteTxn<'_> {
    /// etcd `Compact` at `revision`. The response header carries the current revision.
    ///
    /// Errors: `Compacted` if `revision` <= the compact revision (any revision is accepted
    /// on a never-compacted store, as etcd's initial compact revision is -1); `FutureRev` if
    /// `revision` > the current revision.
    pub fn compact(&mut self, revision: i64) -> Result<CompactionResponse, EtcdError> {
        if revision <= self.compact_rev() {
            return Err(EtcdError::Compacted);
        }
        if revision > self.view_rev() {
            return Err(EtcdError::FutureRev);
        }
        self.apply_compaction(revision);
        Ok(CompactionResponse {
            header: Some(header(self.view_rev())),
        })
    }
}
