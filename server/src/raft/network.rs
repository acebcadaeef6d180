//! openraft's `RaftNetwork` over tonic: AppendEntries, Vote and InstallSnapshot chunks sent
//! to a member's peer URL through the `keelpb.Peer` service.
//!
//! Bodies are openraft's own request/response types, bincode-encoded in `RaftPayload`; the
//! remote side returns `Result<Response, RaftError>` so that raft-level errors (a higher
//! vote, a snapshot mismatch) come back typed. Channels are created lazily and reused for
//! every RPC to that member; a transport failure surfaces as `Unreachable`, which makes
//! openraft back off before retrying.

use std::error::Error;
use std::time::Duration;

use keel_proto::keelpb::peer_client::PeerClient;
use keel_proto::keelpb::RaftPayload;
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};

use super::types::{MemberNode, NodeId, TypeConfig};

/// Creates one [`PeerConnection`] per target member.
#[derive(Clone, Default)]
pub struct PeerNetwork;

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerConnection;

    async fn new_client(&mut self, target: NodeId, node: &MemberNode) -> PeerConnection {
        PeerConnection {
            target,
            url: node.peer_urls.first().cloned().unwrap_or_default(),
            client: None,
        }
    }
}

/// A reusable connection to one member's peer URL.
pub struct PeerConnection {
    target: NodeId,
    url: String,
    client: Option<PeerClient<Channel>>,
}

#[derive(Clone, Copy)]
enum Rpc {
    Append,
    Vote,
    Snapshot,
}

impl PeerConnection {
    fn client(&mut self) -> Result<PeerClient<Channel>, Unreachable> {
        if let Some(c) = &self.client {
            return Ok(c.clone());
        }
        let endpoint = Endpoint::from_shared(self.url.clone())
            .map_err(|e| Unreachable::new(&e))?
            .connect_timeout(Duration::from_millis(500))
            .tcp_nodelay(true);
        let client = PeerClient::new(endpoint.connect_lazy())
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        self.client = Some(client.clone());
        Ok(client)
    }

    async fn call<Req, Resp, E>(
        &mut self,
        rpc: Rpc,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, MemberNode, E>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: Error + DeserializeOwned,
    {
        let data = bincode::serialize(req).map_err(|e| NetworkError::new(&e))?;
        let mut client = self.client()?;
        let mut request = tonic::Request::new(RaftPayload { data });
        request.set_timeout(option.hard_ttl());
        let result = match rpc {
            Rpc::Append => client.append_entries(request).await,
            Rpc::Vote => client.vote(request).await,
            Rpc::Snapshot => client.install_snapshot(request).await,
        };
        let payload = match result {
            Ok(r) => r.into_inner(),
            Err(status) => {
                // Drop the channel so the next RPC reconnects (the member may have restarted).
                self.client = None;
                return Err(Unreachable::new(&status).into());
            }
        };
        let decoded: Result<Resp, E> =
            bincode::deserialize(&payload.data).map_err(|e| NetworkError::new(&e))?;
        decoded.map_err(|e| RemoteError::new(self.target, e).into())
    }
}

impl RaftNetwork<TypeConfig> for PeerConnection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, MemberNode, RaftError<NodeId>>> {
        self.call(Rpc::Append, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, MemberNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.call(Rpc::Snapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, MemberNode, RaftError<NodeId>>> {
        self.call(Rpc::Vote, &rpc, &option).await
    }
}
