//! Refuses peer RPCs from another cluster (etcd `rafthttp`'s `checkClusterCompatibilityFromHeader`:
//! a request whose `X-Etcd-Cluster-ID` differs is answered 412 "cluster ID mismatch").
//!
//! A member reached at a reused address by a member of another cluster (a wrong
//! `--initial-cluster`, an old member of a rebuilt cluster) must not take part in this
//! cluster's votes or replication. RPCs without the header are accepted: a joining member
//! does not know its cluster ID before it asks, and 0.1.0 members never send it.

use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::raft::peers::CLUSTER_ID_HEADER;

/// etcd's error text (`rafthttp.errClusterIDMismatch`).
pub const CLUSTER_ID_MISMATCH: &str = "cluster ID mismatch";

/// The peer service's interceptor for a member of cluster `local` (its cluster ID).
#[derive(Clone, Copy, Debug)]
pub struct ClusterIdCheck {
    /// This member's cluster ID.
    pub local: u64,
}

impl Interceptor for ClusterIdCheck {
    /// Errors: `FailedPrecondition` "cluster ID mismatch" when the header names another
    /// cluster or is not hex.
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let Some(value) = req.metadata().get(CLUSTER_ID_HEADER) else {
            return Ok(req);
        };
        let remote = value
            .to_str()
            .ok()
            .and_then(|v| u64::from_str_radix(v, 16).ok());
        if remote == Some(self.local) {
            return Ok(req);
        }
        tracing::warn!(
            local_member_cluster_id = format!("{:x}", self.local),
            remote_peer_cluster_id = ?value,
            "request cluster ID mismatch"
        );
        Err(Status::failed_precondition(CLUSTER_ID_MISMATCH))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_header(value: Option<&str>) -> Request<()> {
        let mut req = Request::new(());
        if let Some(v) = value {
            req.metadata_mut()
                .insert(CLUSTER_ID_HEADER, v.parse().unwrap());
        }
        req
    }

    #[test]
    fn only_another_clusters_id_is_refused() {
        let mut check = ClusterIdCheck {
            local: 0x4acd_6b7c_94af_1b3b,
        };
        assert!(check.call(with_header(None)).is_ok());
        assert!(check.call(with_header(Some("4acd6b7c94af1b3b"))).is_ok());
        for other in ["4acd6b7c94af1b3c", "zz", ""] {
            let err = check.call(with_header(Some(other))).unwrap_err();
            assert_eq!(err.code(), tonic::Code::FailedPrecondition);
            assert_eq!(err.message(), "cluster ID mismatch");
        }
    }
}
