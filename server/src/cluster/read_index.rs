//! The linearizable read path (Raft thesis §6.4, ReadIndex), on every member.
//!
//! 1. The member obtains a read index: on the leader, openraft's `get_read_log_id` (the leader
//!    confirms its leadership with a heartbeat round to a quorum and returns its commit
//!    point); on a follower, the leader's read index over `keelpb.Peer/ReadIndex`.
//! 2. It waits until its state machine applied the read index, then reads locally.
//!
//! Concurrent reads share rounds ([`Batcher`]): all reads waiting on a member share one
//! ReadIndex RPC, and on the leader all local reads and all follower RPCs share one heartbeat
//! round. While a leadership transfer runs, the leader starts no round (a heartbeat would
//! renew the followers' leader lease and defeat the transfer).

use std::sync::Arc;
use std::time::Duration;

use keel_proto::keelpb::{ReadIndexRequest, peer_answer, peer_call};
use openraft::error::{CheckIsLeaderError, RaftError};
use tokio::time::Instant;

use super::batch::Batcher;
use super::leadership::LeaderCheck;
use super::transfer::TransferGate;
use crate::error::EtcdError;
use crate::raft::leader_calls::Opened;
use crate::raft::peers::{PeerFailure, Peers, classify, is_transport_failure, leader_url};
use crate::raft::types::{NodeId, Raft};
use crate::raft::wait_applied;

/// Pause before retrying a read index after a transient failure (no quorum yet, a leader
/// that just stepped down, an unreachable leader).
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// The read path of one member. See the module docs.
pub struct ReadPath {
    ctx: Arc<Ctx>,
    /// Rounds of this member asking for a read index (locally or from the leader).
    member_rounds: Arc<Batcher>,
    /// Rounds of leadership confirmation, when this member is the leader.
    leader_rounds: Arc<Batcher>,
}

struct Ctx {
    id: NodeId,
    raft: Raft,
    peers: Arc<Peers>,
    transfer: TransferGate,
    timeout: Duration,
    leader_check: Arc<LeaderCheck>,
}

impl ReadPath {
    /// The read path of member `id`; every wait is bounded by `timeout` (etcd's request
    /// timeout). `leader_check` tells whether this member, leading, still has a quorum: a
    /// leader without one runs no read rounds (each would fail and log an error at once).
    pub fn new(
        id: NodeId,
        raft: Raft,
        peers: Arc<Peers>,
        transfer: TransferGate,
        timeout: Duration,
        leader_check: Arc<LeaderCheck>,
    ) -> ReadPath {
        ReadPath {
            ctx: Arc::new(Ctx {
                id,
                raft,
                peers,
                transfer,
                timeout,
                leader_check,
            }),
            member_rounds: Arc::default(),
            leader_rounds: Arc::default(),
        }
    }

    /// Waits until this member may serve a linearizable read: it got a read index and
    /// applied it.
    ///
    /// Errors: `NoLeader` when no leader is known within the timeout, `Timeout` when the
    /// read index or the apply does not arrive in time, `Stopped` on shutdown.
    pub async fn barrier(&self) -> Result<(), EtcdError> {
        let start = Instant::now();
        let index = self.read_index().await?;
        let remaining = self.ctx.timeout.saturating_sub(start.elapsed());
        wait_applied(&self.ctx.raft, index, remaining, "read index applied").await
    }

    /// A read index for this member, from the round it joins.
    pub async fn read_index(&self) -> Result<u64, EtcdError> {
        let ctx = self.ctx.clone();
        let leader_rounds = self.leader_rounds.clone();
        self.member_rounds
            .join(move || {
                let (ctx, leader_rounds) = (ctx.clone(), leader_rounds.clone());
                async move { ctx.member_round(&leader_rounds).await }
            })
            .await
    }

    /// The leader's read index, served to followers (`keelpb.Peer/ReadIndex`).
    ///
    /// Errors: `NotLeader` if this member is not the leader (the follower then asks the new
    /// one), `Timeout` if no quorum confirmed leadership in time, `Stopped` on shutdown.
    pub async fn leader_read_index(&self) -> Result<u64, EtcdError> {
        let ctx = self.ctx.clone();
        self.leader_rounds
            .join(move || {
                let ctx = ctx.clone();
                async move { ctx.leader_round().await }
            })
            .await
    }

    /// Rounds run so far: (member rounds, leader rounds). For tests and logs.
    pub fn rounds(&self) -> (u64, u64) {
        (self.member_rounds.rounds(), self.leader_rounds.rounds())
    }
}

/// The error a failed read-index request reports: the leader's answer, else `NoLeader` (a
/// read index is safe to ask for again, whatever happened to the request).
fn retryable(failure: PeerFailure) -> EtcdError {
    match failure {
        PeerFailure::Answer(e) => e,
        PeerFailure::NotDelivered | PeerFailure::Ambiguous => EtcdError::NoLeader,
    }
}

impl Ctx {
    /// One member round: ask the current leader (possibly ourselves), retrying through
    /// leader changes until the deadline.
    async fn member_round(
        self: &Arc<Self>,
        leader_rounds: &Arc<Batcher>,
    ) -> Result<u64, EtcdError> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let (leader, url) = leader_url(&self.raft);
            let attempt = match (leader, url) {
                // A leader no quorum acknowledges (etcd's would have stepped down): no round,
                // which would fail at once; wait for the quorum or a new leader.
                (Some(l), _) if l == self.id && !self.leader_check.has_leader(&self.raft, l) => {
                    Err(EtcdError::Timeout)
                }
                (Some(l), _) if l == self.id => {
                    let me = self.clone();
                    leader_rounds
                        .join(move || {
                            let me = me.clone();
                            async move { me.leader_round().await }
                        })
                        .await
                }
                (Some(_), Some(url)) => self.ask_leader(&url, deadline).await,
                _ => Err(EtcdError::NoLeader),
            };
            let error = match attempt {
                Ok(index) => return Ok(index),
                Err(EtcdError::Stopped) => return Err(EtcdError::Stopped),
                Err(e) => e,
            };
            if Instant::now() + RETRY_PAUSE >= deadline {
                return Err(match error {
                    EtcdError::NoLeader => EtcdError::NoLeader,
                    _ => EtcdError::Timeout,
                });
            }
            // Wake early when the leader changes, and only then: other metrics change all
            // the time (a leader without a quorum spun here, one failed round after another).
            let mut metrics = self.raft.metrics();
            let _ = tokio::time::timeout(
                RETRY_PAUSE,
                metrics.wait_for(|m| m.current_leader != leader),
            )
            .await;
        }
    }

    /// The leader's read index, asked on this member's leader-call stream to it
    /// (`raft::leader_calls`), or by a unary `keelpb.Peer/ReadIndex` when it does not serve
    /// the stream (0.1.0).
    ///
    /// Errors: the leader's answer (`NotLeader`, `Timeout`), else `NoLeader`: a read index
    /// is safe to ask for again, whatever happened to this request.
    async fn ask_leader(&self, url: &str, deadline: Instant) -> Result<u64, EtcdError> {
        let calls = self.peers.leader_calls();
        let stream = match calls.open(&self.peers, url, deadline).await {
            Opened::Stream(stream) => stream,
            Opened::Failed(failure) => return Err(retryable(failure)),
            Opened::Unary => return self.ask_leader_unary(url, deadline).await,
        };
        let call = peer_call::Call::ReadIndex(ReadIndexRequest { member_id: self.id });
        match stream.call(call, deadline).await {
            Ok(peer_answer::Answer::ReadIndex(r)) => Ok(r.read_index),
            Ok(_) => Err(EtcdError::Internal(
                "keel: the leader answered a read index with another kind of answer".into(),
            )),
            Err(e) => Err(retryable(e.into_failure(&self.peers, url))),
        }
    }

    async fn ask_leader_unary(&self, url: &str, deadline: Instant) -> Result<u64, EtcdError> {
        let mut client = self.peers.client(url).map_err(|_| EtcdError::NoLeader)?;
        let mut request = tonic::Request::new(ReadIndexRequest { member_id: self.id });
        request.set_timeout(deadline.saturating_duration_since(Instant::now()));
        match client.read_index(request).await {
            Ok(r) => Ok(r.into_inner().read_index),
            Err(status) => {
                if is_transport_failure(&status) {
                    self.peers.reset(url);
                }
                Err(retryable(classify(&status)))
            }
        }
    }

    /// One leader round: confirm leadership with a quorum and return the read index.
    async fn leader_round(&self) -> Result<u64, EtcdError> {
        let deadline = Instant::now() + self.timeout;
        if !self.transfer.wait_idle(deadline).await {
            return Err(EtcdError::Timeout);
        }
        match self.raft.get_read_log_id().await {
            Ok((read_log_id, _applied)) => Ok(read_log_id.map_or(0, |l| l.index)),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(_))) => {
                Err(EtcdError::NotLeader)
            }
            Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(_))) => {
                Err(EtcdError::Timeout)
            }
            Err(RaftError::Fatal(_)) => Err(EtcdError::Stopped),
        }
    }
}
