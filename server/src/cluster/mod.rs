//! Running as one member of a multi-member cluster, on the same code path as a single member
//! (docs/raft.md):
//!
//! - [`peers`] — pooled connections to peer URLs and their health;
//! - [`dial_override`] — `--experimental-peer-dial-override`: dial a proxy instead of a peer;
//! - [`bootstrap`] — member and cluster IDs from `--initial-cluster*`, joining with `existing`;
//! - [`timing`] — openraft timers from etcd's heartbeat and election timeout;
//! - [`read_index`] (+ [`batch`]) — linearizable reads on any member, batched;
//! - [`reconfig`] (+ [`members`]) — MemberAdd/Remove/Update/Promote with etcd's checks;
//! - [`transfer`] — `MoveLeader`;
//! - [`removal`] — ClusterInfo for peers and stopping after this member was removed;
//! - [`watchdog`] — an election backstop for members openraft holds back.
//!
//! [`Cluster`] bundles the per-member state these need; the node owns one.

pub mod batch;
pub mod bootstrap;
pub mod dial_override;
pub mod members;
pub mod peers;
pub mod read_index;
pub mod reconfig;
pub mod removal;
pub mod timing;
pub mod transfer;
pub mod watchdog;

use std::sync::Arc;
use std::time::Duration;

use crate::raft::types::{NodeId, Raft};

/// The cluster-facing state of one member.
pub struct Cluster {
    /// Connections to the other members.
    pub peers: Arc<Peers>,
    /// Holds client work on the leader during a leadership transfer.
    pub gate: TransferGate,
    /// The linearizable read path.
    pub reads: ReadPath,
    /// When a leader was last heard from (for the election backstop).
    pub leader_contact: watchdog::LeaderContact,
    /// Serializes membership changes on the leader.
    reconfig: tokio::sync::Mutex<()>,
}

pub use peers::Peers;
pub use read_index::ReadPath;
pub use transfer::TransferGate;

impl Cluster {
    /// The cluster state of member `id`, sending through `peers`; waits are bounded by
    /// `request_timeout`.
    pub fn new(id: NodeId, raft: Raft, peers: Arc<Peers>, request_timeout: Duration) -> Cluster {
        let gate = TransferGate::default();
        Cluster {
            reads: ReadPath::new(id, raft, peers.clone(), gate.clone(), request_timeout),
            peers,
            gate,
            leader_contact: watchdog::LeaderContact::default(),
            reconfig: tokio::sync::Mutex::new(()),
        }
    }

    /// Takes the membership-change lock (held across one change, never across another
    /// component's lock).
    pub async fn reconfig_lock(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.reconfig.lock().await
    }
}
