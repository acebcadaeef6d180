//! The etcd `Watch` service (rpc.proto `service Watch`): one bidirectional stream per call,
//! multiplexing any number of watchers.
//!
//! Each call gets a [`WatchStream`] (requests) and a [`WatchOutput`] (responses) from the
//! member's [`crate::watch::WatchHub`]. A task reads the client's requests and ticks the
//! progress timer; gRPC pulls responses from the output as flow control allows. When the
//! client half-closes, events keep flowing (as in etcd); when the call ends, the output is
//! dropped, the task is aborted and the stream's watchers are removed. A stream opened with
//! `hasleader: true` ends with `etcdserver: no leader` after three leaderless election
//! timeouts ([`super::require_leader`]).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::{Stream, StreamExt};
use keel_proto::etcdserverpb::watch_request::RequestUnion;
use keel_proto::etcdserverpb::watch_server::Watch;
use keel_proto::etcdserverpb::{WatchRequest, WatchResponse};
use keel_proto::rpctypes::RpcError;
use tonic::{Request, Response, Status, Streaming};

use super::credentials::RequestIdentity;
use crate::auth::check;
use crate::auth::error::AuthError;
use crate::error::EtcdError;
use crate::node::Node;
use crate::qos::{Method, RequestInfo};
use crate::watch::WatchStream;
use crate::watch::progress::jittered;

/// Watch service of one member.
pub struct WatchService {
    node: Arc<Node>,
    /// Seeds the per-stream progress jitter.
    streams: AtomicU64,
}

impl WatchService {
    /// Serves watch streams from `node`'s hub.
    pub fn new(node: Arc<Node>) -> WatchService {
        WatchService {
            node,
            streams: AtomicU64::new(0),
        }
    }
}

/// The response stream type of `Watch` (tonic's `BoxStream`, fixed by the generated trait).
pub type WatchResponseStream =
    Pin<Box<dyn Stream<Item = Result<WatchResponse, Status>> + Send + 'static>>;

/// The cancel reason of a create refused by auth for want of permission (and for any auth
/// error other than the three of [`Refusal::reason`]): `rpctypes.ErrGRPCPermissionDenied`
/// as Go prints the gRPC status.
pub const WATCH_DENIED: &str =
    "rpc error: code = PermissionDenied desc = etcdserver: permission denied";

/// Why a watch create was refused.
enum Refusal {
    /// QoS refused it (`etcdserver: too many requests`).
    Qos(EtcdError),
    /// Auth refused it: etcd's error when it is one of the catalogue, `None` otherwise.
    Auth(Option<RpcError>),
}

impl Refusal {
    /// The cancel reason etcd sends for this refusal. Auth (etcd 3.6 `isWatchPermitted`,
    /// PR #14322, also in 3.4.21+ and 3.5.5+): no user, a bad or expired token and an old
    /// auth revision each have their own reason, the Go text of their gRPC status, so a
    /// client can tell "authenticate again" (clientv3 does, for an invalid token) from
    /// "not permitted"; everything else is [`WATCH_DENIED`] (etcd 3.5.1 answered that for
    /// all of them).
    fn reason(&self) -> String {
        match self {
            Refusal::Qos(e) => e.to_string(),
            Refusal::Auth(Some(
                e @ (RpcError::UserEmpty | RpcError::InvalidAuthToken | RpcError::AuthOldRevision),
            )) => format!("rpc error: code = {:?} desc = {}", e.code(), e.message()),
            Refusal::Auth(_) => WATCH_DENIED.to_string(),
        }
    }

    fn from_auth(e: AuthError) -> Refusal {
        match e {
            AuthError::Rpc(e) => Refusal::Auth(Some(e)),
            _ => Refusal::Auth(None),
        }
    }

    fn from_identity(e: EtcdError) -> Refusal {
        match e {
            EtcdError::Rpc(e) => Refusal::Auth(Some(e)),
            _ => Refusal::Auth(None),
        }
    }
}

/// Whether the caller may create the watch in `request`: QoS admits it (a rate governs
/// creates; the permit is not held for the watch's life), then READ on its range (etcd
/// `isWatchPermitted`, judged for each create with the stream's identity). `Err` says why
/// ([`Refusal::reason`] is the cancel reason).
async fn may_create(
    node: &Node,
    identity: &RequestIdentity,
    request: &WatchRequest,
) -> Result<(), Refusal> {
    let Some(RequestUnion::CreateRequest(create)) = &request.request_union else {
        return Ok(());
    };
    let ai = identity
        .resolve(node)
        .await
        .map_err(Refusal::from_identity)?;
    let info = RequestInfo::new(Method::Watch)
        .keys(&create.key, &create.range_end)
        .user(super::admit::user(&ai));
    // Dropped at once: a rate governs creates, the slot is not held for the watch's life.
    drop(
        node.qos
            .admit(&info)
            .map_err(|e| Refusal::Qos(EtcdError::from(e)))?,
    );
    if node.auth.is_enabled() {
        check::watch_create(&node.auth.read(), &ai, create).map_err(Refusal::from_auth)?;
    }
    Ok(())
}

/// Reads requests until the client goes away; ticks progress notifications meanwhile.
/// A create the caller may not make ([`may_create`]) is answered like any create etcd
/// refuses (created and canceled, with the reason).
async fn serve_requests(
    node: Arc<Node>,
    identity: RequestIdentity,
    mut session: WatchStream,
    mut inbound: Streaming<WatchRequest>,
    period: std::time::Duration,
) {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut open = true;
    loop {
        tokio::select! {
            msg = inbound.message(), if open => match msg {
                Ok(Some(request)) => match may_create(&node, &identity, &request).await {
                    Ok(()) => session.handle(request),
                    // Created + canceled with the reason; the stream stays open (etcd).
                    Err(refusal) => session.reject(&refusal.reason()),
                },
                // Half-close: no more requests, but events keep flowing (etcd).
                Ok(None) => open = false,
                Err(status) => {
                    tracing::debug!(%status, "watch stream receive failed");
                    break;
                }
            },
            _ = ticks.tick() => session.progress_tick(),
        }
    }
}

#[tonic::async_trait]
impl Watch for WatchService {
    async fn watch(
        &self,
        request: Request<Streaming<WatchRequest>>,
    ) -> Result<Response<WatchResponseStream>, Status> {
        let identity = RequestIdentity::of(&request)?;
        let require_leader = super::require_leader::requested(request.metadata());
        let inbound = request.into_inner();
        let hub = self.node.watch.clone();
        let seed = self.streams.fetch_add(1, Ordering::Relaxed);
        let period = jittered(hub.config().progress_interval, seed);
        let (session, mut output) = WatchStream::new(hub);
        let task = tokio::spawn(serve_requests(
            self.node.clone(),
            identity,
            session,
            inbound,
            period,
        ));
        let abort = task.abort_handle();
        output.on_drop(move || abort.abort());
        let node = self.node.clone();
        let responses = output.map(move |mut resp| {
            let revision = resp.header.as_ref().map_or(0, |h| h.revision);
            resp.header = Some(node.header(revision));
            Ok(resp)
        });
        let responses = super::until_stopped::until_stopped(responses, self.node.stopped());
        if require_leader {
            let lost = self.node.cluster.leader_loss.subscribe();
            let responses = super::require_leader::until_leader_lost(responses, lost);
            return Ok(Response::new(Box::pin(responses)));
        }
        Ok(Response::new(Box::pin(responses)))
    }
}
