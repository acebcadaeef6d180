//! openraft log storage on Keel's WAL (`crate::wal`).
//!
//! Entries are bincode-encoded `openraft::Entry` values keyed by log index; the vote, the
//! committed log id and the last purged log id are WAL metadata records. Durability contract
//! (Raft paper §5.1 and openraft's `RaftLogStorage` docs): `save_vote` returns only after the
//! vote is fsync'ed, and the `LogFlushed` callback of `append` fires only after the entries are
//! fsync'ed. Concurrent appends share one fdatasync (group commit, in the WAL).
//!
//! The newest entries are also kept in memory ([`LogTail`]), so reading an entry back right
//! after its append (replication to each follower, apply) needs no WAL read.
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

use super::log_tail::LogTail;
use super::trace::{self, Stage};
use super::types::{Entry, LogId, NodeId, StorageError, TypeConfig};
use crate::wal::{Lsn, Wal, WalError};

/// Most encoded entry bytes in one AppendEntries (an entry larger than this still goes, alone):
/// etcd's `maxSizePerMsg`, 1 MiB (`server/etcdserver/raft.go`). Without a byte bound openraft
/// sends up to `max_payload_entries` (300) entries per AppendEntries, and a follower behind by
/// 300 large entries (300 × 1.4 MiB) got a message it could not take in before the RPC
/// timed out, again and again (docs/raft.md, "Message size").
pub const MAX_APPEND_BYTES: usize = 1 << 20;

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
    /// The newest entries in memory, shared by every clone (the readers included).
    tail: Arc<LogTail>,
    on_commit: Option<CommitHook>,
    /// This member's id when a restart must start it as a follower
    /// ([`LogStore::restarting_as_follower`]).
    follower_on_restart: Option<NodeId>,
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
            tail: Arc::default(),
            on_commit: None,
            follower_on_restart: None,
        }
    }

    /// Wraps an opened WAL and reports every committed index to `on_commit`.
    pub fn with_commit_hook(wal: Arc<Wal>, on_commit: CommitHook) -> LogStore {
        LogStore {
            wal,
            tail: Arc::default(),
            on_commit: Some(on_commit),
            follower_on_restart: None,
        }
    }

    /// Makes member `id` start as a follower after a restart even when it was the leader
    /// (Raft paper §5.2: servers start up as followers; etcd does the same): a saved vote
    /// that is committed and for `id` is read back uncommitted, so the member leads again only
    /// after winning an election, in a higher term.
    ///
    /// Why: openraft 0.9 restores such a member as the leader of the same term at once
    /// (`Engine::startup`). Keel's leader sends entries to its followers before its own
    /// fdatasync ends (docs/raft.md), so after a power loss it may have lost entries that its
    /// followers hold; leading on in the same term, it would append different entries under
    /// the same log ids, and the followers would keep theirs (the Log Matching property,
    /// §5.3, assumes one entry per index and term).
    pub fn restarting_as_follower(mut self, id: NodeId) -> LogStore {
        self.follower_on_restart = Some(id);
        self
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
        self.read(start, end, usize::MAX)
    }

    /// The entries of one AppendEntries from index `start`: up to `end` (exclusive) and at most
    /// [`MAX_APPEND_BYTES`] of encoded entries, but at least one entry (openraft reads on from
    /// the last entry it got).
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry>, StorageError> {
        if start >= end {
            return Ok(Vec::new());
        }
        self.read(start, end, MAX_APPEND_BYTES)
    }
}

impl LogStore {
    /// Entries `[start, end)`, from the tail when it holds them all, else from the WAL; stops
    /// before the entry that would take their encoded size past `max_bytes` (the first entry
    /// always comes).
    fn read(&self, start: u64, end: u64, max_bytes: usize) -> Result<Vec<Entry>, StorageError> {
        if let Some(entries) = self.tail.get_limited(start, end, max_bytes) {
            return Ok(entries);
        }
        let raw = self
            .wal
            .read_range_limited(start, end, max_bytes)
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
        // openraft reads the vote once, at start (`StorageHelper::get_initial_state`).
        let vote: Option<Vote<NodeId>> = self.meta(META_VOTE)?;
        Ok(match (vote, self.follower_on_restart) {
            (Some(v), Some(me)) if v.is_committed() && v.leader_id().voted_for() == Some(me) => {
                tracing::info!(
                    term = v.leader_id().get_term(),
                    "was the leader before the restart: starting as a follower"
                );
                Some(Vote::new(v.leader_id().get_term(), me))
            }
            (v, _) => v,
        })
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
        // Lazy: no fdatasync of its own (it rides on the next append's), so a commit advance
        // does not cost the leader a sync round between two appends.
        self.wal
            .set_meta_lazy(META_COMMITTED, &bytes)
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
        let kept: Vec<Entry> = entries
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
            .collect();
        let encoded: Vec<(u64, Vec<u8>)> = kept
            .iter()
            .map(|e| bincode::serialize(e).map(|b| (e.log_id.index, b)))
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
        let sizes = encoded.iter().map(|(_, b)| b.len());
        self.tail.appended(kept.into_iter().zip(sizes).collect());
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
        // The tail first: no reader finds a truncated entry there afterwards.
        self.tail.truncated(log_id.index);
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
        self.tail.purged(log_id.index);
        // etcd's line for the same step (etcdserver `compacted Raft logs`, compact-index).
        tracing::info!(compact_index = log_id.index, "compacted Raft logs");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use openraft::storage::RaftLogStorageExt;
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

    /// An entry carrying a put of `value_bytes` bytes.
    fn put(term: u64, index: u64, value_bytes: usize) -> Entry {
        use keel_proto::etcdserverpb::PutRequest;
        use keel_proto::keelpb::{RaftRequest, raft_request};
        let put = PutRequest {
            key: b"k".to_vec(),
            value: vec![7; value_bytes],
            ..Default::default()
        };
        Entry {
            log_id: log_id(term, index),
            payload: EntryPayload::Normal(super::super::types::Request::new(RaftRequest {
                id: index,
                request: Some(raft_request::Request::Put(put)),
                ..Default::default()
            })),
        }
    }

    fn indexes(entries: &[Entry]) -> Vec<u64> {
        entries.iter().map(|e| e.log_id.index).collect()
    }

    /// An AppendEntries carries at most `MAX_APPEND_BYTES` of entries, but always one, whether
    /// the entries come from the in-memory tail or from the WAL.
    #[tokio::test]
    async fn a_replication_read_is_bounded_by_bytes_but_returns_at_least_one_entry() {
        let quarter = MAX_APPEND_BYTES / 4;
        let (_dir, mut s) = store();
        // 1..=8: a quarter of the budget each, minus framing; 9: twice the budget alone.
        let mut entries: Vec<Entry> = (1..=8).map(|i| put(1, i, quarter - 64)).collect();
        entries.push(put(1, 9, 2 * MAX_APPEND_BYTES));
        entries.push(put(1, 10, 10));
        s.blocking_append(entries.clone()).await.unwrap();
        assert_eq!(
            indexes(&s.limited_get_log_entries(1, 11).await.unwrap()),
            [1, 2, 3, 4]
        );
        assert_eq!(
            indexes(&s.limited_get_log_entries(7, 11).await.unwrap()),
            [7, 8]
        );
        assert_eq!(
            indexes(&s.limited_get_log_entries(9, 11).await.unwrap()),
            [9]
        );
        assert_eq!(
            indexes(&s.limited_get_log_entries(10, 11).await.unwrap()),
            [10]
        );
        // Unbounded reads (apply, snapshots) still get the whole range.
        assert_eq!(s.try_get_log_entries(1..11).await.unwrap(), entries);

        // The same from the WAL alone (a store reopened on it has an empty tail).
        let mut from_wal = LogStore::new(s.wal.clone());
        assert!(from_wal.tail.is_empty());
        assert_eq!(
            indexes(&from_wal.limited_get_log_entries(1, 11).await.unwrap()),
            [1, 2, 3, 4]
        );
        assert_eq!(
            indexes(&from_wal.limited_get_log_entries(5, 11).await.unwrap()),
            [5, 6, 7, 8]
        );
        assert_eq!(
            indexes(&from_wal.limited_get_log_entries(9, 11).await.unwrap()),
            [9]
        );
        assert_eq!(from_wal.try_get_log_entries(1..11).await.unwrap(), entries);
    }

    /// One step of the model test: appends after the last entry (with a term that may grow),
    /// a truncation, or a purge, at positions relative to the current log.
    #[derive(Debug, Clone)]
    enum Op {
        Append { count: u64, term_up: bool },
        Truncate { back: u64 },
        Purge { ahead: u64 },
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (1u64..40, any::<bool>()).prop_map(|(count, term_up)| Op::Append { count, term_up }),
            1 => (0u64..30).prop_map(|back| Op::Truncate { back }),
            1 => (0u64..30).prop_map(|ahead| Op::Purge { ahead }),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(48))]

        /// Reads through the log store (its in-memory tail or the WAL) always equal a model of
        /// the log, whatever sequence of appends, truncations and purges came before.
        #[test]
        fn reads_equal_the_model_log(ops in proptest::collection::vec(op(), 1..40)) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            rt.block_on(async {
                let (_dir, mut s) = store();
                // index -> term of every entry in the log; entries above `purged` only.
                let mut model: std::collections::BTreeMap<u64, u64> = Default::default();
                let (mut purged, mut term, mut next) = (0u64, 1u64, 1u64);
                for op in ops {
                    match op {
                        Op::Append { count, term_up } => {
                            if term_up {
                                term += 1;
                            }
                            let batch: Vec<Entry> = (next..next + count).map(|i| blank(term, i)).collect();
                            s.blocking_append(batch).await.unwrap();
                            for i in next..next + count {
                                model.insert(i, term);
                            }
                            next += count;
                        }
                        Op::Truncate { back } => {
                            let from = next.saturating_sub(back).max(purged + 1);
                            if from < next {
                                s.truncate(log_id(term, from)).await.unwrap();
                                model.retain(|i, _| *i < from);
                                next = from;
                            }
                        }
                        Op::Purge { ahead } => {
                            let upto = (purged + ahead).min(next - 1);
                            if upto > purged {
                                let t = model[&upto];
                                s.purge(log_id(t, upto)).await.unwrap();
                                model.retain(|i, _| *i > upto);
                                purged = upto;
                            }
                        }
                    }
                    // Every range, including ones that reach below the tail or past the end.
                    let lo = purged.saturating_sub(2);
                    for a in [lo, purged + 1, next.saturating_sub(3), next.saturating_sub(1)] {
                        for b in [a + 1, a + 5, next, next + 2] {
                            let got: Vec<(u64, u64)> = s
                                .try_get_log_entries(a..b)
                                .await
                                .unwrap()
                                .iter()
                                .map(|e| (e.log_id.index, e.log_id.leader_id.term))
                                .collect();
                            let want: Vec<(u64, u64)> =
                                model.range(a..b.max(a)).map(|(i, t)| (*i, *t)).collect();
                            assert_eq!(got, want, "range {a}..{b}");
                        }
                    }
                }
            });
        }
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

#[cfg(test)]
mod restart_tests {
    use std::sync::Arc;

    use openraft::Vote;
    use openraft::storage::RaftLogStorage;

    use super::LogStore;
    use crate::wal::{Wal, WalOptions};

    /// The vote `saved` through one store, read back by a fresh store on the same WAL directory
    /// (a restart) that starts member 1 as a follower when `as_follower`.
    async fn restart_with(saved: Vote<u64>, as_follower: bool) -> Option<Vote<u64>> {
        let dir = tempfile::tempdir().unwrap();
        {
            let wal = Wal::open(dir.path(), WalOptions::default()).unwrap();
            let mut s = LogStore::new(Arc::new(wal));
            s.save_vote(&saved).await.unwrap();
        }
        let wal = Wal::open(dir.path(), WalOptions::default()).unwrap();
        let mut s = LogStore::new(Arc::new(wal));
        if as_follower {
            s = s.restarting_as_follower(1);
        }
        s.read_vote().await.unwrap()
    }

    #[tokio::test]
    async fn a_restarted_leader_reads_its_vote_back_uncommitted() {
        let led = Vote::new_committed(7, 1);
        let demoted = restart_with(led, true).await.unwrap();
        assert_eq!(
            demoted,
            Vote::new(7, 1),
            "same term and candidate, not committed"
        );
        assert!(!demoted.is_committed());
        // Without the option (openraft's storage suite), the vote reads back as saved.
        assert_eq!(restart_with(led, false).await, Some(led));
    }

    #[tokio::test]
    async fn other_votes_read_back_as_saved() {
        let followed = Vote::new_committed(7, 2);
        assert_eq!(restart_with(followed, true).await, Some(followed));
        let voted = Vote::new(8, 1);
        assert_eq!(restart_with(voted, true).await, Some(voted));
        let voted_for_other = Vote::new(8, 3);
        assert_eq!(
            restart_with(voted_for_other, true).await,
            Some(voted_for_other)
        );
    }
}
