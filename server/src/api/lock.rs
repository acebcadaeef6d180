//! The etcd `Lock` service (`v3lockpb.Lock`: Lock, Unlock), etcd's `v3lock` server and
//! `concurrency.Mutex` run in the member ([`super::concurrency`]).
//!
//! Lock(name, lease):
//! 1. the session lease: `lease`, or a new 60 s one for lease 0 (nobody keeps it alive);
//! 2. one Txn (etcd `tryAcquire`): if `<name>/<lease hex>` does not exist, put it (empty
//!    value, on the lease); either way read it and the oldest key under `<name>/`;
//! 3. if that oldest key is ours, the caller holds the lock: answer with the Txn's header;
//! 4. else wait for every older key to be deleted, then check that our key is still there
//!    with its create revision and lease (etcd 3.5's fix of #11456; Keel also stops waiting
//!    as soon as our key goes), and answer with that read's header;
//! 5. a wait that fails, or a call the client abandons, deletes our key (etcd `Unlock` on
//!    error); a key that vanished is left alone and answered `mutex: session is expired`.
//!
//! Unlock(key) is a plain delete of `key` (etcd: no check that it is a lock key). Locking
//! twice with the same lease is the same acquisition.
//!
//! The lock is only as good as its lease: a holder must fence its writes with the key's
//! create revision (docs/lock-election.md).

use std::sync::Arc;

use keel_proto::etcdserverpb::TxnRequest;
use keel_proto::v3lockpb::lock_server::Lock;
use keel_proto::v3lockpb::{LockRequest, LockResponse, UnlockRequest, UnlockResponse};
use tonic::{Request, Response, Status};

use super::concurrency::caller::{Caller, Entry};
use super::concurrency::wait::{OwnKey, wait_for_turn};
use super::concurrency::{first_created, ops};
use crate::error::EtcdError;
use crate::node::Node;
use crate::qos::Method;

/// Lock service of one member.
pub struct LockService {
    node: Arc<Node>,
}

impl LockService {
    /// Serves Lock and Unlock through `node`'s KV, Lease and Watch.
    pub fn new(node: Arc<Node>) -> LockService {
        LockService { node }
    }
}

/// etcd `Mutex.tryAcquire`: put our key if absent; read it back and the owner.
fn try_acquire(prefix: &[u8], key: &[u8], lease: i64) -> TxnRequest {
    TxnRequest {
        compare: vec![ops::created_at(key, 0)],
        success: vec![ops::put(key, b"", lease), ops::get(first_created(prefix))],
        failure: vec![ops::get_key(key), ops::get(first_created(prefix))],
    }
}

#[tonic::async_trait]
impl Lock for LockService {
    async fn lock(&self, request: Request<LockRequest>) -> Result<Response<LockResponse>, Status> {
        let caller = Caller::of(&self.node, &request);
        let req = request.into_inner();
        let Entry { prefix, lease, key } = caller.enter(Method::Lock, &req.name, req.lease).await?;
        let acquired = caller.txn(try_acquire(&prefix, &key, lease)).await?;
        let seen_at = ops::revision_of(&acquired);
        let create_revision = if acquired.succeeded {
            seen_at
        } else {
            ops::first_kv(&acquired, 0)
                .map(|kv| kv.create_revision)
                .ok_or_else(|| EtcdError::Internal("keel: lock key missing in its Txn".into()))?
        };
        let owner = ops::first_kv(&acquired, 1).map(|kv| kv.create_revision);
        if owner.is_none_or(|rev| rev == create_revision) {
            return Ok(Response::new(LockResponse {
                header: acquired.header,
                key,
            }));
        }
        let own = OwnKey {
            key: key.clone(),
            create_revision,
            lease,
            seen_at,
        };
        let release = |caller: Caller, own: OwnKey| async move {
            let _ = caller.delete(own.key).await;
        };
        let header = wait_for_turn(&caller, &prefix, own, release).await?;
        Ok(Response::new(LockResponse { header, key }))
    }

    async fn unlock(
        &self,
        request: Request<UnlockRequest>,
    ) -> Result<Response<UnlockResponse>, Status> {
        let caller = Caller::of(&self.node, &request);
        let key = request.into_inner().key;
        caller.admit(Method::Unlock, &key, &[]).await?;
        let deleted = caller.delete(key).await?;
        Ok(Response::new(UnlockResponse {
            header: deleted.header,
        }))
    }
}
