//! The etcd `Cluster` service (etcd rpc.proto `service Cluster`): MemberList, MemberAdd,
//! MemberRemove, MemberUpdate and MemberPromote. Changes run on the leader with etcd's strict
//! reconfiguration checks; a follower forwards them (`crate::cluster::reconfig`).

use std::sync::Arc;

use keel_proto::etcdserverpb::cluster_server::Cluster;
use keel_proto::etcdserverpb::{
    Member, MemberAddRequest, MemberAddResponse, MemberListRequest, MemberListResponse,
    MemberPromoteRequest, MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse,
    MemberUpdateRequest, MemberUpdateResponse,
};
use tonic::{Request, Response, Status};

use super::credentials::authorize;
use crate::auth::check::Rpc;
use crate::cluster::reconfig;
use crate::node::Node;

/// Cluster service of one member.
pub struct ClusterService {
    node: Arc<Node>,
}

impl ClusterService {
    /// Serves cluster requests for `node`.
    pub fn new(node: Arc<Node>) -> ClusterService {
        ClusterService { node }
    }

    /// Every member of the latest raft membership config, voters and learners, with the
    /// name and client URLs it published (empty until it has started, as in etcd).
    pub fn members(&self) -> Vec<Member> {
        reconfig::current_members(&self.node.cluster)
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_list(
        &self,
        request: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        authorize(&self.node, &request, Rpc::MemberList).await?;
        if request.get_ref().linearizable {
            self.node.read_barrier().await?;
        }
        Ok(Response::new(MemberListResponse {
            // etcd's Cluster headers carry no revision (`ClusterServer.header`).
            header: Some(self.node.header(0)),
            members: self.members(),
        }))
    }

    async fn member_add(
        &self,
        request: Request<MemberAddRequest>,
    ) -> Result<Response<MemberAddResponse>, Status> {
        authorize(&self.node, &request, Rpc::MemberAdd).await?;
        Ok(Response::new(
            reconfig::member_add(&self.node.cluster, request.into_inner()).await?,
        ))
    }

    async fn member_remove(
        &self,
        request: Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        authorize(&self.node, &request, Rpc::MemberRemove).await?;
        Ok(Response::new(
            reconfig::member_remove(&self.node.cluster, request.into_inner()).await?,
        ))
    }

    async fn member_update(
        &self,
        request: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        authorize(&self.node, &request, Rpc::MemberUpdate).await?;
        Ok(Response::new(
            reconfig::member_update(&self.node.cluster, request.into_inner()).await?,
        ))
    }

    async fn member_promote(
        &self,
        request: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        authorize(&self.node, &request, Rpc::MemberPromote).await?;
        Ok(Response::new(
            reconfig::member_promote(&self.node.cluster, request.into_inner()).await?,
        ))
    }
}
