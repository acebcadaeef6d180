//! [`Caller`]: KV and Lease calls made inside the member on a client's behalf, with the
//! client's identity (etcd's `v3client`, the in-process client its Lock and Election
//! servers use).
//!
//! Each call builds a `tonic::Request` from the original request's metadata (the auth
//! token) and extensions (the TLS peer certificates, for the common name) and runs the
//! member's own [`KvService`] or [`LeaseService`] method: no network hop, and exactly the
//! checks a client's own call gets. The identity is resolved again for every call, as
//! etcd reuses the caller's token: a token that expires while a Lock waits fails the next
//! call with the auth error.
//!
//! Errors keep their text but an etcd server error (one of `rpctypes`' catalogue) comes back
//! with code `Unknown` ([`as_client_error`]): etcd's Lock and Election servers get it through
//! clientv3, whose `toErr` turns it into a plain `rpctypes.EtcdError`, which gRPC then sends
//! as `Unknown` (etcd 3.4.23: Lock with an unknown lease answers code 2, where a Put with it
//! answers 5).

use std::sync::Arc;

use keel_proto::etcdserverpb::kv_server::Kv;
use keel_proto::etcdserverpb::lease_server::Lease;
use keel_proto::etcdserverpb::{
    DeleteRangeRequest, DeleteRangeResponse, LeaseGrantRequest, RangeRequest, RangeResponse,
    TxnRequest, TxnResponse,
};
use keel_proto::rpctypes::RpcError;
use tonic::metadata::MetadataMap;
use tonic::{Code, Extensions, Request, Status};

use super::{NO_LEASE, SESSION_TTL};
use crate::api::credentials::auth_info;
use crate::api::{KvService, LeaseService, admit};
use crate::node::Node;
use crate::qos::{Method, RequestInfo};

/// The member's KV and Lease services, called as the client of one request.
#[derive(Clone)]
pub struct Caller {
    node: Arc<Node>,
    metadata: MetadataMap,
    extensions: Extensions,
}

impl Caller {
    /// Calls as the client that sent `request`.
    pub fn of<T>(node: &Arc<Node>, request: &Request<T>) -> Caller {
        Caller {
            node: node.clone(),
            metadata: request.metadata().clone(),
            extensions: request.extensions().clone(),
        }
    }

    /// The member the calls run on.
    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// Admits one `method` call on `[key, range_end)` (`range_end` empty: `key` alone)
    /// through QoS (rules that name the
    /// Lock and Election methods), as the client. The permit is dropped at once: the
    /// internal KV calls are admitted on their own, and a waiting Lock must not hold a
    /// slot for its whole wait.
    ///
    /// Errors: an identity that does not resolve (`etcdserver: invalid auth token`);
    /// `etcdserver: too many requests`.
    pub async fn admit(&self, method: Method, key: &[u8], range_end: &[u8]) -> Result<(), Status> {
        let probe = self.request(());
        let ai = auth_info(&self.node, &probe)
            .await
            .map_err(|e| as_client_error(e.into()))?;
        let info = RequestInfo::new(method)
            .keys(key, range_end)
            .user(admit::user(&ai));
        drop(
            admit::admit(&self.node, &info)
                .await
                .map_err(as_client_error)?,
        );
        Ok(())
    }

    fn request<M>(&self, message: M) -> Request<M> {
        Request::from_parts(self.metadata.clone(), self.extensions.clone(), message)
    }

    fn kv(&self) -> KvService {
        KvService::new(self.node.clone())
    }

    /// `KV.Txn` as the client.
    ///
    /// Errors: those of the client's own Txn (validation, auth, quota, raft).
    pub async fn txn(&self, req: TxnRequest) -> Result<TxnResponse, Status> {
        let answer = self.kv().txn(self.request(req)).await;
        Ok(answer.map_err(as_client_error)?.into_inner())
    }

    /// `KV.Range` as the client (linearizable unless `req.serializable`).
    ///
    /// Errors: those of the client's own Range.
    pub async fn range(&self, req: RangeRequest) -> Result<RangeResponse, Status> {
        let answer = self.kv().range(self.request(req)).await;
        Ok(answer.map_err(as_client_error)?.into_inner())
    }

    /// `KV.DeleteRange` of the single `key` as the client.
    ///
    /// Errors: those of the client's own DeleteRange.
    pub async fn delete(&self, key: Vec<u8>) -> Result<DeleteRangeResponse, Status> {
        let req = DeleteRangeRequest {
            key,
            ..Default::default()
        };
        let answer = self.kv().delete_range(self.request(req)).await;
        Ok(answer.map_err(as_client_error)?.into_inner())
    }

    /// The first steps of Lock and Campaign (etcd's `NewMutex`/`NewElection` plus the
    /// session): admits `method` on the prefix `name/`, takes the caller's lease (a 60 s
    /// session lease for 0, [`Caller::session_lease`]) and names the caller's key
    /// `name/<lease hex>`.
    ///
    /// Errors: the admission's or the lease grant's status.
    pub async fn enter(&self, method: Method, name: &[u8], lease: i64) -> Result<Entry, Status> {
        let prefix = super::prefix_of(name);
        self.admit(method, &prefix, &super::prefix_end(&prefix))
            .await?;
        let lease = self.session_lease(lease).await?;
        let key = super::owner_key(&prefix, lease);
        Ok(Entry { prefix, lease, key })
    }

    /// The session lease of a Lock or Campaign: `lease` itself, or for [`NO_LEASE`] a new
    /// [`SESSION_TTL`] lease granted as the client (etcd `concurrency.NewSession`). The
    /// session is orphaned at once, as in etcd: nobody keeps the lease alive.
    ///
    /// Errors: those of the client's own LeaseGrant.
    pub async fn session_lease(&self, lease: i64) -> Result<i64, Status> {
        if lease != NO_LEASE {
            return Ok(lease);
        }
        let grant = LeaseGrantRequest {
            ttl: SESSION_TTL,
            id: NO_LEASE,
        };
        let service = LeaseService::new(self.node.clone());
        let answer = service.lease_grant(self.request(grant)).await;
        Ok(answer.map_err(as_client_error)?.into_inner().id)
    }

    /// Runs `cleanup` on a new task if the returned guard is dropped while still armed: how
    /// a Lock or Campaign that is abandoned while it waits (the client canceled, the call's
    /// future was dropped) still removes its key, as etcd's `Unlock`/`Resign` on context
    /// cancel do.
    pub fn on_abandon<F, Fut>(&self, cleanup: F) -> AbandonGuard
    where
        F: FnOnce(Caller) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let caller = self.clone();
        AbandonGuard {
            cleanup: Some(Box::new(move || {
                tokio::spawn(cleanup(caller));
            })),
        }
    }
}

/// `status` as etcd's Lock and Election servers answer an error of their in-process client:
/// an etcd server error (found by its text, as clientv3's `rpctypes.Error` finds it) with code
/// `Unknown` and the same text; any other status (a cancelled or timed-out call) unchanged.
pub fn as_client_error(status: Status) -> Status {
    match RpcError::from_message(status.message()) {
        Some(e) => Status::new(Code::Unknown, e.message()),
        None => status,
    }
}

/// Runs its cleanup when dropped, unless [`AbandonGuard::disarm`]ed ([`Caller::on_abandon`]).
pub struct AbandonGuard {
    cleanup: Option<Box<dyn FnOnce() + Send>>,
}

impl AbandonGuard {
    /// The call finished (either way) and cleaned up itself: no cleanup on drop.
    pub fn disarm(mut self) {
        self.cleanup = None;
    }
}

impl Drop for AbandonGuard {
    fn drop(&mut self) {
        if let Some(cleanup) = self.cleanup.take() {
            cleanup();
        }
    }
}

/// Where a Lock or Campaign caller queues ([`Caller::enter`]).
pub struct Entry {
    /// `name/`.
    pub prefix: Vec<u8>,
    /// The caller's lease ID (the session lease when the request had none).
    pub lease: i64,
    /// The caller's key, `name/<lease hex>`.
    pub key: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_errors_come_back_as_unknown_with_their_text() {
        let lease = as_client_error(Status::not_found("etcdserver: requested lease not found"));
        assert_eq!(
            (lease.code(), lease.message()),
            (Code::Unknown, "etcdserver: requested lease not found")
        );
        let denied = as_client_error(Status::permission_denied("etcdserver: permission denied"));
        assert_eq!(denied.code(), Code::Unknown);
        let cancelled = as_client_error(Status::cancelled("the client went away"));
        assert_eq!(
            (cancelled.code(), cancelled.message()),
            (Code::Cancelled, "the client went away")
        );
    }
}
