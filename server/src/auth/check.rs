//! Permission checks: may the user behind an [`AuthInfo`] make this request? (etcd 3.6.14:
//! `server/etcdserver/apply/apply_auth.go`, `v3_server.go`, `api/v3rpc/{key,maintenance,
//! member,auth,watch}.go`; the table is in docs/auth.md and ETCD-FACTS §1c.)
//!
//! Every check is a pure function of the store (users, roles, permission cache, enabled flag,
//! auth revision), the request and the lease keys the caller supplies. Made at apply time
//! with the `AuthInfo` stamped into the entry, it gives the same answer on every member that
//! applies the same log; made before proposing or for a serializable read, it answers from
//! the member's applied state (etcd does both the same way).
//!
//! With auth disabled every check passes. Otherwise, for key operations (etcd
//! `isOpPermitted`), in this order: no credentials → `user name is empty`; a revision older
//! than the store's → `revision of auth store is old`; an unknown user → `permission
//! denied`; role `root` → permitted; else the user's merged ranges decide. Admin checks
//! (etcd `IsAdminPermitted`) do not look at the revision: no credentials → `user name is
//! empty`, unknown user → `user name not found`, no role `root` → `permission denied`.

use keel_proto::etcdserverpb::{
    AuthRoleGetRequest, AuthUserGetRequest, DeleteRangeRequest, LeaseTimeToLiveRequest, PutRequest,
    RangeRequest, TxnRequest, WatchCreateRequest, request_op::Request,
};
use keel_proto::rpctypes::RpcError;

use super::error::AuthError;
use super::model::{Access, AuthInfo};
use super::store::AuthStore;

/// The keys attached to a lease at this point of the log (the lessor's view), supplied by the
/// caller. Any `Fn(i64) -> Option<Vec<Vec<u8>>>` is one.
pub trait LeaseKeys {
    /// The keys attached to lease `id`, or `None` when no such lease exists.
    fn attached_keys(&self, id: i64) -> Option<Vec<Vec<u8>>>;
}

impl<F: Fn(i64) -> Option<Vec<Vec<u8>>>> LeaseKeys for F {
    fn attached_keys(&self, id: i64) -> Option<Vec<Vec<u8>>> {
        self(id)
    }
}

/// etcd `isOpPermitted`: `access` on `key` .. `range_end` (empty = the key alone, `"\0"` =
/// from `key` on).
pub fn key_op(
    store: &AuthStore,
    ai: &AuthInfo,
    key: &[u8],
    range_end: &[u8],
    access: Access,
) -> Result<(), AuthError> {
    if !store.is_enabled() {
        return Ok(());
    }
    if ai.revision == 0 {
        return Err(RpcError::UserEmpty.into());
    }
    if ai.revision < store.revision() {
        return Err(RpcError::AuthOldRevision.into());
    }
    let Some(perms) = store.perms(&ai.username) else {
        return Err(RpcError::PermissionDenied.into());
    };
    if perms.root || perms.permits(key, range_end, access) {
        Ok(())
    } else {
        Err(RpcError::PermissionDenied.into())
    }
}

/// etcd `IsAdminPermitted`: the user holds role `root`.
pub fn admin(store: &AuthStore, ai: &AuthInfo) -> Result<(), AuthError> {
    if !store.is_enabled() {
        return Ok(());
    }
    if ai.is_anonymous() {
        return Err(RpcError::UserEmpty.into());
    }
    match store.perms(&ai.username) {
        None => Err(RpcError::UserNotFound.into()),
        Some(p) if p.root => Ok(()),
        Some(_) => Err(RpcError::PermissionDenied.into()),
    }
}

/// etcd `requireAuthInfo`: any credentials at all.
pub fn authenticated(store: &AuthStore, ai: &AuthInfo) -> Result<(), AuthError> {
    if store.is_enabled() && ai.is_anonymous() {
        return Err(RpcError::UserEmpty.into());
    }
    Ok(())
}

/// Range: READ on the range.
pub fn range(store: &AuthStore, ai: &AuthInfo, r: &RangeRequest) -> Result<(), AuthError> {
    key_op(store, ai, &r.key, &r.range_end, Access::Read)
}

/// Watch create: READ on the watched range (etcd `isWatchPermitted`). A denied watch is
/// answered created and canceled with the error's text; the stream stays open.
pub fn watch_create(
    store: &AuthStore,
    ai: &AuthInfo,
    r: &WatchCreateRequest,
) -> Result<(), AuthError> {
    key_op(store, ai, &r.key, &r.range_end, Access::Read)
}

/// Put (etcd `checkPutAuth`): WRITE on the key; with a lease, WRITE on every key already
/// attached to it (or admin); with `prev_kv`, READ on the key.
pub fn put(
    store: &AuthStore,
    ai: &AuthInfo,
    r: &PutRequest,
    leases: &impl LeaseKeys,
) -> Result<(), AuthError> {
    key_op(store, ai, &r.key, &[], Access::Write)?;
    lease_puts(store, ai, r.lease, leases)?;
    if r.prev_kv {
        key_op(store, ai, &r.key, &[], Access::Read)?;
    }
    Ok(())
}

/// DeleteRange: WRITE on the range, and READ with `prev_kv`.
pub fn delete_range(
    store: &AuthStore,
    ai: &AuthInfo,
    r: &DeleteRangeRequest,
) -> Result<(), AuthError> {
    key_op(store, ai, &r.key, &r.range_end, Access::Write)?;
    if r.prev_kv {
        key_op(store, ai, &r.key, &r.range_end, Access::Read)?;
    }
    Ok(())
}

/// Txn (etcd `checkTxnPermission`): READ on every compare's range, then every op of both
/// branches as above, nested txns included (CVE-2026-33343).
pub fn txn(
    store: &AuthStore,
    ai: &AuthInfo,
    r: &TxnRequest,
    leases: &impl LeaseKeys,
) -> Result<(), AuthError> {
    for c in &r.compare {
        key_op(store, ai, &c.key, &c.range_end, Access::Read)?;
    }
    for op in r.success.iter().chain(&r.failure) {
        match &op.request {
            None => {}
            Some(Request::RequestRange(r)) => range(store, ai, r)?,
            Some(Request::RequestPut(r)) => put(store, ai, r, leases)?,
            Some(Request::RequestDeleteRange(r)) => {
                // etcd checks READ first inside a txn.
                if r.prev_kv {
                    key_op(store, ai, &r.key, &r.range_end, Access::Read)?;
                }
                key_op(store, ai, &r.key, &r.range_end, Access::Write)?;
            }
            Some(Request::RequestTxn(t)) => txn(store, ai, t, leases)?,
        }
    }
    Ok(())
}

/// etcd `checkLeasePuts`: admin, or WRITE on every key attached to lease `id`; a lease that
/// does not exist (or `id` 0) needs nothing.
fn lease_puts(
    store: &AuthStore,
    ai: &AuthInfo,
    id: i64,
    leases: &impl LeaseKeys,
) -> Result<(), AuthError> {
    if id == 0 || !store.is_enabled() {
        return Ok(());
    }
    let Some(keys) = leases.attached_keys(id) else {
        return Ok(());
    };
    if admin(store, ai).is_ok() {
        return Ok(());
    }
    for key in keys {
        key_op(store, ai, &key, &[], Access::Write)?;
    }
    Ok(())
}

/// LeaseGrant: any credentials (since 3.6.9).
pub fn lease_grant(store: &AuthStore, ai: &AuthInfo) -> Result<(), AuthError> {
    authenticated(store, ai)
}

/// LeaseRevoke: credentials (API), then admin or WRITE on every attached key (apply).
pub fn lease_revoke(
    store: &AuthStore,
    ai: &AuthInfo,
    id: i64,
    leases: &impl LeaseKeys,
) -> Result<(), AuthError> {
    authenticated(store, ai)?;
    lease_puts(store, ai, id, leases)
}

/// LeaseKeepAlive (etcd `checkLeaseRenew`): the same rule as [`lease_revoke`].
pub fn lease_keep_alive(
    store: &AuthStore,
    ai: &AuthInfo,
    id: i64,
    leases: &impl LeaseKeys,
) -> Result<(), AuthError> {
    lease_revoke(store, ai, id, leases)
}

/// LeaseTimeToLive: credentials; with `keys`, admin or READ on every attached key (etcd
/// `checkLeaseTimeToLive`).
pub fn lease_time_to_live(
    store: &AuthStore,
    ai: &AuthInfo,
    r: &LeaseTimeToLiveRequest,
    leases: &impl LeaseKeys,
) -> Result<(), AuthError> {
    authenticated(store, ai)?;
    if !r.keys || !store.is_enabled() || admin(store, ai).is_ok() {
        return Ok(());
    }
    for key in leases.attached_keys(r.id).unwrap_or_default() {
        key_op(store, ai, &key, &[], Access::Read)?;
    }
    Ok(())
}

/// LeaseLeases (etcd `checkLeaseLeases`): credentials, then admin or READ on every key
/// attached to any lease.
pub fn lease_leases<K: AsRef<[u8]>>(
    store: &AuthStore,
    ai: &AuthInfo,
    all_attached_keys: impl IntoIterator<Item = K>,
) -> Result<(), AuthError> {
    authenticated(store, ai)?;
    if !store.is_enabled() || admin(store, ai).is_ok() {
        return Ok(());
    }
    for key in all_attached_keys {
        key_op(store, ai, key.as_ref(), &[], Access::Read)?;
    }
    Ok(())
}

/// UserGet: admin, or the user asking about themself.
pub fn user_get(store: &AuthStore, ai: &AuthInfo, r: &AuthUserGetRequest) -> Result<(), AuthError> {
    match admin(store, ai) {
        Err(e) if r.name != ai.username => Err(e),
        _ => Ok(()),
    }
}

/// RoleGet: admin, or a user asking about a role they hold (etcd `HasRole`).
pub fn role_get(store: &AuthStore, ai: &AuthInfo, r: &AuthRoleGetRequest) -> Result<(), AuthError> {
    match admin(store, ai) {
        Err(e) => {
            let holds = store
                .user(&ai.username)
                .is_some_and(|u| u.roles.contains(&r.role));
            if holds { Ok(()) } else { Err(e) }
        }
        Ok(()) => Ok(()),
    }
}

/// The RPCs whose permission does not depend on keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rpc {
    /// KV.Compact.
    Compact,
    /// Cluster.MemberAdd.
    MemberAdd,
    /// Cluster.MemberRemove.
    MemberRemove,
    /// Cluster.MemberUpdate.
    MemberUpdate,
    /// Cluster.MemberPromote.
    MemberPromote,
    /// Cluster.MemberList.
    MemberList,
    /// Maintenance.Status.
    Status,
    /// Maintenance.Alarm with action GET.
    AlarmGet,
    /// Maintenance.Alarm with action ACTIVATE or DEACTIVATE.
    AlarmChange,
    /// Maintenance.Defragment.
    Defragment,
    /// Maintenance.Snapshot.
    Snapshot,
    /// Maintenance.Hash.
    Hash,
    /// Maintenance.HashKV.
    HashKv,
    /// Maintenance.MoveLeader.
    MoveLeader,
    /// Maintenance.Downgrade.
    Downgrade,
    /// Keel's QoS admin service (`keelpb.Qos`, every RPC; docs/qos.md): root only, like
    /// etcd's admin RPCs.
    QosAdmin,
    /// Auth.AuthEnable.
    AuthEnable,
    /// Auth.AuthDisable.
    AuthDisable,
    /// Auth.AuthStatus.
    AuthStatus,
    /// Auth.UserAdd.
    UserAdd,
    /// Auth.UserDelete.
    UserDelete,
    /// Auth.UserChangePassword.
    UserChangePassword,
    /// Auth.UserGrantRole.
    UserGrantRole,
    /// Auth.UserRevokeRole.
    UserRevokeRole,
    /// Auth.UserList.
    UserList,
    /// Auth.RoleAdd.
    RoleAdd,
    /// Auth.RoleDelete.
    RoleDelete,
    /// Auth.RoleGrantPermission.
    RoleGrantPermission,
    /// Auth.RoleRevokePermission.
    RoleRevokePermission,
    /// Auth.RoleList.
    RoleList,
    /// Auth.Authenticate.
    Authenticate,
    /// Lease.LeaseGrant.
    LeaseGrant,
}

/// What an [`Rpc`] requires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Need {
    /// Nothing (Authenticate).
    Nothing,
    /// Any credentials ([`authenticated`]).
    Authenticated,
    /// Role `root` ([`admin`]).
    Admin,
}

impl Rpc {
    /// The rule of an `Alarm` request (etcd 3.6): GET needs credentials, ACTIVATE and
    /// DEACTIVATE root.
    pub fn alarm(req: &keel_proto::etcdserverpb::AlarmRequest) -> Rpc {
        use keel_proto::etcdserverpb::alarm_request::AlarmAction;
        if req.action == AlarmAction::Get as i32 {
            Rpc::AlarmGet
        } else {
            Rpc::AlarmChange
        }
    }

    /// What this RPC requires with auth enabled (ETCD-FACTS §1c, 3.6.14 after the 2026 CVE
    /// fixes: Compact is admin; MemberList and Status need only credentials).
    pub fn need(self) -> Need {
        use Rpc::*;
        match self {
            Authenticate => Need::Nothing,
            MemberList | Status | AlarmGet | LeaseGrant => Need::Authenticated,
            Compact | MemberAdd | MemberRemove | MemberUpdate | MemberPromote | AlarmChange
            | Defragment | Snapshot | Hash | HashKv | MoveLeader | Downgrade | QosAdmin
            | AuthEnable | AuthDisable | AuthStatus | UserAdd | UserDelete | UserChangePassword
            | UserGrantRole | UserRevokeRole | UserList | RoleAdd | RoleDelete
            | RoleGrantPermission | RoleRevokePermission | RoleList => Need::Admin,
        }
    }
}

/// Checks an RPC of [`Rpc`] (see [`Rpc::need`]).
pub fn rpc(store: &AuthStore, ai: &AuthInfo, rpc: Rpc) -> Result<(), AuthError> {
    match rpc.need() {
        Need::Nothing => Ok(()),
        Need::Authenticated => authenticated(store, ai),
        Need::Admin => admin(store, ai),
    }
}
