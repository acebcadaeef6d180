//! `/version`: the versions a member reports, from one place ([`VersionInfo::of`]).

use serde::Serialize;

use crate::node::Node;

/// The versions of `/version` (etcd's `{"etcdserver","etcdcluster"}` plus Keel's own) and of
/// the `etcd_server_version` / `etcd_cluster_version` metrics.
///
/// - `etcdserver`: the etcd API version Keel implements ([`keel_proto::ETCD_API_VERSION`],
///   also `Status.version`).
/// - `etcdcluster`: the etcd API version of the cluster, `major.minor.0` as etcd reports it.
/// - `keelserver`: this binary's version.
/// - `keelcluster`: the Keel version the whole cluster runs at, `major.minor.0`.
///
/// `keelcluster` is the replicated cluster version ([`Node::cluster_version`], the lowest
/// server version of all members, decided by the leader through raft: docs/upgrades.md);
/// `etcdcluster` is the etcd API every Keel release so far implements.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct VersionInfo {
    /// The etcd API version of this member.
    #[serde(rename = "etcdserver")]
    pub etcd_server: String,
    /// The etcd API version of the cluster (`major.minor.0`).
    #[serde(rename = "etcdcluster")]
    pub etcd_cluster: String,
    /// Keel's version of this member.
    #[serde(rename = "keelserver")]
    pub keel_server: String,
    /// Keel's version of the cluster (`major.minor.0`).
    #[serde(rename = "keelcluster")]
    pub keel_cluster: String,
}

impl VersionInfo {
    /// The versions `node` reports now.
    pub fn of(node: &Node) -> VersionInfo {
        let etcd = keel_proto::ETCD_API_VERSION;
        VersionInfo {
            etcd_server: etcd.to_string(),
            etcd_cluster: minor_zero(etcd),
            keel_server: env!("CARGO_PKG_VERSION").to_string(),
            keel_cluster: minor_zero(&node.cluster_version().to_string()),
        }
    }

    /// The cluster version as the `etcd_cluster_version` label shows it (`major.minor`).
    pub fn cluster_label(&self) -> String {
        major_minor(&self.etcd_cluster).to_string()
    }
}

/// `3.6` of `3.6.14`.
fn major_minor(version: &str) -> &str {
    match version.match_indices('.').nth(1) {
        Some((i, _)) => &version[..i],
        None => version,
    }
}

/// `3.6.0` of `3.6.14` (etcd's cluster versions are `major.minor.0`).
fn minor_zero(version: &str) -> String {
    format!("{}.0", major_minor(version))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_versions_are_cut_to_minor() {
        assert_eq!(minor_zero("3.6.14"), "3.6.0");
        assert_eq!(major_minor("3.6.14"), "3.6");
        assert_eq!(major_minor("3"), "3");
        let v = VersionInfo {
            etcd_server: "3.6.0".into(),
            etcd_cluster: "3.6.0".into(),
            keel_server: "0.1.0".into(),
            keel_cluster: "0.1.0".into(),
        };
        assert_eq!(
            serde_json::to_string(&v).unwrap(),
            r#"{"etcdserver":"3.6.0","etcdcluster":"3.6.0","keelserver":"0.1.0","keelcluster":"0.1.0"}"#
        );
        assert_eq!(v.cluster_label(), "3.6");
    }
}
