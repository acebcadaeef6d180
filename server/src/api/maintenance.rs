//! The etcd `Maintenance` service: Status, HashKV, MoveLeader and Defragment. Other methods
//! answer UNIMPLEMENTED until their issues land (see docs/compat.md).

use std::sync::Arc;

use keel_proto::etcdserverpb::maintenance_server::Maintenance;
use keel_proto::etcdserverpb::{
    DefragmentRequest, DefragmentResponse, HashKvRequest, HashKvResponse, MoveLeaderRequest,
    MoveLeaderResponse, StatusRequest, StatusResponse,
};
use tonic::{Request, Response, Status};

use super::credentials::authorize;
use crate::auth::check::Rpc;
use crate::cluster::transfer;
use crate::node::Node;

/// Maintenance service of one member.
pub struct MaintenanceService {
    node: Arc<Node>,
}

impl MaintenanceService {
    /// Serves maintenance requests for `node`.
    pub fn new(node: Arc<Node>) -> MaintenanceService {
        MaintenanceService { node }
    }
}

#[tonic::async_trait]
impl Maintenance for MaintenanceService {
    /// etcd `Status`: `version` is the etcd API version Keel implements
    /// ([`keel_proto::ETCD_API_VERSION`]); raft fields come from this member's raft metrics.
    async fn status(
        &self,
        request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        authorize(&self.node, &request, Rpc::Status).await?;
        let store = self.node.store.get();
        let m = self.node.raft.metrics().borrow().clone();
        let is_learner = m
            .membership_config
            .membership()
            .learner_ids()
            .any(|id| id == self.node.id);
        let db_size = self.node.db_size();
        // etcd reports the commit index as `raft_index`.
        let committed = self
            .node
            .raft
            .with_raft_state(|st| st.committed.map_or(0, |l| l.index))
            .await
            .unwrap_or_else(|_| m.last_log_index.unwrap_or(0));
        Ok(Response::new(StatusResponse {
            header: Some(self.node.header(store.current_revision())),
            version: keel_proto::ETCD_API_VERSION.to_string(),
            db_size,
            leader: m.current_leader.unwrap_or(0),
            raft_index: committed,
            raft_term: m.current_term,
            raft_applied_index: m.last_applied.map_or(0, |l| l.index),
            errors: Vec::new(),
            db_size_in_use: db_size,
            is_learner,
            storage_version: String::new(),
            db_size_quota: self.node.config.quota_bytes(),
            downgrade_info: None,
        }))
    }

    /// etcd `HashKV`: the hash of the MVCC key space at `revision` (0 = current).
    async fn hash_kv(
        &self,
        request: Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
        authorize(&self.node, &request, Rpc::HashKv).await?;
        let req = request.into_inner();
        let store = self.node.store.get();
        let h = store.hash_kv(req.revision)?;
        Ok(Response::new(HashKvResponse {
            header: Some(self.node.header(store.current_revision())),
            hash: h.hash,
            compact_revision: h.compact_revision,
            hash_revision: h.hash_revision,
        }))
    }

    /// etcd `Defragment`: flushes this member's store to disk ([`Node::defragment`]); it does
    /// not shrink the file as etcd's bolt rewrite does (docs/compat.md).
    async fn defragment(
        &self,
        request: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
        authorize(&self.node, &request, Rpc::Defragment).await?;
        let bytes = self.node.defragment().await?;
        tracing::info!(flushed_bytes = bytes, "defragment: store flushed");
        // etcd 3.4 answers an empty DefragmentResponse (no header).
        Ok(Response::new(DefragmentResponse { header: None }))
    }

    /// etcd `MoveLeader`: only the leader accepts it (`NotLeader` elsewhere, as in etcd;
    /// etcdctl sends it to the leader among its endpoints).
    async fn move_leader(
        &self,
        request: Request<MoveLeaderRequest>,
    ) -> Result<Response<MoveLeaderResponse>, Status> {
        authorize(&self.node, &request, Rpc::MoveLeader).await?;
        transfer::move_leader(&self.node.cluster, request.into_inner().target_id).await?;
        Ok(Response::new(MoveLeaderResponse {
            header: Some(self.node.header(self.node.store.get().current_revision())),
        }))
    }
}
