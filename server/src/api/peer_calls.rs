//! Leader side of the leader-call stream (`keelpb.Peer/LeaderCalls`): one long-lived stream per
//! member carries its forwarded proposals, read-index requests and its clients' lease
//! keepalives and TimeToLive requests to this member (the sender
//! is `raft::leader_calls`). Each call is answered on the same stream by its sequence number,
//! in the order the answers are ready, with what the unary RPCs (`Forward`, `ReadIndex`,
//! `LeaseRenew`, `LeaseTimeToLive`) answer: the same functions serve both.
//!
//! Invariants:
//! - Every call read is answered once, unless the stream ends first (the sender went away,
//!   or the member's shutdown drain ran out); the sender treats an unanswered call as
//!   ambiguous.
//! - Once the member stops, no call is started: new calls are refused with "not leader", and
//!   the drained stream ends with that status, which refuses the calls still unread; so only
//!   calls that may have proposed something are ever ambiguous.
//! - A call is given up `timeout_ms` (the sender's deadline) after it was read, with the
//!   status tonic answers an expired `grpc-timeout` with, as the unary RPC is: it outlives its
//!   caller by at most the time it waited unread.
//! - At most [`MAX_PENDING`] calls of one stream run at once; the stream is not read further
//!   until one is answered (a member sends a few forwarded batches and one read-index round
//!   at a time, so only a flood waits).

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, Stream, StreamExt};
use keel_proto::etcdserverpb::{
    LeaseKeepAliveResponse, LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use keel_proto::keelpb::{
    ForwardAnswer, PeerAnswer, PeerCall, PeerError, RaftRequest, RaftResponse, ReadIndexResponse,
    peer_answer, peer_call,
};
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::{Status, Streaming};

use super::lease_leader;
use crate::cluster::drain::OpenStream;
use crate::error::EtcdError;
use crate::node::Node;

/// Calls of one stream that may run at once. Large: a call may wait seconds on the leader (a
/// keepalive of an expired lease waits for its revocation, as in etcd), and while the limit is
/// reached nothing else from that member is read, its writes and reads included (a fresh-user
/// check saw them stall 7 s behind 400 slow keepalives at a limit of 256).
pub const MAX_PENDING: usize = 8192;

/// The answer stream of `LeaderCalls`.
pub type AnswerStream = Pin<Box<dyn Stream<Item = Result<PeerAnswer, Status>> + Send>>;

/// Proposes a forwarded request on this member (`keelpb.Peer/Forward`, and a `forward` call on
/// the stream): its result in the shape it came in and the log index of the entry that carried
/// it. See `Node::propose_forwarded`.
///
/// Errors: `InvalidArgument` "forwarded raft request is empty"; the etcd errors of
/// `Node::propose_forwarded` (etcd's "not leader" when this member does not lead).
pub async fn forward(node: &Node, req: RaftRequest) -> Result<(RaftResponse, u64), Status> {
    if req.request.is_none() {
        return Err(Status::invalid_argument("forwarded raft request is empty"));
    }
    Ok(node.propose_forwarded(req).await?)
}

/// This member's read index for a follower (`keelpb.Peer/ReadIndex`, and a `read_index` call
/// on the stream): its commit point once a quorum confirmed its leadership (Raft thesis §6.4),
/// and its term.
///
/// Errors: etcd's "not leader" when this member does not lead; `Timeout`, `Stopped`.
pub async fn read_index(node: &Node) -> Result<ReadIndexResponse, Status> {
    let read_index = node.cluster.reads.leader_read_index().await?;
    let term = node.raft.metrics().borrow().current_term;
    Ok(ReadIndexResponse { read_index, term })
}

/// Renews lease `id` on this member, the leader (`keelpb.Peer/LeaseRenew`, and a `lease_renew`
/// call on the stream): its TTL in seconds, 0 when there is no such lease.
///
/// Errors: etcd's "not leader" when this member does not lead; `Timeout` at `deadline`.
pub async fn lease_renew(
    node: &Node,
    id: i64,
    deadline: Instant,
) -> Result<LeaseKeepAliveResponse, Status> {
    let ttl = lease_leader::renew_local(node, id, deadline).await?;
    Ok(LeaseKeepAliveResponse {
        id,
        ttl,
        ..Default::default()
    })
}

/// A lease's TTLs from this member, the leader (`keelpb.Peer/LeaseTimeToLive`, and a
/// `lease_time_to_live` call on the stream); TTL -1 when there is no such lease, the header
/// left unset.
///
/// Errors: etcd's "not leader" when this member does not lead; `Timeout` at `deadline`.
pub async fn lease_time_to_live(
    node: &Node,
    req: &LeaseTimeToLiveRequest,
    deadline: Instant,
) -> Result<LeaseTimeToLiveResponse, Status> {
    Ok(lease_leader::time_to_live_local(node, req, deadline).await?)
}

/// Serves one leader-call stream for `node`: the answer stream reads `inbound`, runs each call
/// and yields its answer when ready. It runs in the task tonic polls the response body from.
/// The stream ends when the sender closes it and every call is answered. Once the member's
/// drain begins (`cluster::drain`: it stops) the calls running are still answered (a
/// forwarded write may still commit during the shutdown drain, as a unary `Forward` could;
/// the peer server keeps serving raft until every call stream ended), calls read meanwhile are
/// answered at once with etcd's "not leader" (nothing proposed: the sender asks again, the
/// next leader once one is elected), and the stream ends when none runs, with that same
/// status, which refuses the calls sent but not read.
pub fn serve(node: Arc<Node>, inbound: Streaming<PeerCall>) -> AnswerStream {
    let pump = Pump {
        _open: node.cluster.calls.open(),
        stopping: node.cluster.calls.stopping(),
        node,
        inbound,
        running: FuturesUnordered::new(),
        reading: true,
        draining: false,
    };
    Box::pin(futures::stream::unfold(
        (pump, false),
        |(mut pump, ended)| async move {
            if ended {
                return None;
            }
            match pump.next().await {
                Some(answer) => Some((Ok(answer), (pump, false))),
                // Drained: every call read was answered, so a call the sender is still
                // waiting for was sent after the last read and never run. The status that
                // ends the stream refuses it as the calls read during the drain were, and
                // the sender asks again instead of reporting an ambiguous failure (its
                // client would get "request timed out, possibly due to previous leader
                // failure" for a write that was never proposed).
                None if pump.draining => {
                    Some((Err(Status::from(EtcdError::NotLeader)), (pump, true)))
                }
                None => None,
            }
        },
    ))
}

/// The state of one stream: the calls running.
struct Pump {
    /// Counts this stream as open for the member's drain until the pump drops.
    _open: OpenStream,
    node: Arc<Node>,
    inbound: Streaming<PeerCall>,
    stopping: watch::Receiver<bool>,
    running: FuturesUnordered<BoxFuture<'static, PeerAnswer>>,
    /// Whether the sender may still send calls.
    reading: bool,
    /// Whether the member is stopping: calls running are answered, new ones refused.
    draining: bool,
}

/// What woke a stream's pump.
enum Event {
    Answer(PeerAnswer),
    Call(Option<PeerCall>),
    /// The member began to stop.
    Stop,
}

impl Pump {
    /// The next answer; `None` when the sender closed the stream, or the member stops, and
    /// no call runs.
    async fn next(&mut self) -> Option<PeerAnswer> {
        loop {
            if (!self.reading || self.draining) && self.running.is_empty() {
                return None;
            }
            let event = tokio::select! {
                biased;
                _ = self.stopping.wait_for(|s| *s), if !self.draining => Event::Stop,
                Some(answer) = self.running.next(), if !self.running.is_empty() => {
                    Event::Answer(answer)
                }
                msg = self.inbound.message(), if self.reading && self.running.len() < MAX_PENDING => {
                    // A broken stream ends like a closed one: what runs is still answered.
                    Event::Call(msg.unwrap_or(None))
                }
            };
            match event {
                Event::Answer(answer) => return Some(answer),
                // Proposes nothing: the sender asks again, the new leader once there is one.
                Event::Call(Some(call)) if self.draining => {
                    return Some(PeerAnswer {
                        seq: call.seq,
                        answer: Some(error(&Status::from(EtcdError::NotLeader))),
                    });
                }
                Event::Call(Some(call)) => self.running.push(run(self.node.clone(), call)),
                Event::Call(None) => self.reading = false,
                Event::Stop => self.draining = true,
            }
        }
    }
}

/// Runs one call to its answer, giving up at its deadline.
fn run(node: Arc<Node>, call: PeerCall) -> BoxFuture<'static, PeerAnswer> {
    let PeerCall {
        seq,
        timeout_ms,
        call,
    } = call;
    let deadline = Instant::now() + Duration::from_millis(timeout_ms.into());
    Box::pin(async move {
        let work = async {
            match call {
                Some(peer_call::Call::Forward(req)) => {
                    let (response, log_index) = forward(&node, req).await?;
                    Ok(peer_answer::Answer::Forward(ForwardAnswer {
                        response: Some(response),
                        log_index,
                    }))
                }
                Some(peer_call::Call::ReadIndex(_)) => {
                    read_index(&node).await.map(peer_answer::Answer::ReadIndex)
                }
                Some(peer_call::Call::LeaseRenew(req)) => lease_renew(&node, req.id, deadline)
                    .await
                    .map(peer_answer::Answer::LeaseRenew),
                Some(peer_call::Call::LeaseTimeToLive(req)) => {
                    lease_time_to_live(&node, &req, deadline)
                        .await
                        .map(peer_answer::Answer::LeaseTimeToLive)
                }
                None => Err(Status::invalid_argument("leader call is empty")),
            }
        };
        let answer = match tokio::time::timeout_at(deadline, work).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(status)) => error(&status),
            // What tonic answers an expired `grpc-timeout` with (the unary RPCs' deadline).
            Err(_) => error(&Status::cancelled("Timeout expired")),
        };
        PeerAnswer {
            seq,
            answer: Some(answer),
        }
    })
}

fn error(status: &Status) -> peer_answer::Answer {
    peer_answer::Answer::Error(PeerError {
        code: status.code() as i32,
        message: status.message().to_string(),
    })
}
