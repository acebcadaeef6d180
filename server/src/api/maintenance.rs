//! The etcd `Maintenance` service: Alarm, Status, HashKV, MoveLeader and Defragment. Other
//! methods answer UNIMPLEMENTED until their issues land (see docs/compat.md).

use std::sync::Arc;

use keel_proto::etcdserverpb::maintenance_server::Maintenance;
use keel_proto::etcdserverpb::{
    AlarmRequest, AlarmResponse, DefragmentRequest, DefragmentResponse, HashKvRequest,
    HashKvResponse, MoveLeaderRequest, MoveLeaderResponse, StatusRequest, StatusResponse,
};
use keel_proto::keelpb::{raft_request::Request as Rq, raft_response::Response as Rs};
use tonic::{Request, Response, Status};

use crate::cluster::transfer;
use crate::error::EtcdError;
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
    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
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
            errors: self.node.alarms.status_errors(),
            db_size_in_use: self.node.db_size_in_use(),
            is_learner,
            storage_version: String::new(),
            db_size_quota: self.node.config.quota_bytes(),
            downgrade_info: None,
        }))
    }

    /// etcd `Alarm`: GET, ACTIVATE and DEACTIVATE all go through raft (as in etcd, so GET
    /// is linearizable) and are applied by `alarm::Alarms::apply`; the response has no
    /// header, as etcd 3.4's.
    async fn alarm(
        &self,
        request: Request<AlarmRequest>,
    ) -> Result<Response<AlarmResponse>, Status> {
        let resp = self.node.propose(Rq::Alarm(request.into_inner())).await?;
        match resp.response {
            Some(Rs::Alarm(r)) => Ok(Response::new(r)),
            _ => Err(EtcdError::Internal(
                "keel: apply returned an unexpected response type".into(),
            )
            .into()),
        }
    }

    /// etcd `HashKV`: the hash of the MVCC key space at `revision` (0 = current).
    async fn hash_kv(
        &self,
        request: Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
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
        _: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
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
        transfer::move_leader(&self.node.cluster, request.into_inner().target_id).await?;
        Ok(Response::new(MoveLeaderResponse {
            header: Some(self.node.header(self.node.store.get().current_revision())),
        }))
    }
}
