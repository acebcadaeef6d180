//! Follower side of the streamed AppendEntries (`keelpb.Peer/AppendEntriesStream`).
//!
//! One long-lived stream per leader carries its AppendEntries RPCs, heartbeats included, to
//! this member (the sender is `raft::append_stream`). Each request is handed to openraft's core
//! as soon as it arrives, so a request can be appended while the previous one's fsync runs
//! (several RPCs share one WAL fsync), and its response is sent when the core answers it.
//! [`submit`] and [`reply`] are also the unary `AppendEntries` RPC's (a 0.1.0 leader's).
//!
//! Invariants:
//! - Requests reach the raft core in stream order: each is submitted
//!   (`Raft::submit_append_entries`, Keel's openraft patch) before the next is read.
//! - Responses leave in request order, one per request, so the sender matches them to its
//!   requests by position alone.
//! - An AppendEntries success still means "on stable storage" (Raft paper, Figure 2): the
//!   response is the core's, sent only after its flush.
//! - At most [`MAX_PENDING`] requests wait for the core; the stream is not read further until
//!   one is answered (the leader keeps two in flight, so only timed-out retries queue up).

use std::pin::Pin;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::{FuturesOrdered, Stream, StreamExt};
use keel_proto::keelpb::RaftPayload;
use openraft::error::RaftError;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};
use tokio::sync::watch;
use tonic::{Status, Streaming};

use crate::node::Node;
use crate::raft::trace::{self, Stage};
use crate::raft::types::{NodeId, TypeConfig};

/// Requests of one stream that may wait for the raft core at once.
pub const MAX_PENDING: usize = 64;

/// The response stream of `AppendEntriesStream`.
pub type ResponseStream = Pin<Box<dyn Stream<Item = Result<RaftPayload, Status>> + Send>>;

/// Serves one AppendEntries stream for `node`: the response stream reads `inbound`, submits
/// each request to raft and yields the answers in order. It runs in the task tonic polls the
/// response body from, so an answer is encoded without another hand-off.
///
/// Errors (ending the stream, as its last item): `InvalidArgument` "bad raft payload: …" for a
/// request that does not decode; `Internal` if a response cannot be encoded.
/// The stream ends when `stopping` becomes `true` (the member stops; requests still waiting for
/// raft are not answered, and the leader treats them as lost).
pub fn serve(
    node: Arc<Node>,
    inbound: Streaming<RaftPayload>,
    stopping: watch::Receiver<bool>,
) -> ResponseStream {
    let pump = Pump {
        node,
        inbound,
        stopping,
        pending: FuturesOrdered::new(),
        reading: true,
    };
    Box::pin(futures::stream::unfold(pump, |mut pump| async move {
        let item = pump.next().await?;
        Some((item, pump))
    }))
}

pub type Answer = Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>;

/// A request's answer from raft, with the log indexes it carried when traced.
pub type Answered = (Answer, Option<(u64, u64)>);

/// What woke a stream's pump (on the stack for one loop turn, so its size does not matter).
#[allow(clippy::large_enum_variant)]
enum Event {
    Answer(Answered),
    Request(Result<Option<RaftPayload>, Status>),
}

/// The state of one stream: the requests submitted to raft and not yet answered.
struct Pump {
    node: Arc<Node>,
    inbound: Streaming<RaftPayload>,
    stopping: watch::Receiver<bool>,
    pending: FuturesOrdered<BoxFuture<'static, Answered>>,
    /// Whether the leader may still send requests.
    reading: bool,
}

impl Pump {
    /// The next response; `None` when the leader closed the stream and every submitted request
    /// is answered, after a bad request (whose error was the last item), or once the member
    /// stops.
    async fn next(&mut self) -> Option<Result<RaftPayload, Status>> {
        loop {
            if !self.reading && self.pending.is_empty() {
                return None;
            }
            let event = tokio::select! {
                biased;
                _ = self.stopping.wait_for(|s| *s) => return None,
                // Answers before requests: they free room and carry the follower's progress.
                Some(answer) = self.pending.next(), if !self.pending.is_empty() => Event::Answer(answer),
                msg = self.inbound.message(), if self.reading && self.pending.len() < MAX_PENDING => {
                    Event::Request(msg)
                }
            };
            match event {
                Event::Answer(answered) => return Some(reply(&self.node, answered)),
                Event::Request(Ok(Some(payload))) => {
                    if let Err(status) = self.submit(&payload) {
                        self.reading = false;
                        self.pending.clear();
                        return Some(Err(status));
                    }
                }
                // The leader ended the stream, or it broke: answer what was submitted.
                Event::Request(Ok(None) | Err(_)) => self.reading = false,
            }
        }
    }

    /// Hands one request to raft (it is in the core's queue on return).
    fn submit(&mut self, payload: &RaftPayload) -> Result<(), Status> {
        let answer = submit(&self.node, payload)?;
        self.pending.push_back(Box::pin(answer));
        Ok(())
    }
}

/// Decodes one AppendEntries (`payload`, bincode) from the leader and hands it to raft: it is
/// in the core's queue on return, and the future resolves to the core's answer. Used by the
/// stream and by the unary `AppendEntries` RPC alike.
///
/// Errors: `InvalidArgument` "bad raft payload: …" when `payload` does not decode.
pub fn submit(
    node: &Node,
    payload: &RaftPayload,
) -> Result<impl std::future::Future<Output = Answered> + Send + 'static, Status> {
    let req: AppendEntriesRequest<TypeConfig> = bincode::deserialize(&payload.data)
        .map_err(|e| Status::invalid_argument(format!("bad raft payload: {e}")))?;
    node.cluster.leader_contact.touch();
    let traced = trace::covered(&req.entries, |e| e.log_id.index);
    // `peer` is the follower of the RPC on both sides: here, this member.
    if let Some((first, last)) = traced {
        trace::mark(Stage::AeRecv, first, last, node.id);
    }
    let answer = node.raft.submit_append_entries(req);
    Ok(async move { (answer.await, traced) })
}

/// The payload that answers the leader (bincode `Result<AppendEntriesResponse, RaftError>`).
///
/// Errors: `Internal` if the answer cannot be encoded.
pub fn reply(node: &Node, (answer, traced): Answered) -> Result<RaftPayload, Status> {
    if let Some((first, last)) = traced {
        trace::mark(Stage::AeReply, first, last, node.id);
    }
    bincode::serialize(&answer)
        .map(|data| RaftPayload { data })
        .map_err(|e| Status::internal(e.to_string()))
}
