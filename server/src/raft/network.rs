//! openraft's `RaftNetwork` over tonic: AppendEntries, Vote and InstallSnapshot chunks sent
//! to a member's peer URL through the `keelpb.Peer` service.
//!
//! AppendEntries (heartbeats included) go on one long-lived stream per follower
//! ([`AppendStreams`](super::append_stream::AppendStreams)); Vote and InstallSnapshot are unary RPCs.
//!
//! Bodies are openraft's own request/response types, bincode-encoded in `RaftPayload`; the
//! remote side returns `Result<Response, RaftError>` so that raft-level errors (a higher
//! vote, a snapshot mismatch) come back typed.
//!
//! Connections: every client of one member shares the pooled channel of its peer URL
//! ([`Peers`]), because openraft creates a fresh client per replication stream, per election
//! and per heartbeat round. Timeouts: each RPC carries openraft's deadline (`RPCOption`).
//! A transport failure surfaces as `Unreachable`; openraft then waits out [`backoff`] before it
//! retries, and the failed channel is dropped so the retry reconnects.
//!
//! Batching: openraft's replication stream sends everything appended since its last RPC in
//! one AppendEntries (up to `max_payload_entries`), and the follower appends the batch with one
//! WAL fsync, so concurrent client writes share RPCs and fsyncs.

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use keel_proto::keelpb::RaftPayload;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::append_stream::{OnGiveUp, Sent};
use super::peers::{Peers, is_transport_failure};
use super::trace::{self, Stage};
use super::types::{MemberNode, NodeId, TypeConfig};

/// First wait after a transport failure; doubles per failure up to [`BACKOFF_MAX`].
const BACKOFF_FIRST: Duration = Duration::from_millis(50);
/// Longest wait between retries to an unreachable member: a fifth of etcd's default election
/// timeout (1,000 ms). A restarted member that hears from no leader for an election timeout
/// campaigns and raises the term; with a 1 s cap, a follower that was down for 10 s or more
/// did so on every restart under load (found by a fresh-user check: term 3 → 8 on one restart).
const BACKOFF_MAX: Duration = Duration::from_millis(200);

/// Creates one [`PeerConnection`] per target member, all on the shared [`Peers`] pool.
#[derive(Clone, Default)]
pub struct PeerNetwork {
    peers: Arc<Peers>,
}

impl PeerNetwork {
    /// A network sending through `peers`.
    pub fn new(peers: Arc<Peers>) -> PeerNetwork {
        PeerNetwork { peers }
    }
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerConnection;

    async fn new_client(&mut self, target: NodeId, node: &MemberNode) -> PeerConnection {
        PeerConnection {
            target,
            label: format!("{target:x}"),
            url: node.peer_url().cloned().unwrap_or_default(),
            peers: self.peers.clone(),
        }
    }
}

/// The connection to one member's (first) peer URL.
pub struct PeerConnection {
    target: NodeId,
    /// The target's member ID in hex: the `To`/`From` label of the peer metrics.
    label: String,
    url: String,
    peers: Arc<Peers>,
}

#[derive(Clone, Copy)]
enum Rpc {
    Append,
    Vote,
    PreVote,
    Snapshot,
}

/// openraft's wait between retries after `Unreachable`: exponential from [`BACKOFF_FIRST`]
/// to [`BACKOFF_MAX`], so a restarted member hears from the leader well within an election
/// timeout.
pub fn backoff() -> Backoff {
    let delays = std::iter::successors(Some(BACKOFF_FIRST), |d| Some((*d * 2).min(BACKOFF_MAX)));
    Backoff::new(delays)
}

impl PeerConnection {
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
        self.call_unary(rpc, RaftPayload { data }, option).await
    }

    /// One unary RPC carrying `payload` (a bincode request).
    async fn call_unary<Resp, E>(
        &mut self,
        rpc: Rpc,
        payload: RaftPayload,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, MemberNode, E>>
    where
        Resp: DeserializeOwned,
        E: Error + DeserializeOwned,
    {
        let (result, sent, started) = self.send_unary(rpc, payload, option).await?;
        self.finish(result, sent, started)
    }

    /// Sends one unary RPC; returns its raw outcome, the bytes sent and when it started (for
    /// [`finish`](Self::finish)). Fails only when no client can be made for the URL.
    async fn send_unary<E>(
        &mut self,
        rpc: Rpc,
        payload: RaftPayload,
        option: &RPCOption,
    ) -> Result<
        (
            Result<RaftPayload, tonic::Status>,
            usize,
            std::time::Instant,
        ),
        RPCError<NodeId, MemberNode, E>,
    >
    where
        E: Error + DeserializeOwned,
    {
        let mut client = self
            .peers
            .client(&self.url)
            .map_err(|e| Unreachable::new(&e))?;
        let sent = payload.data.len();
        let mut request = tonic::Request::new(payload);
        request.set_timeout(option.hard_ttl());
        let started = std::time::Instant::now();
        let result = match rpc {
            Rpc::Append => client.append_entries(request).await,
            Rpc::Vote => client.vote(request).await,
            Rpc::PreVote => client.pre_vote(request).await,
            Rpc::Snapshot => client.install_snapshot(request).await,
        };
        Ok((result.map(tonic::Response::into_inner), sent, started))
    }

    /// An AppendEntries on the peer's stream ([`AppendStreams`](super::append_stream::AppendStreams)), or as a unary RPC to a peer
    /// that does not serve the stream.
    async fn call_append<E>(
        &mut self,
        req: &AppendEntriesRequest<TypeConfig>,
        option: &RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, MemberNode, E>>
    where
        E: Error + DeserializeOwned,
    {
        let data = bincode::serialize(req).map_err(|e| NetworkError::new(&e))?;
        let sent = data.len();
        let started = std::time::Instant::now();
        let streams = self.peers.append_streams();
        let on_give_up = if req.entries.is_empty() {
            OnGiveUp::LeaveQueued
        } else {
            OnGiveUp::CancelStream
        };
        match streams
            .send(&self.peers, &self.url, RaftPayload { data }, on_give_up)
            .await
        {
            Sent::Answer(Err(status)) if status.code() == tonic::Code::Unimplemented => {
                // A 0.1.0 member: this request goes again, as a unary RPC.
                self.call(Rpc::Append, req, option).await
            }
            Sent::Answer(result) => self.finish(result, sent, started),
            Sent::Unary(payload) => self.call_unary(Rpc::Append, payload, option).await,
        }
    }

    /// Records an RPC's outcome (metrics, peer health) and decodes its answer.
    #[allow(clippy::result_large_err)] // openraft's error type, as the trait methods return
    fn finish<Resp, E>(
        &mut self,
        result: Result<RaftPayload, tonic::Status>,
        sent: usize,
        started: std::time::Instant,
    ) -> Result<Resp, RPCError<NodeId, MemberNode, E>>
    where
        Resp: DeserializeOwned,
        E: Error + DeserializeOwned,
    {
        let received = result.as_ref().ok().map(|r| r.data.len());
        crate::metrics::network().record_rpc(&self.label, sent, received, started.elapsed());
        let payload = match result {
            Ok(p) => p,
            Err(status) => {
                if is_transport_failure(&status) {
                    self.peers.record(self.target, false);
                    self.peers.reset(&self.url);
                    return Err(Unreachable::new(&status).into());
                }
                return Err(NetworkError::new(&status).into());
            }
        };
        self.peers.record(self.target, true);
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
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, MemberNode, RaftError<NodeId>>>
    {
        self.peers.count_append(rpc.entries.len());
        let traced = trace::covered(&rpc.entries, |e| e.log_id.index);
        if let Some((first, last)) = traced {
            trace::mark(Stage::AeSend, first, last, self.target);
        }
        let result = self.call_append(&rpc, &option).await;
        if let (Some((first, last)), Ok(_)) = (traced, &result) {
            trace::mark(Stage::AeAck, first, last, self.target);
        }
        result
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

    /// `keelpb.Peer/PreVote` (Raft thesis §9.6). A 0.1.0 member does not serve it
    /// (Unimplemented) and counts as granting: it would answer the real vote as before.
    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, MemberNode, RaftError<NodeId>>> {
        let data = bincode::serialize(&rpc).map_err(|e| NetworkError::new(&e))?;
        let (result, sent, started) = self
            .send_unary(Rpc::PreVote, RaftPayload { data }, &option)
            .await?;
        if let Err(status) = &result
            && status.code() == tonic::Code::Unimplemented
        {
            return Ok(VoteResponse::new(rpc.vote, None, true));
        }
        self.finish(result, sent, started)
    }

    fn backoff(&self) -> Backoff {
        backoff()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let delays: Vec<Duration> = backoff().take(7).collect();
        let ms: Vec<u128> = delays.iter().map(|d| d.as_millis()).collect();
        assert_eq!(ms, vec![50, 100, 200, 200, 200, 200, 200]);
    }

    /// A 0.1.0 member serves no `keelpb.Peer/PreVote`: its Unimplemented counts as a grant,
    /// so a mixed cluster elects as before pre-vote (docs/upgrades.md).
    #[tokio::test]
    async fn a_member_without_pre_vote_counts_as_granting_it() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_routes(tonic::service::Routes::default())
                .serve_with_incoming(incoming),
        );
        let mut conn = PeerNetwork::new(Arc::new(Peers::default()))
            .new_client(
                9,
                &MemberNode {
                    name: "old".into(),
                    peer_urls: vec![format!("http://{addr}")],
                },
            )
            .await;
        let option = RPCOption::new(Duration::from_secs(2));
        let next = openraft::Vote::new(3, 1u64);
        let resp = conn
            .pre_vote(VoteRequest::new(next, None), option.clone())
            .await
            .expect("granted");
        assert!(resp.vote_granted);
        assert_eq!(resp.vote, next);
        // The real vote has no such fallback: Unimplemented there is an error.
        let err = conn
            .vote(VoteRequest::new(next, None), option)
            .await
            .unwrap_err();
        assert!(matches!(err, RPCError::Network(_)), "got {err:?}");
        server.abort();
    }

    #[tokio::test]
    async fn an_unreachable_member_is_reported_and_marked_down() {
        let peers = Arc::new(Peers::default());
        peers.record(9, true);
        // Port 1 on loopback refuses connections.
        let mut conn = PeerNetwork::new(peers.clone())
            .new_client(
                9,
                &MemberNode {
                    name: "x".into(),
                    peer_urls: vec!["http://127.0.0.1:1".into()],
                },
            )
            .await;
        let req = VoteRequest::new(openraft::Vote::new(1, 1u64), None);
        let err = conn
            .vote(req, RPCOption::new(Duration::from_secs(2)))
            .await
            .unwrap_err();
        assert!(matches!(err, RPCError::Unreachable(_)), "got {err:?}");
        assert_eq!(peers.active_since(9), None);
    }
}
