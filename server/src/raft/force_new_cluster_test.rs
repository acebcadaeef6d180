//! `--force-new-cluster` on a real log and state machine: a follower of a lost 3-member
//! cluster becomes a one-member cluster that keeps every entry, elects itself and commits
//! them; a later restart without the flag stays a one-member cluster.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use openraft::{CommittedLeaderId, EntryPayload, Membership, StoredMembership, Vote};

use super::force_new_cluster::force_new_cluster;
use super::log_store::META_VOTE;
use super::types::{Entry, LogId, MemberNode, Raft};
use super::{LogStore, PeerNetwork};
use crate::wal::{Wal, WalOptions};

/// Entries led by member 2 in term 3.
fn log_id(index: u64) -> LogId {
    openraft::LogId::new(CommittedLeaderId::new(3, 2), index)
}

fn node(i: u64) -> MemberNode {
    MemberNode {
        name: format!("n{i}"),
        peer_urls: vec![format!("http://127.0.0.1:{i}")],
    }
}

/// A 3-member config, then five puts; member 1 knows only the first three as committed.
fn write_follower_log(wal_dir: &std::path::Path) {
    let nodes: BTreeMap<u64, MemberNode> = (1..=3).map(|i| (i, node(i))).collect();
    let mut entries = vec![Entry {
        log_id: log_id(0),
        payload: EntryPayload::Membership(Membership::new(vec![BTreeSet::from([1, 2, 3])], nodes)),
    }];
    entries.extend((1..=5).map(|i| super::test_support::put_entry(log_id(i), i)));
    super::test_support::write_wal(wal_dir, &entries, Vote::new_committed(3, 2u64), log_id(3));
}

async fn start(dir: &std::path::Path) -> (Raft, Arc<crate::mvcc::SharedStore>) {
    let wal = Arc::new(Wal::open(&dir.join("wal"), WalOptions::default()).unwrap());
    let (sm, shared) = super::test_support::state_machine(dir);
    let config = Arc::new(openraft::Config::default().validate().unwrap());
    let raft = Raft::new(1, config, PeerNetwork::default(), LogStore::new(wal), sm)
        .await
        .unwrap();
    raft.trigger().elect().await.unwrap();
    raft.wait(Some(Duration::from_secs(10)))
        .current_leader(1, "the lone voter leads")
        .await
        .expect("member 1 becomes leader alone");
    (raft, shared)
}

fn voters_and_nodes(raft: &Raft) -> (Vec<u64>, Vec<u64>) {
    let m = raft.metrics().borrow().membership_config.clone();
    (
        m.membership().voter_ids().collect(),
        m.membership().nodes().map(|(i, _)| *i).collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_of_a_lost_cluster_restarts_alone_with_every_entry() {
    let dir = tempfile::tempdir().unwrap();
    let wal_dir = dir.path().join("wal");
    write_follower_log(&wal_dir);
    {
        let wal = Wal::open(&wal_dir, WalOptions::default()).unwrap();
        let forced = force_new_cluster(&wal, 1, &StoredMembership::default()).unwrap();
        assert_eq!(forced.removed, [2, 3]);
        assert_eq!(forced.last_index, 5);
        let entry = forced.entry.expect("a membership entry is written");
        assert_eq!(entry.index, 6);
        assert_eq!(entry.leader_id, CommittedLeaderId::new(4, 1));
        let vote: Vote<u64> = bincode::deserialize(&wal.meta(META_VOTE).unwrap()).unwrap();
        assert_eq!(vote, Vote::new(4, 1));
    }

    let (raft, shared) = start(dir.path()).await;
    assert_eq!(voters_and_nodes(&raft), (vec![1], vec![1]));
    raft.wait(Some(Duration::from_secs(10)))
        .applied_index_at_least(Some(7), "the new term's blank entry")
        .await
        .expect("everything up to the new term's first entry applied");
    let got = super::test_support::k_revisions(&shared);
    let want = super::test_support::k_applied_in_order(5);
    assert_eq!(
        got, want,
        "uncommitted entries 4 and 5 are kept and committed"
    );
    let committed = raft
        .metrics()
        .borrow()
        .membership_config
        .log_id()
        .map(|l| l.index);
    assert_eq!(committed, Some(6));
    raft.shutdown().await.unwrap();
    // The store handle keeps sled (and its directory lock) open.
    drop((raft, shared));

    // A restart without the flag keeps the one-member cluster, and running it again is a
    // no-op.
    {
        let wal = Wal::open(&wal_dir, WalOptions::default()).unwrap();
        let again = force_new_cluster(&wal, 1, &StoredMembership::default()).unwrap();
        assert_eq!(again.entry, None);
        assert!(again.removed.is_empty());
    }
    let (raft, _shared) = start(dir.path()).await;
    assert_eq!(voters_and_nodes(&raft), (vec![1], vec![1]));
    raft.shutdown().await.unwrap();
}

#[test]
fn a_member_missing_from_its_config_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let wal_dir = dir.path().join("wal");
    write_follower_log(&wal_dir);
    let wal = Wal::open(&wal_dir, WalOptions::default()).unwrap();
    let before = wal.last_index();
    let err = force_new_cluster(&wal, 9, &StoredMembership::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "force-new-cluster: member 9 is not in its own membership config"
    );
    assert_eq!(wal.last_index(), before, "nothing written");
}

#[test]
fn a_new_data_dir_is_left_to_bootstrap() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), WalOptions::default()).unwrap();
    let forced = force_new_cluster(&wal, 1, &StoredMembership::default()).unwrap();
    assert_eq!(forced.entry, None);
    assert_eq!((wal.last_index(), wal.meta(META_VOTE)), (None, None));
}
