//! Keel patch: pipelined AppendEntries, at most [`MAX_IN_FLIGHT`] RPCs in flight per follower.
//!
//! openraft 0.9.25 sends one AppendEntries and waits for its response before the next, so an
//! entry appended meanwhile waits a whole round trip (network and the follower's fsync) before
//! it even leaves the leader. Here the replication task keeps up to two RPCs in flight
//! (hashicorp/raft found two best on a LAN): while logs are in flight, `RaftCore` extends the
//! in-flight range under the same request id (`ProgressEntry::extend_inflight`), and the task
//! sends the extension at once on a second network client.
//!
//! Invariants:
//! - Responses are handled in the order the RPCs were sent (`FuturesOrdered`), so every ack
//!   reported to `RaftCore` extends the previous one (partial acks of the in-flight range).
//! - A conflict is reported only for an RPC sent as the head of the pipeline (no earlier log RPC
//!   of its generation was unanswered when it was sent): a pipelined RPC may reach the follower
//!   before the one in front of it, and its conflict then says nothing about the follower's log.
//!   It restarts the pipeline from the acknowledged `matching` instead.
//! - After a conflict, an error or a restart, every RPC still in flight belongs to an old
//!   generation: its response is dropped unread (its network client is reused).
//! - A snapshot is sent only when no RPC is in flight.

use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::FuturesOrdered;

use crate::error::decompose::DecomposeResult;
use crate::error::RPCError;
use crate::error::Timeout;
use crate::log_id_range::LogIdRange;
use crate::network::RPCOption;
use crate::network::RPCTypes;
use crate::network::RaftNetwork;
use crate::raft::AppendEntriesRequest;
use crate::raft::AppendEntriesResponse;
use crate::replication::request_id::RequestId;
use crate::type_config::alias::InstantOf;
use crate::type_config::TypeConfigExt;
use crate::LogId;
use crate::RaftTypeConfig;

/// AppendEntries RPCs in flight to one follower at most.
pub(crate) const MAX_IN_FLIGHT: usize = 2;

/// What an RPC in flight carries.
#[derive(Debug)]
pub(crate) enum Sent<C>
where C: RaftTypeConfig
{
    /// No entries, after `prev` (the acknowledged matching when sent): keeps the leadership
    /// and carries the commit index.
    Heartbeat { prev: Option<LogId<C::NodeId>> },
    /// Entries `range` of the in-flight logs `request_id`; `head`: no earlier log RPC of the
    /// same generation was unanswered when it was sent.
    Logs {
        request_id: RequestId,
        range: LogIdRange<C::NodeId>,
        head: bool,
    },
}

/// An answered RPC, with the network client it used.
pub(crate) struct Done<C, Net>
where C: RaftTypeConfig
{
    pub(crate) network: Net,
    pub(crate) generation: u64,
    pub(crate) sent: Sent<C>,
    pub(crate) leader_time: InstantOf<C>,
    pub(crate) result: Result<AppendEntriesResponse<C::NodeId>, RPCError<C::NodeId, C::Node>>,
}

/// The RPCs in flight to one follower and the logs request they serve.
pub(crate) struct Pipeline<C, Net>
where C: RaftTypeConfig
{
    /// Network clients not in use (one per possible RPC in flight).
    pub(crate) idle: Vec<Net>,
    /// RPCs in flight, oldest first.
    pub(crate) in_flight: FuturesOrdered<BoxFuture<'static, Done<C, Net>>>,
    /// Bumped to make every RPC in flight stale.
    pub(crate) generation: u64,
    /// Log RPCs of the current generation in flight.
    pub(crate) logs_in_flight: usize,
    /// The logs request being served, and the last log id `RaftCore` asked for under it.
    pub(crate) logs: Option<(RequestId, Option<LogId<C::NodeId>>)>,
    /// A logs request ended here (conflict or error); extensions of it that `RaftCore` sent
    /// before it heard of the end are dropped.
    pub(crate) ended: Option<RequestId>,
}

impl<C, Net> Pipeline<C, Net>
where
    C: RaftTypeConfig,
    Net: RaftNetwork<C>,
{
    pub(crate) fn new(networks: Vec<Net>) -> Self {
        assert_eq!(networks.len(), MAX_IN_FLIGHT, "one network client per RPC in flight");
        Self {
            idle: networks,
            in_flight: FuturesOrdered::new(),
            generation: 0,
            logs_in_flight: 0,
            logs: None,
            ended: None,
        }
    }

    /// Whether another RPC may be sent now: every RPC in flight, stale ones included, holds
    /// one of the [`MAX_IN_FLIGHT`] network clients.
    pub(crate) fn has_room(&self) -> bool {
        !self.idle.is_empty()
    }

    /// Sends `payload` from leader `leader` to `target` on an idle network client; `timeout`
    /// bounds the RPC (openraft's heartbeat interval, as before).
    pub(crate) fn send(
        &mut self,
        sent: Sent<C>,
        payload: AppendEntriesRequest<C>,
        timeout: Duration,
        leader: C::NodeId,
        target: C::NodeId,
    ) {
        let mut network = self.idle.pop().expect("an idle network client: check has_room()");
        if matches!(sent, Sent::Logs { .. }) {
            self.logs_in_flight += 1;
        }
        let generation = self.generation;
        let leader_time = C::now();
        let timeout_error = Timeout {
            action: RPCTypes::AppendEntries,
            id: leader,
            target,
            timeout,
        };
        let fut = async move {
            let option = RPCOption::new(timeout);
            let res = C::timeout(timeout, network.append_entries(payload, option)).await;
            let result = match res {
                Err(_) => Err(RPCError::Timeout(timeout_error)),
                Ok(r) => DecomposeResult::<C, _, _>::decompose_infallible(r),
            };
            Done {
                network,
                generation,
                sent,
                leader_time,
                result,
            }
        };
        self.in_flight.push_back(Box::pin(fut));
    }

    /// Takes back the network client of an answered RPC; returns whether the RPC belongs to the
    /// current generation (else its response must be dropped).
    pub(crate) fn answered(&mut self, done_network: Net, generation: u64, sent: &Sent<C>) -> bool {
        self.idle.push(done_network);
        if generation != self.generation {
            return false;
        }
        if matches!(sent, Sent::Logs { .. }) {
            self.logs_in_flight -= 1;
        }
        true
    }

    /// Makes every RPC in flight stale.
    pub(crate) fn new_generation(&mut self) {
        self.generation += 1;
        self.logs_in_flight = 0;
    }
}
