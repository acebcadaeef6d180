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
//!
//! **One forwarding hop.** Every member runs a proposer, and a follower's entries go to the
//! leader (`keelpb.Peer/Forward`), whose proposer batches them with its own. An entry that
//! holds forwarded requests is proposed with [`Route::LeaderOnly`]: it is never forwarded a
//! second time. If this member no longer leads (a leadership transfer or an election
//! happened while the entry waited), the forwarded requests are answered `NotLeader` (their
//! member asks the new leader itself) and this member's own requests go on in an entry of
//! their own. Forwarding them again would let two members' in-flight slots wait on each
//! other: the new leader's slots held by forwards to the old leader, whose slots hold
//! forwards to the new one, until the request deadline (found by a fresh-user check:
//! `move-leader` under load left requests hanging for the full 7 s).
//!
//! For the same reason a forwarded batch still waiting in the queue when this member stops
//! leading is withdrawn and answered `NotLeader` at once, rather than waiting for a slot
//! behind this member's own forwards. A claim decides, exactly once, whether the batch is
//! withdrawn or taken into an entry, so a withdrawn batch is never proposed.
//!
//! **The request timeout counts from arrival**, as etcd's does: a client request waits for
//! its answer at most the request timeout from the moment it is queued, including the time
//! it waits for a slot. One still queued then is withdrawn (never proposed) and answered
//! etcd's `request timed out`. Otherwise entries that cannot commit (a leader without a
//! quorum) held every slot for a timeout each, and a request queued behind them waited for
//! that, then for a timeout of its own: a fresh-user check saw a put hang past its client's
//! 10 s deadline where etcd answers at 7 s.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

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

/// Where an entry may be proposed (see "One forwarding hop" above).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Here if this member leads, else forwarded to the leader: an entry of this member's
    /// own requests only.
    Anywhere,
    /// Here, and only while this member leads: an entry holding requests that another member
    /// forwarded.
    LeaderOnly,
}

/// A proposal that produced no result.
#[derive(Debug)]
pub enum Refused {
    /// It failed; the error is every request's answer.
    Failed(EtcdError),
    /// [`Route::LeaderOnly`] on a member that does not lead: nothing was proposed, and the
    /// entry comes back whole.
    NotLeader(RaftRequest),
}

impl From<EtcdError> for Refused {
    fn from(e: EtcdError) -> Refused {
        Refused::Failed(e)
    }
}

/// Proposes one entry along a [`Route`] and resolves with its applied result and its raft
/// log index (a single request's apply-time error as `Err`, as [`into_result`] makes it).
pub type ProposeFn = Arc<
    dyn Fn(
            RaftRequest,
            Route,
        ) -> Pin<Box<dyn Future<Output = Result<(RaftResponse, u64), Refused>> + Send>>
        + Send
        + Sync,
>;

/// A forwarded batch's apply results, one per request in its order (apply-time errors
/// included, as `Response::Error`), and the log index of the entry that carried them.
pub type Forwarded = (Vec<RaftResponse>, u64);

/// Where a queued unit's result goes.
enum Reply {
    /// One client request of this member: its own result.
    One(oneshot::Sender<Result<RaftResponse, EtcdError>>),
    /// A batch a follower forwarded (`keelpb.Peer/Forward`): its requests stay together,
    /// in order, inside one entry.
    Many(oneshot::Sender<Result<Forwarded, EtcdError>>),
}

/// A unit of the queue: one request, or a forwarded batch's requests.
struct Pending {
    requests: Vec<RaftRequest>,
    bytes: usize,
    /// When it was queued (`trace::start`: 0 when the timeline is off).
    queued_us: u64,
    reply: Reply,
    /// Its caller's claim (see [`Claim`]): a forwarded batch, or a request whose caller
    /// may time out; `None`: always taken.
    claim: Option<Arc<Claim>>,
}

impl Pending {
    /// Claims the unit for an entry: `false` if its caller withdrew it first.
    fn take(&self) -> bool {
        self.claim.as_ref().is_none_or(|c| c.settle(TAKEN))
    }
}

/// Decides, exactly once, whether a queued unit is taken into an entry (which then answers
/// it) or withdrawn by its caller (and never proposed).
struct Claim(AtomicU8);

const QUEUED: u8 = 0;
const TAKEN: u8 = 1;
const WITHDRAWN: u8 = 2;

impl Claim {
    fn new() -> Claim {
        Claim(AtomicU8::new(QUEUED))
    }

    /// Moves a queued claim to `to` ([`TAKEN`] or [`WITHDRAWN`]); `false` if it was settled
    /// already.
    fn settle(&self, to: u8) -> bool {
        self.0
            .compare_exchange(QUEUED, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// The batching front of a member's raft log.
pub struct Proposer {
    tx: mpsc::Sender<Pending>,
    /// How long a client request may wait for its answer, from arrival (etcd's request
    /// timeout: 5 s plus two election timeouts).
    request_timeout: Duration,
}

impl Proposer {
    /// Starts the batching task; `propose` submits one entry to raft (forwarding it to the
    /// leader, or waiting for one, as its [`Route`] allows) and returns its apply result and
    /// log index. A request of [`Proposer::propose`] is answered within `request_timeout`.
    pub fn start(propose: ProposeFn, request_timeout: Duration) -> Proposer {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(run(rx, propose));
        Proposer {
            tx,
            request_timeout,
        }
    }

    /// Queues `request` for the next batch and waits for its own apply result.
    ///
    /// Errors: those of the proposal (no leader, stopped, ...); `Stopped` if the member is
    /// shutting down; `Timeout` once the request timeout passed since the call (module
    /// docs): a request still queued then is never proposed, one in an entry may still be
    /// applied (as a write etcd answers `request timed out` may be).
    pub async fn propose(&self, request: RaftRequest) -> Result<RaftResponse, EtcdError> {
        let deadline = tokio::time::Instant::now() + self.request_timeout;
        let (reply, mut rx) = oneshot::channel();
        let claim = Arc::new(Claim::new());
        let queued = self.queue(vec![request], Reply::One(reply), Some(claim.clone()));
        tokio::time::timeout_at(deadline, queued)
            .await
            .map_err(|_| EtcdError::Timeout)??;
        tokio::select! {
            biased;
            answer = &mut rx => return answer.unwrap_or(Err(EtcdError::Stopped)),
            () = tokio::time::sleep_until(deadline) => {}
        }
        claim.settle(WITHDRAWN);
        Err(EtcdError::Timeout)
    }

    /// Queues the requests of a batch another member forwarded, to share an entry with
    /// this member's own requests and other forwarded batches (one entry per batch made the
    /// leader of a cluster whose clients spread over all members append 2.7× the entries
    /// of one whose clients talk to the leader; docs/benchmarks.md). Waits for their apply
    /// results, in order, and the entry's log index. When `stepped_down` resolves (this
    /// member no longer leads) while the batch still waits in the queue, withdraws it.
    ///
    /// Errors: `NotLeader` for a withdrawn batch, or one whose entry found this member no
    /// longer leading (never proposed either way); otherwise as [`Proposer::propose`];
    /// apply-time errors are results, not errors.
    pub async fn propose_forwarded(
        &self,
        requests: Vec<RaftRequest>,
        stepped_down: impl Future<Output = ()>,
    ) -> Result<Forwarded, EtcdError> {
        let (reply, mut rx) = oneshot::channel();
        let claim = Arc::new(Claim::new());
        self.queue(requests, Reply::Many(reply), Some(claim.clone()))
            .await?;
        tokio::select! {
            answer = &mut rx => return answer.unwrap_or(Err(EtcdError::Stopped)),
            () = stepped_down => {}
        }
        if claim.settle(WITHDRAWN) {
            return Err(EtcdError::NotLeader);
        }
        // Already in an entry: that entry answers (`NotLeader` if it is refused).
        rx.await.unwrap_or(Err(EtcdError::Stopped))
    }

    async fn queue(
        &self,
        requests: Vec<RaftRequest>,
        reply: Reply,
        claim: Option<Arc<Claim>>,
    ) -> Result<(), EtcdError> {
        let bytes = requests.iter().map(Message::encoded_len).sum();
        self.tx
            .send(Pending {
                requests,
                bytes,
                queued_us: super::trace::start(),
                reply,
                claim,
            })
            .await
            .map_err(|_| EtcdError::Stopped)
    }

    /// Units (requests or forwarded batches) queued and not yet taken into a batch (QoS
    /// overload protection reads it).
    pub fn queued(&self) -> u64 {
        (self.tx.max_capacity() - self.tx.capacity()) as u64
    }
}

async fn run(mut rx: mpsc::Receiver<Pending>, propose: ProposeFn) {
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    // A unit that did not fit in the previous batch: it opens the next one.
    let mut carried: Option<Pending> = None;
    loop {
        // Wait for a free slot first, so requests keep accumulating while all slots are busy.
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let first = match carried.take() {
            Some(p) => p,
            None => loop {
                match rx.recv().await {
                    Some(p) if p.take() => break p,
                    Some(_withdrawn) => {}
                    None => return,
                }
            },
        };
        let mut requests = first.requests.len();
        let mut bytes = first.bytes;
        let mut batch = vec![first];
        while requests < MAX_BATCH_REQUESTS && bytes < MAX_BATCH_BYTES {
            match rx.try_recv() {
                Ok(p) if !p.take() => {}
                Ok(p) => {
                    // A unit is never split: one that would overflow the bounds waits.
                    if requests + p.requests.len() > MAX_BATCH_REQUESTS
                        || bytes + p.bytes > MAX_BATCH_BYTES
                    {
                        carried = Some(p);
                        break;
                    }
                    requests += p.requests.len();
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

async fn submit(batch: Vec<Pending>, propose: ProposeFn) {
    let total: usize = batch.iter().map(|p| p.requests.len()).sum();
    crate::metrics::keel()
        .proposal_batch_requests
        .observe(total as f64);
    // The queue is FIFO: the first request waited longest.
    if batch[0].queued_us != 0 {
        let id = batch[0].requests[0].id;
        super::trace::mark_at(Stage::Receive, id, id, 0, batch[0].queued_us);
    }
    let route = if batch.iter().any(|p| matches!(p.reply, Reply::Many(_))) {
        Route::LeaderOnly
    } else {
        Route::Anywhere
    };
    if let Some(own) = propose_units(batch, route, &propose).await {
        // This member stopped leading: its own requests go to the leader, alone.
        propose_units(own, Route::Anywhere, &propose).await;
    }
}

/// Proposes `batch` as one entry along `route` and answers every unit. When a
/// [`Route::LeaderOnly`] entry is refused, answers the forwarded units `NotLeader` and returns
/// this member's own units, unproposed (`None` if there are none).
async fn propose_units(
    mut batch: Vec<Pending>,
    route: Route,
    propose: &ProposeFn,
) -> Option<Vec<Pending>> {
    if let [
        Pending {
            reply: Reply::One(_),
            ..
        },
    ] = batch.as_slice()
    {
        // One request of this member alone: proposed as itself. (A forwarded unit always
        // goes in a batch entry, so its apply errors come back as results.)
        let p = batch.pop().expect("one unit");
        let request = p.requests.into_iter().next().expect("one request");
        let result = match propose(request, Route::Anywhere).await {
            Ok((resp, _)) => Ok(resp),
            Err(Refused::Failed(e)) => Err(e),
            Err(Refused::NotLeader(_)) => Err(EtcdError::NotLeader),
        };
        if let Reply::One(reply) = p.reply {
            let _ = reply.send(result);
        }
        return None;
    }
    let total: usize = batch.iter().map(|p| p.requests.len()).sum();
    let mut requests = Vec::with_capacity(total);
    let mut replies = Vec::with_capacity(batch.len());
    for p in batch {
        replies.push((p.requests.len(), p.reply));
        requests.extend(p.requests);
    }
    let entry = RaftRequest {
        auth_header: None,
        id: requests[0].id,
        request: Some(raft_request::Request::Batch(RequestBatch { requests })),
    };
    match propose(entry, route).await {
        Ok((
            RaftResponse {
                response: Some(raft_response::Response::Batch(b)),
                ..
            },
            index,
        )) if b.responses.len() == total => {
            let mut responses = b.responses.into_iter();
            for (n, reply) in replies {
                match reply {
                    Reply::One(reply) => {
                        let resp = responses.next().expect("one response per request");
                        let _ = reply.send(into_result(resp));
                    }
                    Reply::Many(reply) => {
                        let _ = reply.send(Ok((responses.by_ref().take(n).collect(), index)));
                    }
                }
            }
        }
        Ok((other, _)) => {
            let e = EtcdError::Internal(format!("keel: batch entry answered with {other:?}"));
            replies.into_iter().for_each(|(_, r)| r.fail(&e));
        }
        Err(Refused::Failed(e)) => replies.into_iter().for_each(|(_, r)| r.fail(&e)),
        Err(Refused::NotLeader(entry)) => return split_refused(entry, replies),
    }
    None
}

/// Takes a refused batch entry apart: forwarded units are answered `NotLeader`, this
/// member's own come back as units of one request each (`None` if there are none).
fn split_refused(entry: RaftRequest, replies: Vec<(usize, Reply)>) -> Option<Vec<Pending>> {
    let Some(raft_request::Request::Batch(batch)) = entry.request else {
        let e = EtcdError::Internal("keel: a refused batch entry came back changed".into());
        replies.into_iter().for_each(|(_, r)| r.fail(&e));
        return None;
    };
    let mut requests = batch.requests.into_iter();
    let mut own = Vec::new();
    for (n, reply) in replies {
        match reply {
            Reply::Many(_) => {
                requests.by_ref().take(n).for_each(drop);
                reply.fail(&EtcdError::NotLeader);
            }
            Reply::One(_) => {
                let Some(request) = requests.next() else {
                    reply.fail(&EtcdError::Internal(
                        "keel: a refused batch entry came back short".into(),
                    ));
                    continue;
                };
                own.push(Pending {
                    bytes: request.encoded_len(),
                    requests: vec![request],
                    queued_us: 0,
                    reply,
                    claim: None,
                });
            }
        }
    }
    (!own.is_empty()).then_some(own)
}

impl Reply {
    /// Answers the unit with `e` (the whole entry failed).
    fn fail(self, e: &EtcdError) {
        // A caller that gave up dropped its receiver: nothing to answer.
        match self {
            Reply::One(reply) => drop(reply.send(Err(e.clone()))),
            Reply::Many(reply) => drop(reply.send(Err(e.clone()))),
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

    /// The request ids of an entry and an answer that gives each request revision = its id
    /// (a single request: the entry's own revision; a batch: one response per request).
    fn echo(req: &RaftRequest) -> (Vec<u64>, RaftResponse) {
        let put = |id: u64| RaftResponse {
            revision: id as i64,
            response: Some(raft_response::Response::Put(PutResponse::default())),
        };
        match &req.request {
            Some(raft_request::Request::Batch(b)) => {
                let ids: Vec<u64> = b.requests.iter().map(|r| r.id).collect();
                let responses = ids.iter().map(|&id| put(id)).collect();
                let batch = RaftResponse {
                    revision: 0,
                    response: Some(raft_response::Response::Batch(ResponseBatch { responses })),
                };
                (ids, batch)
            }
            _ => (vec![req.id], put(req.id)),
        }
    }

    /// A fake raft: records the request ids of each entry (its log index is its position,
    /// from 1), answers each request with revision = its id, and fails request id 3 with an
    /// apply error.
    fn fake(entries: Arc<Mutex<Vec<Vec<u64>>>>) -> ProposeFn {
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
        Arc::new(move |req: RaftRequest, _route: Route| {
            let entries = entries.clone();
            Box::pin(async move {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                let mut entries = entries.lock().unwrap();
                match &req.request {
                    Some(raft_request::Request::Batch(b)) => {
                        entries.push(b.requests.iter().map(|r| r.id).collect());
                        let responses = b.requests.iter().map(answer).collect();
                        let resp = RaftResponse {
                            revision: 0,
                            response: Some(raft_response::Response::Batch(ResponseBatch {
                                responses,
                            })),
                        };
                        Ok((resp, entries.len() as u64))
                    }
                    _ => {
                        entries.push(vec![req.id]);
                        let index = entries.len() as u64;
                        Ok((into_result(answer(&req))?, index))
                    }
                }
            })
        })
    }

    #[tokio::test]
    async fn concurrent_requests_share_entries_and_get_their_own_results() {
        let entries = Arc::new(Mutex::new(Vec::new()));
        let proposer = Arc::new(Proposer::start(fake(entries.clone()), LONG));
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
            entries.iter().map(Vec::len).sum::<usize>(),
            200,
            "every request proposed exactly once"
        );
        assert!(
            entries.len() < 50,
            "200 concurrent requests went out in {} entries",
            entries.len()
        );
    }

    /// Forwarded batches (ids from 1000 up, 100 per batch) and this member's own requests
    /// (ids below 200) share entries; a batch is never split, its results come back in
    /// order with apply errors as results, with the index of the entry that carried it.
    #[tokio::test]
    async fn forwarded_batches_share_entries_whole_and_keep_their_order() {
        let entries = Arc::new(Mutex::new(Vec::new()));
        let proposer = Arc::new(Proposer::start(fake(entries.clone()), LONG));
        let mut own = Vec::new();
        for i in 0..200u64 {
            let p = proposer.clone();
            own.push(tokio::spawn(async move { (i, p.propose(put(i)).await) }));
        }
        let mut forwarded = Vec::new();
        for b in 0..12u64 {
            let mut ids: Vec<u64> = (0..100).map(|k| 1000 + b * 100 + k).collect();
            if b == 0 {
                ids[50] = 3; // fails at apply, inside the batch
            }
            let p = proposer.clone();
            forwarded.push(tokio::spawn(async move {
                let reqs = ids.iter().map(|&i| put(i)).collect();
                (ids, p.propose_forwarded(reqs, std::future::pending()).await)
            }));
        }
        for t in own {
            let (i, res) = t.await.unwrap();
            if i == 3 {
                assert_eq!(res.unwrap_err(), EtcdError::Compacted);
            } else {
                assert_eq!(res.unwrap().revision, i as i64);
            }
        }
        let mut answered = Vec::new();
        for t in forwarded {
            answered.push(t.await.unwrap());
        }
        // Only now is every entry proposed.
        let entries = entries.lock().unwrap().clone();
        for (ids, res) in answered {
            let (responses, index) = res.expect("a forwarded batch is answered");
            assert_eq!(responses.len(), ids.len());
            for (id, resp) in ids.iter().zip(&responses) {
                match &resp.response {
                    Some(raft_response::Response::Error(e)) => {
                        assert_eq!(*id, 3);
                        assert_eq!(e.message, EtcdError::Compacted.to_string());
                    }
                    _ => assert_eq!(resp.revision, *id as i64),
                }
            }
            let entry = &entries[index as usize - 1];
            let at = entry
                .iter()
                .position(|i| *i == ids[0])
                .expect("the batch is in the entry of its index");
            assert_eq!(&entry[at..at + ids.len()], &ids[..], "whole and in order");
        }
        assert_eq!(
            entries.iter().map(Vec::len).sum::<usize>(),
            200 + 1200,
            "every request proposed exactly once"
        );
        assert!(entries.iter().all(|e| e.len() <= MAX_BATCH_REQUESTS));
        assert!(
            entries.len() < 40,
            "1,400 requests went out in {} entries",
            entries.len()
        );
    }

    /// A member that stopped leading: it refuses every `LeaderOnly` entry and forwards
    /// `Anywhere` ones (recorded, answered revision = id). Forwarded batches (ids from 1000)
    /// are answered `NotLeader` and never proposed again; this member's own requests (ids
    /// below 100) are each proposed exactly once, in entries without forwarded requests.
    #[tokio::test]
    async fn a_member_that_stopped_leading_sends_forwarded_requests_back_and_its_own_on() {
        type Log = Mutex<Vec<(Route, Vec<u64>)>>;
        let proposed: Arc<Log> = Arc::default();
        let log = proposed.clone();
        let follower: ProposeFn = Arc::new(move |req: RaftRequest, route: Route| {
            let log = log.clone();
            Box::pin(async move {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                let (ids, answer) = echo(&req);
                log.lock().unwrap().push((route, ids));
                if route == Route::LeaderOnly {
                    return Err(Refused::NotLeader(req));
                }
                Ok((answer, 7))
            })
        });
        let proposer = Arc::new(Proposer::start(follower, LONG));
        let mut own = Vec::new();
        let mut forwarded = Vec::new();
        for i in 0..100u64 {
            let p = proposer.clone();
            own.push(tokio::spawn(async move { (i, p.propose(put(i)).await) }));
            if i % 10 == 0 {
                let p = proposer.clone();
                let reqs = (0..5).map(|k| put(1000 + i * 10 + k)).collect();
                forwarded.push(tokio::spawn(async move {
                    p.propose_forwarded(reqs, std::future::pending()).await
                }));
            }
        }
        for t in own {
            let (i, res) = t.await.unwrap();
            assert_eq!(res.expect("an own request is answered").revision, i as i64);
        }
        for t in forwarded {
            assert_eq!(t.await.unwrap().unwrap_err(), EtcdError::NotLeader);
        }
        let proposed = proposed.lock().unwrap();
        let mut own_ids: Vec<u64> = Vec::new();
        for (route, ids) in proposed.iter() {
            let has_forwarded = ids.iter().any(|id| *id >= 1000);
            match route {
                Route::LeaderOnly => {
                    assert!(has_forwarded, "LeaderOnly without forwarded: {ids:?}")
                }
                Route::Anywhere => {
                    assert!(
                        !has_forwarded,
                        "a forwarded request was forwarded again: {ids:?}"
                    );
                    own_ids.extend(ids);
                }
            }
        }
        own_ids.sort_unstable();
        assert_eq!(
            own_ids,
            (0..100).collect::<Vec<_>>(),
            "each own request forwarded once"
        );
        assert!(
            proposed.iter().any(|(r, _)| *r == Route::LeaderOnly),
            "the test mixed forwarded and own requests in an entry"
        );
    }

    /// All slots busy (their entries blocked) and a forwarded batch queued behind them: when
    /// this member steps down the batch is withdrawn and answered `NotLeader` at once, and
    /// once the slots free up it is never proposed; a batch queued later still is.
    #[tokio::test]
    async fn a_queued_forwarded_batch_is_withdrawn_when_this_member_steps_down() {
        let (blocked, release, proposed) = gated();
        let proposer = Arc::new(Proposer::start(blocked, LONG));
        let mut own = Vec::new();
        for i in 0..MAX_IN_FLIGHT as u64 {
            let p = proposer.clone();
            own.push(tokio::spawn(async move { p.propose(put(i)).await }));
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let (step_down, stepped_down) = oneshot::channel::<()>();
        let p = proposer.clone();
        let withdrawn = tokio::spawn(async move {
            let stepped_down = async {
                let _ = stepped_down.await;
            };
            p.propose_forwarded(vec![put(1000), put(1001)], stepped_down)
                .await
        });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!withdrawn.is_finished(), "the batch waits for a slot");
        step_down.send(()).unwrap();
        let answer = tokio::time::timeout(std::time::Duration::from_secs(5), withdrawn)
            .await
            .expect("withdrawn at once, with every slot still busy")
            .unwrap();
        assert_eq!(answer.unwrap_err(), EtcdError::NotLeader);

        let p = proposer.clone();
        let later = tokio::spawn(async move {
            p.propose_forwarded(vec![put(2000)], std::future::pending())
                .await
        });
        release.add_permits(100);
        for (i, t) in own.into_iter().enumerate() {
            assert_eq!(t.await.unwrap().unwrap().revision, i as i64);
        }
        let (responses, _) = later.await.unwrap().expect("a later batch is proposed");
        assert_eq!(responses[0].revision, 2000);
        let mut proposed = proposed.lock().unwrap().clone();
        proposed.sort_unstable();
        assert_eq!(
            proposed,
            [0, 1, 2, 3, 2000],
            "the withdrawn batch was never proposed"
        );
    }

    /// A request timeout no test reaches.
    const LONG: Duration = Duration::from_secs(60);

    /// A propose function whose entries record their request IDs when proposed, then wait
    /// for a permit of the returned semaphore before answering (echoes).
    fn gated() -> (ProposeFn, Arc<Semaphore>, Arc<Mutex<Vec<u64>>>) {
        let release = Arc::new(Semaphore::new(0));
        let proposed: Arc<Mutex<Vec<u64>>> = Arc::default();
        let (gate, log) = (release.clone(), proposed.clone());
        let propose: ProposeFn = Arc::new(move |req: RaftRequest, _route: Route| {
            let (gate, log) = (gate.clone(), log.clone());
            Box::pin(async move {
                let (ids, answer) = echo(&req);
                log.lock().unwrap().extend(&ids);
                let _ = gate.acquire().await.unwrap();
                Ok((answer, 1))
            })
        });
        (propose, release, proposed)
    }

    /// Every slot held by entries that never commit (a leader without a quorum): each
    /// request, those in the entries and one queued behind them, is answered `Timeout` once
    /// the request timeout passed since its call, and the queued one is never proposed.
    #[tokio::test]
    async fn the_request_timeout_counts_from_arrival_and_a_queued_request_is_withdrawn() {
        let (blocked, release, proposed) = gated();
        let timeout = Duration::from_millis(300);
        let proposer = Arc::new(Proposer::start(blocked, timeout));
        let mut calls = Vec::new();
        for i in 0..=MAX_IN_FLIGHT as u64 {
            let p = proposer.clone();
            calls.push(tokio::spawn(async move {
                let called = tokio::time::Instant::now();
                (p.propose(put(i)).await, called.elapsed())
            }));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for call in calls {
            let (answer, waited) = tokio::time::timeout(Duration::from_secs(5), call)
                .await
                .expect("answered while the entries still hold every slot")
                .unwrap();
            assert_eq!(answer.unwrap_err(), EtcdError::Timeout);
            assert!(
                waited >= timeout && waited < 2 * timeout,
                "answered {waited:?} after the call"
            );
        }
        release.add_permits(100);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            *proposed.lock().unwrap(),
            [0, 1, 2, 3],
            "the request queued behind the slots was never proposed"
        );
    }
}
