//! The apply hook: one committed auth entry → permission check, store change, token effects
//! (etcd `authApplierV3.Apply` + `applierV3backend.Auth*` + the token calls inside
//! `authStore`).
//!
//! The coordinator's applier calls [`apply`] for each auth entry, under the apply loop's
//! ownership of the store, with a batch that also carries the entry's consistent index.
//! Order, as etcd: the admin check (from the `AuthInfo` stamped into the entry), then the
//! store change, then the token effects of a successful change (a new token; dropped tokens
//! on UserDelete, UserChangePassword and AuthDisable).

use keel_proto::etcdserverpb as pb;

use super::check::{self, Rpc};
use super::error::AuthError;
use super::model::AuthInfo;
use super::storage::AuthWrites;
use super::store::AuthStore;
use super::token::TokenProvider;

/// The Authenticate entry (etcd `InternalAuthenticateRequest`): the password was checked
/// before proposing, so the entry carries only the user name and the simple token's random
/// part (empty for JWT).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InternalAuthenticate {
    /// The user to issue a token to.
    pub name: String,
    /// The random part of the simple token (`TokenProvider::gen_prefix`).
    pub simple_token: String,
}

/// Declares [`AuthRequest`] and [`AuthResponse`], one variant each per RPC of
/// `etcdserverpb.Auth`: `Variant(request type, response type)`.
macro_rules! auth_entries {
    ($($rpc:ident($req:ty, $resp:ty),)*) => {
        /// One auth entry of the log: every request of `etcdserverpb.Auth` (the reads go
        /// through raft too, as in etcd 3.6, so they are linearizable and checked at apply).
        #[derive(Debug, Clone, PartialEq)]
        #[allow(missing_docs)]
        pub enum AuthRequest {
            $($rpc($req),)*
        }

        /// The response to an [`AuthRequest`], same variant; headers are left for the
        /// applier.
        #[derive(Debug, Clone, PartialEq)]
        #[allow(missing_docs)]
        pub enum AuthResponse {
            $($rpc($resp),)*
        }
    };
}

auth_entries! {
    Enable(pb::AuthEnableRequest, pb::AuthEnableResponse),
    Disable(pb::AuthDisableRequest, pb::AuthDisableResponse),
    Status(pb::AuthStatusRequest, pb::AuthStatusResponse),
    Authenticate(InternalAuthenticate, pb::AuthenticateResponse),
    UserAdd(pb::AuthUserAddRequest, pb::AuthUserAddResponse),
    UserGet(pb::AuthUserGetRequest, pb::AuthUserGetResponse),
    UserList(pb::AuthUserListRequest, pb::AuthUserListResponse),
    UserDelete(pb::AuthUserDeleteRequest, pb::AuthUserDeleteResponse),
    UserChangePassword(pb::AuthUserChangePasswordRequest, pb::AuthUserChangePasswordResponse),
    UserGrantRole(pb::AuthUserGrantRoleRequest, pb::AuthUserGrantRoleResponse),
    UserRevokeRole(pb::AuthUserRevokeRoleRequest, pb::AuthUserRevokeRoleResponse),
    RoleAdd(pb::AuthRoleAddRequest, pb::AuthRoleAddResponse),
    RoleGet(pb::AuthRoleGetRequest, pb::AuthRoleGetResponse),
    RoleList(pb::AuthRoleListRequest, pb::AuthRoleListResponse),
    RoleDelete(pb::AuthRoleDeleteRequest, pb::AuthRoleDeleteResponse),
    RoleGrantPermission(pb::AuthRoleGrantPermissionRequest, pb::AuthRoleGrantPermissionResponse),
    RoleRevokePermission(pb::AuthRoleRevokePermissionRequest, pb::AuthRoleRevokePermissionResponse),
}

impl AuthRequest {
    /// The RPC this entry came from, for the admin check.
    pub fn rpc(&self) -> Option<Rpc> {
        use AuthRequest::*;
        Some(match self {
            Enable(_) => Rpc::AuthEnable,
            Disable(_) => Rpc::AuthDisable,
            Status(_) => Rpc::AuthStatus,
            Authenticate(_) => Rpc::Authenticate,
            UserAdd(_) => Rpc::UserAdd,
            UserList(_) => Rpc::UserList,
            UserDelete(_) => Rpc::UserDelete,
            UserChangePassword(_) => Rpc::UserChangePassword,
            UserGrantRole(_) => Rpc::UserGrantRole,
            UserRevokeRole(_) => Rpc::UserRevokeRole,
            RoleAdd(_) => Rpc::RoleAdd,
            RoleList(_) => Rpc::RoleList,
            RoleDelete(_) => Rpc::RoleDelete,
            RoleGrantPermission(_) => Rpc::RoleGrantPermission,
            RoleRevokePermission(_) => Rpc::RoleRevokePermission,
            // Their rule depends on the request (self / own role): see `check`.
            UserGet(_) | RoleGet(_) => return None,
        })
    }
}

/// Applies the auth entry `req` at raft `index`, proposed by `ai`: the permission check,
/// then the change (staged into `w`), then its token effects on `tokens`. A failure changes
/// nothing.
///
/// Errors: the check's or the store's [`AuthError`]; a token that cannot be issued
/// (`TokenProvider::assign`).
pub fn apply(
    store: &mut AuthStore,
    tokens: &TokenProvider,
    ai: &AuthInfo,
    index: u64,
    req: &AuthRequest,
    w: &mut impl AuthWrites,
) -> Result<AuthResponse, AuthError> {
    match req {
        AuthRequest::UserGet(r) => check::user_get(store, ai, r)?,
        AuthRequest::RoleGet(r) => check::role_get(store, ai, r)?,
        _ => {
            if let Some(rpc) = req.rpc() {
                check::rpc(store, ai, rpc)?;
            }
        }
    }
    use AuthRequest as Q;
    use AuthResponse as A;
    Ok(match req {
        Q::Enable(r) => {
            let resp = store.apply_auth_enable(r, w)?;
            tokens.enable();
            A::Enable(resp)
        }
        Q::Disable(r) => {
            let resp = store.apply_auth_disable(r, w)?;
            tokens.disable();
            A::Disable(resp)
        }
        Q::Status(r) => A::Status(store.apply_auth_status(r)),
        Q::Authenticate(r) => {
            let who = store.apply_authenticate(&r.name)?;
            let token = tokens.assign(&who, &r.simple_token, index)?;
            A::Authenticate(pb::AuthenticateResponse {
                header: None,
                token,
            })
        }
        Q::UserAdd(r) => A::UserAdd(store.apply_user_add(r, w)?),
        Q::UserGet(r) => A::UserGet(store.apply_user_get(r)?),
        Q::UserList(r) => A::UserList(store.apply_user_list(r)),
        Q::UserDelete(r) => {
            let resp = store.apply_user_delete(r, w)?;
            tokens.invalidate_user(&r.name);
            A::UserDelete(resp)
        }
        Q::UserChangePassword(r) => {
            let resp = store.apply_user_change_password(r, w)?;
            tokens.invalidate_user(&r.name);
            A::UserChangePassword(resp)
        }
        Q::UserGrantRole(r) => A::UserGrantRole(store.apply_user_grant_role(r, w)?),
        Q::UserRevokeRole(r) => A::UserRevokeRole(store.apply_user_revoke_role(r, w)?),
        Q::RoleAdd(r) => A::RoleAdd(store.apply_role_add(r, w)?),
        Q::RoleGet(r) => A::RoleGet(store.apply_role_get(r)?),
        Q::RoleList(r) => A::RoleList(store.apply_role_list(r)),
        Q::RoleDelete(r) => A::RoleDelete(store.apply_role_delete(r, w)?),
        Q::RoleGrantPermission(r) => {
            A::RoleGrantPermission(store.apply_role_grant_permission(r, w)?)
        }
        Q::RoleRevokePermission(r) => {
            A::RoleRevokePermission(store.apply_role_revoke_permission(r, w)?)
        }
    })
}

/// Puts `tokens` in step with a store just loaded or installed from a snapshot: enabled
/// records tokens, disabled drops them all (etcd `Recover`).
pub fn sync_tokens(store: &AuthStore, tokens: &TokenProvider) {
    if store.is_enabled() {
        tokens.enable();
    } else {
        tokens.disable();
    }
}
