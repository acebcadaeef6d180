//! `Maintenance.Downgrade` (etcd 3.5+, docs/upgrades.md "Downgrade"): VALIDATE checks a target,
//! ENABLE starts the job (the leader then lowers the cluster version to the target, so the
//! newer members stop writing anything the target cannot read), CANCEL ends it (the cluster
//! version rises again once every member runs the newer release).

use keel_proto::etcdserverpb::downgrade_request::DowngradeAction;
use keel_proto::etcdserverpb::{DowngradeRequest, DowngradeResponse};
use keel_proto::keelpb::{DowngradeInfoSet, raft_request::Request as Rq};
use keel_proto::rpctypes::RpcError;

use crate::error::EtcdError;
use crate::node::Node;
use crate::version::{Version, validate_downgrade};

/// Runs one Downgrade request on `node`; the response carries the cluster version as etcd
/// writes it (`major.minor.0`).
///
/// Errors: etcd's (`etcdserver: wrong downgrade target version format`, `... invalid
/// downgrade target version`, `... cluster has a downgrade job in progress`, `... no inflight
/// downgrade job`); ENABLE while state the target cannot read is in use is refused with
/// `FailedPrecondition` naming it; those of proposing.
pub async fn downgrade(
    node: &Node,
    req: &DowngradeRequest,
) -> Result<DowngradeResponse, EtcdError> {
    // Judge on the applied state of the whole committed log.
    node.read_barrier().await?;
    let cluster = node.cluster_version.decided();
    let running = node.downgrade.target();
    match DowngradeAction::try_from(req.action) {
        Ok(DowngradeAction::Validate) => {
            validate_downgrade(cluster, &req.version, running)?;
        }
        Ok(DowngradeAction::Enable) => {
            let target = validate_downgrade(cluster, &req.version, running)?;
            if let Some(what) = newer_state_in_use(node) {
                return Err(EtcdError::FailedPrecondition(format!(
                    "cannot downgrade to {target}: {what} in use needs the newer release"
                )));
            }
            set(node, Some(target)).await?;
        }
        Ok(DowngradeAction::Cancel) => {
            if running.is_none() {
                return Err(RpcError::NoInflightDowngrade.into());
            }
            set(node, None).await?;
        }
        Err(_) => {
            return Err(EtcdError::InvalidArgument(format!(
                "unknown downgrade action {}",
                req.action
            )));
        }
    }
    Ok(DowngradeResponse {
        header: Some(node.header(node.store.get().current_revision())),
        version: format!("{}.0", node.cluster_version.get()),
    })
}

async fn set(node: &Node, target: Option<Version>) -> Result<(), EtcdError> {
    node.propose(Rq::DowngradeInfoSet(DowngradeInfoSet {
        enabled: target.is_some(),
        version: target.map(|v| v.to_string()).unwrap_or_default(),
    }))
    .await
    .map(|_| ())
}

/// State of 0.2-only features that Keel 0.1.0 would not see (the rows of `version::gates`
/// above 0.1), if any is in use.
fn newer_state_in_use(node: &Node) -> Option<&'static str> {
    let auth = node.auth.read();
    if auth.is_enabled() || !auth.users().is_empty() || !auth.roles().is_empty() {
        return Some("auth (users, roles or auth enabled)");
    }
    drop(auth);
    if !node.qos.rules().rules().is_empty() {
        return Some("QoS rules");
    }
    if !node.alarms.status_errors().is_empty() {
        return Some("a raised alarm");
    }
    None
}
