//! Auth at apply (etcd `authApplierV3`): the permission checks that depend on state, made
//! from the entry's [`AuthHeader`] and the applied state only, and the auth entries
//! themselves.
//!
//! - An entry **without** a header was issued by the server (lease expiry and checkpoints,
//!   member attributes): it applies with root authority (etcd #11689, where the leader's
//!   LeaseRevoke without credentials was refused by members with auth on).
//! - A client entry carries a header (an empty user name when the client sent no token);
//!   Put, DeleteRange, Txn, LeaseRevoke, LeaseGrant, Compaction and QoS rule changes are checked with it
//!   before they run; a refusal applies as that error and changes nothing.
//! - Auth entries run through [`auth::apply::apply`], staging into the entry's batch, which
//!   also carries the consistent index (etcd #11651).

use keel_proto::keelpb::{AuthHeader, raft_request, raft_response};

use crate::auth::check::{self, Rpc};
use crate::auth::{self, AuthError, AuthInfo, AuthRequest, AuthState, AuthStore};
use crate::backend::Batch;
use crate::lease::Lessor;

/// Who an entry runs as: `None` for server-issued entries (root authority).
pub fn authority(header: Option<&AuthHeader>) -> Option<AuthInfo> {
    header.map(|h| AuthInfo::new(h.username.clone(), h.auth_revision))
}

/// The apply-time permission check of a key, lease or compaction request proposed by `ai`
/// (see the module docs); other requests pass.
///
/// Errors: the check's [`AuthError`] (etcd's `user name is empty`, `permission denied`,
/// `revision of auth store is old`, ...).
pub fn check_request(
    store: &AuthStore,
    ai: &AuthInfo,
    req: &raft_request::Request,
    lessor: &Lessor,
) -> Result<(), AuthError> {
    use raft_request::Request as Rq;
    if !store.is_enabled() {
        return Ok(());
    }
    let keys = |id: i64| lessor.info(id, true).map(|i| i.keys);
    match req {
        Rq::Put(r) => check::put(store, ai, r, &keys),
        Rq::DeleteRange(r) => check::delete_range(store, ai, r),
        Rq::Txn(r) => check::txn(store, ai, r, &keys),
        Rq::LeaseRevoke(r) => check::lease_revoke(store, ai, r.id, &keys),
        Rq::LeaseGrant(_) => check::lease_grant(store, ai),
        Rq::Compaction(_) => check::rpc(store, ai, Rpc::Compact),
        Rq::QosRuleChange(_) => check::rpc(store, ai, Rpc::QosAdmin),
        Rq::Alarm(a) => check::rpc(store, ai, Rpc::alarm(a)),
        _ => Ok(()),
    }
}

/// Applies auth entry `req` at log index `index` for `ai` (anonymous when the entry has no
/// header: no server-issued entry changes auth), staging its changes into `batch`.
///
/// Errors: the admin check's or the store's [`AuthError`]; nothing is changed or staged.
pub fn apply_entry(
    state: &AuthState,
    ai: Option<&AuthInfo>,
    index: u64,
    req: &AuthRequest,
    batch: &mut Batch,
) -> Result<raft_response::Response, AuthError> {
    let anonymous = AuthInfo::default();
    let mut store = state.write();
    let resp = auth::apply::apply(
        &mut store,
        state.tokens(),
        ai.unwrap_or(&anonymous),
        index,
        req,
        batch,
    )?;
    Ok(resp.into_raft())
}
