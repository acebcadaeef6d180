//! openraft log storage on Keel's WAL (`crate::wal`).
//!
//! Entries are bincode-encoded `openraft::Entry` values keyed by log index; the vote, the
//! committed log id and the last purged log id are WAL metadata records. Durability contract
//! (Raft paper §5.1 and openraft's `RaftLogStorage` docs): `save_vote` returns only after the
//! vote is fsync'ed, and the `LogFlushed` callback of `append` fires only after the entries are
//! fsync'ed. Concurrent appends share one fdatasync (group commit, in the WAL).
//!
//! Raft log invariants, asserted as toyDB asserts its log's (a break would let two members
//! hold different committed entries at one index, Raft paper §5.3–5.4):
//! - an append carries consecutive indices with non-decreasing terms;
//! - the committed log id never moves backwards;
//! - no entry at or below the committed log id is ever truncated.

// openraft's `StorageError` (the error type its storage traits require) is large by design;
// it only travels on the rare failure path.
#![allow(clippy::result_large_err)]

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader, StorageIOError, Vote};

use super::trace::{self, Stage};
use super::types::{Entry, LogId, NodeId, StorageError, TypeConfig};
use crate::wal::{Lsn, Wal, WalError};

/// WAL metadata key of the raft vote (bincode `Vote<NodeId>`).
pub const META_VOTE: u8 = 1;
/// WAL metadata key of the committed log id (bincode `Option<LogId>`).
pub const META_COMMITTED: u8 = 2;
/// WAL metadata key of the last purged log id (bincode `LogId`).
pub const META_PURGED: u8 = 3;

/// The raft log store. Cheap to clone: clones share one WAL (the reader handed to
/// replication tasks is such a clone).
#[derive(Clone)]
pub struct LogStore {
    wal: Arc<Wal>,
    on_commit: Option<CommitHook>,
}

/// Called with the committed log index each time openraft advances it (QoS overload
/// protection reads the apply lag, committed − applied, from it; openraft 0.9's metrics do
/// not carry the committed index).
pub type CommitHook = Arc<dyn Fn(u64) + Send + Sync>;

impl LogStore {
    /// Wraps an opened WAL.
    pub fn new(wal: Arc<Wal>) -> LogStore {
        LogStore {
            wal,
            on_commit: None,
        }
    }

    /// Wraps an opened WAL and reports every committed index to `on_commit`.
    pub fn with_commit_hook(wal: Arc<Wal>, on_commit: CommitHook) -> LogStore {
        LogStore {
            wal,
            on_commit: Some(on_commit),
        }
    }

    fn meta<T: serde::de::DeserializeOwned>(&self, key: u8) -> Result<Option<T>, StorageError> {
        match self.wal.meta(key) {
            None => Ok(None),
            Some(bytes) => bincode::deserialize(&bytes)
                .map(Some)
                .map_err(|e| StorageIOError::read_logs(&e).into()),
        }
    }

    /// Waits, off the async runtime's worker threads, until `lsn` is durable.
    async fn durable(&self, lsn: Lsn) -> Result<(), WalError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.wal.on_durable(
            lsn,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        rx.await.unwrap_or_else(|_| {
            Err(WalError::Io(std::io::Error::other(
                "wal sync thread stopped",
            )))
        })
    }

    fn decode(bytes: &[u8], index: u64) -> Result<Entry, StorageError> {
        bincode::deserialize(bytes).map_err(|e| StorageIOError::read_log_at_index(index, &e).into())
    }
}

fn io_err(e: &WalError) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s + 1,
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.saturating_add(1),
            Bound::Excluded(&e) => e,
            Bound::Unbounded => self.wal.last_index().map_or(0, |l| l + 1),
        };
        if start >= end {
            return Ok(Vec::new());
        }
        let raw = self
            .wal
            .read_range(start, end)
            .map_err(|e| StorageIOError::read_logs(&e))?;
        raw.iter().map(|(i, b)| Self::decode(b, *i)).collect()
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged_log_id: Option<LogId> = self.meta(META_PURGED)?;
        let last_log_id = match self.wal.last_index() {
            Some(i) => match self
                .wal
                .read(i)
                .map_err(|e| StorageIOError::read_logs(&e))?
            {
                Some(bytes) => Some(Self::decode(&bytes, i)?.log_id),
                None => last_purged_log_id,
            },
            None => last_purged_log_id,
        };
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        let bytes = bincode::serialize(vote).map_err(|e| StorageIOError::write_vote(&e))?;
        let lsn = self
            .wal
            .set_meta(META_VOTE, &bytes)
            .map_err(|e| StorageIOError::write_vote(&e))?;
        // A vote must be on disk before it is acknowledged (Raft paper §5.2, Figure 2).
        self.durable(lsn)
            .await
            .map_err(|e| StorageIOError::write_vote(&e).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        self.meta(META_VOTE)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        // Not waited for: committed is a hint that lets a restart re-apply without an
        // election; it only ever names entries that are already durable.
        let before = self.meta::<Option<LogId>>(META_COMMITTED)?.flatten();
        assert!(
            committed >= before,
            "raft log: the committed log id would move back from {before:?} to {committed:?}"
        );
        let bytes = bincode::serialize(&committed).map_err(|e| StorageIOError::write_logs(&e))?;
        self.wal
            .set_meta(META_COMMITTED, &bytes)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        if let Some(c) = committed {
            trace::mark(Stage::Commit, c.index, c.index, 0);
        }
        if let (Some(hook), Some(c)) = (&self.on_commit, committed) {
            hook(c.index);
        }
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.meta::<Option<LogId>>(META_COMMITTED)?.flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        // Entries at or below the purge point are already in the applied state (a snapshot or
        // the store); the WAL keeps only what follows it.
        let purged = self.wal.purged_index();
        let mut previous: Option<LogId> = None;
        let encoded: Vec<(u64, Vec<u8>)> = entries
            .into_iter()
            .inspect(|e| {
                if let Some(p) = previous {
                    assert!(
                        e.log_id.index == p.index + 1 && e.log_id.leader_id >= p.leader_id,
                        "raft log: entry {} appended after {p}",
                        e.log_id
                    );
                }
                previous = Some(e.log_id);
            })
            .filter(|e| purged.is_none_or(|p| e.log_id.index > p))
            .map(|e| bincode::serialize(&e).map(|b| (e.log_id.index, b)))
            .collect::<Result<_, _>>()
            .map_err(|e| StorageIOError::write_logs(&e))?;
        let refs: Vec<(u64, &[u8])> = encoded.iter().map(|(i, b)| (*i, b.as_slice())).collect();
        let traced = trace::covered(&encoded, |e| e.0);
        if let Some((first, last)) = traced {
            trace::mark(Stage::Append, first, last, 0);
        }
        let lsn = self
            .wal
            .append(&refs)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        // Group commit: the WAL's sync thread fires this after the fdatasync covering `lsn`.
        self.wal.on_durable(
            lsn,
            Box::new(move |r| {
                if let Some((first, last)) = traced {
                    trace::mark(Stage::Durable, first, last, 0);
                }
                callback.log_io_completed(r.map_err(|e| io_err(&e)))
            }),
        );
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let committed = self.meta::<Option<LogId>>(META_COMMITTED)?.flatten();
        assert!(
            committed.is_none_or(|c| log_id.index > c.index),
            "raft log: truncating from {log_id} would drop committed entries (committed: {committed:?})"
        );
        self.wal
            .truncate_from(log_id.index)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        // Persist the purge point before dropping segments, so a restart never sees a log
        // that starts after a gap without knowing why.
        let bytes = bincode::serialize(&log_id).map_err(|e| StorageIOError::write_logs(&e))?;
        let lsn = self
            .wal
            .set_meta(META_PURGED, &bytes)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        self.durable(lsn)
            .await
            .map_err(|e| StorageIOError::write_logs(&e))?;
        self.wal
            .purge_to(log_id.index)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, EntryPayload};

    use super::*;

    fn log_id(term: u64, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    fn blank(term: u64, index: u64) -> Entry {
        Entry {
            log_id: log_id(term, index),
            payload: EntryPayload::Blank,
        }
    }

    fn store() -> (tempfile::TempDir, LogStore) {
        let dir = tempfile::tempdir().unwrap();
        let wal = Wal::open(dir.path(), crate::wal::WalOptions::default()).unwrap();
        (dir, LogStore::new(Arc::new(wal)))
    }

    /// Appends `entries` as openraft would, without waiting for the flush callback.
    fn append(store: &LogStore, entries: Vec<Entry>) {
        let encoded: Vec<(u64, Vec<u8>)> = entries
            .iter()
            .map(|e| (e.log_id.index, bincode::serialize(e).unwrap()))
            .collect();
        let refs: Vec<(u64, &[u8])> = encoded.iter().map(|(i, b)| (*i, b.as_slice())).collect();
        store.wal.append(&refs).unwrap();
    }

    #[tokio::test]
    async fn the_commit_hook_hears_every_committed_index() {
        let dir = tempfile::tempdir().unwrap();
        let wal = Wal::open(dir.path(), crate::wal::WalOptions::default()).unwrap();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let hook = seen.clone();
        let mut s = LogStore::with_commit_hook(
            Arc::new(wal),
            Arc::new(move |i| hook.lock().unwrap().push(i)),
        );
        append(&s, (1..=5).map(|i| blank(1, i)).collect());
        s.save_committed(Some(log_id(1, 3))).await.unwrap();
        s.save_committed(Some(log_id(1, 5))).await.unwrap();
        assert_eq!(*seen.lock().unwrap(), [3, 5]);
    }

    #[tokio::test]
    async fn truncating_uncommitted_entries_is_allowed() {
        let (_dir, mut s) = store();
        append(&s, (1..=5).map(|i| blank(1, i)).collect());
        s.save_committed(Some(log_id(1, 3))).await.unwrap();
        s.truncate(log_id(1, 4)).await.unwrap();
        assert_eq!(s.wal.last_index(), Some(3));
        assert_eq!(s.read_committed().await.unwrap(), Some(log_id(1, 3)));
    }

    #[tokio::test]
    #[should_panic(expected = "would drop committed entries")]
    async fn truncating_a_committed_entry_panics() {
        let (_dir, mut s) = store();
        append(&s, (1..=5).map(|i| blank(1, i)).collect());
        s.save_committed(Some(log_id(1, 3))).await.unwrap();
        let _ = s.truncate(log_id(1, 3)).await;
    }

    #[tokio::test]
    #[should_panic(expected = "would move back")]
    async fn the_committed_log_id_never_moves_back() {
        let (_dir, mut s) = store();
        s.save_committed(Some(log_id(2, 7))).await.unwrap();
        let _ = s.save_committed(Some(log_id(2, 6))).await;
    }
}
