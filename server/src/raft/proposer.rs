//! Proposal batching: concurrent client requests share one raft entry.
//!
//! Every raft entry costs the leader's core a command round, a log append, a place in an
//! AppendEntries per follower and an apply call. The proposer queues requests and proposes
//! everything that arrived while the previous batches were in flight as one
//! `keelpb.RequestBatch` entry: one append, one share of a group-committed fsync, one
//! replication slot. Apply still gives every request its own revision, in queue order (see
//! `apply::Applier::apply_batch`).
//!
//! Bounds: at most [`MAX_BATCH_REQUESTS`] requests and [`MAX_BATCH_BYTES`] bytes per entry,
//! and at most [`MAX_IN_FLIGHT`] entries proposed at once; a full queue makes callers wait
//! (back-pressure), it never grows without bound.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use keel_proto::keelpb::{RaftRequest, RaftResponse, RequestBatch, raft_request, raft_response};
use prost::Message;
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::trace::Stage;
use crate::error::EtcdError;

/// Most requests in one batch entry.
pub const MAX_BATCH_REQUESTS: usize = 512;
/// Most encoded bytes of requests in one batch entry (a single larger request, up to
/// `--max-request-bytes`, still goes alone).
pub const MAX_BATCH_BYTES: usize = 4 << 20;
/// Most batch entries proposed and not yet applied at once.
pub const MAX_IN_FLIGHT: usize = 4;
/// Queue length before callers wait.
const QUEUE: usize = 8192;

/// Proposes one entry and resolves with its applied result.
pub type ProposeFn = Arc<
    dyn Fn(RaftRequest) -> Pin<Box<dyn Future<Output = Result<RaftResponse, EtcdError>> + Send>>
        + Send
        + Sync,
>;

struct Pending {
    request: RaftRequest,
    bytes: usize,
    /// When it was queued (`trace::start`: 0 when the timeline is off).
    queued_us: u64,
    reply: oneshot::Sender<Result<RaftResponse, EtcdError>>,
}

/// The batching front of a member's raft log.
pub struct Proposer {
    tx: mpsc::Sender<Pending>,
}

impl Proposer {
    /// Starts the batching task; `propose` submits one entry to raft (with forwarding to the
    /// leader and waiting for a leader) and returns its apply result.
    pub fn start(propose: ProposeFn) -> Proposer {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(run(rx, propose));
        Proposer { tx }
    }

    /// Queues `request` for the next batch and waits for its own apply result.
    ///
    /// Errors: those of the proposal (no leader, stopped, ...), or `Stopped` if the member
    /// is shutting down.
    pub async fn propose(&self, request: RaftRequest) -> Result<RaftResponse, EtcdError> {
        let (reply, rx) = oneshot::channel();
        let bytes = request.encoded_len();
        self.tx
            .send(Pending {
                request,
                bytes,
                queued_us: super::trace::start(),
                reply,
            })
            .await
            .map_err(|_| EtcdError::Stopped)?;
        rx.await.unwrap_or(Err(EtcdError::Stopped))
    }

    /// Requests queued and not yet taken into a batch (QoS overload protection reads it).
    pub fn queued(&self) -> u64 {
        (self.tx.max_capacity() - self.tx.capacity()) as u64
    }
}

async fn run(mut rx: mpsc::Receiver<Pending>, propose: ProposeFn) {
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    loop {
        // Wait for a free slot first, so requests keep accumulating while all slots are busy.
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = rx.recv().await else { return };
        let mut bytes = first.bytes;
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH_REQUESTS && bytes < MAX_BATCH_BYTES {
            match rx.try_recv() {
                Ok(p) => {
                    bytes += p.bytes;
                    batch.push(p);
                }
                Err(_) => break,
            }
        }
        let propose = propose.clone();
        tokio::spawn(async move {
            submit(batch, propose).await;
            drop(permit);
        });
    }
}

async fn submit(mut batch: Vec<Pending>, propose: ProposeFn) {
    crate::metrics::keel()
        .proposal_batch_requests
        .observe(batch.len() as f64);
    // The queue is FIFO: the first request waited longest.
    if batch[0].queued_us != 0 {
        let id = batch[0].request.id;
        super::trace::mark_at(Stage::Receive, id, id, 0, batch[0].queued_us);
    }
    if batch.len() == 1 {
        let p = batch.pop().expect("one request");
        let _ = p.reply.send(propose(p.request).await);
        return;
    }
    let (requests, replies): (Vec<_>, Vec<_>) =
        batch.into_iter().map(|p| (p.request, p.reply)).unzip();
    let entry = RaftRequest {
        auth_header: None,
        id: requests[0].id,
        request: Some(raft_request::Request::Batch(RequestBatch { requests })),
    };
    match propose(entry).await {
        Ok(RaftResponse {
            response: Some(raft_response::Response::Batch(b)),
            ..
        }) if b.responses.len() == replies.len() => {
            for (reply, resp) in replies.into_iter().zip(b.responses) {
                let _ = reply.send(into_result(resp));
            }
        }
        Ok(other) => {
            let e = EtcdError::Internal(format!("keel: batch entry answered with {other:?}"));
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}

/// Turns an apply result into the caller's result (apply-time etcd errors become `Err`).
pub fn into_result(resp: RaftResponse) -> Result<RaftResponse, EtcdError> {
    match &resp.response {
        Some(raft_response::Response::Error(e)) => Err(EtcdError::from_parts(e.code, &e.message)),
        _ => Ok(resp),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_proto::etcdserverpb::{PutRequest, PutResponse};
    use keel_proto::keelpb::{ApplyError, ResponseBatch};
    use std::sync::Mutex;

    fn put(i: u64) -> RaftRequest {
        RaftRequest {
            auth_header: None,
            id: i,
            request: Some(raft_request::Request::Put(PutRequest {
                key: format!("k{i}").into_bytes(),
                ..Default::default()
            })),
        }
    }

    /// A fake raft: records entry sizes, answers each request with revision = its id, and
    /// fails request id 3 with an apply error.
    fn fake(entries: Arc<Mutex<Vec<usize>>>) -> ProposeFn {
        fn answer(r: &RaftRequest) -> RaftResponse {
            if r.id == 3 {
                return RaftResponse {
                    revision: 0,
                    response: Some(raft_response::Response::Error(ApplyError {
                        code: tonic::Code::OutOfRange as i32,
                        message: EtcdError::Compacted.to_string(),
                    })),
                };
            }
            RaftResponse {
                revision: r.id as i64,
                response: Some(raft_response::Response::Put(PutResponse::default())),
            }
        }
        Arc::new(move |req: RaftRequest| {
            let entries = entries.clone();
            Box::pin(async move {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                match &req.request {
                    Some(raft_request::Request::Batch(b)) => {
                        entries.lock().unwrap().push(b.requests.len());
                        let responses = b.requests.iter().map(answer).collect();
                        Ok(RaftResponse {
                            revision: 0,
                            response: Some(raft_response::Response::Batch(ResponseBatch {
                                responses,
                            })),
                        })
                    }
                    _ => {
                        entries.lock().unwrap().push(1);
                        into_result(answer(&req))
                    }
                }
            })
        })
    }

    #[tokio::test]
    async fn concurrent_requests_share_entries_and_get_their_own_results() {
        let entries = Arc::new(Mutex::new(Vec::new()));
        let proposer = Arc::new(Proposer::start(fake(entries.clone())));
        let mut tasks = Vec::new();
        for i in 0..200u64 {
            let p = proposer.clone();
            tasks.push(tokio::spawn(async move { (i, p.propose(put(i)).await) }));
        }
        for t in tasks {
            let (i, res) = t.await.unwrap();
            if i == 3 {
                assert_eq!(res.unwrap_err(), EtcdError::Compacted);
            } else {
                assert_eq!(
                    res.unwrap().revision,
                    i as i64,
                    "request {i} got its own result"
                );
            }
        }
        let entries = entries.lock().unwrap();
        assert_eq!(
            entries.iter().sum::<usize>(),
            200,
            "every request proposed exactly once"
        );
        assert!(
            entries.len() < 50,
            "200 concurrent requests went out in {} entries",
            entries.len()
        );
    }
}
