//! Leader side of the streamed AppendEntries: one long-lived `keelpb.Peer/AppendEntriesStream`
//! per follower peer URL, shared by every AppendEntries this member sends there (the pipelined
//! replication RPCs and the heartbeats). The follower side is `api::peer_stream`.
//!
//! Why: a unary RPC is a new HTTP/2 stream with its own request and response headers, a new
//! server task and its wake-ups; on a stream, an AppendEntries is one DATA frame each way.
//!
//! Invariants:
//! - A request's waiter joins the queue and the request enters the stream under one lock, so
//!   queue order is stream order; the follower answers once per request, in order, so the
//!   n-th response belongs to the n-th waiter.
//! - A caller of an entry-carrying request that gives up before its answer (openraft's
//!   timeout) cancels the whole stream (HTTP/2 `RST_STREAM`), as a unary RPC's timeout
//!   cancels that RPC: a follower that was paused must not work through every request that
//!   timed out meanwhile when it resumes (each one a stale probe of its log, possibly MBs).
//!   The other waiters of the stream fail with `DeadlineExceeded`, which openraft treats as
//!   a network error (not an unreachable member).
//! - An entry-less request (a heartbeat, a read-index leadership check) whose caller gives up
//!   is left queued and its answer dropped: it waited behind entries the follower is still
//!   taking in (a 1 MiB message takes longer than its 100 ms timeout), and cancelling would
//!   fail those entries too, to be read and sent again. It is cheap for a resumed follower to
//!   work through, so only once [`MAX_ABANDONED`] waiters are queued does a giving-up
//!   heartbeat cancel the stream (a follower that stopped answering).
//! - A stream that ends or fails is marked dead under the same lock before its waiters are
//!   failed, so no waiter joins a dead stream; the next request opens a new stream.
//! - A peer that does not serve the stream (a 0.1.0 member: `Unimplemented`) gets unary
//!   `AppendEntries` RPCs; the stream is tried again after [`super::stream_table::UNARY_RETRY`], since the member may
//!   have been upgraded.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use keel_proto::keelpb::RaftPayload;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Code, Status};

use super::peers::Peers;
use super::stream_table::StreamTable;

/// `KEEL_UNARY_APPEND=1` in the environment: every AppendEntries is a unary RPC, as before
/// the stream (for same-binary A/B benchmarks, docs/benchmarks.md).
static UNARY_ONLY: std::sync::LazyLock<bool> =
    std::sync::LazyLock::new(|| std::env::var_os("KEEL_UNARY_APPEND").is_some_and(|v| v == "1"));

type Waiter = oneshot::Sender<Result<RaftPayload, Status>>;

/// Waiters on one stream beyond which an entry-less request that gives up cancels it anyway
/// (module docs): 256 heartbeat intervals, 25.6 s with etcd's 100 ms.
pub const MAX_ABANDONED: usize = 256;

/// What giving up on a request does to its stream (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnGiveUp {
    /// Cancel the stream and fail its other waiters: the request carried entries.
    CancelStream,
    /// Leave the request queued and drop its answer, unless [`MAX_ABANDONED`] waiters are
    /// queued: the request carried no entries.
    LeaveQueued,
}

/// The open AppendEntries streams of one member, by peer URL.
#[derive(Default)]
pub struct AppendStreams {
    table: StreamTable<Stream>,
}

/// One stream: the request side and the waiters for its responses, oldest first.
struct Stream {
    state: Mutex<Queue>,
    /// Cancels the task that opened the stream and reads its responses (dropping the
    /// response resets the HTTP/2 stream).
    reader: std::sync::OnceLock<tokio::task::AbortHandle>,
}

struct Queue {
    /// `None` once the stream ended: no waiter may join.
    requests: Option<mpsc::UnboundedSender<RaftPayload>>,
    waiters: VecDeque<Waiter>,
}

/// How one AppendEntries was answered.
pub enum Sent {
    /// The follower's response payload, or the status that ended the stream.
    Answer(Result<RaftPayload, Status>),
    /// The peer does not serve the stream: send the request as a unary RPC.
    Unary(RaftPayload),
}

impl AppendStreams {
    /// Sends `payload` (a bincode `AppendEntriesRequest`) to the peer at `url` on its stream,
    /// opening one on `peers`' pooled channel if none is open, and waits for the response.
    ///
    /// Returns [`Sent::Unary`] with the payload when the peer does not serve the stream (the
    /// caller sends it as a unary RPC). Errors (in [`Sent::Answer`]): the status that ended the
    /// stream (a transport failure, or the follower's "bad raft payload"), `Unavailable`
    /// "append stream closed" when it ended without one, or `DeadlineExceeded` when another
    /// caller gave up on the stream and cancelled it.
    ///
    /// Dropping the returned future before it resolves (a timeout) cancels the stream, or
    /// leaves the request queued, as `on_give_up` says.
    pub async fn send(
        &self,
        peers: &Peers,
        url: &str,
        payload: RaftPayload,
        on_give_up: OnGiveUp,
    ) -> Sent {
        if *UNARY_ONLY || self.table.is_unary(url) {
            return Sent::Unary(payload);
        }
        let (tx, rx) = oneshot::channel();
        let mut payload = Some(payload);
        let mut sent_on = None;
        // Two tries: the stream found may have ended just now.
        for _ in 0..2 {
            let stream = match self.stream(peers, url) {
                Ok(s) => s,
                Err(status) => return Sent::Answer(Err(status)),
            };
            let mut q = stream.state.lock().expect("append stream lock");
            let Some(requests) = &q.requests else {
                drop(q);
                self.table.forget(url, &stream);
                continue;
            };
            let p = payload.take().expect("the payload is sent once");
            match requests.send(p) {
                Ok(()) => {
                    q.waiters.push_back(tx);
                    drop(q);
                    sent_on = Some(stream);
                    break;
                }
                Err(mpsc::error::SendError(p)) => {
                    payload = Some(p);
                    q.requests = None;
                    drop(q);
                    self.table.forget(url, &stream);
                }
            }
        }
        if let Some(p) = payload {
            // Both streams ended at once: let the unary RPC report what is wrong.
            return Sent::Unary(p);
        }
        let stream = sent_on.expect("a stream took the request");
        let mut give_up = GiveUp {
            streams: self,
            url,
            stream: Some(stream),
            on_give_up,
        };
        let answer = rx.await;
        give_up.stream = None; // Answered (or the stream ended): nothing to cancel.
        match answer {
            Ok(Err(status)) if status.code() == Code::Unimplemented => {
                self.table.mark_unary(url);
                Sent::Answer(Err(status))
            }
            Ok(answer) => Sent::Answer(answer),
            Err(_) => Sent::Answer(Err(Status::unavailable("append stream closed"))),
        }
    }

    /// Requests sent on the open stream to `url` and not answered yet (0 without a stream).
    #[cfg(test)]
    pub fn waiters(&self, url: &str) -> usize {
        self.table.peek(url).map_or(0, |s| {
            s.state.lock().expect("append stream lock").waiters.len()
        })
    }

    /// Closes the stream to `url` (after a transport failure on its channel); waiters of it
    /// fail when the stream's reader sees it end.
    pub fn reset(&self, url: &str) {
        if let Some(s) = self.table.remove(url) {
            s.state.lock().expect("append stream lock").requests = None;
        }
    }

    /// Ends `stream` (to `url`) now: removes it from the table, fails its waiters with
    /// `status` and cancels its reader, which resets the HTTP/2 stream.
    fn cancel(&self, url: &str, stream: &Arc<Stream>, status: Status) {
        self.table.forget(url, stream);
        stream.end(status);
        if let Some(reader) = stream.reader.get() {
            reader.abort();
        }
    }

    /// The open stream to `url`, or a new one whose reader task is spawned here. (A stream
    /// that ended stays in the table until a sender finds it closed and forgets it.)
    fn stream(&self, peers: &Peers, url: &str) -> Result<Arc<Stream>, Status> {
        self.table.get_or_open(url, |_| true, || open(peers, url))
    }
}

/// A new stream to `url` on `peers`' pooled channel, whose reader task is spawned here.
///
/// Errors: `Unavailable` "bad peer URL ..." when `url` is not one.
fn open(peers: &Peers, url: &str) -> Result<Arc<Stream>, Status> {
    let mut client = peers
        .client(url)
        .map_err(|e| Status::unavailable(format!("bad peer URL {url}: {e}")))?;
    let (requests, outbound) = mpsc::unbounded_channel();
    let stream = Arc::new(Stream {
        state: Mutex::new(Queue {
            requests: Some(requests),
            waiters: VecDeque::new(),
        }),
        reader: std::sync::OnceLock::new(),
    });
    let reader = stream.clone();
    let task = tokio::spawn(async move {
        let opened = client
            .append_entries_stream(UnboundedReceiverStream::new(outbound))
            .await;
        let end = match opened {
            Ok(response) => {
                let mut inbound = response.into_inner();
                loop {
                    match inbound.message().await {
                        Ok(Some(answer)) => reader.answer(Ok(answer)),
                        Ok(None) => break Status::unavailable("append stream closed"),
                        Err(status) => break status,
                    }
                }
            }
            Err(status) => status,
        };
        reader.end(end);
    });
    let _ = stream.reader.set(task.abort_handle());
    Ok(stream)
}

impl Stream {
    /// Hands the next response to the oldest waiter.
    fn answer(&self, answer: Result<RaftPayload, Status>) {
        let waiter = self
            .state
            .lock()
            .expect("append stream lock")
            .waiters
            .pop_front();
        if let Some(w) = waiter {
            // The caller may have given up (timeout); its response is dropped.
            let _ = w.send(answer);
        }
    }

    /// Marks the stream ended and fails every waiter with `status`.
    fn end(&self, status: Status) {
        let waiters = {
            let mut q = self.state.lock().expect("append stream lock");
            q.requests = None;
            std::mem::take(&mut q.waiters)
        };
        for w in waiters {
            let _ = w.send(Err(status.clone()));
        }
    }
}

/// Cancels the stream a request went out on if its caller stops waiting before the answer
/// (dropped while `stream` is still set), as `on_give_up` says.
struct GiveUp<'a> {
    streams: &'a AppendStreams,
    url: &'a str,
    stream: Option<Arc<Stream>>,
    on_give_up: OnGiveUp,
}

impl Drop for GiveUp<'_> {
    fn drop(&mut self) {
        let Some(stream) = self.stream.take() else {
            return;
        };
        if self.on_give_up == OnGiveUp::LeaveQueued
            && stream
                .state
                .lock()
                .expect("append stream lock")
                .waiters
                .len()
                <= MAX_ABANDONED
        {
            return;
        }
        let status = Status::deadline_exceeded(
            "append stream cancelled: an earlier AppendEntries on it timed out",
        );
        self.streams.cancel(self.url, &stream, status);
    }
}
