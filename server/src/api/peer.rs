//! Server side of Keel's peer protocol (`keelpb.Peer`): hands openraft RPCs to the local
//! raft and proposes forwarded client requests.

use std::sync::Arc;

use keel_proto::keelpb::peer_server::Peer;
use keel_proto::etcdserverpb::{
    LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use keel_proto::keelpb::{RaftPayload, RaftRequest, RaftResponse};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::{Request, Response, Status};

use super::lease_leader;
use crate::node::Node;

/// Peer service of one member.
pub struct PeerService {
    node: Arc<Node>,
}

impl PeerService {
    /// Serves peer RPCs for `node`.
    pub fn new(node: Arc<Node>) -> PeerService {
        PeerService { node }
    }
}

fn decode<T: DeserializeOwned>(p: &RaftPayload) -> Result<T, Status> {
    bincode::deserialize(&p.data).map_err(|e| Status::invalid_argument(format!("bad raft payload: {e}")))
}

fn encode<T: Serialize>(v: &T) -> Result<Response<RaftPayload>, Status> {
    bincode::serialize(v)
        .map(|data| Response::new(RaftPayload { data }))
        .map_err(|e| Status::internal(e.to_string()))
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn append_entries(&self, r: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let req = decode(r.get_ref())?;
        encode(&self.node.raft.append_entries(req).await)
    }

    async fn vote(&self, r: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let req = decode(r.get_ref())?;
        encode(&self.node.raft.vote(req).await)
    }

    async fn install_snapshot(&self, r: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let req = decode(r.get_ref())?;
        encode(&self.node.raft.install_snapshot(req).await)
    }

    async fn forward(&self, r: Request<RaftRequest>) -> Result<Response<RaftResponse>, Status> {
        let req = r.into_inner();
        if req.request.is_none() {
            return Err(Status::invalid_argument("forwarded raft request is empty"));
        }
        Ok(Response::new(self.node.propose_entry(req).await?))
    }

    async fn lease_renew(&self, r: Request<LeaseKeepAliveRequest>) -> Result<Response<LeaseKeepAliveResponse>, Status> {
        let id = r.into_inner().id;
        let deadline = tokio::time::Instant::now() + self.node.request_timeout();
        let ttl = lease_leader::renew_local(&self.node, id, deadline).await?;
        Ok(Response::new(LeaseKeepAliveResponse { id, ttl, ..Default::default() }))
    }

    async fn lease_time_to_live(
        &self,
        r: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        let deadline = tokio::time::Instant::now() + self.node.request_timeout();
        let resp = lease_leader::time_to_live_local(&self.node, r.get_ref(), deadline).await?;
        Ok(Response::new(resp))
    }
}
