//! Connections to other members' peer URLs, shared by every peer RPC a member sends (raft
//! replication, votes, snapshots, forwarded proposals, read index, leadership transfer,
//! membership changes), plus the per-member connection health that etcd's strict
//! reconfiguration checks read (etcd `rafthttp.Transport.ActiveSince`).
//!
//! One lazily connected HTTP/2 channel per peer URL carries all RPCs to that member (openraft
//! creates a new network client for every heartbeat round and every read-index round, so
//! without the pool each of them would open a TCP connection). A channel whose transport failed
//! is dropped, so the next RPC reconnects (the member may have restarted).
//!
//! Every RPC carries this member's cluster ID in [`CLUSTER_ID_HEADER`] once it is known
//! (etcd's `X-Etcd-Cluster-ID`), so a member of another cluster that reaches this one by a
//! reused address is refused instead of joining its votes (`api::peer_cluster_id`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use keel_proto::keelpb::peer_client::PeerClient;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use super::append_stream::AppendStreams;
use super::dial_override::DialOverrides;
use super::leader_calls::LeaderCalls;
use super::types::{MemberNode, NodeId, Raft};
use crate::error::EtcdError;
use crate::tls::client::PeerConnector;

/// Time allowed to open a TCP connection to a peer.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// HTTP/2 ping interval on idle peer connections, so a vanished peer is noticed.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// How long an HTTP/2 ping may stay unanswered before the connection is dropped.
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(3);

/// gRPC metadata key of the sender's cluster ID, lower-case hex (etcd's rafthttp header
/// `X-Etcd-Cluster-ID`).
pub const CLUSTER_ID_HEADER: &str = "x-etcd-cluster-id";

/// A `keelpb.Peer` client on a pooled channel, stamping [`CLUSTER_ID_HEADER`].
pub type PeerRpcClient = PeerClient<InterceptedService<Channel, ClusterIdStamp>>;

/// Adds [`CLUSTER_ID_HEADER`] to each outgoing peer RPC once the cluster ID is known (0:
/// not yet, while a joining member asks the cluster who it is).
#[derive(Clone, Default)]
pub struct ClusterIdStamp(Arc<AtomicU64>);

impl Interceptor for ClusterIdStamp {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let id = self.0.load(Ordering::Relaxed);
        if id != 0 {
            let value = format!("{id:x}")
                .parse()
                .expect("hex digits are valid metadata");
            req.metadata_mut().insert(CLUSTER_ID_HEADER, value);
        }
        Ok(req)
    }
}

/// The pool of peer channels and the health table. Cheap to share behind an `Arc`.
#[derive(Default)]
pub struct Peers {
    channels: Mutex<HashMap<String, Channel>>,
    cluster_id: ClusterIdStamp,
    dial_overrides: DialOverrides,
    /// How `https://` peer URLs are dialed (`None`: they cannot be).
    tls: Option<PeerConnector>,
    health: Mutex<HashMap<NodeId, Health>>,
    append_rpcs: AtomicU64,
    append_entries: AtomicU64,
    append_streams: AppendStreams,
    leader_calls: LeaderCalls,
}

/// Counters of the AppendEntries RPCs this member sent (as leader), to show batching: many
/// client writes share one AppendEntries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendStats {
    /// AppendEntries RPCs that carried at least one entry.
    pub rpcs: u64,
    /// Entries those RPCs carried in total.
    pub entries: u64,
}

/// Connection health of one member, as seen from this member.
#[derive(Debug, Clone, Copy, Default)]
struct Health {
    /// Start of the current run of successful RPCs; `None` after a transport failure.
    active_since: Option<Instant>,
    /// When the member last answered an RPC.
    answered: Option<Instant>,
}

impl Peers {
    /// A pool that dials `overrides[url]` instead of a peer URL `url` that has an override
    /// (`--experimental-peer-dial-override`).
    pub fn with_dial_overrides(overrides: DialOverrides) -> Peers {
        Peers {
            dial_overrides: overrides,
            ..Peers::default()
        }
    }

    /// The same pool, dialing `https://` peer URLs through `connector` (peer TLS).
    pub fn with_tls(mut self, connector: PeerConnector) -> Peers {
        self.tls = Some(connector);
        self
    }

    /// Stamps `cluster_id` on every RPC sent from now on ([`CLUSTER_ID_HEADER`]).
    pub fn set_cluster_id(&self, cluster_id: u64) {
        self.cluster_id.0.store(cluster_id, Ordering::Relaxed);
    }

    /// The address a connection to the peer advertised at `url` actually dials: its override,
    /// or `url` itself.
    pub fn dial_url<'a>(&'a self, url: &'a str) -> &'a str {
        self.dial_overrides.get(url).map_or(url, String::as_str)
    }

    /// A client for the `keelpb.Peer` service at `url` (e.g. `http://127.0.0.1:2380`), on the
    /// pooled channel for that URL. Message sizes are unlimited: snapshot chunks and append
    /// batches are bounded by openraft's config, not by gRPC. The connection goes to
    /// [`Peers::dial_url`] of `url`; an `https://` one through the pool's TLS connector
    /// ([`Peers::with_tls`]; without one it is dialed in plaintext and the peer refuses it).
    ///
    /// Errors: `url` (or its override) is not a valid URI.
    pub fn client(&self, url: &str) -> Result<PeerRpcClient, tonic::transport::Error> {
        let channel = {
            let mut channels = self.channels.lock().expect("peer channel lock");
            match channels.get(url) {
                Some(c) => c.clone(),
                None => {
                    let dial = self.dial_url(url);
                    // tonic's own TLS would refuse a custom connector on an `https` URI: the
                    // endpoint keeps `http` and the connector does the TLS.
                    let tls_dial = dial.strip_prefix("https://");
                    let plain_uri = tls_dial.map(|rest| format!("http://{rest}"));
                    let endpoint =
                        Endpoint::from_shared(plain_uri.unwrap_or_else(|| dial.to_string()))?
                            .connect_timeout(CONNECT_TIMEOUT)
                            .tcp_nodelay(true)
                            .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
                            .keep_alive_timeout(KEEP_ALIVE_TIMEOUT);
                    let c = match (tls_dial, &self.tls) {
                        (Some(_), Some(connector)) => {
                            endpoint.connect_with_connector_lazy(connector.clone())
                        }
                        _ => endpoint.connect_lazy(),
                    };
                    channels.insert(url.to_string(), c.clone());
                    c
                }
            }
        };
        Ok(
            PeerClient::with_interceptor(channel, self.cluster_id.clone())
                .max_decoding_message_size(usize::MAX)
                .max_encoding_message_size(usize::MAX),
        )
    }

    /// Drops the pooled channel of `url` after a transport failure; the next
    /// [`Peers::client`] call reconnects.
    pub fn reset(&self, url: &str) {
        self.channels.lock().expect("peer channel lock").remove(url);
        self.append_streams.reset(url);
        self.leader_calls.reset(url);
    }

    /// The leader-call streams (forwarded proposals, read index) to the peers of this pool.
    pub fn leader_calls(&self) -> &LeaderCalls {
        &self.leader_calls
    }

    /// The AppendEntries streams to the peers of this pool.
    pub fn append_streams(&self) -> &AppendStreams {
        &self.append_streams
    }

    /// Records the outcome of one RPC to member `id`: `true` when the member answered (with
    /// any result), `false` on a transport failure.
    pub fn record(&self, id: NodeId, reachable: bool) {
        let mut health = self.health.lock().expect("peer health lock");
        let h = health.entry(id).or_default();
        if reachable {
            h.answered = Some(Instant::now());
        }
        match (reachable, h.active_since) {
            (true, None) => h.active_since = Some(Instant::now()),
            (true, Some(_)) => {}
            (false, _) => h.active_since = None,
        }
    }

    /// When the current run of successful RPCs to `id` began (etcd's `ActiveSince`); `None`
    /// if the last RPC failed or none was sent.
    pub fn active_since(&self, id: NodeId) -> Option<Instant> {
        self.health
            .lock()
            .expect("peer health lock")
            .get(&id)
            .and_then(|h| h.active_since)
    }

    /// When `id` last answered one of this member's raft RPCs (an RPC that timed out, to a
    /// stopped member say, records nothing: this shows it).
    pub fn last_answer(&self, id: NodeId) -> Option<Instant> {
        self.health
            .lock()
            .expect("peer health lock")
            .get(&id)
            .and_then(|h| h.answered)
    }

    /// Counts one AppendEntries RPC carrying `entries` entries (heartbeats, with none, are
    /// not counted).
    pub fn count_append(&self, entries: usize) {
        if entries > 0 {
            self.append_rpcs.fetch_add(1, Ordering::Relaxed);
            self.append_entries
                .fetch_add(entries as u64, Ordering::Relaxed);
        }
    }

    /// The AppendEntries counters so far.
    pub fn append_stats(&self) -> AppendStats {
        AppendStats {
            rpcs: self.append_rpcs.load(Ordering::Relaxed),
            entries: self.append_entries.load(Ordering::Relaxed),
        }
    }

    /// Whether `id` answered one of this member's raft RPCs within the last `within`.
    pub fn answered_within(&self, id: NodeId, within: Duration) -> bool {
        self.last_answer(id).is_some_and(|t| t.elapsed() <= within)
    }

    /// Whether `id` has answered continuously since `since` or earlier (etcd's
    /// `isConnectedSince`).
    pub fn connected_since(&self, id: NodeId, since: Instant) -> bool {
        self.active_since(id).is_some_and(|t| t <= since)
    }
}

/// The leader this member knows of and the peer URL to reach it at ([`MemberNode::peer_url`]
/// of its entry in the membership config): `(None, None)` while no leader is known, a `None`
/// URL when the leader is not in this member's config yet. Every leader-only RPC (forwarded
/// proposals, read index, membership changes, lease keepalives) is routed with it.
///
/// [`MemberNode::peer_url`]: super::types::MemberNode::peer_url
pub fn leader_url(raft: &Raft) -> (Option<NodeId>, Option<String>) {
    let (leader, node) = leader_node(raft);
    (leader, node.and_then(|n| n.peer_url().cloned()))
}

/// The leader this member knows of (raft metrics) and its entry in the membership config:
/// `(None, None)` while no leader is known, a `None` entry when the leader is not in this
/// member's config yet.
pub fn leader_node(raft: &Raft) -> (Option<NodeId>, Option<MemberNode>) {
    let m = raft.metrics();
    let m = m.borrow();
    let node = m
        .current_leader
        .and_then(|l| m.membership_config.membership().get_node(&l).cloned());
    (m.current_leader, node)
}

/// The index of the last log entry the leader knows `id` holds (openraft's replication
/// metrics: `None` on a follower, for a member not replicated to, or before the first match).
pub fn matched_index(m: &openraft::RaftMetrics<NodeId, MemberNode>, id: NodeId) -> Option<u64> {
    m.replication
        .as_ref()
        .and_then(|r| r.get(&id).cloned().flatten())
        .map(|l| l.index)
}

/// What a failed peer RPC tells about the request it carried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerFailure {
    /// The connection could not be opened: the request never left this member, so sending it
    /// again (to the same or a new leader) cannot duplicate it.
    NotDelivered,
    /// The connection broke or timed out after the request was sent: it may have been
    /// applied. Reported to the client as etcd's "request timed out, possibly due to previous
    /// leader failure".
    Ambiguous,
    /// The peer answered with this etcd error.
    Answer(EtcdError),
}

/// Classifies a failed peer RPC (see [`PeerFailure`]).
pub fn classify(status: &tonic::Status) -> PeerFailure {
    if status.code() == tonic::Code::Unavailable && status.message().contains("connect") {
        PeerFailure::NotDelivered
    } else if is_transport_failure(status) {
        PeerFailure::Ambiguous
    } else if is_deadline(status) && !is_etcd_error(status) {
        // The deadline this member set on the call passed first (tonic's "Timeout
        // expired"): the request may still be applied, which etcd's "request timed out"
        // says. Found by a fresh-user check: clients got `Internal: Timeout expired`.
        PeerFailure::Answer(EtcdError::Timeout)
    } else {
        PeerFailure::Answer(EtcdError::from_parts(
            status.code() as i32,
            status.message(),
        ))
    }
}

/// `status`'s message followed by its chain of causes (`: `-separated), so a TLS failure
/// says why (`... received fatal alert: UnknownCA`) instead of tonic's bare "transport error".
pub fn describe(status: &tonic::Status) -> String {
    let mut text = status.message().to_string();
    let mut source = std::error::Error::source(status);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Whether `status` carries one of etcd's own error texts (an answer, not a transport fault).
fn is_etcd_error(status: &tonic::Status) -> bool {
    status.message().starts_with("etcdserver: ")
}

/// Whether `status` is a gRPC deadline that passed (tonic answers its `grpc-timeout` with
/// `Cancelled`, other stacks with `DeadlineExceeded`).
fn is_deadline(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Cancelled | tonic::Code::DeadlineExceeded
    )
}

/// Whether a failed RPC means the connection itself is unusable (refused, reset, closed), as
/// opposed to an answer or a deadline. etcd answers some of its errors with `Unavailable`
/// ("request timed out", "no leader", "leader changed"): those are answers, over a connection
/// that works.
pub fn is_transport_failure(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unavailable | tonic::Code::Unknown
    ) && !is_etcd_error(status)
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_proto::rpctypes::RpcError;

    #[test]
    fn health_tracks_runs_of_successes() {
        let peers = Peers::default();
        assert_eq!(peers.active_since(7), None);
        peers.record(7, true);
        let first = peers.active_since(7).expect("active after a success");
        peers.record(7, true);
        assert_eq!(peers.active_since(7), Some(first), "a run keeps its start");
        assert!(peers.connected_since(7, Instant::now()));
        assert!(!peers.connected_since(7, first - Duration::from_secs(1)));
        let answered = peers.last_answer(7).expect("answered");
        peers.record(7, false);
        assert_eq!(peers.active_since(7), None);
        assert_eq!(
            peers.last_answer(7),
            Some(answered),
            "a failure keeps the last answer"
        );
        assert!(!peers.connected_since(7, Instant::now()));
    }

    #[test]
    fn failures_are_classified_by_whether_the_request_left() {
        let refused = tonic::Status::unavailable("tcp connect error");
        assert_eq!(classify(&refused), PeerFailure::NotDelivered);
        let reset = tonic::Status::unknown("transport error");
        assert_eq!(classify(&reset), PeerFailure::Ambiguous);
        let no_leader: tonic::Status = EtcdError::NoLeader.into();
        assert_eq!(
            classify(&no_leader),
            PeerFailure::Answer(EtcdError::NoLeader)
        );
        let compacted: tonic::Status = EtcdError::Compacted.into();
        assert_eq!(
            classify(&compacted),
            PeerFailure::Answer(EtcdError::Compacted)
        );
        for expired in [
            tonic::Status::cancelled("Timeout expired"),
            tonic::Status::deadline_exceeded("Deadline Exceeded"),
        ] {
            assert_eq!(classify(&expired), PeerFailure::Answer(EtcdError::Timeout));
        }
        let canceled: tonic::Status = EtcdError::from(RpcError::Canceled).into();
        assert_eq!(
            classify(&canceled),
            PeerFailure::Answer(RpcError::Canceled.into())
        );
    }

    #[tokio::test]
    async fn channels_are_pooled_per_url_and_reset_on_demand() {
        let peers = Peers::default();
        peers.client("http://127.0.0.1:1").unwrap();
        peers.client("http://127.0.0.1:1").unwrap();
        peers.client("http://127.0.0.1:2").unwrap();
        assert_eq!(peers.channels.lock().unwrap().len(), 2);
        peers.reset("http://127.0.0.1:1");
        assert_eq!(peers.channels.lock().unwrap().len(), 1);
        assert!(peers.client("not a url").is_err());
    }

    #[tokio::test]
    async fn overrides_change_the_dialed_address_but_not_the_pool_key() {
        let overrides =
            super::super::dial_override::parse("http://127.0.0.1:1=http://127.0.0.1:11").unwrap();
        let peers = Peers::with_dial_overrides(overrides);
        assert_eq!(peers.dial_url("http://127.0.0.1:1"), "http://127.0.0.1:11");
        assert_eq!(peers.dial_url("http://127.0.0.1:2"), "http://127.0.0.1:2");
        peers.client("http://127.0.0.1:1").unwrap();
        assert!(
            peers
                .channels
                .lock()
                .unwrap()
                .contains_key("http://127.0.0.1:1")
        );
    }
}
