//! Keel's multi-version key-value store: etcd's revision model on sled, with the key index
//! in memory.
//!
//! - Every change gets a [`Revision`] `(main, sub)`; `main` is the store revision, which
//!   advances by one per raft entry that changes something (a fresh store is at revision 1,
//!   the first write makes revision 2, as in etcd).
//! - sled holds one record per revision (`k` + main + sub [+ `t`]) → `mvccpb.KeyValue`, plus
//!   a little meta (`m…`); the layout is declared in [`crate::backend::schema`], the bytes
//!   are encoded by `codec.rs`.
//! - The in-memory [`index::Index`] maps each key to its history ([`key_index::KeyHistory`])
//!   and answers counts, limits, filters, sorting and `keys_only` without reading values.
//! - [`MvccStore`] serves readers from an immutable published view of the index; the single
//!   writer (the apply loop) works on a [`WriteTxn`] that copies only the index blocks it
//!   touches, writes one sled batch and then publishes the new view.
//!
//! Design, byte layouts, invariants, locking and measured figures: `docs/mvcc.md`.

mod codec;
mod compact;
mod compactor;
mod events;
mod hash;
mod history;
pub mod index;
pub mod key_index;
mod older;
mod range;
mod rebuild;
pub mod revision;
mod separators;
mod shared;
mod staged;
mod store;
mod txn;
mod unpersisted;
mod write_txn;

#[cfg(test)]
pub(crate) mod test_support;
#[cfg(test)]
mod tests_count;
/// Scenario tests: the goldenscripts in `testscripts/` (docs/testing.md), and the runner
/// frame and etcd request vocabulary the lease, watch and raft runners share.
#[cfg(test)]
pub(crate) mod tests_golden;
#[cfg(test)]
mod tests_model;
#[cfg(test)]
mod tests_perf;
#[cfg(test)]
mod tests_persist;
#[cfg(test)]
mod tests_read_txn;
#[cfg(test)]
mod tests_scenarios;

pub use compactor::{
    BATCH_PAUSE, BATCH_REMOVALS, COMPACT_HASHES_KEPT, CompactHash, INLINE_REMOVALS,
};
pub use events::EventBatch;
pub use hash::{Crc32c, HashKv, crc32c};
pub(crate) use history::Collector;
pub use revision::Revision;
pub use shared::SharedStore;
pub use store::{IndexStats, MvccStore};
pub use txn::{is_txn_read_only, is_txn_serializable, txn_ops};
pub use unpersisted::PersistPolicy;
pub use write_txn::{Committed, WriteTxn};

/// A storage-level failure of the MVCC store (not an etcd request error: those are
/// [`crate::error::EtcdError`]). Any of these is fatal for the member.
#[derive(Debug, thiserror::Error)]
pub enum MvccError {
    /// sled failed (I/O, or its own corruption detection).
    #[error("mvcc: storage error: {0}")]
    Storage(#[from] sled::Error),
    /// A stored record or meta value does not decode, or contradicts the index.
    #[error("mvcc: corrupt entry {key}: {reason}")]
    Corrupt {
        /// The sled key, escaped for display.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The data was written in an MVCC format this binary does not know.
    #[error("mvcc: unsupported on-disk format version {found} (this binary reads {supported})")]
    Format {
        /// Version found in the tree.
        found: u64,
        /// Version this binary reads and writes.
        supported: u64,
    },
    /// The parallel index rebuild failed to run.
    #[error("mvcc: index rebuild failed: {0}")]
    Rebuild(String),
    /// The physical-compaction thread could not be started.
    #[error("mvcc: cannot start the compaction thread: {0}")]
    Thread(#[source] std::io::Error),
    /// A write txn changed the apply group's working index and was then dropped without
    /// being staged (a storage failure in the middle of a request): the group no longer
    /// matches what would be written, so it is never flushed and the member must restart
    /// from its last flushed state and the WAL.
    #[error("mvcc: apply group abandoned after a partial write: {0}")]
    Abandoned(String),
    /// An earlier commit of published groups to sled failed (unpersisted.rs), so no later
    /// one may go; the member must stop and restart from its last committed state and the
    /// WAL.
    #[error("mvcc: an earlier commit to sled failed: {0}")]
    Background(String),
}

impl From<crate::backend::BackendError> for MvccError {
    fn from(e: crate::backend::BackendError) -> Self {
        match e {
            crate::backend::BackendError::Storage(e) => MvccError::Storage(e),
        }
    }
}

impl MvccError {
    /// A corruption error for sled key `key`.
    pub fn corrupt(key: &[u8], reason: impl Into<String>) -> MvccError {
        MvccError::Corrupt {
            key: key.escape_ascii().to_string(),
            reason: reason.into(),
        }
    }
}

impl From<MvccError> for crate::error::EtcdError {
    fn from(e: MvccError) -> Self {
        crate::error::EtcdError::Internal(e.to_string())
    }
}
