//! Server side of Keel's peer protocol (`keelpb.Peer`): hands openraft RPCs to the local
//! raft, proposes forwarded client requests, and serves the cluster RPCs (read index,
//! leadership transfer, cluster info, forwarded membership changes; see `crate::cluster`).

use std::sync::Arc;

use keel_proto::etcdserverpb::{
    HashKvRequest, HashKvResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse, MemberAddRequest, MemberAddResponse,
    MemberPromoteRequest, MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse,
    MemberUpdateRequest, MemberUpdateResponse,
};
use keel_proto::keelpb::peer_server::Peer;
use keel_proto::keelpb::{
    ClusterInfoRequest, ClusterInfoResponse, ConfirmTransferRequest, ConfirmTransferResponse,
    PeerCall, RaftPayload, RaftRequest, RaftResponse, ReadIndexRequest, ReadIndexResponse,
    TimeoutNowRequest, TimeoutNowResponse, WaiveLeaderLeaseRequest, WaiveLeaderLeaseResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::{Request, Response, Status};

use super::{peer_calls, peer_stream};
use crate::cluster::{leader_lease, reconfig, removal, transfer};
use crate::node::{FORWARD_LOG_INDEX, Node};

/// Peer service of one member.
pub struct PeerService {
    node: Arc<Node>,
    /// Becomes `true` when the member stops serving peers (ends the AppendEntries streams).
    stopping: tokio::sync::watch::Receiver<bool>,
}

impl PeerService {
    /// Serves peer RPCs for `node` until `stopping` becomes `true`.
    pub fn new(node: Arc<Node>, stopping: tokio::sync::watch::Receiver<bool>) -> PeerService {
        PeerService { node, stopping }
    }
}

fn decode<T: DeserializeOwned>(p: &RaftPayload) -> Result<T, Status> {
    bincode::deserialize(&p.data)
        .map_err(|e| Status::invalid_argument(format!("bad raft payload: {e}")))
}

fn encode<T: Serialize>(v: &T) -> Result<Response<RaftPayload>, Status> {
    bincode::serialize(v)
        .map(|data| Response::new(RaftPayload { data }))
        .map_err(|e| Status::internal(e.to_string()))
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn append_entries(
        &self,
        r: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let answered = peer_stream::submit(&self.node, r.get_ref())?.await;
        peer_stream::reply(&self.node, answered).map(Response::new)
    }

    async fn append_entries_stream(
        &self,
        r: Request<tonic::Streaming<RaftPayload>>,
    ) -> Result<Response<peer_stream::ResponseStream>, Status> {
        Ok(Response::new(peer_stream::serve(
            self.node.clone(),
            r.into_inner(),
            self.stopping.clone(),
        )))
    }

    async fn vote(&self, r: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let req = decode(r.get_ref())?;
        encode(&self.node.raft.vote(req).await)
    }

    async fn pre_vote(&self, r: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let req = decode(r.get_ref())?;
        encode(&self.node.raft.pre_vote(req).await)
    }

    async fn install_snapshot(
        &self,
        r: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let req = decode(r.get_ref())?;
        self.node.cluster.leader_contact.touch();
        encode(&self.node.raft.install_snapshot(req).await)
    }

    async fn forward(&self, r: Request<RaftRequest>) -> Result<Response<RaftResponse>, Status> {
        let (resp, index) = peer_calls::forward(&self.node, r.into_inner()).await?;
        let mut response = Response::new(resp);
        response.metadata_mut().insert(
            FORWARD_LOG_INDEX,
            index
                .to_string()
                .parse()
                .expect("digits are valid metadata"),
        );
        Ok(response)
    }

    async fn lease_renew(
        &self,
        r: Request<LeaseKeepAliveRequest>,
    ) -> Result<Response<LeaseKeepAliveResponse>, Status> {
        let deadline = tokio::time::Instant::now() + self.node.request_timeout();
        peer_calls::lease_renew(&self.node, r.get_ref().id, deadline)
            .await
            .map(Response::new)
    }

    async fn lease_time_to_live(
        &self,
        r: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        let deadline = tokio::time::Instant::now() + self.node.request_timeout();
        peer_calls::lease_time_to_live(&self.node, r.get_ref(), deadline)
            .await
            .map(Response::new)
    }

    async fn read_index(
        &self,
        _r: Request<ReadIndexRequest>,
    ) -> Result<Response<ReadIndexResponse>, Status> {
        peer_calls::read_index(&self.node).await.map(Response::new)
    }

    async fn leader_calls(
        &self,
        r: Request<tonic::Streaming<PeerCall>>,
    ) -> Result<Response<peer_calls::AnswerStream>, Status> {
        Ok(Response::new(peer_calls::serve(
            self.node.clone(),
            r.into_inner(),
        )))
    }

    async fn timeout_now(
        &self,
        r: Request<TimeoutNowRequest>,
    ) -> Result<Response<TimeoutNowResponse>, Status> {
        transfer::on_timeout_now(&self.node.cluster, r.get_ref())
            .await
            .map(Response::new)
    }

    async fn confirm_transfer(
        &self,
        r: Request<ConfirmTransferRequest>,
    ) -> Result<Response<ConfirmTransferResponse>, Status> {
        Ok(Response::new(transfer::on_confirm_transfer(
            &self.node.cluster.gate,
            r.get_ref(),
        )))
    }

    async fn waive_leader_lease(
        &self,
        r: Request<WaiveLeaderLeaseRequest>,
    ) -> Result<Response<WaiveLeaderLeaseResponse>, Status> {
        Ok(Response::new(
            leader_lease::on_waive_leader_lease(&self.node.cluster, r.get_ref()).await,
        ))
    }

    async fn cluster_info(
        &self,
        r: Request<ClusterInfoRequest>,
    ) -> Result<Response<ClusterInfoResponse>, Status> {
        Ok(Response::new(
            removal::cluster_info(&self.node.cluster, r.into_inner()).await,
        ))
    }

    async fn member_add(
        &self,
        r: Request<MemberAddRequest>,
    ) -> Result<Response<MemberAddResponse>, Status> {
        Ok(Response::new(
            reconfig::add_on_leader(&self.node.cluster, r.into_inner()).await?,
        ))
    }

    async fn member_remove(
        &self,
        r: Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        Ok(Response::new(
            reconfig::remove_on_leader(&self.node.cluster, r.into_inner()).await?,
        ))
    }

    async fn member_update(
        &self,
        r: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        Ok(Response::new(
            reconfig::update_on_leader(&self.node.cluster, r.into_inner()).await?,
        ))
    }

    async fn member_promote(
        &self,
        r: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        Ok(Response::new(
            reconfig::promote_on_leader(&self.node.cluster, r.into_inner()).await?,
        ))
    }

    /// This member's HashKV at the requested revision (the corruption checks): the hash
    /// kept at that compaction revision if there is one (etcd's `HashByRev`; it answers even
    /// once a later compaction passed the revision), else computed now.
    async fn hash_kv(&self, r: Request<HashKvRequest>) -> Result<Response<HashKvResponse>, Status> {
        let store = self.node.store.get();
        let revision = r.into_inner().revision;
        let h = tokio::task::spawn_blocking(move || store.hash_at_compaction(revision))
            .await
            .map_err(|e| Status::internal(format!("hash task: {e}")))??;
        Ok(Response::new(HashKvResponse {
            header: Some(self.node.header(h.current_revision)),
            hash: h.hash,
            compact_revision: h.compact_revision,
            hash_revision: h.hash_revision,
        }))
    }
}
