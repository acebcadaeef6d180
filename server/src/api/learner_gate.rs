//! What a learner serves, as etcd's `v3rpc/interceptor.go` decides it
//! (`isRPCSupportedForLearner` and the stream interceptor, etcd 3.5): a raft learner answers
//! `Maintenance.Status`, `KV.Range` and the `Maintenance.Snapshot` stream, and refuses every
//! other RPC of the client services, unary or stream, with `etcdserver: rpc not supported for
//! learner` (`Unavailable`, so clientv3 retries it on another endpoint).
//!
//! The refusal happens before the request is decoded: by [`LearnerGateLayer`] for gRPC, and
//! by the JSON gateway for its routes ([`serves`]). A Range is let through because only its
//! body says whether it is serializable; a linearizable one is refused by the read path
//! (`Node::read_barrier`). Keel's own `keelpb.Qos` service is gated like etcd's: a learner
//! serves reads of its own state only.
//!
//! "Learner" here means "not a voter of the membership this member knows": a member that
//! just joined knows no membership until the leader's log or snapshot reaches it, and may
//! have been added as a learner; it served its first requests as a voter would (a put was
//! applied through a fresh learner, found by a fresh-user check), where etcd's learner,
//! which learns its role from its peers at start, refused them. A joining voter therefore
//! refuses too until its membership arrives (clients retry `Unavailable` elsewhere), and a
//! member that applied its own removal refuses until it stops.
//!
//! One difference in order: etcd checks the learner before require-leader; here the gate sits
//! inside the require-leader interceptor (tonic's interceptor body cannot be built outside
//! it), so a learner without a leader answers a `hasleader` request with `etcdserver: no
//! leader`. Both are `Unavailable`, and clients retry both elsewhere.

use std::sync::Arc;
use std::task::{Context, Poll};

use axum::http::{Request, Response};
use futures::future::{Either, Ready, ready};
use tonic::Status;
use tower_layer::Layer;
use tower_service::Service;

use crate::error::EtcdError;
use crate::node::Node;

/// The gRPC packages of the client services (path prefixes).
const CLIENT_PACKAGES: [&str; 4] = ["/etcdserverpb.", "/v3lockpb.", "/v3electionpb.", "/keelpb."];

/// The RPCs a learner serves (gRPC paths).
const SERVED_ON_A_LEARNER: [&str; 3] = [
    "/etcdserverpb.Maintenance/Status",
    "/etcdserverpb.KV/Range",
    "/etcdserverpb.Maintenance/Snapshot",
];

/// Whether a learner serves the RPC at gRPC `path` (`/etcdserverpb.KV/Put`). Paths outside
/// the client services (`/health`, `/v3/kv/put`) are not RPCs and are not judged here.
pub fn serves(path: &str) -> bool {
    SERVED_ON_A_LEARNER.contains(&path) || !CLIENT_PACKAGES.iter().any(|p| path.starts_with(p))
}

/// `Err(etcdserver: rpc not supported for learner)` when `node` is not a voter
/// ([`Node::is_voter`]) and does not serve the RPC at gRPC `path`.
pub fn check(node: &Node, path: &str) -> Result<(), Status> {
    if !serves(path) && !node.is_voter() {
        return Err(EtcdError::NotSupportedForLearner.into());
    }
    Ok(())
}

/// The layer ([`Server::layer`](tonic::transport::Server::layer)) that refuses, on a learner,
/// the gRPC calls a learner does not serve.
#[derive(Clone)]
pub struct LearnerGateLayer {
    node: Arc<Node>,
}

impl LearnerGateLayer {
    /// The gate of `node`.
    pub fn new(node: Arc<Node>) -> LearnerGateLayer {
        LearnerGateLayer { node }
    }
}

impl<S> Layer<S> for LearnerGateLayer {
    type Service = LearnerGate<S>;

    fn layer(&self, inner: S) -> LearnerGate<S> {
        LearnerGate {
            inner,
            node: self.node.clone(),
        }
    }
}

/// The service [`LearnerGateLayer`] wraps around `S`.
#[derive(Clone)]
pub struct LearnerGate<S> {
    inner: S,
    node: Arc<Node>,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for LearnerGate<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Default,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = Either<Ready<Result<Response<ResBody>, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        match check(&self.node, req.uri().path()) {
            // A trailers-only gRPC answer: status and message in the headers.
            Err(status) => Either::Left(ready(Ok(status.into_http()))),
            Ok(()) => Either::Right(self.inner.call(req)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::serves;

    #[test]
    fn a_learner_serves_status_range_and_snapshot_only() {
        for path in [
            "/etcdserverpb.Maintenance/Status",
            "/etcdserverpb.KV/Range",
            "/etcdserverpb.Maintenance/Snapshot",
            // Not RPCs: the HTTP endpoints and the gateway's own routes.
            "/health",
            "/v3/kv/put",
        ] {
            assert!(serves(path), "{path}");
        }
        for path in [
            "/etcdserverpb.KV/Put",
            "/etcdserverpb.KV/RangeStream",
            "/etcdserverpb.KV/Txn",
            "/etcdserverpb.Watch/Watch",
            "/etcdserverpb.Lease/LeaseKeepAlive",
            "/etcdserverpb.Cluster/MemberList",
            "/etcdserverpb.Maintenance/MoveLeader",
            "/etcdserverpb.Auth/Authenticate",
            "/v3lockpb.Lock/Lock",
            "/v3electionpb.Election/Observe",
            "/keelpb.Qos/QoSRuleList",
        ] {
            assert!(!serves(path), "{path}");
        }
    }
}
