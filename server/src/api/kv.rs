//! The etcd `KV` service: Range, Put, DeleteRange, Txn, Compact (etcd rpc.proto `service KV`),
//! and etcd 3.7's RangeStream ([`super::range_stream`]).
//!
//! Requests are validated with etcd's rules before anything is proposed
//! ([`super::kv_validate`]); writes go through the raft log ([`Node::propose`]); reads are
//! linearizable by default ([`Node::read_barrier`]) or local when `serializable` is set. A
//! txn that only reads is served as a read, not proposed ([`mvcc::is_txn_read_only`]).

use std::sync::Arc;

use keel_proto::etcdserverpb::kv_server::Kv;
use keel_proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, TxnRequest, TxnResponse,
};
use keel_proto::keelpb::{raft_request::Request as Rq, raft_response::Response as Rs};
use tonic::{Request, Response, Status};

use super::credentials::{auth_info, still_current};
use super::{admit, kv_validate};
use crate::alarm::quota;
use crate::auth::AuthInfo;
use crate::auth::check::{self, Rpc};
use crate::error::EtcdError;
use crate::heavy;
use crate::mvcc;
use crate::node::Node;
use crate::qos::Method;

/// KV service of one member.
pub struct KvService {
    node: Arc<Node>,
}

impl KvService {
    /// Serves KV requests through `node`.
    pub fn new(node: Arc<Node>) -> KvService {
        KvService { node }
    }

    /// Proposes `req` as `ai`; apply checks its permissions (`apply/auth.rs`).
    async fn write(&self, ai: &AuthInfo, req: Rq) -> Result<(i64, Option<Rs>), Status> {
        // A learner never gets here: `learner_gate` refused the call.
        let resp = self.node.propose_as(ai, req).await?;
        Ok((resp.revision, resp.response))
    }
}

impl KvService {
    /// A txn that only reads, served without proposing it (etcd `v3_server.go` `Txn`): after
    /// the ReadIndex barrier unless every range in it is serializable, then evaluated on the
    /// local store at one revision. Permissions are the proposed txn's (READ on every compare
    /// and range), judged at the read point and refused if the auth revision moved meanwhile
    /// (etcd `doSerialize`, as for Range).
    async fn txn_read_only(&self, ai: &AuthInfo, req: &TxnRequest) -> Result<TxnResponse, Status> {
        // The chaos failpoint that breaks linearizable ranges breaks these reads alike.
        if !mvcc::is_txn_serializable(req) && !crate::failpoint::hit("linearizable_read_stale") {
            self.node.read_barrier().await?;
        }
        let no_leases = |_: i64| None;
        check::txn(&self.node.auth.read(), ai, req, &no_leases)?;
        let store = self.node.store.get();
        let long = store.txn_reads(req) > heavy::LONG_RANGE_KEYS;
        let mut resp = heavy::run_if(long, || store.txn_read_only(req))?;
        still_current(&self.node, ai)?;
        let revision = resp.header.as_ref().map_or(0, |h| h.revision);
        resp.header = Some(self.node.header(revision));
        Ok(resp)
    }
}

fn unexpected() -> Status {
    EtcdError::Internal("keel: apply returned an unexpected response type".into()).into()
}

#[tonic::async_trait]
impl Kv for KvService {
    async fn range_stream(
        &self,
        request: Request<RangeRequest>,
    ) -> Result<Response<super::range_stream::RangeStreamBody>, Status> {
        super::range_stream::serve(self.node.clone(), request).await
    }

    async fn range(
        &self,
        request: Request<RangeRequest>,
    ) -> Result<Response<RangeResponse>, Status> {
        let ai = auth_info(&self.node, &request).await?;
        let user = admit::user(&ai);
        let req = request.into_inner();
        kv_validate::check_range(&req)?;
        let _permit = admit::range(&self.node, &req, user).await?;
        // The `linearizable_read_stale` failpoint skips ReadIndex: a deliberately broken
        // member that serves linearizable reads from its local state (chaos --inject).
        if !req.serializable && !crate::failpoint::hit("linearizable_read_stale") {
            self.node.read_barrier().await?;
        }
        // READ on the range, judged at the read point; refused after the read if the auth
        // revision moved meanwhile (etcd `doSerialize`).
        check::range(&self.node.auth.read(), &ai, &req)?;
        let store = self.node.store.get();
        // A big range holds this thread for long: the member's other tasks move off it.
        let long = store.range_reads(&req) > heavy::LONG_RANGE_KEYS;
        let mut resp = heavy::run_if(long, || store.range(&req))?;
        still_current(&self.node, &ai)?;
        let revision = resp
            .header
            .as_ref()
            .map_or_else(|| store.current_revision(), |h| h.revision);
        resp.header = Some(self.node.header(revision));
        Ok(Response::new(resp))
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let ai = auth_info(&self.node, &request).await?;
        let user = admit::user(&ai);
        let req = request.into_inner();
        kv_validate::check_put(&req)?;
        let _permit = admit::put(&self.node, &req, user).await?;
        self.node.check_quota(quota::cost_put(&req)).await?;
        match self.write(&ai, Rq::Put(req)).await? {
            (rev, Some(Rs::Put(mut r))) => {
                r.header = Some(self.node.header(rev));
                Ok(Response::new(r))
            }
            _ => Err(unexpected()),
        }
    }

    async fn delete_range(
        &self,
        request: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        let ai = auth_info(&self.node, &request).await?;
        let user = admit::user(&ai);
        let req = request.into_inner();
        kv_validate::check_delete_range(&req)?;
        let _permit = admit::delete_range(&self.node, &req, user).await?;
        match self.write(&ai, Rq::DeleteRange(req)).await? {
            (rev, Some(Rs::DeleteRange(mut r))) => {
                r.header = Some(self.node.header(rev));
                Ok(Response::new(r))
            }
            _ => Err(unexpected()),
        }
    }

    async fn txn(&self, request: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        let ai = auth_info(&self.node, &request).await?;
        let user = admit::user(&ai);
        let req = request.into_inner();
        kv_validate::check_txn(&req, self.node.config.max_txn_ops as usize)?;
        let _permit = admit::txn(&self.node, &req, user).await?;
        self.node.check_quota(quota::cost_txn(&req)).await?;
        if mvcc::is_txn_read_only(&req) {
            return self.txn_read_only(&ai, &req).await.map(Response::new);
        }
        match self.write(&ai, Rq::Txn(req)).await? {
            (rev, Some(Rs::Txn(mut r))) => {
                // Nested responses keep the header apply gave them (revision only), as etcd's.
                r.header = Some(self.node.header(rev));
                Ok(Response::new(r))
            }
            _ => Err(unexpected()),
        }
    }

    async fn compact(
        &self,
        request: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        let ai = auth_info(&self.node, &request).await?;
        let user = admit::user(&ai);
        // Root only (CVE-2026-33413); checked again at apply.
        check::rpc(&self.node.auth.read(), &ai, Rpc::Compact)?;
        let req = request.into_inner();
        kv_validate::check_compaction(&req)?;
        let _permit = admit::keyless(&self.node, Method::Compact, user).await?;
        let (physical, revision) = (req.physical, req.revision);
        match self.write(&ai, Rq::Compaction(req)).await? {
            (rev, Some(Rs::Compaction(mut r))) => {
                if physical {
                    // etcd `physical`: answer only once the compacted records are removed
                    // from the backend (Keel removes them in the background after apply).
                    let store = self.node.store.get();
                    let timeout = std::time::Duration::from_secs(60);
                    let done = tokio::task::spawn_blocking(move || {
                        store.wait_physical_compaction(revision, timeout)
                    })
                    .await
                    .unwrap_or(false);
                    if !done {
                        return Err(EtcdError::Timeout.into());
                    }
                }
                r.header = Some(self.node.header(rev));
                Ok(Response::new(r))
            }
            _ => Err(unexpected()),
        }
    }
}
