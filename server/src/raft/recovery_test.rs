//! A crash between WAL append and apply: entries that are durable and committed in the WAL
//! but never reached the store are applied when the member restarts, exactly once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use openraft::{CommittedLeaderId, EntryPayload, Membership, Vote};

use super::types::{Entry, LogId, MemberNode, Raft};
use super::{LogStore, PeerNetwork};
use crate::wal::{Wal, WalOptions};

fn log_id(index: u64) -> LogId {
    openraft::LogId::new(CommittedLeaderId::new(1, 1), index)
}

fn entries() -> Vec<Entry> {
    let mut nodes = BTreeMap::new();
    nodes.insert(
        1u64,
        MemberNode {
            name: "n1".into(),
            peer_urls: vec!["http://127.0.0.1:1".into()],
        },
    );
    let mut out = vec![Entry {
        log_id: log_id(0),
        payload: EntryPayload::Membership(Membership::new(vec![BTreeSet::from([1u64])], nodes)),
    }];
    out.extend((1..=5).map(|i| super::test_support::put_entry(log_id(i), i)));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_entries_missing_from_the_store_are_applied_on_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (wal_dir, snap_dir) = (dir.path().join("wal"), dir.path().join("snap"));
    std::fs::create_dir_all(&wal_dir).unwrap();
    std::fs::create_dir_all(&snap_dir).unwrap();
    // The state at the crash: log durable and committed up to 5, store empty.
    super::test_support::write_wal(
        &wal_dir,
        &entries(),
        Vote::new_committed(1, 1u64),
        log_id(5),
    );

    let wal = Arc::new(Wal::open(&wal_dir, WalOptions::default()).unwrap());
    let (sm, shared) = super::test_support::state_machine(dir.path());
    let config = Arc::new(openraft::Config::default().validate().unwrap());
    let raft = Raft::new(1, config, PeerNetwork::default(), LogStore::new(wal), sm)
        .await
        .unwrap();

    raft.wait(Some(Duration::from_secs(10)))
        .applied_index_at_least(Some(5), "re-apply committed entries")
        .await
        .expect("committed entries re-applied after restart");
    let got = super::test_support::k_revisions(&shared);
    let want = super::test_support::k_applied_in_order(5);
    assert_eq!(
        got, want,
        "each committed put applied exactly once, in log order"
    );
    assert_eq!(shared.get().current_revision(), 6);
    raft.shutdown().await.unwrap();
}

/// The leader applies an entry once a quorum holds it durably, which with its append
/// submitted without waiting (docs/raft.md) can be before its own fsync. A leader that
/// crashes then may restart with its store ahead of its WAL: applied 5, log durable to 3.
/// openraft's start purges the log up to the applied index (nothing below it is needed
/// again), and the member goes on from there without applying anything twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_ahead_of_the_wal_starts_from_the_applied_index() {
    use openraft::storage::RaftStateMachine;

    let dir = tempfile::tempdir().unwrap();
    let wal_dir = dir.path().join("wal");
    std::fs::create_dir_all(&wal_dir).unwrap();
    {
        // The state at the crash: entries 0..=5 applied, only 0..=3 in the WAL.
        let (mut sm, _) = super::test_support::state_machine(dir.path());
        sm.apply(entries()).await.unwrap();
        super::test_support::write_wal(
            &wal_dir,
            &entries()[..4],
            Vote::new_committed(1, 1u64),
            log_id(3),
        );
    }

    let wal = Arc::new(Wal::open(&wal_dir, WalOptions::default()).unwrap());
    let (sm, shared) = super::test_support::state_machine(dir.path());
    let config = Arc::new(openraft::Config::default().validate().unwrap());
    let raft = Raft::new(
        1,
        config,
        PeerNetwork::default(),
        LogStore::new(wal.clone()),
        sm,
    )
    .await
    .unwrap();
    assert_eq!(
        wal.purged_index(),
        Some(5),
        "log purged up to the applied index"
    );
    assert_eq!(
        super::test_support::k_revisions(&shared),
        super::test_support::k_applied_in_order(5),
        "nothing applied twice"
    );

    // The lone voter elects itself and appends after the purge point.
    raft.wait(Some(Duration::from_secs(10)))
        .current_leader(1, "elected")
        .await
        .expect("the member leads again");
    let next = super::test_support::put_entry(log_id(0), 6).payload;
    let openraft::EntryPayload::Normal(request) = next else {
        unreachable!()
    };
    raft.client_write(request).await.expect("a new write");
    assert_eq!(
        super::test_support::k_revisions(&shared),
        super::test_support::k_applied_in_order(6)
    );
    raft.shutdown().await.unwrap();
}
