//! The etcd `Lease` service: LeaseGrant, LeaseRevoke, LeaseKeepAlive, LeaseTimeToLive,
//! LeaseLeases (etcd rpc.proto `service Lease`, etcd `api/v3rpc/lease.go`).
//!
//! - Grant and revoke go through the raft log. The lease ID (client-chosen, or generated
//!   here) and the TTL (raised to etcd's minimum TTL) are fixed before proposing, so apply
//!   does not depend on the member.
//! - Keepalives and TimeToLive need the leader's schedule ([`super::lease_leader`]); a
//!   follower forwards them, as etcd does.
//! - Leases lists the leases this member has applied (etcd: local, no read barrier).
//!
//! Responses follow etcd 3.4: an unknown lease gives `LeaseRevoke` → `etcdserver: requested
//! lease not found`, `LeaseTimeToLive` → TTL -1 (no error), `LeaseKeepAlive` → TTL 0.

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use keel_proto::etcdserverpb::lease_server::Lease;
use keel_proto::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseLeasesRequest, LeaseLeasesResponse, LeaseRevokeRequest, LeaseRevokeResponse, LeaseStatus,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use keel_proto::keelpb::{raft_request::Request as Rq, raft_response::Response as Rs};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::credentials::{RequestIdentity, auth_info};
use super::{admit, lease_leader};
use crate::alarm::quota;
use crate::auth::check;
use crate::error::EtcdError;
use crate::lease::{MAX_LEASE_TTL, NO_LEASE, min_lease_ttl};
use crate::node::Node;
use crate::qos::{Method, RequestInfo};

/// How many generated IDs a grant tries before giving up on `lease already exists` (a
/// generated ID collides only with a client-chosen one).
const GENERATED_ID_ATTEMPTS: usize = 3;
/// Keepalive responses buffered per stream before the stream stops reading requests.
const KEEPALIVE_BUFFER: usize = 16;
/// Keepalives of one stream renewed concurrently (answers stay in request order).
const KEEPALIVE_PIPELINE: usize = 32;

/// The response stream of `LeaseKeepAlive`.
type KeepAliveStream = Pin<Box<dyn Stream<Item = Result<LeaseKeepAliveResponse, Status>> + Send>>;

/// Lease service of one member.
pub struct LeaseService {
    node: Arc<Node>,
}

impl LeaseService {
    /// Serves lease requests through `node`.
    pub fn new(node: Arc<Node>) -> LeaseService {
        LeaseService { node }
    }

    fn header_now(&self) -> keel_proto::etcdserverpb::ResponseHeader {
        self.node.header(self.node.store.get().current_revision())
    }
}

fn unexpected() -> Status {
    EtcdError::Internal("keel: apply returned an unexpected response type".into()).into()
}

/// The TTL a grant is proposed with: etcd's minimum TTL for this member's raft timings if
/// the client asked for less (etcd `lessor.Grant`).
///
/// Errors: `LeaseTtlTooLarge` above [`MAX_LEASE_TTL`].
pub fn grant_ttl(node: &Node, requested: i64) -> Result<i64, EtcdError> {
    if requested > MAX_LEASE_TTL {
        return Err(EtcdError::LeaseTtlTooLarge);
    }
    let min = min_lease_ttl(node.config.election_timeout, node.config.heartbeat_interval);
    Ok(requested.max(min))
}

#[tonic::async_trait]
impl Lease for LeaseService {
    async fn lease_grant(
        &self,
        request: Request<LeaseGrantRequest>,
    ) -> Result<Response<LeaseGrantResponse>, Status> {
        // Credentials are checked at apply (etcd `requireAuthInfo`).
        let ai = auth_info(&self.node, &request).await?;
        let user = admit::user(&ai);
        let req = request.into_inner();
        let _permit = admit::keyless(&self.node, Method::LeaseGrant, user).await?;
        let ttl = grant_ttl(&self.node, req.ttl)?;
        self.node.check_quota(quota::LEASE_OVERHEAD).await?;
        let chosen = req.id != NO_LEASE;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let id = if chosen {
                req.id
            } else {
                self.node.lease_ids.next()
            };
            match self
                .node
                .propose_as(&ai, Rq::LeaseGrant(LeaseGrantRequest { ttl, id }))
                .await
            {
                Ok(resp) => {
                    let Some(Rs::LeaseGrant(mut r)) = resp.response else {
                        return Err(unexpected());
                    };
                    r.header = Some(self.node.header(resp.revision));
                    return Ok(Response::new(r));
                }
                Err(EtcdError::LeaseExist) if !chosen && attempt < GENERATED_ID_ATTEMPTS => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    async fn lease_revoke(
        &self,
        request: Request<LeaseRevokeRequest>,
    ) -> Result<Response<LeaseRevokeResponse>, Status> {
        // WRITE on every attached key (or root), checked at apply from the log.
        let ai = auth_info(&self.node, &request).await?;
        let user = admit::user(&ai);
        let req = request.into_inner();
        let _permit = admit::keyless(&self.node, Method::LeaseRevoke, user).await?;
        let resp = self.node.propose_as(&ai, Rq::LeaseRevoke(req)).await?;
        let Some(Rs::LeaseRevoke(mut r)) = resp.response else {
            return Err(unexpected());
        };
        r.header = Some(self.node.header(resp.revision));
        Ok(Response::new(r))
    }

    async fn lease_keep_alive(
        &self,
        request: Request<Streaming<LeaseKeepAliveRequest>>,
    ) -> Result<Response<KeepAliveStream>, Status> {
        let identity = RequestIdentity::of(&request)?;
        let require_leader = super::require_leader::requested(request.metadata());
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(KEEPALIVE_BUFFER);
        let node = self.node.clone();
        tokio::spawn(async move {
            // One response per request, in request order (etcd `leaseKeepAlive`); up to
            // KEEPALIVE_PIPELINE renewals of one stream run at once, so a follower's
            // forwarding round trips overlap. The stream ends when the client closes it, on
            // a transport error, or after an error response.
            let requests = inbound
                .take_while(|r| std::future::ready(r.is_ok()))
                .filter_map(|r| std::future::ready(r.ok()));
            let replies = requests
                .map(|req| {
                    let node = node.clone();
                    let identity = identity.clone();
                    async move {
                        // etcd `checkLeaseRenew`: root, or WRITE on every attached key.
                        let ai = identity.resolve(&node).await?;
                        // Each keep-alive is admitted on its own (high priority by default).
                        let info = RequestInfo::new(Method::LeaseKeepAlive).user(admit::user(&ai));
                        let _permit = node.qos.admit(&info).map_err(EtcdError::from)?;
                        check::lease_keep_alive(&node.auth.read(), &ai, req.id, &|id| {
                            node.lessor.info(id, true).map(|i| i.keys)
                        })
                        .map_err(EtcdError::from)?;
                        // The header is taken before renewing, so a client never sees a
                        // keepalive at a revision after the lease's revocation (as etcd).
                        let header = node.header(node.store.get().current_revision());
                        let ttl = lease_leader::renew(&node, req.id).await?;
                        Ok(LeaseKeepAliveResponse {
                            header: Some(header),
                            id: req.id,
                            ttl,
                        })
                    }
                })
                .buffered(KEEPALIVE_PIPELINE);
            let mut replies = std::pin::pin!(replies);
            while let Some(item) = replies.next().await {
                let item = item.map_err(|e: EtcdError| Status::from(e));
                let failed = item.is_err();
                if tx.send(item).await.is_err() || failed {
                    break;
                }
            }
        });
        let replies =
            super::until_stopped::until_stopped(ReceiverStream::new(rx), self.node.stopped());
        if require_leader {
            // etcd cancels every require-leader stream after 3 leaderless election timeouts.
            let lost = self.node.cluster.leader_loss.subscribe();
            let replies = super::require_leader::until_leader_lost(replies, lost);
            return Ok(Response::new(Box::pin(replies)));
        }
        Ok(Response::new(Box::pin(replies)))
    }

    async fn lease_time_to_live(
        &self,
        request: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        let ai = auth_info(&self.node, &request).await?;
        let user = admit::user(&ai);
        let req = request.into_inner();
        let _permit = admit::keyless(&self.node, Method::LeaseTimeToLive, user).await?;
        check::lease_time_to_live(&self.node.auth.read(), &ai, &req, &|id| {
            self.node.lessor.info(id, true).map(|i| i.keys)
        })?;
        let mut resp = lease_leader::time_to_live(&self.node, &req).await?;
        resp.header = Some(self.header_now());
        Ok(Response::new(resp))
    }

    /// The leases this member has applied, like etcd (`lessor.Leases`, no read barrier).
    async fn lease_leases(
        &self,
        request: Request<LeaseLeasesRequest>,
    ) -> Result<Response<LeaseLeasesResponse>, Status> {
        let ai = auth_info(&self.node, &request).await?;
        let user = admit::user(&ai);
        let _permit = admit::keyless(&self.node, Method::LeaseLeases, user).await?;
        let ids = self.node.lessor.ids();
        let auth = self.node.auth.read();
        if auth.is_enabled() {
            let keys = ids
                .iter()
                .filter_map(|&id| self.node.lessor.info(id, true))
                .flat_map(|i| i.keys);
            check::lease_leases(&auth, &ai, keys)?;
        }
        drop(auth);
        let leases = ids.into_iter().map(|id| LeaseStatus { id }).collect();
        Ok(Response::new(LeaseLeasesResponse {
            header: Some(self.header_now()),
            leases,
        }))
    }
}
