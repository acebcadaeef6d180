//! The etcd `Cluster` service: MemberList. Membership changes arrive with the cluster issue
//! and answer UNIMPLEMENTED until then.

use std::sync::Arc;

use keel_proto::etcdserverpb::cluster_server::Cluster;
use keel_proto::etcdserverpb::{Member, MemberListRequest, MemberListResponse};
use tonic::{Request, Response, Status};

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

    /// Every member of the last applied raft membership config, voters and learners, with
    /// the name and client URLs it published (empty until it has started, as in etcd).
    pub fn members(&self) -> Vec<Member> {
        let metrics = self.node.raft.metrics().borrow().clone();
        let membership = metrics.membership_config.membership().clone();
        let learners: Vec<u64> = membership.learner_ids().collect();
        membership
            .nodes()
            .map(|(id, node)| {
                let attrs = self.node.attributes.get(*id);
                Member {
                    id: *id,
                    name: attrs.as_ref().map_or_else(String::new, |a| a.name.clone()),
                    peer_ur_ls: node.peer_urls.clone(),
                    client_ur_ls: attrs.map_or_else(Vec::new, |a| a.client_urls),
                    is_learner: learners.contains(id),
                }
            })
            .collect()
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_list(
        &self,
        request: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        if request.get_ref().linearizable {
            self.node.read_barrier().await?;
        }
        let revision = self.node.store.get().current_revision();
        Ok(Response::new(MemberListResponse {
            header: Some(self.node.header(revision)),
            members: self.members(),
        }))
    }
}
