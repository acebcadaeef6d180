//! Tests of the lessor with the real applier and MVCC store: apply of lease entries, key
//! attachment, persistence across a reopen, the follower's lack of any schedule, and the
//! leader loop (expiry through raft entries, rate limit, checkpoints, step-down).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use keel_proto::etcdserverpb::{
    Compare, DeleteRangeRequest, LeaseCheckpoint, LeaseCheckpointRequest, LeaseGrantRequest,
    LeaseRevokeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest, compare, request_op,
};
use keel_proto::keelpb::{
    LeaseExpire, RaftRequest, RaftResponse, raft_request::Request as Rq,
    raft_response::Response as Rs,
};
use keel_proto::mvccpb::event::EventType;
use openraft::{CommittedLeaderId, EntryPayload};
use tokio::sync::watch;

use super::runner::{self, Proposer, RunnerConfig};
use super::{ApplyOutcome, LeaseId, Lessor, PrimaryConfig, Remaining, Renewal};
use crate::apply::Applier;
use crate::error::EtcdError;
use crate::membership::Attributes;
use crate::mvcc::MvccStore;
use crate::raft::types::{Entry, Request};

/// One member's apply path on a temporary sled tree.
struct Member {
    _db: sled::Db,
    tree: sled::Tree,
    applier: Applier,
    index: u64,
}

impl Member {
    fn new() -> Member {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let tree = db.open_tree("keel").unwrap();
        let applier = Self::open(&tree);
        Member {
            _db: db,
            tree,
            applier,
            index: 0,
        }
    }

    fn open(tree: &sled::Tree) -> Applier {
        let store = Arc::new(MvccStore::open(tree.clone()).unwrap());
        Applier::open(tree.clone(), store, Arc::new(Attributes::default())).unwrap()
    }

    /// Simulates a restart: a fresh applier and lessor over the same tree.
    fn reopen(&mut self) {
        self.applier = Self::open(&self.tree);
    }

    fn lessor(&self) -> Arc<Lessor> {
        self.applier.lessor().clone()
    }

    fn apply(&mut self, req: Rq) -> RaftResponse {
        self.index += 1;
        let entry = Entry {
            log_id: openraft::LogId::new(CommittedLeaderId::new(1, 1), self.index),
            payload: EntryPayload::Normal(Request(RaftRequest {
                id: self.index,
                request: Some(req),
            })),
        };
        self.applier.apply(&entry).unwrap().0
    }

    fn apply_ok(&mut self, req: Rq) -> RaftResponse {
        let resp = self.apply(req);
        assert!(
            !matches!(resp.response, Some(Rs::Error(_))),
            "unexpected error {resp:?}"
        );
        resp
    }

    fn grant(&mut self, id: LeaseId, ttl: i64) -> RaftResponse {
        self.apply(Rq::LeaseGrant(LeaseGrantRequest { id, ttl }))
    }

    fn put(&mut self, key: &str, lease: LeaseId) -> RaftResponse {
        self.apply(Rq::Put(PutRequest {
            key: key.into(),
            value: b"v".to_vec(),
            lease,
            ..Default::default()
        }))
    }

    /// `(key, lease)` of every live key.
    fn keys(&self) -> Vec<(String, LeaseId)> {
        let all = RangeRequest {
            key: vec![0],
            range_end: vec![0],
            ..Default::default()
        };
        let resp = self.applier.store().range(&all).unwrap();
        resp.kvs
            .iter()
            .map(|kv| (String::from_utf8(kv.key.clone()).unwrap(), kv.lease))
            .collect()
    }

    fn revision(&self) -> i64 {
        self.applier.store().current_revision()
    }
}

fn error_of(resp: &RaftResponse) -> Option<EtcdError> {
    match &resp.response {
        Some(Rs::Error(e)) => Some(EtcdError::from_parts(e.code, &e.message)),
        _ => None,
    }
}

fn put_op(key: &str, lease: LeaseId) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestPut(PutRequest {
            key: key.into(),
            value: b"t".to_vec(),
            lease,
            ..Default::default()
        })),
    }
}

#[test]
fn revoke_deletes_all_keys_in_one_revision_with_one_event_each() {
    let mut m = Member::new();
    m.grant(7, 60);
    m.put("b", 7);
    m.put("a", 7);
    m.put("c", 0);
    let before = m.revision();
    // Drive the revocation through a write view to see its events.
    let lessor = m.lessor();
    let store = m.applier.store().clone();
    let mut w = store.write();
    let outcome = lessor.apply_revoke(&mut w, &[7], true).unwrap();
    let committed = w.commit().unwrap();
    lessor.publish(Some(outcome.clone()), &committed.events);
    assert_eq!(outcome, ApplyOutcome::Revoked(vec![7]));
    assert_eq!(
        committed.revision,
        before + 1,
        "one revision for the whole revocation"
    );
    let deleted: Vec<_> = committed
        .events
        .iter()
        .map(|e| {
            (
                e.r#type,
                String::from_utf8(e.kv.as_ref().unwrap().key.clone()).unwrap(),
            )
        })
        .collect();
    let del = EventType::Delete as i32;
    assert_eq!(
        deleted,
        vec![(del, "a".to_string()), (del, "b".to_string())],
        "one DELETE per key, in key order"
    );
    assert_eq!(m.keys(), vec![("c".to_string(), 0)]);
    assert!(!lessor.contains(7));
    assert_eq!(lessor.owner(b"a"), None);
}

#[test]
fn revoke_through_apply_and_unknown_revoke_errors() {
    let mut m = Member::new();
    m.grant(1, 60);
    m.put("k", 1);
    let rev = m.revision();
    let resp = m.apply_ok(Rq::LeaseRevoke(LeaseRevokeRequest { id: 1 }));
    assert_eq!(resp.revision, rev + 1);
    assert!(m.keys().is_empty());
    let again = m.apply(Rq::LeaseRevoke(LeaseRevokeRequest { id: 1 }));
    assert_eq!(error_of(&again), Some(EtcdError::LeaseNotFound));
    assert_eq!(again.revision, rev + 1, "a failed revoke writes nothing");
    // A lease without keys is revoked without a new revision (etcd: no keys, no txn).
    m.grant(2, 60);
    let resp = m.apply_ok(Rq::LeaseRevoke(LeaseRevokeRequest { id: 2 }));
    assert_eq!(resp.revision, rev + 1);
}

#[test]
fn grant_errors_match_etcd_and_change_nothing() {
    let mut m = Member::new();
    let ok = m.grant(5, 30);
    match ok.response {
        Some(Rs::LeaseGrant(g)) => assert_eq!((g.id, g.ttl), (5, 30)),
        other => panic!("grant answered {other:?}"),
    }
    assert_eq!(error_of(&m.grant(5, 10)), Some(EtcdError::LeaseExist));
    assert_eq!(
        error_of(&m.grant(6, super::MAX_LEASE_TTL + 1)),
        Some(EtcdError::LeaseTtlTooLarge)
    );
    assert_eq!(error_of(&m.grant(0, 10)), Some(EtcdError::LeaseNotFound));
    assert!(m.grant(i64::MAX, super::MAX_LEASE_TTL).response.is_some());
    let l = m.lessor();
    assert_eq!(l.ids(), vec![5, i64::MAX]);
    assert_eq!(
        l.info(5, false).unwrap().ttl,
        30,
        "the duplicate grant kept the first TTL"
    );
    assert_eq!(m.revision(), 1, "grants never create a revision");
}

#[test]
fn put_and_txn_with_an_unknown_lease_fail_whole() {
    let mut m = Member::new();
    m.grant(1, 60);
    assert_eq!(error_of(&m.put("x", 99)), Some(EtcdError::LeaseNotFound));
    let txn = TxnRequest {
        success: vec![put_op("good", 1), put_op("bad", 99)],
        ..Default::default()
    };
    assert_eq!(
        error_of(&m.apply(Rq::Txn(txn))),
        Some(EtcdError::LeaseNotFound)
    );
    assert!(m.keys().is_empty(), "nothing of the failed txn was written");
    assert_eq!(m.revision(), 1);
    // Only the branch that runs is checked (etcd checkPut on the taken path).
    let failing_compare = Compare {
        result: compare::CompareResult::Equal as i32,
        target: compare::CompareTarget::Version as i32,
        key: b"good".to_vec(),
        target_union: Some(compare::TargetUnion::Version(5)),
        ..Default::default()
    };
    let txn = TxnRequest {
        compare: vec![failing_compare],
        success: vec![put_op("bad", 99)],
        failure: vec![put_op("good", 1)],
    };
    m.apply_ok(Rq::Txn(txn));
    assert_eq!(m.keys(), vec![("good".to_string(), 1)]);
    assert_eq!(
        m.lessor().info(1, true).unwrap().keys,
        vec![b"good".to_vec()]
    );
}

#[test]
fn attachments_follow_overwrites_and_deletes() {
    let mut m = Member::new();
    m.grant(1, 60);
    m.grant(2, 60);
    m.put("k", 1);
    m.put("k", 2);
    let l = m.lessor();
    assert_eq!(l.owner(b"k"), Some(2));
    assert!(
        l.info(1, true).unwrap().keys.is_empty(),
        "overwrite moved the key to lease 2"
    );
    m.apply_ok(Rq::Put(PutRequest {
        key: b"k".to_vec(),
        value: b"w".to_vec(),
        ignore_lease: true,
        ..Default::default()
    }));
    assert_eq!(l.owner(b"k"), Some(2), "ignore_lease keeps the attachment");
    m.put("k", 0);
    assert_eq!(l.owner(b"k"), None, "a put without lease detaches");
    m.put("j", 1);
    m.apply_ok(Rq::DeleteRange(DeleteRangeRequest {
        key: b"j".to_vec(),
        ..Default::default()
    }));
    assert_eq!(l.owner(b"j"), None);
    // Revoking lease 1 must not touch the key it no longer owns.
    m.put("k", 2);
    m.apply_ok(Rq::LeaseRevoke(LeaseRevokeRequest { id: 1 }));
    assert_eq!(m.keys(), vec![("k".to_string(), 2)]);
}

#[test]
fn lease_state_survives_a_reopen() {
    let mut m = Member::new();
    m.grant(1, 60);
    m.grant(-3, 9);
    m.put("a", 1);
    m.put("b", 1);
    m.put("c", -3);
    m.apply_ok(Rq::LeaseCheckpoint(LeaseCheckpointRequest {
        checkpoints: vec![
            LeaseCheckpoint {
                id: 1,
                remaining_ttl: 42,
            },
            LeaseCheckpoint {
                id: 77,
                remaining_ttl: 5,
            },
        ],
    }));
    m.reopen();
    let l = m.lessor();
    assert_eq!(l.ids(), vec![-3, 1]);
    assert_eq!(
        l.info(1, true).unwrap().keys,
        vec![b"a".to_vec(), b"b".to_vec()]
    );
    assert_eq!(l.info(-3, true).unwrap().keys, vec![b"c".to_vec()]);
    // The checkpointed remaining TTL came back: a leader promoted now schedules 42 s (+ extend).
    l.promote(PrimaryConfig {
        extend: Duration::ZERO,
        checkpoint_interval: Some(Duration::from_secs(300)),
        revoke_retry: Duration::from_secs(5),
    });
    assert!(matches!(l.remaining(1), Remaining::Secs(41..=42)));
    assert!(matches!(l.remaining(-3), Remaining::Secs(8..=9)));
    // Revocation after a reopen still finds the keys.
    m.apply_ok(Rq::LeaseRevoke(LeaseRevokeRequest { id: 1 }));
    assert_eq!(m.keys(), vec![("c".to_string(), -3)]);
}

#[test]
fn expire_batches_skip_unknown_and_duplicate_ids() {
    let mut m = Member::new();
    for id in 1..=3 {
        m.grant(id, 60);
        m.put(&format!("k{id}"), id);
    }
    let rev = m.revision();
    let resp = m.apply_ok(Rq::LeaseExpire(LeaseExpire {
        ids: vec![1, 9, 3, 1],
    }));
    match resp.response {
        Some(Rs::LeaseExpire(r)) => assert_eq!(r.revoked, 2),
        other => panic!("expire answered {other:?}"),
    }
    assert_eq!(resp.revision, rev + 1, "one revision for the batch");
    assert_eq!(m.keys(), vec![("k2".to_string(), 2)]);
    assert_eq!(m.lessor().ids(), vec![2]);
}

/// A follower applies a long grant/expire churn without ever holding a schedule, and its
/// lease maps end as small as they started.
#[test]
fn follower_holds_no_schedule_or_memory_under_churn() {
    let mut m = Member::new();
    let l = m.lessor();
    let cycles = 20_000;
    let started = Instant::now();
    for i in 0..cycles {
        let id = i + 1;
        m.grant(id, 5);
        m.put("session", id);
        if i % 100 == 99 {
            // The leader expires in batches; one entry revokes 100 leases.
            m.apply_ok(Rq::LeaseExpire(LeaseExpire {
                ids: (id - 99..=id).collect(),
            }));
            let s = l.stats();
            assert_eq!(
                s.primary_expiry, None,
                "a follower never holds an expiry heap"
            );
            assert_eq!(s.primary_heap_bytes, None);
            assert_eq!(s.leases, 0);
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "churn took too long"
        );
    }
    assert!(!l.is_primary());
    assert!(l.is_empty());
    assert_eq!(l.stats().attached_keys, 0);
    assert_eq!(
        l.renew(1),
        Renewal::NotPrimary,
        "a follower cannot renew: it forwards"
    );
    assert_eq!(l.remaining(1), Remaining::NotPrimary);
}

#[test]
fn leader_renews_reports_remaining_and_demotion_drops_the_schedule() {
    let mut m = Member::new();
    m.grant(1, 30);
    let l = m.lessor();
    assert_eq!(l.renew(1), Renewal::NotPrimary);
    l.promote(PrimaryConfig {
        extend: Duration::from_secs(1),
        checkpoint_interval: None,
        revoke_retry: Duration::from_secs(5),
    });
    assert!(
        matches!(l.remaining(1), Remaining::Secs(30..=31)),
        "TTL + election extension"
    );
    assert_eq!(
        l.renew(1),
        Renewal::Renewed {
            ttl: 30,
            clear_checkpoint: false
        }
    );
    assert!(matches!(l.remaining(1), Remaining::Secs(29..=30)));
    assert_eq!(l.renew(2), Renewal::NotFound);
    // A grant applied while leader is scheduled right away.
    m.grant(2, 10);
    assert!(matches!(l.remaining(2), Remaining::Secs(9..=10)));
    assert_eq!(l.stats().primary_expiry, Some(2));
    l.demote();
    assert_eq!(l.stats().primary_expiry, None);
    assert_eq!(l.renew(1), Renewal::NotPrimary);
}

#[test]
fn keepalive_after_a_checkpoint_must_clear_it() {
    let mut m = Member::new();
    m.grant(1, 600);
    m.apply_ok(Rq::LeaseCheckpoint(LeaseCheckpointRequest {
        checkpoints: vec![LeaseCheckpoint {
            id: 1,
            remaining_ttl: 100,
        }],
    }));
    let l = m.lessor();
    l.promote(PrimaryConfig {
        extend: Duration::ZERO,
        checkpoint_interval: Some(Duration::from_secs(60)),
        revoke_retry: Duration::from_secs(5),
    });
    assert!(matches!(l.remaining(1), Remaining::Secs(99..=100)));
    assert_eq!(
        l.renew(1),
        Renewal::Renewed {
            ttl: 600,
            clear_checkpoint: true
        }
    );
    m.apply_ok(Rq::LeaseCheckpoint(LeaseCheckpointRequest {
        checkpoints: vec![LeaseCheckpoint {
            id: 1,
            remaining_ttl: 0,
        }],
    }));
    assert_eq!(
        l.renew(1),
        Renewal::Renewed {
            ttl: 600,
            clear_checkpoint: false
        }
    );
}

// ------------------------------------------------------------------ the leader loop

/// Proposes by applying directly to one member (a single-member "raft").
struct ApplyingProposer {
    member: Mutex<Member>,
    proposals: AtomicUsize,
}

impl ApplyingProposer {
    fn new(member: Member) -> Arc<ApplyingProposer> {
        Arc::new(ApplyingProposer {
            member: Mutex::new(member),
            proposals: AtomicUsize::new(0),
        })
    }

    fn with<T>(&self, f: impl FnOnce(&mut Member) -> T) -> T {
        f(&mut self.member.lock().unwrap())
    }
}

impl Proposer for ApplyingProposer {
    async fn propose(&self, req: Rq) -> Result<RaftResponse, EtcdError> {
        self.proposals.fetch_add(1, Ordering::Relaxed);
        let resp = self.with(|m| m.apply(req));
        match error_of(&resp) {
            Some(e) => Err(e),
            None => Ok(resp),
        }
    }
}

fn runner_config(rate: u64, batch: usize, checkpoint: Option<Duration>) -> RunnerConfig {
    RunnerConfig {
        primary: PrimaryConfig {
            extend: Duration::ZERO,
            checkpoint_interval: checkpoint,
            revoke_retry: Duration::from_secs(5),
        },
        revoke_rate: rate,
        batch,
        checkpoint_batch: 1000,
        max_in_flight: 2,
    }
}

/// Waits up to `limit` for `cond`.
async fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cond()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runner_expires_leases_through_entries_only_while_leader() {
    let p = ApplyingProposer::new(Member::new());
    let lessor = p.with(|m| {
        for id in 1..=50 {
            m.grant(id, 1);
            m.put(&format!("k{id}"), id);
        }
        m.lessor()
    });
    let (leader, signal) = watch::channel(false);
    let task = tokio::spawn(runner::run(
        lessor.clone(),
        p.clone(),
        signal,
        runner_config(100_000, 1000, None),
    ));
    // A follower: no schedule, no proposals, however long it waits.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(lessor.stats().primary_expiry, None);
    assert_eq!(
        p.proposals.load(Ordering::Relaxed),
        0,
        "a follower proposes no expiry"
    );
    assert_eq!(lessor.len(), 50);

    let promoted = Instant::now();
    leader.send(true).unwrap();
    assert!(
        eventually(Duration::from_secs(10), || lessor.is_empty()).await,
        "leases were not expired"
    );
    let took = promoted.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "expired before the TTL: {took:?}"
    );
    assert!(
        p.with(|m| m.keys().is_empty()),
        "keys of expired leases are deleted"
    );
    assert!(
        p.proposals.load(Ordering::Relaxed) <= 2,
        "50 leases fit one or two batched entries"
    );

    leader.send(false).unwrap();
    assert!(
        eventually(Duration::from_secs(5), || !lessor.is_primary()).await,
        "step-down keeps the schedule"
    );
    drop(leader);
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("runner ends when the signal closes")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runner_rate_limits_a_storm() {
    let p = ApplyingProposer::new(Member::new());
    let lessor = p.with(|m| {
        for id in 1..=1000 {
            m.grant(id, 1);
        }
        m.lessor()
    });
    let (leader, signal) = watch::channel(true);
    let task = tokio::spawn(runner::run(
        lessor.clone(),
        p.clone(),
        signal,
        runner_config(500, 100, None),
    ));
    let start = Instant::now();
    assert!(eventually(Duration::from_secs(20), || lessor.is_empty()).await);
    let took = start.elapsed();
    // 1 s TTL, then 1000 leases at 500/s after a burst of one batch (100): >= 2.8 s.
    assert!(
        took >= Duration::from_millis(2600),
        "the revoke rate was not applied: {took:?}"
    );
    assert!(took < Duration::from_secs(10), "too slow: {took:?}");
    let entries = p.proposals.load(Ordering::Relaxed);
    assert!(
        (5..=40).contains(&entries),
        "{entries} expiry entries for 1000 leases in batches of <= 100"
    );
    drop(leader);
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runner_checkpoints_remaining_ttl() {
    let p = ApplyingProposer::new(Member::new());
    let lessor = p.with(|m| {
        m.grant(1, 30);
        m.grant(2, 1);
        m.lessor()
    });
    let (leader, signal) = watch::channel(true);
    let task = tokio::spawn(runner::run(
        lessor.clone(),
        p.clone(),
        signal,
        runner_config(100_000, 1000, Some(Duration::from_millis(500))),
    ));
    // Lease 1 is checkpointed every 0.5 s with a remaining TTL of ~29-30 s; a promoted
    // member would schedule that instead of the full TTL.
    let reopened_remaining = || {
        let tree = p.with(|m| m.tree.clone());
        super::record::load_all(&tree)
            .unwrap()
            .iter()
            .find(|r| r.id == 1)
            .map(|r| r.remaining_ttl)
    };
    assert!(
        eventually(Duration::from_secs(5), || reopened_remaining()
            .is_some_and(|r| (28..30).contains(&r)))
        .await
    );
    assert!(
        !lessor.contains(2) || eventually(Duration::from_secs(5), || !lessor.contains(2)).await
    );
    drop(leader);
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap();
}
