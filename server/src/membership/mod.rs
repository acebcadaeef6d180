//! Members of the cluster: etcd-compatible member and cluster IDs, the initial cluster
//! (`--initial-cluster`), and the attributes each member publishes (name, client URLs).
//!
//! Raft membership itself (voters, learners) lives in openraft's membership config; this
//! module owns what etcd's `membership.RaftCluster` adds on top.

mod attributes;
mod ids;

pub use attributes::{Attributes, MembershipError};
pub use ids::{InitialClusterError, InitialMember, cluster_id, member_id, parse_initial_cluster};
