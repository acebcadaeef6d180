//! What each cluster version enables: the one table of gated raft entries (issue 16, part 2;
//! docs/upgrades.md "What each version gates").
//!
//! Every `RaftRequest` variant is listed in [`gate_of`], whose match has no wildcard: a new
//! entry kind does not compile until it says which cluster version it needs. An entry that
//! Keel 0.1.0 cannot apply (it decodes an unknown variant as no request and skips it, so its
//! state would silently diverge) needs 0.2. The API refuses a gated request before proposing
//! and apply refuses it again against the applied cluster version, with the same error on
//! every member.

use keel_proto::keelpb::raft_request::Request as Rq;

use super::Version;
use crate::error::EtcdError;

/// One row of the table: the entries of one feature and the cluster version they need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gate {
    /// What the row enables, as refusals name it ("auth requests").
    pub what: &'static str,
    /// The lowest cluster version that may apply these entries.
    pub since: Version,
}

/// Entries Keel 0.1.0 applies: KV, compaction, leases, member attributes, batches.
pub const BASE: Gate = Gate {
    what: "the etcd v3 KV and lease API",
    since: Version::MIN,
};
/// The cluster version entry itself: 0.1.0 decodes it as no request and skips it, so the
/// leader may write it into any cluster (it only rises once every member publishes 0.2).
pub const CLUSTER_VERSION_SET: Gate = Gate {
    what: "setting the cluster version",
    since: Version::MIN,
};
/// The downgrade job (Maintenance.Downgrade ENABLE/CANCEL): a no-op to 0.1.0, and it must
/// stay allowed once the cluster version was lowered (CANCEL).
pub const DOWNGRADE: Gate = Gate {
    what: "the downgrade job",
    since: Version::MIN,
};
/// Auth (fields 30–47, docs/auth.md): users, roles, permissions, enable/disable, tokens.
pub const AUTH: Gate = Gate {
    what: "auth requests",
    since: Version::V0_2,
};
/// QoS rule changes (field 60, docs/qos.md).
pub const QOS_RULES: Gate = Gate {
    what: "QoS rule changes",
    since: Version::V0_2,
};
/// Alarms (field 70): a raised NOSPACE or CORRUPT alarm refuses writes at apply.
pub const ALARMS: Gate = Gate {
    what: "alarms",
    since: Version::V0_2,
};

/// Every row, lowest version first (docs/upgrades.md prints this table).
pub const TABLE: &[Gate] = &[
    BASE,
    CLUSTER_VERSION_SET,
    DOWNGRADE,
    AUTH,
    QOS_RULES,
    ALARMS,
];

/// The row `req` belongs to.
pub fn gate_of(req: &Rq) -> Gate {
    match req {
        Rq::Put(_)
        | Rq::DeleteRange(_)
        | Rq::Txn(_)
        | Rq::Compaction(_)
        | Rq::LeaseGrant(_)
        | Rq::LeaseRevoke(_)
        | Rq::MemberAttributes(_)
        | Rq::Batch(_)
        | Rq::LeaseCheckpoint(_)
        | Rq::LeaseExpire(_) => BASE,
        Rq::ClusterVersionSet(_) => CLUSTER_VERSION_SET,
        Rq::DowngradeInfoSet(_) => DOWNGRADE,
        Rq::AuthEnable(_)
        | Rq::AuthDisable(_)
        | Rq::AuthStatus(_)
        | Rq::Authenticate(_)
        | Rq::UserAdd(_)
        | Rq::UserGet(_)
        | Rq::UserList(_)
        | Rq::UserDelete(_)
        | Rq::UserChangePassword(_)
        | Rq::UserGrantRole(_)
        | Rq::UserRevokeRole(_)
        | Rq::RoleAdd(_)
        | Rq::RoleGet(_)
        | Rq::RoleList(_)
        | Rq::RoleDelete(_)
        | Rq::RoleGrantPermission(_)
        | Rq::RoleRevokePermission(_) => AUTH,
        Rq::QosRuleChange(_) => QOS_RULES,
        Rq::Alarm(_) => ALARMS,
    }
}

/// A request the cluster version does not allow yet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cluster version {cluster} is too low for {what} (needs {since})")]
pub struct GateRefusal {
    /// The cluster version in force.
    pub cluster: Version,
    /// What was refused (the row's name).
    pub what: &'static str,
    /// The version the row needs.
    pub since: Version,
}

/// Whether `cluster` allows `req` (a batch: every request in it).
///
/// Errors: [`GateRefusal`] naming the row.
pub fn check(cluster: Version, req: &Rq) -> Result<(), GateRefusal> {
    if let Rq::Batch(b) = req {
        for r in b.requests.iter().filter_map(|r| r.request.as_ref()) {
            check(cluster, r)?;
        }
        return Ok(());
    }
    let gate = gate_of(req);
    if cluster >= gate.since {
        Ok(())
    } else {
        Err(GateRefusal {
            cluster,
            what: gate.what,
            since: gate.since,
        })
    }
}

/// Clients see a refusal as gRPC `FailedPrecondition` (etcd's code for `ErrNotCapable`, its
/// capability gate), with the reason as the message.
impl From<GateRefusal> for EtcdError {
    fn from(r: GateRefusal) -> EtcdError {
        EtcdError::FailedPrecondition(r.to_string())
    }
}

#[cfg(test)]
mod tests {
    use keel_proto::etcdserverpb as pb;
    use keel_proto::keelpb;

    use super::*;

    const V1: Version = Version::MIN;
    const V2: Version = Version::V0_2;

    fn refused(cluster: Version, req: &Rq) -> String {
        check(cluster, req).unwrap_err().to_string()
    }

    /// Row BASE: everything 0.1.0 applies runs at 0.1.
    #[test]
    fn base_entries_run_at_0_1() {
        let reqs = [
            Rq::Put(pb::PutRequest::default()),
            Rq::DeleteRange(pb::DeleteRangeRequest::default()),
            Rq::Txn(pb::TxnRequest::default()),
            Rq::Compaction(pb::CompactionRequest::default()),
            Rq::LeaseGrant(pb::LeaseGrantRequest::default()),
            Rq::LeaseRevoke(pb::LeaseRevokeRequest::default()),
            Rq::LeaseCheckpoint(pb::LeaseCheckpointRequest::default()),
            Rq::LeaseExpire(keelpb::LeaseExpire::default()),
            Rq::MemberAttributes(keelpb::MemberAttributes::default()),
        ];
        for r in &reqs {
            assert_eq!(gate_of(r), BASE);
            assert_eq!(check(V1, r), Ok(()), "{r:?}");
        }
    }

    /// Row CLUSTER_VERSION_SET: the leader may set the version in a mixed cluster.
    #[test]
    fn cluster_version_set_runs_at_0_1() {
        let r = Rq::ClusterVersionSet(keelpb::ClusterVersionSet {
            version: "0.2".into(),
        });
        assert_eq!(gate_of(&r), CLUSTER_VERSION_SET);
        assert_eq!(check(V1, &r), Ok(()));
    }

    /// Row DOWNGRADE: enabling and cancelling run at 0.1 (CANCEL after the version fell).
    #[test]
    fn the_downgrade_job_runs_at_0_1() {
        let r = Rq::DowngradeInfoSet(keelpb::DowngradeInfoSet::default());
        assert_eq!(gate_of(&r), DOWNGRADE);
        assert_eq!(check(V1, &r), Ok(()));
    }

    /// Row AUTH: every auth entry needs 0.2.
    #[test]
    fn auth_needs_0_2() {
        let reqs = [
            Rq::AuthEnable(pb::AuthEnableRequest::default()),
            Rq::AuthDisable(pb::AuthDisableRequest::default()),
            Rq::AuthStatus(pb::AuthStatusRequest::default()),
            Rq::Authenticate(keelpb::InternalAuthenticateRequest::default()),
            Rq::UserAdd(pb::AuthUserAddRequest::default()),
            Rq::UserGet(pb::AuthUserGetRequest::default()),
            Rq::UserList(pb::AuthUserListRequest::default()),
            Rq::UserDelete(pb::AuthUserDeleteRequest::default()),
            Rq::UserChangePassword(pb::AuthUserChangePasswordRequest::default()),
            Rq::UserGrantRole(pb::AuthUserGrantRoleRequest::default()),
            Rq::UserRevokeRole(pb::AuthUserRevokeRoleRequest::default()),
            Rq::RoleAdd(pb::AuthRoleAddRequest::default()),
            Rq::RoleGet(pb::AuthRoleGetRequest::default()),
            Rq::RoleList(pb::AuthRoleListRequest::default()),
            Rq::RoleDelete(pb::AuthRoleDeleteRequest::default()),
            Rq::RoleGrantPermission(pb::AuthRoleGrantPermissionRequest::default()),
            Rq::RoleRevokePermission(pb::AuthRoleRevokePermissionRequest::default()),
        ];
        for r in &reqs {
            assert_eq!(
                refused(V1, r),
                "cluster version 0.1 is too low for auth requests (needs 0.2)"
            );
            assert_eq!(check(V2, r), Ok(()));
        }
    }

    /// Row QOS_RULES.
    #[test]
    fn qos_rule_changes_need_0_2() {
        let r = Rq::QosRuleChange(keelpb::QosRuleChange::default());
        assert_eq!(
            refused(V1, &r),
            "cluster version 0.1 is too low for QoS rule changes (needs 0.2)"
        );
        assert_eq!(check(V2, &r), Ok(()));
    }

    /// Row ALARMS.
    #[test]
    fn alarms_need_0_2() {
        let r = Rq::Alarm(pb::AlarmRequest::default());
        assert_eq!(
            refused(V1, &r),
            "cluster version 0.1 is too low for alarms (needs 0.2)"
        );
        assert_eq!(check(V2, &r), Ok(()));
    }

    /// A batch is refused if any request in it is.
    #[test]
    fn a_batch_is_as_strict_as_its_strictest_request() {
        let batch = |reqs: Vec<Rq>| {
            Rq::Batch(keelpb::RequestBatch {
                requests: reqs
                    .into_iter()
                    .map(|r| keelpb::RaftRequest {
                        request: Some(r),
                        ..Default::default()
                    })
                    .collect(),
            })
        };
        let ok = batch(vec![Rq::Put(pb::PutRequest::default())]);
        assert_eq!(check(V1, &ok), Ok(()));
        let mixed = batch(vec![
            Rq::Put(pb::PutRequest::default()),
            Rq::UserAdd(pb::AuthUserAddRequest::default()),
        ]);
        assert_eq!(check(V1, &mixed).unwrap_err().what, "auth requests");
        assert_eq!(check(V2, &mixed), Ok(()));
    }

    #[test]
    fn refusals_are_failed_precondition() {
        let e: EtcdError = check(V1, &Rq::Alarm(pb::AlarmRequest::default()))
            .unwrap_err()
            .into();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert_eq!(
            EtcdError::from_parts(e.code() as i32, &e.to_string()),
            e,
            "an apply-time refusal crosses the log and the peer forward unchanged"
        );
        assert!(TABLE.windows(2).all(|w| w[0].since <= w[1].since));
    }
}
