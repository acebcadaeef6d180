//! Sender side of a member's calls to the leader on one stream (`keelpb.Peer/LeaderCalls`):
//! forwarded proposals, read-index requests, and its clients' lease keepalives and
//! TimeToLive requests, one long-lived stream per leader peer URL.
//! The leader side is `api::peer_calls`.
//!
//! Why: a unary RPC is a new HTTP/2 stream with its request and response headers and a new
//! server task; a put sent to a follower paid that once more than a put sent to the leader
//! (docs/benchmarks.md, "What a forwarded put costs at one client"). On the stream a call is
//! one DATA frame each way.
//!
//! Invariants:
//! - A call enters a stream only once the leader accepted the stream (its response headers
//!   arrived), so a call is never lost to a peer that does not serve the stream (a 0.1.0
//!   member answers `Unimplemented` at once): the caller still holds it and sends it as a
//!   unary RPC ([`Opened::Unary`]), and keeps doing so for `stream_table::UNARY_RETRY`.
//! - A call's waiter is registered under its sequence number before the call enters the
//!   stream, under one lock, so every answer finds its waiter; answers may come in any order.
//! - A stream that ends or fails is marked ended under that lock before its waiters are
//!   failed, so no call joins an ended stream; the next call opens a new stream.
//! - A call that was sent and not answered is ambiguous (it may have been applied): its
//!   waiter gets the status that ended the stream, which `peers::classify` reads as such.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use keel_proto::keelpb::{PeerAnswer, PeerCall, peer_answer, peer_call};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Code, Status};

use crate::error::EtcdError;

use super::peers::{PeerFailure, Peers, classify, is_transport_failure};
use super::stream_table::StreamTable;

/// `KEEL_UNARY_FORWARD=1` in the environment: forwarded proposals and read-index requests go
/// as unary RPCs, as before the stream (for same-binary A/B benchmarks, docs/benchmarks.md).
static UNARY_ONLY: std::sync::LazyLock<bool> =
    std::sync::LazyLock::new(|| std::env::var_os("KEEL_UNARY_FORWARD").is_some_and(|v| v == "1"));

type Waiter = oneshot::Sender<Result<peer_answer::Answer, CallError>>;

/// The open leader-call streams of one member, by peer URL.
#[derive(Default)]
pub struct LeaderCalls {
    table: StreamTable<CallStream>,
}

/// What opening (or finding) the stream to a leader gave.
pub enum Opened {
    /// The stream, accepted by the leader: send calls on it.
    Stream(Arc<CallStream>),
    /// The leader does not serve the stream: send the call as a unary RPC.
    Unary,
    /// The stream could not be opened, so no call was sent on it: `NotDelivered` when the
    /// leader could not be reached, `Answer(Timeout)` when `deadline` passed first, else the
    /// answer the leader refused the stream with (as `peers::classify` reads a unary RPC's).
    Failed(PeerFailure),
}

/// How a call on an open stream failed.
#[derive(Debug)]
pub enum CallError {
    /// The stream ended before the call entered it: the leader never got the call.
    NotSent,
    /// The leader answered with this error (code and message of the status the unary RPC
    /// would have failed with). The stream works: an answer came back on it.
    Answered(Status),
    /// The status that ended the stream after the call was sent (ambiguous), or `Cancelled`
    /// "Timeout expired" when the caller's deadline passed first.
    Failed(Status),
}

impl CallError {
    /// What the failure tells about the call (`peers::classify`); drops the pooled channel to
    /// `url` (and the streams on it) after a transport failure, so the next call reconnects,
    /// but never for an answer: one call's error must not fail the others in flight (a
    /// fresh-user check found every write in flight failing as ambiguous whenever the leader
    /// answered one keepalive with etcd's `request timed out`, an `Unavailable` status).
    pub fn into_failure(self, peers: &Peers, url: &str) -> PeerFailure {
        match self {
            CallError::NotSent => PeerFailure::NotDelivered,
            CallError::Answered(status) => classify(&status),
            CallError::Failed(status) => {
                if is_transport_failure(&status) {
                    peers.reset(url);
                }
                classify(&status)
            }
        }
    }
}

/// One stream to a leader: whether the leader accepted it, and the calls awaiting answers.
pub struct CallStream {
    /// `None` while the stream opens; then `Ok` once the leader accepted it, or the status it
    /// failed with.
    opened: watch::Receiver<Option<Result<(), Status>>>,
    state: Mutex<Pending>,
    /// Cancels the task that opened the stream and reads its answers (when the pool drops the
    /// stream after a transport failure).
    reader: std::sync::OnceLock<tokio::task::AbortHandle>,
}

struct Pending {
    /// `None` once the stream ended: no call may join.
    calls: Option<mpsc::UnboundedSender<PeerCall>>,
    next_seq: u64,
    waiters: HashMap<u64, Waiter>,
}

impl LeaderCalls {
    /// The stream to the leader at `url`, opened on `peers`' pooled channel if none is open,
    /// once the leader accepted it; waits at most until `deadline` for that.
    pub async fn open(&self, peers: &Peers, url: &str, deadline: tokio::time::Instant) -> Opened {
        if *UNARY_ONLY || self.table.is_unary(url) {
            return Opened::Unary;
        }
        let stream = match self.stream(peers, url) {
            Ok(s) => s,
            Err(_) => return Opened::Failed(PeerFailure::NotDelivered),
        };
        let mut opened = stream.opened.clone();
        let outcome = tokio::time::timeout_at(deadline, opened.wait_for(Option::is_some)).await;
        let outcome = match outcome {
            Err(_) => return Opened::Failed(PeerFailure::Answer(EtcdError::Timeout)),
            Ok(Err(_)) => Err(Status::unavailable("leader calls stream closed")),
            Ok(Ok(o)) => o.clone().expect("waited for an outcome"),
        };
        match outcome {
            Ok(()) => Opened::Stream(stream),
            Err(status) => {
                self.table.forget(url, &stream);
                if status.code() == Code::Unimplemented {
                    self.table.mark_unary(url);
                    Opened::Unary
                } else if is_transport_failure(&status) {
                    peers.reset(url);
                    Opened::Failed(PeerFailure::NotDelivered)
                } else {
                    // Refused outright (another cluster's member: "cluster ID mismatch"): the
                    // answer a unary RPC would have got. Nothing was sent, so never ambiguous.
                    Opened::Failed(match classify(&status) {
                        PeerFailure::Answer(e) => PeerFailure::Answer(e),
                        PeerFailure::NotDelivered | PeerFailure::Ambiguous => {
                            PeerFailure::NotDelivered
                        }
                    })
                }
            }
        }
    }

    /// Closes the stream to `url` (after a transport failure on its channel): calls waiting
    /// on it fail, and the next call opens a new stream.
    pub fn reset(&self, url: &str) {
        if let Some(s) = self.table.remove(url) {
            s.end(Status::unavailable("leader calls stream reset"));
            if let Some(reader) = s.reader.get() {
                reader.abort();
            }
        }
    }

    /// The live stream to `url`, or a new one whose task (open, then read answers) is spawned
    /// here.
    fn stream(&self, peers: &Peers, url: &str) -> Result<Arc<CallStream>, Status> {
        self.table
            .get_or_open(url, |s| !s.has_ended(), || open(peers, url))
    }
}

/// A new stream to `url` on `peers`' pooled channel; its task opens it and reads its answers.
///
/// Errors: `Unavailable` "bad peer URL ..." when `url` is not one.
fn open(peers: &Peers, url: &str) -> Result<Arc<CallStream>, Status> {
    let mut client = peers
        .client(url)
        .map_err(|e| Status::unavailable(format!("bad peer URL {url}: {e}")))?;
    let (calls, outbound) = mpsc::unbounded_channel();
    let (opened_tx, opened) = watch::channel(None);
    let stream = Arc::new(CallStream {
        opened,
        state: Mutex::new(Pending {
            calls: Some(calls),
            next_seq: 0,
            waiters: HashMap::new(),
        }),
        reader: std::sync::OnceLock::new(),
    });
    let reader = stream.clone();
    let task = tokio::spawn(async move {
        let end = match client
            .leader_calls(UnboundedReceiverStream::new(outbound))
            .await
        {
            Ok(response) => {
                opened_tx.send_replace(Some(Ok(())));
                let mut inbound = response.into_inner();
                loop {
                    match inbound.message().await {
                        Ok(Some(answer)) => reader.answer(answer),
                        Ok(None) => break Status::unavailable("leader calls stream closed"),
                        Err(status) => break status,
                    }
                }
            }
            Err(status) => {
                opened_tx.send_replace(Some(Err(status.clone())));
                status
            }
        };
        reader.end(end);
    });
    let _ = stream.reader.set(task.abort_handle());
    Ok(stream)
}

impl CallStream {
    /// Sends `call` to the leader with `deadline` and waits for its answer.
    ///
    /// Errors: [`CallError::NotSent`] when the stream ended before the call entered it;
    /// [`CallError::Answered`] with the leader's error (code and message of the etcd error it
    /// would have returned on the unary RPC); [`CallError::Failed`] with the status that ended
    /// the stream, or `Cancelled` "Timeout expired" at `deadline`, as a unary RPC's own timeout
    /// (the leader gives up on the call at about the same deadline).
    pub async fn call(
        &self,
        call: peer_call::Call,
        deadline: tokio::time::Instant,
    ) -> Result<peer_answer::Answer, CallError> {
        let timeout_ms = deadline
            .saturating_duration_since(tokio::time::Instant::now())
            .as_millis()
            .try_into()
            .unwrap_or(u32::MAX);
        let (tx, rx) = oneshot::channel();
        let seq = {
            let mut p = self.state.lock().expect("leader calls lock");
            let seq = p.next_seq;
            let Some(calls) = &p.calls else {
                return Err(CallError::NotSent);
            };
            let msg = PeerCall {
                seq,
                timeout_ms,
                call: Some(call),
            };
            if calls.send(msg).is_err() {
                p.calls = None;
                return Err(CallError::NotSent);
            }
            p.next_seq += 1;
            p.waiters.insert(seq, tx);
            seq
        };
        let mut gone = Forget {
            stream: self,
            seq: Some(seq),
        };
        let answer = tokio::time::timeout_at(deadline, rx).await;
        if answer.is_ok() {
            // Answered, or failed by the stream's end: the waiter is gone already.
            gone.seq = None;
        }
        match answer {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(CallError::Failed(Status::unavailable(
                "leader calls stream closed",
            ))),
            // What tonic's client answers when a unary RPC's own timeout passes (`gone`
            // forgets the waiter).
            Err(_) => Err(CallError::Failed(Status::cancelled("Timeout expired"))),
        }
    }

    /// Whether the stream ended (a stream that failed to open ends too, right after it
    /// publishes the failure, which `LeaderCalls::open` reads).
    fn has_ended(&self) -> bool {
        self.state
            .lock()
            .expect("leader calls lock")
            .calls
            .is_none()
    }

    /// Hands an answer to the call with its sequence number (none: the caller gave up).
    fn answer(&self, answer: PeerAnswer) {
        let waiter = self
            .state
            .lock()
            .expect("leader calls lock")
            .waiters
            .remove(&answer.seq);
        if let Some(w) = waiter {
            let answer = match answer.answer {
                Some(peer_answer::Answer::Error(e)) => Err(CallError::Answered(Status::new(
                    Code::from(e.code),
                    e.message,
                ))),
                Some(ok) => Ok(ok),
                None => Err(CallError::Answered(Status::internal(
                    "keel: an empty leader-call answer",
                ))),
            };
            let _ = w.send(answer);
        }
    }

    fn forget(&self, seq: u64) {
        self.state
            .lock()
            .expect("leader calls lock")
            .waiters
            .remove(&seq);
    }

    /// Marks the stream ended and fails every waiting call with `status`.
    fn end(&self, status: Status) {
        let waiters = {
            let mut p = self.state.lock().expect("leader calls lock");
            p.calls = None;
            std::mem::take(&mut p.waiters)
        };
        for (_, w) in waiters {
            let _ = w.send(Err(CallError::Failed(status.clone())));
        }
    }
}

/// Removes a call's waiter if its caller stops waiting before the answer (dropped while `seq`
/// is still set).
struct Forget<'a> {
    stream: &'a CallStream,
    seq: Option<u64>,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        if let Some(seq) = self.seq.take() {
            self.stream.forget(seq);
        }
    }
}
