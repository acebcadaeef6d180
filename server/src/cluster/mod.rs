//! Running as one member of a multi-member cluster, on the same code path as a single member
//! (docs/raft.md):
//!
//! - [`autocompact`] — the leader's auto-compaction (etcd's periodic and revision modes);
//! - [`corrupt`], [`compact_hash`] — the corruption checks (initial, periodic, compact-hash);
//! - [`bootstrap`] — member and cluster IDs from `--initial-cluster*`, joining with `existing`;
//! - [`timing`] — openraft timers from etcd's heartbeat and election timeout;
//! - [`read_index`] (+ [`batch`]) — linearizable reads on any member, batched;
//! - [`reconfig`] (+ [`members`]) — MemberAdd/Remove/Update/Promote with etcd's checks;
//! - [`transfer`] (+ [`leader_lease`]) — `MoveLeader` and the stopping leader's hand-over;
//! - [`removal`] — ClusterInfo for peers and stopping after this member was removed;
//! - [`watchdog`] — an election backstop for members openraft holds back;
//! - [`leadership`] — whether this member has a leader (require-leader requests);
//! - [`drain`] — a stopping member answers the leader calls it runs before its peer server stops.
//!
//! Peer connections are raft's transport (`raft::peers`, `raft::dial_override`). [`Cluster`]
//! bundles the handles and per-member state these need; the node owns one, and nothing here
//! sees the node itself.

pub mod autocompact;
pub mod batch;
pub mod bootstrap;
pub mod compact_hash;
pub mod corrupt;
pub mod drain;
pub mod leader_lease;
pub mod leadership;
pub mod members;
pub mod read_index;
pub mod reconfig;
pub mod removal;
pub mod timing;
pub mod transfer;
pub mod watchdog;

use std::sync::Arc;

use keel_proto::etcdserverpb::ResponseHeader;
use openraft::Membership;

use crate::membership::Attributes;
use crate::mvcc::SharedStore;
use crate::raft::Peers;
use crate::raft::types::{MemberNode, NodeId, Raft};

pub use read_index::ReadPath;
pub use timing::{RaftTimers, Timing};
pub use transfer::TransferGate;

/// The cluster-facing state of one member: the handles the cluster layer works with, and
/// its own state (transfer gate, read path, leader contact, reconfiguration lock). The node
/// builds it with [`Cluster::new`].
pub struct Cluster {
    /// This member's ID.
    pub id: NodeId,
    /// The cluster ID.
    pub cluster_id: u64,
    /// The raft handle.
    pub raft: Raft,
    /// Connections to the other members.
    pub peers: Arc<Peers>,
    /// Published member attributes.
    pub attributes: Arc<Attributes>,
    /// The current MVCC store (response headers carry its revision).
    pub store: Arc<SharedStore>,
    /// Timers and timeouts.
    pub timing: Timing,
    /// Holds client work on the leader during a leadership transfer.
    pub gate: TransferGate,
    /// The linearizable read path.
    pub reads: ReadPath,
    /// When a leader was last heard from (for the election backstop).
    pub leader_contact: watchdog::LeaderContact,
    /// Raised after etcd's 3 leaderless election timeouts: require-leader streams end.
    pub leader_loss: leadership::LeaderLoss,
    /// Whether this member has a leader (shared with the read path).
    leader_check: Arc<leadership::LeaderCheck>,
    /// The drain of the leader calls this member serves, when it stops.
    pub calls: drain::CallDrain,
    /// Serializes membership changes on the leader.
    reconfig: tokio::sync::Mutex<()>,
    /// Set when the member starts to stop: it campaigns no more ([`Cluster::stop_elections`]).
    stopping: std::sync::atomic::AtomicBool,
}

impl Cluster {
    /// The cluster state of member `id` of cluster `cluster_id`, with a fresh transfer gate,
    /// read path, leader contact and reconfiguration lock.
    pub fn new(
        id: NodeId,
        cluster_id: u64,
        raft: Raft,
        peers: Arc<Peers>,
        attributes: Arc<Attributes>,
        store: Arc<SharedStore>,
        timing: Timing,
    ) -> Cluster {
        let gate = TransferGate::default();
        let leader_check = Arc::new(leadership::LeaderCheck::new(timing.election_timeout));
        Cluster {
            reads: ReadPath::new(
                id,
                raft.clone(),
                peers.clone(),
                gate.clone(),
                timing.request_timeout,
                leader_check.clone(),
            ),
            id,
            cluster_id,
            raft,
            peers,
            attributes,
            store,
            timing,
            gate,
            leader_contact: watchdog::LeaderContact::default(),
            leader_loss: leadership::LeaderLoss::default(),
            leader_check,
            calls: drain::CallDrain::default(),
            reconfig: tokio::sync::Mutex::new(()),
            stopping: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Called when the member starts to stop (SIGTERM): neither openraft's election timer nor
    /// the election backstop starts an election from now on. The member closes its peer
    /// listener first and may take seconds to drain its clients; meanwhile it hears no leader
    /// and would campaign (a fresh-user check saw a follower given SIGTERM under load start an
    /// election 1.4 s later; the others' leader lease normally refuses its votes, so this is a
    /// safeguard, docs/raft.md).
    pub fn stop_elections(&self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.raft.runtime_config().elect(false);
    }

    /// Whether [`Cluster::stop_elections`] was called.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Takes the membership-change lock (held across one change, never across another
    /// component's lock).
    pub async fn reconfig_lock(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.reconfig.lock().await
    }

    /// A response header for `revision` (etcd fills cluster_id, member_id, revision and
    /// raft_term on every response).
    pub fn header(&self, revision: i64) -> ResponseHeader {
        ResponseHeader {
            cluster_id: self.cluster_id,
            member_id: self.id,
            revision,
            raft_term: self.raft.metrics().borrow().current_term,
        }
    }

    /// The effective raft membership config, as raft's metrics report it now.
    pub fn membership(&self) -> Membership<NodeId, MemberNode> {
        self.raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .clone()
    }

    /// Whether this member has a leader now, as etcd's require-leader check sees it
    /// ([`leadership::has_leader`]).
    pub fn has_leader(&self) -> bool {
        self.leader_check.has_leader(&self.raft, self.id)
    }

    /// Whether this member is raft leader now.
    pub fn is_leader(&self) -> bool {
        self.raft.metrics().borrow().current_leader == Some(self.id)
    }

    /// Whether raft names this member leader but no quorum acknowledged it for an election
    /// timeout ([`leadership::has_leader`]): where an etcd leader would have stepped down
    /// (CheckQuorum), so it takes no writes and answers no keepalives.
    pub fn leads_without_quorum(&self) -> bool {
        self.is_leader() && !self.has_leader()
    }
}
