//! Tests of the lessor with the real applier and MVCC store that are not scenarios: the
//! follower's lack of any schedule under a long churn, and the leader loop in real time
//! (expiry through raft entries, rate limit, checkpoints, step-down). The scenarios (apply
//! of lease entries, key attachment, reopen, renew and remaining TTL) are goldenscripts:
//! `lease/testscripts/`, run by `tests/golden.rs` on this file's [`Member`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use keel_proto::etcdserverpb::{LeaseGrantRequest, PutRequest, RangeRequest};
use keel_proto::keelpb::{
    LeaseExpire, RaftRequest, RaftResponse, raft_request::Request as Rq,
    raft_response::Response as Rs,
};
use openraft::{CommittedLeaderId, EntryPayload};
use tokio::sync::watch;

use super::runner::{self, Proposer, RunnerConfig};
use super::{LeaseId, Lessor, PrimaryConfig, Remaining, Renewal};
use crate::apply::Applier;
use crate::error::EtcdError;
use crate::membership::Attributes;
use crate::mvcc::MvccStore;
use crate::raft::types::{Entry, Request};

/// The scenarios: goldenscripts in `lease/testscripts/` (docs/testing.md).
mod golden;

/// One member's apply path on a temporary sled tree (also the goldenscript runner's).
pub(super) struct Member {
    _db: sled::Db,
    tree: sled::Tree,
    pub applier: Applier,
    index: u64,
}

impl Member {
    pub fn new() -> Member {
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
    pub fn reopen(&mut self) {
        self.applier = Self::open(&self.tree);
    }

    pub fn lessor(&self) -> Arc<Lessor> {
        self.applier.lessor().clone()
    }

    pub fn apply(&mut self, req: Rq) -> RaftResponse {
        self.index += 1;
        let entry = Entry {
            log_id: openraft::LogId::new(CommittedLeaderId::new(1, 1), self.index),
            payload: EntryPayload::Normal(Request::new(RaftRequest {
                auth_header: None,
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
    pub fn keys(&self) -> Vec<(String, LeaseId)> {
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
}

fn error_of(resp: &RaftResponse) -> Option<EtcdError> {
    match &resp.response {
        Some(Rs::Error(e)) => Some(EtcdError::from_parts(e.code, &e.message)),
        _ => None,
    }
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
    // A storm of 20,000 live leases, then all expire: the maps give their memory back.
    for id in 1..=20_000 {
        m.grant(id, 5);
    }
    let full = l.stats().slots;
    assert!(full >= 20_000, "{full} slots for 20,000 leases");
    m.apply_ok(Rq::LeaseExpire(LeaseExpire {
        ids: (1..=20_000).collect(),
    }));
    let after = l.stats();
    assert_eq!((after.leases, after.primary_expiry), (0, None));
    assert!(
        after.slots < 4096,
        "lease maps kept {} of {full} slots",
        after.slots
    );
    assert_eq!(
        l.renew(1),
        Renewal::NotPrimary,
        "a follower cannot renew: it forwards"
    );
    assert_eq!(l.remaining(1), Remaining::NotPrimary);
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

    /// A proposer over a fresh member set up by `setup`, and the member's lessor.
    fn setup(setup: impl FnOnce(&mut Member)) -> (Arc<ApplyingProposer>, Arc<Lessor>) {
        let mut member = Member::new();
        setup(&mut member);
        let lessor = member.lessor();
        (ApplyingProposer::new(member), lessor)
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

/// The leader loop over `p`'s member, with the leadership signal in the test's hands.
struct LeaderLoop {
    leader: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl LeaderLoop {
    fn start(
        p: &Arc<ApplyingProposer>,
        lessor: &Arc<Lessor>,
        leader: bool,
        config: RunnerConfig,
    ) -> LeaderLoop {
        let (tx, signal) = watch::channel(leader);
        let task = tokio::spawn(runner::run(lessor.clone(), p.clone(), signal, config));
        LeaderLoop { leader: tx, task }
    }

    /// Closes the signal: the loop must end.
    async fn stop(self) {
        drop(self.leader);
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("runner ends when the signal closes")
            .unwrap();
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
    let (p, lessor) = ApplyingProposer::setup(|m| {
        for id in 1..=50 {
            m.grant(id, 1);
            m.put(&format!("k{id}"), id);
        }
    });
    let run = LeaderLoop::start(&p, &lessor, false, runner_config(100_000, 1000, None));
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
    run.leader.send(true).unwrap();
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

    run.leader.send(false).unwrap();
    assert!(
        eventually(Duration::from_secs(5), || !lessor.is_primary()).await,
        "step-down keeps the schedule"
    );
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runner_rate_limits_a_storm() {
    let (p, lessor) = ApplyingProposer::setup(|m| {
        for id in 1..=1000 {
            m.grant(id, 1);
        }
    });
    let run = LeaderLoop::start(&p, &lessor, true, runner_config(500, 100, None));
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
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runner_checkpoints_remaining_ttl() {
    let (p, lessor) = ApplyingProposer::setup(|m| {
        m.grant(1, 30);
        m.grant(2, 1);
    });
    let run = LeaderLoop::start(
        &p,
        &lessor,
        true,
        runner_config(100_000, 1000, Some(Duration::from_millis(500))),
    );
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
    run.stop().await;
}
