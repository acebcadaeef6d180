//! Lease calls that only the leader can answer, because only it holds deadlines: a
//! keepalive ([`renew`]) and TimeToLive's remaining TTL ([`time_to_live`]).
//!
//! On the leader they run against the local [`crate::lease::Lessor`]; on a follower they
//! are forwarded to the leader over the peer protocol (`keelpb.Peer/LeaseRenew`,
//! `LeaseTimeToLive`; etcd forwards both to the leader over HTTP the same way), on the
//! member's pooled peer connection to the leader (`raft::peers`), like every peer RPC. A
//! member that just won an election answers once its schedule is built (it has applied its
//! term's first entry). Every wait is bounded by etcd's request timeout.

use std::future::Future;
use std::time::Duration;

use keel_proto::etcdserverpb::{
    LeaseCheckpoint, LeaseCheckpointRequest, LeaseKeepAliveRequest, LeaseTimeToLiveRequest,
    LeaseTimeToLiveResponse,
};
use keel_proto::keelpb::raft_request::Request as Rq;
use keel_proto::keelpb::{peer_answer, peer_call};
use tokio::time::Instant;

use crate::error::EtcdError;
use crate::lease::{LeaseId, Remaining, Renewal};
use crate::node::Node;
use crate::raft::leader_calls::{CallError, Opened};
use crate::raft::peers::{PeerFailure, is_transport_failure, leader_url};

/// Longest pause between two attempts of a leader-only call.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Where a leader-only call goes now.
enum Route {
    Local,
    Remote(String),
    NoLeader,
}

fn route(node: &Node) -> Route {
    match leader_url(&node.raft) {
        // A leader that no quorum acknowledged for an election timeout counts as none, as an
        // etcd leader demotes its lessor when CheckQuorum steps it down: a keepalive answered
        // there would tell a client its lease lives while a majority elsewhere may expire it.
        (Some(l), _) if l == node.id && node.cluster.leads_without_quorum() => Route::NoLeader,
        (Some(l), _) if l == node.id => Route::Local,
        // The pool dials the leader where `--experimental-peer-dial-override` says.
        (Some(_), Some(url)) => Route::Remote(url),
        _ => Route::NoLeader,
    }
}

/// Pauses a retry until the raft metrics change (e.g. a leader is elected) or 100 ms pass.
///
/// Errors: at `deadline`, `NoLeader` if no leader is known, else `Timeout`; `Stopped` on
/// shutdown.
async fn pause(node: &Node, deadline: Instant) -> Result<(), EtcdError> {
    let mut metrics = node.raft.metrics();
    let wake = (Instant::now() + RETRY_PAUSE).min(deadline);
    if let Ok(Err(_)) = tokio::time::timeout_at(wake, metrics.changed()).await {
        return Err(EtcdError::Stopped);
    }
    if Instant::now() >= deadline {
        return Err(if metrics.borrow().current_leader.is_none() {
            EtcdError::NoLeader
        } else {
            EtcdError::Timeout
        });
    }
    Ok(())
}

/// Renews lease `id` and returns its TTL in seconds, 0 if the lease does not exist or has
/// expired (etcd `LeaseKeepAlive`). See the module docs.
///
/// Errors: `NoLeader`/`Timeout` if no leader answers within the request timeout,
/// `Stopped` on shutdown, or the error of committing a clearing checkpoint.
pub async fn renew(node: &Node, id: LeaseId) -> Result<i64, EtcdError> {
    on_leader(
        node,
        |deadline| renew_local(node, id, deadline),
        |url, deadline| async move { forward_renew(node, &url, id, deadline).await },
    )
    .await
}

/// Runs a leader-only call until it gets an answer within the request timeout: `local` with
/// the deadline on the leader, `remote` with the leader's peer URL and the deadline
/// elsewhere; `NotLeader` (no leader known, or it moved) pauses and tries again.
async fn on_leader<T, L, LF, R, RF>(node: &Node, local: L, remote: R) -> Result<T, EtcdError>
where
    L: Fn(Instant) -> LF,
    LF: Future<Output = Result<T, EtcdError>>,
    R: Fn(String, Instant) -> RF,
    RF: Future<Output = Result<T, EtcdError>>,
{
    let deadline = Instant::now() + node.request_timeout();
    loop {
        let attempt = match route(node) {
            Route::Local => local(deadline).await,
            Route::Remote(url) => remote(url, deadline).await,
            Route::NoLeader => Err(EtcdError::NotLeader),
        };
        match attempt {
            Err(EtcdError::NotLeader) => pause(node, deadline).await?,
            other => return other,
        }
    }
}

/// Renews `id` on this member, which must be the leader. Waits for the schedule if the
/// member was just elected, and for the revocation if the lease already expired.
///
/// Errors: `NotLeader` if this member does not lead (any more); `Timeout` at `deadline`.
pub async fn renew_local(node: &Node, id: LeaseId, deadline: Instant) -> Result<i64, EtcdError> {
    loop {
        let mut changes = node.lessor.changes();
        match node.lessor.renew(id) {
            Renewal::Renewed {
                ttl,
                clear_checkpoint,
            } => {
                if clear_checkpoint {
                    let cp = LeaseCheckpoint {
                        id,
                        remaining_ttl: 0,
                    };
                    let req = Rq::LeaseCheckpoint(LeaseCheckpointRequest {
                        checkpoints: vec![cp],
                    });
                    node.propose(req).await?;
                }
                return Ok(ttl);
            }
            Renewal::NotFound => return Ok(0),
            Renewal::NotPrimary if !node.cluster.is_leader() => return Err(EtcdError::NotLeader),
            Renewal::NotPrimary | Renewal::Expired => {}
        }
        // Expired (its revocation is pending) or elected but not yet primary.
        wait_for_lessor(&mut changes, deadline).await?;
    }
}

/// Waits until the lessor changes (`changes`, from [`crate::lease::Lessor::changes`]) or
/// 100 ms pass, so the caller re-checks leadership at least that often.
///
/// Errors: `Timeout` once `deadline` has passed.
async fn wait_for_lessor(
    changes: &mut tokio::sync::watch::Receiver<u64>,
    deadline: Instant,
) -> Result<(), EtcdError> {
    let wake = (Instant::now() + RETRY_PAUSE).min(deadline);
    let _ = tokio::time::timeout_at(wake, changes.changed()).await;
    if Instant::now() >= deadline {
        return Err(EtcdError::Timeout);
    }
    Ok(())
}

async fn forward_renew(
    node: &Node,
    url: &str,
    id: LeaseId,
    deadline: Instant,
) -> Result<i64, EtcdError> {
    let call = peer_call::Call::LeaseRenew(LeaseKeepAliveRequest { id });
    match on_stream(node, url, "keepalive", call, deadline).await {
        Some(Ok(peer_answer::Answer::LeaseRenew(r))) => return Ok(r.ttl),
        Some(Ok(_)) => return Err(wrong_answer("keepalive")),
        Some(Err(e)) => return Err(e),
        None => {}
    }
    let mut req = tonic::Request::new(LeaseKeepAliveRequest { id });
    req.set_timeout(deadline.saturating_duration_since(Instant::now()));
    let answer = peer_client(node, url)?.lease_renew(req).await;
    forwarded(node, url, "keepalive", answer.map(|r| r.into_inner().ttl))
}

/// Sends `call` to the leader at `url` on this member's leader-call stream
/// (`raft::leader_calls`); `None` when the leader does not serve the stream (0.1.0): send the
/// unary RPC instead. A call the leader may not have got reads as `NotLeader`, so the caller
/// asks again (a renewal and a TimeToLive may be repeated).
///
/// Errors: the leader's answer, as [`forwarded`] reads it; `NotLeader` for a stream that
/// could not be opened or had ended; `Timeout` at `deadline`.
async fn on_stream(
    node: &Node,
    url: &str,
    what: &str,
    call: peer_call::Call,
    deadline: Instant,
) -> Option<Result<peer_answer::Answer, EtcdError>> {
    let peers = &node.cluster.peers;
    let stream = match peers.leader_calls().open(peers, url, deadline).await {
        Opened::Stream(stream) => stream,
        Opened::Unary => return None,
        Opened::Failed(PeerFailure::Answer(e)) => return Some(Err(e)),
        Opened::Failed(_) => return Some(Err(EtcdError::NotLeader)),
    };
    Some(match stream.call(call, deadline).await {
        Ok(answer) => Ok(answer),
        Err(CallError::NotSent) => Err(EtcdError::NotLeader),
        // An answer: the stream works, nothing to reset.
        Err(CallError::Answered(status)) => Err(lease_error(url, what, &status)),
        Err(CallError::Failed(status)) => forwarded(node, url, what, Err(status)),
    })
}

fn wrong_answer(what: &str) -> EtcdError {
    EtcdError::Internal(format!(
        "keel: the leader answered a lease {what} with another kind of answer"
    ))
}

/// A client on the pooled peer connection to `url`.
///
/// Errors: `Internal` for a URL that is not one (the leader's entry is corrupt).
fn peer_client(node: &Node, url: &str) -> Result<crate::raft::peers::PeerRpcClient, EtcdError> {
    node.cluster
        .peers
        .client(url)
        .map_err(|e| EtcdError::Internal(format!("bad leader peer URL {url}: {e}")))
}

/// The result of a call forwarded to the leader at `url`: `Unavailable` (the leader is gone
/// or busy) becomes `NotLeader`, so the caller retries with the leader raft knows then; a
/// broken connection is dropped from the pool so the retry reconnects.
fn forwarded<T>(
    node: &Node,
    url: &str,
    what: &str,
    answer: Result<T, tonic::Status>,
) -> Result<T, EtcdError> {
    match answer {
        Ok(v) => Ok(v),
        Err(s) => {
            if is_transport_failure(&s) {
                node.cluster.peers.reset(url);
            }
            Err(lease_error(url, what, &s))
        }
    }
}

/// The error a lease call the leader at `url` failed with reports: `Unavailable` (the leader
/// is gone or busy) becomes `NotLeader`, so the caller retries with the leader raft knows
/// then; otherwise the status's etcd error.
fn lease_error(url: &str, what: &str, s: &tonic::Status) -> EtcdError {
    if s.code() == tonic::Code::Unavailable {
        tracing::debug!(leader = url, "lease {what} forward failed: {s}");
        EtcdError::NotLeader
    } else {
        EtcdError::from_parts(s.code() as i32, s.message())
    }
}

/// `LeaseTimeToLive` answered by the leader: the lease's granted TTL, its remaining TTL
/// in whole seconds from the leader's schedule, and its keys if asked; TTL -1 when there is
/// no such lease (etcd 3.4 answers a follower's TimeToLive from the leader the same way).
/// The header is left for the caller.
///
/// Errors: as [`renew`].
pub async fn time_to_live(
    node: &Node,
    req: &LeaseTimeToLiveRequest,
) -> Result<LeaseTimeToLiveResponse, EtcdError> {
    on_leader(
        node,
        |deadline| time_to_live_local(node, req, deadline),
        |url, deadline| async move { forward_time_to_live(node, &url, req, deadline).await },
    )
    .await
}

/// [`time_to_live`] on this member, which must be the leader: a read barrier (so every
/// committed grant and revocation is applied here), then the lessor and its schedule.
///
/// Errors: `NotLeader` if this member does not lead; `Timeout` at `deadline`.
pub async fn time_to_live_local(
    node: &Node,
    req: &LeaseTimeToLiveRequest,
    deadline: Instant,
) -> Result<LeaseTimeToLiveResponse, EtcdError> {
    if !node.cluster.is_leader() {
        return Err(EtcdError::NotLeader);
    }
    node.read_barrier().await?;
    let not_found = LeaseTimeToLiveResponse {
        id: req.id,
        ttl: -1,
        ..Default::default()
    };
    loop {
        let mut changes = node.lessor.changes();
        let Some(info) = node.lessor.info(req.id, req.keys) else {
            return Ok(not_found);
        };
        match node.lessor.remaining(req.id) {
            Remaining::Secs(ttl) => {
                return Ok(LeaseTimeToLiveResponse {
                    header: None,
                    id: req.id,
                    ttl,
                    granted_ttl: info.ttl,
                    keys: info.keys,
                });
            }
            Remaining::NotFound => return Ok(not_found),
            Remaining::NotPrimary if !node.cluster.is_leader() => return Err(EtcdError::NotLeader),
            Remaining::NotPrimary => {}
        }
        // Elected but the schedule is not built yet.
        wait_for_lessor(&mut changes, deadline).await?;
    }
}

async fn forward_time_to_live(
    node: &Node,
    url: &str,
    req: &LeaseTimeToLiveRequest,
    deadline: Instant,
) -> Result<LeaseTimeToLiveResponse, EtcdError> {
    let call = peer_call::Call::LeaseTimeToLive(*req);
    match on_stream(node, url, "TimeToLive", call, deadline).await {
        Some(Ok(peer_answer::Answer::LeaseTimeToLive(r))) => return Ok(r),
        Some(Ok(_)) => return Err(wrong_answer("TimeToLive")),
        Some(Err(e)) => return Err(e),
        None => {}
    }
    let mut request = tonic::Request::new(*req);
    request.set_timeout(deadline.saturating_duration_since(Instant::now()));
    let answer = peer_client(node, url)?.lease_time_to_live(request).await;
    forwarded(node, url, "TimeToLive", answer.map(|r| r.into_inner()))
}
