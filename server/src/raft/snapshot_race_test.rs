//! Snapshot export vs. compaction vs. install, on one state machine: the races the export
//! lock exists for (see `raft/export.rs`). The scenarios are goldenscripts
//! (`raft/testscripts/`, run by `snapshot_race_test/golden.rs` on this file's [`Member`]); what stays
//! here are the loops and the background-compaction race over a shared log. Every wait is
//! bounded, so a deadlock fails the test instead of hanging it.

use std::sync::Arc;
use std::time::Duration;

use keel_proto::etcdserverpb::{CompactionRequest, PutRequest};
use keel_proto::keelpb::{RaftRequest, raft_request};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{CommittedLeaderId, EntryPayload, RaftSnapshotBuilder};
use tokio::io::AsyncWriteExt;

use super::state_machine::StateMachine;
use super::types::{Entry, LogId, Request, TypeConfig};
use crate::mvcc::SharedStore;

/// Bound on any single step; a step that takes longer is a deadlock.
pub(super) const STEP: Duration = Duration::from_secs(20);

/// The scenarios: goldenscripts in `raft/testscripts/` (docs/testing.md).
mod golden;

/// One member's state machine on a temporary directory, fed entries it numbers itself
/// (also the goldenscript runner's member).
pub(super) struct Member {
    pub dir: tempfile::TempDir,
    pub sm: StateMachine,
    pub shared: Arc<SharedStore>,
    pub next_index: u64,
}

impl Member {
    pub fn new() -> Member {
        let dir = tempfile::tempdir().unwrap();
        let (sm, shared) = super::test_support::state_machine(dir.path());
        Member {
            dir,
            sm,
            shared,
            next_index: 1,
        }
    }

    pub fn entry(&mut self, request: raft_request::Request) -> Entry {
        let index = self.next_index;
        self.next_index += 1;
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Request::new(RaftRequest {
                auth_header: None,
                id: index,
                request: Some(request),
            })),
        }
    }

    pub fn put(&mut self, key: &str, value: &str) -> Entry {
        self.entry(raft_request::Request::Put(PutRequest {
            key: key.into(),
            value: value.into(),
            ..Default::default()
        }))
    }

    pub fn compact(&mut self, revision: i64) -> Entry {
        self.entry(raft_request::Request::Compaction(CompactionRequest {
            revision,
            physical: true,
        }))
    }

    /// Writes `rounds` versions of `keys` keys.
    pub async fn load(&mut self, keys: usize, rounds: usize) {
        let mut entries = Vec::new();
        for r in 0..rounds {
            for k in 0..keys {
                entries.push(self.put(&format!("key-{k:04}"), &format!("v{r}")));
            }
        }
        self.sm.apply(entries).await.unwrap();
    }

    pub fn revision(&self) -> i64 {
        self.shared.get().current_revision()
    }

    pub fn hash(&self, revision: i64) -> u32 {
        self.shared.get().hash_kv(revision).unwrap().hash
    }

    /// Builds a snapshot of the applied state and reads it into memory.
    pub async fn export(&mut self) -> Built {
        let snap = self.sm.get_snapshot_builder().await.build_snapshot().await;
        Built::read(snap.unwrap()).await
    }
}

/// A built snapshot, read into memory (test snapshots are small): installable any number
/// of times, and corruptible.
pub(super) struct Built {
    pub meta: openraft::SnapshotMeta<super::types::NodeId, super::types::MemberNode>,
    pub data: Vec<u8>,
}

impl Built {
    pub async fn read(mut snap: Snapshot<TypeConfig>) -> Built {
        let mut data = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut snap.snapshot, &mut data)
            .await
            .unwrap();
        Built {
            meta: snap.meta,
            data,
        }
    }

    /// Feeds the snapshot to `sm` as if it came from the leader and installs it.
    pub async fn install(
        &self,
        sm: &mut StateMachine,
    ) -> Result<(), openraft::StorageError<super::types::NodeId>> {
        let mut receiving = sm.begin_receiving_snapshot().await?;
        receiving.write_all(&self.data).await.unwrap();
        sm.install_snapshot(&self.meta, receiving).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_compactions_and_installs_interleave_without_deadlock() {
    let mut donor = Member::new();
    donor.load(30, 2).await;
    let mut m = Member::new();
    for round in 0..12 {
        m.load(30, 1).await;
        let rev = m.revision();
        // An export in flight while a compaction and then an install arrive.
        let mut builder = m.sm.get_snapshot_builder().await;
        let export = tokio::spawn(async move { builder.build_snapshot().await });
        let compact = m.compact(rev - 1);
        let applied = tokio::time::timeout(STEP, m.sm.apply(vec![compact])).await;
        assert!(
            applied.is_ok_and(|r| r.is_ok()),
            "round {round}: compaction deadlocked or failed"
        );
        let snap = donor.export().await;
        let installed = tokio::time::timeout(STEP, snap.install(&mut m.sm)).await;
        assert!(
            installed.is_ok_and(|r| r.is_ok()),
            "round {round}: install deadlocked or failed"
        );
        tokio::time::timeout(STEP, export)
            .await
            .unwrap_or_else(|_| panic!("round {round}: export deadlocked"))
            .unwrap()
            .unwrap();
        assert_eq!(
            m.hash(m.revision()),
            donor.hash(donor.revision()),
            "round {round}"
        );
        // Continue from the donor's log position.
        m.next_index = donor.next_index + 1 + round as u64 * 1000;
    }
}

#[test]
fn compactions_inside_batches_are_recognised() {
    use keel_proto::keelpb::RequestBatch;
    let mut m = Member::new();
    let put = m.put("k", "v");
    let compact = m.compact(1);
    let batch = |requests: Vec<RaftRequest>| Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), 99),
        payload: EntryPayload::Normal(Request::new(RaftRequest {
            auth_header: None,
            id: 99,
            request: Some(raft_request::Request::Batch(RequestBatch { requests })),
        })),
    };
    let inner = |e: &Entry| match &e.payload {
        EntryPayload::Normal(r) => r.message().clone(),
        _ => unreachable!("test entries are normal"),
    };
    assert!(super::state_machine::is_compaction(&compact));
    assert!(!super::state_machine::is_compaction(&put));
    assert!(super::state_machine::is_compaction(&batch(vec![
        inner(&put),
        inner(&compact)
    ])));
    assert!(!super::state_machine::is_compaction(&batch(vec![inner(
        &put
    )])));
}

/// The race of the issue: a snapshot is installed while the member's background compaction
/// is still removing records. The install must neither deadlock nor lose records: the
/// removals left over belong to a compaction the (later) snapshot includes too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installing_a_snapshot_while_a_background_compaction_runs() {
    const KEYS: usize = 4000;
    let mut donor = Member::new();
    let mut member = Member::new();
    // The shared log: two versions of every key, then a compaction that supersedes KEYS
    // records (more than the 1000 removed inline, so the rest runs in the background), then
    // more writes only the donor applies before it snapshots.
    let mut history = Vec::new();
    for round in 0..2 {
        for k in 0..KEYS {
            history.push(donor.put(&format!("key-{k:05}"), &format!("v{round}")));
        }
    }
    donor.sm.apply(history.clone()).await.unwrap();
    member.sm.apply(history).await.unwrap();
    member.next_index = donor.next_index;
    let rev = donor.revision();
    let compaction = donor.compact(rev);
    member.next_index = donor.next_index;
    donor.sm.apply(vec![compaction.clone()]).await.unwrap();
    let later: Vec<Entry> = (0..50)
        .map(|i| donor.put(&format!("later-{i}"), "x"))
        .collect();
    donor.sm.apply(later).await.unwrap();
    assert!(donor.shared.get().wait_physical_compaction(rev, STEP));
    let donor_hash = donor.hash(donor.revision());
    let snap = donor.export().await;

    member.sm.apply(vec![compaction]).await.unwrap();
    let running = member.shared.get().physical_compact_revision() < rev;
    tokio::time::timeout(STEP, snap.install(&mut member.sm))
        .await
        .expect("install during a background compaction deadlocked")
        .unwrap();
    assert_eq!(member.revision(), donor.revision());
    assert_eq!(member.hash(member.revision()), donor_hash);
    // Whatever the old compactor still removes afterwards must not change the state.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(member.hash(member.revision()), donor_hash);
    eprintln!("background compaction still running when the install began: {running}");
}
