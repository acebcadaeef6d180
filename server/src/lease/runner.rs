//! The leader's lease loop: expiry and checkpoints, through raft.
//!
//! [`run`] parks on the leadership signal while the member is a follower: no heap, no
//! deadline, no timer. When the signal turns true (this member leads and has applied its
//! term's first entry, so the lessor holds every lease committed before the election), it
//! calls [`Lessor::promote`] to build the schedule and serves as primary:
//!
//! - due leases are taken from the schedule within the revocation budget (a
//!   [`TokenBucket`] at `--lease-revoke-rate` leases/s), grouped into `keelpb.LeaseExpire`
//!   entries of at most `batch` leases (and, while the rate limit bites, of at least a
//!   tenth of a second's budget), and proposed with at most `max_in_flight` entries
//!   outstanding. Every member applies the same deletion. A lease whose entry does not
//!   apply is proposed again after `revoke_retry`.
//! - due checkpoints are proposed as `LeaseCheckpoint` entries of at most
//!   `checkpoint_batch` leases (etcd `maxLeaseCheckpointBatchSize` = 1000).
//!
//! When the signal turns false (step-down, shutdown) the loop returns, in-flight proposal
//! tasks are aborted, and [`Lessor::demote`] drops the schedule.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use keel_proto::etcdserverpb::LeaseCheckpointRequest;
use keel_proto::keelpb::{LeaseExpire, RaftResponse, raft_request};
use openraft::{RaftMetrics, ServerState};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::Lessor;
use super::primary::PrimaryConfig;
use super::rate::TokenBucket;
use crate::error::EtcdError;
use crate::raft::types::{MemberNode, NodeId};

/// Proposes raft requests for the lease loop: the member's node implements it (`node.rs`,
/// `NodeProposer`), tests use a fake. The lease module knows only this trait.
pub trait Proposer: Send + Sync + 'static {
    /// Proposes `req` and resolves once it is applied here.
    fn propose(
        &self,
        req: raft_request::Request,
    ) -> impl Future<Output = Result<RaftResponse, EtcdError>> + Send;
}

/// Settings of the leader's lease loop (a member's come from its flags:
/// `RunnerConfig::from_config` in `config/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerConfig {
    /// Schedule settings (TTL extension, checkpoint interval, revocation retry).
    pub primary: PrimaryConfig,
    /// Leases revoked per second at most (`--lease-revoke-rate`; etcd's fixed rate is 1000).
    pub revoke_rate: u64,
    /// Leases per `LeaseExpire` entry at most.
    pub batch: usize,
    /// Leases per `LeaseCheckpoint` entry at most.
    pub checkpoint_batch: usize,
    /// Lease entries proposed and not yet applied, at most.
    pub max_in_flight: usize,
}

/// Default leases per `LeaseExpire` entry: 1000 IDs are ~10 KB, far below
/// `--max-request-bytes`, and one entry's apply stays short.
pub const DEFAULT_EXPIRE_BATCH: usize = 1000;
/// etcd's `maxLeaseCheckpointBatchSize`.
pub const DEFAULT_CHECKPOINT_BATCH: usize = 1000;
/// Lease entries in flight: enough to keep raft's pipeline busy during a storm.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 4;

/// True when `m` says this member leads and has applied an entry of its own term (the
/// blank entry openraft commits on election), i.e. all earlier entries are applied.
pub fn is_ready_leader(m: &RaftMetrics<NodeId, MemberNode>, me: NodeId) -> bool {
    m.state == ServerState::Leader
        && m.current_leader == Some(me)
        && m.last_applied
            .is_some_and(|l| l.leader_id.term == m.current_term)
}

/// Derives the leadership signal of [`run`] from raft metrics. The signal closes (after a
/// final `false`) when raft shuts down.
pub fn leadership(
    mut metrics: watch::Receiver<RaftMetrics<NodeId, MemberNode>>,
    me: NodeId,
) -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        loop {
            let ready = is_ready_leader(&metrics.borrow_and_update(), me);
            tx.send_if_modified(|v| std::mem::replace(v, ready) != ready);
            tokio::select! {
                r = metrics.changed() => if r.is_err() { break },
                _ = tx.closed() => return,
            }
        }
        let _ = tx.send(false);
    });
    rx
}

/// Runs the lease loop until the leadership signal closes. See the module docs.
pub async fn run<P: Proposer>(
    lessor: Arc<Lessor>,
    proposer: Arc<P>,
    mut leader: watch::Receiver<bool>,
    config: RunnerConfig,
) {
    loop {
        // Follower: no schedule, and wait without any timer.
        assert!(
            !lessor.is_primary(),
            "a follower holds no lease expiry schedule"
        );
        if leader.wait_for(|l| *l).await.is_err() {
            return;
        }
        lessor.promote(config.primary.clone());
        tracing::info!(
            leases = lessor.len(),
            "lease: became primary, expiry schedule built"
        );
        let closed = serve_as_primary(&lessor, &proposer, &mut leader, &config).await;
        lessor.demote();
        tracing::info!("lease: stepped down, expiry schedule dropped");
        if closed {
            return;
        }
    }
}

/// Serves until leadership is lost; returns true if the signal closed.
async fn serve_as_primary<P: Proposer>(
    lessor: &Arc<Lessor>,
    proposer: &Arc<P>,
    leader: &mut watch::Receiver<bool>,
    config: &RunnerConfig,
) -> bool {
    let batch = config.batch.max(1);
    // When the rate limit bites, wait for at least a tenth of a second's budget so that a
    // storm is revoked in ~10 well-filled entries per second, not one entry per token.
    let min_batch = batch.min((config.revoke_rate / 10).max(1) as usize);
    let max_in_flight = config.max_in_flight.max(1);
    let mut bucket = TokenBucket::new(config.revoke_rate, batch as u64, Instant::now());
    let mut in_flight: JoinSet<()> = JoinSet::new();
    loop {
        // Revocations, within the rate and the in-flight bound.
        while in_flight.len() < max_in_flight {
            let budget = bucket.available(Instant::now()).min(batch);
            if budget < min_batch {
                break;
            }
            let ids = lessor.take_expired(budget);
            if ids.is_empty() {
                break;
            }
            bucket.consume(ids.len());
            let p = proposer.clone();
            in_flight.spawn(async move {
                let n = ids.len();
                if let Err(e) = p
                    .propose(raft_request::Request::LeaseExpire(LeaseExpire { ids }))
                    .await
                {
                    tracing::warn!(
                        leases = n,
                        "lease: expiry entry not applied, will retry: {e}"
                    );
                }
            });
        }
        // Checkpoints.
        while in_flight.len() < max_in_flight {
            let checkpoints = lessor.take_checkpoints(config.checkpoint_batch.max(1));
            if checkpoints.is_empty() {
                break;
            }
            let p = proposer.clone();
            in_flight.spawn(async move {
                let req =
                    raft_request::Request::LeaseCheckpoint(LeaseCheckpointRequest { checkpoints });
                if let Err(e) = p.propose(req).await {
                    tracing::debug!("lease: checkpoint entry not applied: {e}");
                }
            });
        }

        let now = Instant::now();
        let (next_due, next_expiry) = lessor.next_due();
        let full = in_flight.len() >= max_in_flight;
        let wake_at = if next_expiry.is_some_and(|d| d <= now) {
            // Leases are due: wait for budget (or for a slot, via join_next below).
            (!full).then(|| {
                now + bucket
                    .wait_for(min_batch, now)
                    .max(Duration::from_millis(1))
            })
        } else if full {
            None
        } else {
            next_due
        };
        let sleep = async {
            match wake_at {
                Some(t) => tokio::time::sleep_until(t.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = leader.changed() => match changed {
                Err(_) => return true,
                Ok(()) if !*leader.borrow_and_update() => return false,
                Ok(()) => {}
            },
            _ = sleep => {}
            Some(_) = in_flight.join_next(), if !in_flight.is_empty() => {}
            _ = lessor.woken() => {}
        }
    }
}
