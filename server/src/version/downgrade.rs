//! The downgrade job (etcd `Maintenance.Downgrade`, `server/etcdserver/version/downgrade.go`):
//! the target a cluster is being lowered to, replicated state.
//!
//! On-disk: sled key [`schema::DOWNGRADE_TARGET`] → the target `major.minor` as UTF-8, written
//! by apply in the batch of the `downgrade_info_set` entry that enabled it, removed by the one
//! that cancelled it. Absent = no downgrade job.

use std::sync::RwLock;

use keel_proto::rpctypes::RpcError;

use super::{ClusterVersionError, Version};
use crate::backend::{Batch, schema};
use crate::error::EtcdError;

/// The applied downgrade job of this member.
#[derive(Default)]
pub struct Downgrade {
    target: RwLock<Option<Version>>,
}

impl Downgrade {
    /// Loads the stored job.
    ///
    /// Errors: sled I/O, or a stored value that is not `major.minor`.
    pub fn load(tree: &sled::Tree) -> Result<Downgrade, ClusterVersionError> {
        Ok(Downgrade {
            target: RwLock::new(read(tree)?),
        })
    }

    /// Re-reads the stored job (after a snapshot replaced the tree).
    ///
    /// Errors: as [`Downgrade::load`].
    pub fn reload(&self, tree: &sled::Tree) -> Result<(), ClusterVersionError> {
        *self.target.write().expect("downgrade lock") = read(tree)?;
        Ok(())
    }

    /// The target of the enabled downgrade, if any.
    pub fn target(&self) -> Option<Version> {
        *self.target.read().expect("downgrade lock")
    }

    /// Stages the job (`None`: cancelled) into an apply batch; then [`Downgrade::publish`].
    pub fn stage(batch: &mut Batch, target: Option<Version>) {
        match target {
            Some(v) => batch.insert(
                schema::DOWNGRADE_TARGET.to_vec(),
                v.to_string().into_bytes(),
            ),
            None => batch.remove(schema::DOWNGRADE_TARGET.to_vec()),
        }
    }

    /// Makes an applied job visible.
    pub fn publish(&self, target: Option<Version>) {
        *self.target.write().expect("downgrade lock") = target;
    }
}

fn read(tree: &sled::Tree) -> Result<Option<Version>, ClusterVersionError> {
    match tree.get(schema::DOWNGRADE_TARGET)? {
        Some(v) => Ok(Some(String::from_utf8_lossy(&v).parse()?)),
        None => Ok(None),
    }
}

/// etcd `downgradeValidate`: the target parsed from `version` if `cluster` may be downgraded to
/// it: exactly one minor below the cluster version, with no job running.
///
/// Errors (etcd's): `WrongDowngradeVersionFormat` for a target that is not `major.minor[.patch]`;
/// `ClusterVersionUnavailable` before the first decision; `DowngradeInProcess` while a job
/// runs; `InvalidDowngradeTargetVersion` for any other target than one minor below.
pub fn validate(
    cluster: Option<Version>,
    version: &str,
    running: Option<Version>,
) -> Result<Version, EtcdError> {
    let target: Version = version
        .parse()
        .map_err(|_| EtcdError::from(RpcError::WrongDowngradeVersionFormat))?;
    let cluster = cluster.ok_or(EtcdError::from(RpcError::ClusterVersionUnavailable))?;
    if running.is_some() {
        return Err(RpcError::DowngradeInProcess.into());
    }
    // Keel 0.1 is the first release: nothing runs below it.
    if cluster.previous_minor() != Some(target) || target < Version::MIN {
        return Err(RpcError::InvalidDowngradeTargetVersion.into());
    }
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1: Version = Version::MIN;
    const V2: Version = Version::V0_2;

    #[test]
    fn only_one_minor_below_with_no_job_running() {
        assert_eq!(validate(Some(V2), "0.1", None), Ok(V1));
        assert_eq!(validate(Some(V2), "0.1.0", None), Ok(V1));
        let err = |r: Result<Version, EtcdError>| r.unwrap_err().to_string();
        assert_eq!(
            err(validate(Some(V2), "v0.1", None)),
            "etcdserver: wrong downgrade target version format"
        );
        assert_eq!(
            err(validate(None, "0.1", None)),
            "etcdserver: cluster version not found during downgrade"
        );
        assert_eq!(
            err(validate(Some(V2), "0.1", Some(V1))),
            "etcdserver: cluster has a downgrade job in progress"
        );
        for bad in ["0.2", "0.0", "0.3", "1.1"] {
            assert_eq!(
                err(validate(Some(V2), bad, None)),
                "etcdserver: invalid downgrade target version",
                "{bad}"
            );
        }
        assert_eq!(
            err(validate(Some(V1), "0.0", None)),
            "etcdserver: invalid downgrade target version",
            "no release below 0.1"
        );
    }

    #[test]
    fn the_job_is_stored_and_removed() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let tree = db.open_tree("t").unwrap();
        assert_eq!(Downgrade::load(&tree).unwrap().target(), None);
        tree.insert(schema::DOWNGRADE_TARGET, b"0.1").unwrap();
        let d = Downgrade::load(&tree).unwrap();
        assert_eq!(d.target(), Some(V1));
        tree.remove(schema::DOWNGRADE_TARGET).unwrap();
        d.reload(&tree).unwrap();
        assert_eq!(d.target(), None);
    }
}
