//! The applied cluster version (etcd `membership.RaftCluster.version`).
//!
//! On-disk: sled key [`schema::CLUSTER_VERSION`] → `major.minor` as UTF-8, written by apply in
//! the batch of the `cluster_version_set` entry that set it (with the consistent index).
//! Absent = not decided yet (a new cluster before the leader's first decision, or a data dir
//! written by Keel 0.1.0): the cluster then runs as [`Version::MIN`].

use tokio::sync::watch;

use super::{ParseVersionError, Version};
use crate::backend::{Batch, schema};

/// The stored cluster version cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ClusterVersionError {
    /// sled failed.
    #[error(transparent)]
    Storage(#[from] sled::Error),
    /// The stored value is not a version.
    #[error("stored cluster version: {0}")]
    Decode(#[from] ParseVersionError),
}

/// The cluster version as applied on this member; readers (API, /version, metrics) get it
/// here, and can wait for a change ([`ClusterVersion::subscribe`]).
pub struct ClusterVersion {
    current: watch::Sender<Option<Version>>,
}

impl ClusterVersion {
    /// A member whose cluster version is `v` (tests; `None`: not decided).
    pub fn new(v: Option<Version>) -> ClusterVersion {
        ClusterVersion {
            current: watch::Sender::new(v),
        }
    }

    /// Loads the stored cluster version.
    ///
    /// Errors: sled I/O, or a stored value that is not `major.minor`.
    pub fn load(tree: &sled::Tree) -> Result<ClusterVersion, ClusterVersionError> {
        Ok(ClusterVersion::new(read(tree)?))
    }

    /// Re-reads the stored value (after a snapshot replaced the tree).
    ///
    /// Errors: as [`ClusterVersion::load`].
    pub fn reload(&self, tree: &sled::Tree) -> Result<(), ClusterVersionError> {
        self.current.send_replace(read(tree)?);
        Ok(())
    }

    /// The cluster version in force: the decided one, or [`Version::MIN`] before the first
    /// decision.
    pub fn get(&self) -> Version {
        self.decided().unwrap_or(Version::MIN)
    }

    /// The decided cluster version; `None` before the leader's first decision.
    pub fn decided(&self) -> Option<Version> {
        *self.current.borrow()
    }

    /// Stages `v` into an apply batch; call [`ClusterVersion::publish`] once it is staged.
    pub fn stage(batch: &mut Batch, v: Version) {
        batch.insert(schema::CLUSTER_VERSION.to_vec(), v.to_string().into_bytes());
    }

    /// Makes an applied cluster version visible to readers.
    pub fn publish(&self, v: Version) {
        self.current.send_replace(Some(v));
    }

    /// A receiver that sees every applied change.
    pub fn subscribe(&self) -> watch::Receiver<Option<Version>> {
        self.current.subscribe()
    }
}

fn read(tree: &sled::Tree) -> Result<Option<Version>, ClusterVersionError> {
    match tree.get(schema::CLUSTER_VERSION)? {
        Some(v) => Ok(Some(String::from_utf8_lossy(&v).parse()?)),
        None => Ok(None),
    }
}

/// Stores `v` as the applied cluster version of `tree` (tests that apply gated entries
/// without a leader to decide it).
#[cfg(test)]
pub(crate) fn store_for_test(tree: &sled::Tree, v: Version) {
    tree.insert(schema::CLUSTER_VERSION, v.to_string().as_bytes())
        .expect("store the cluster version");
}
