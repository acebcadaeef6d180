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
use keel_proto::keelpb::{self, raft_request, raft_response};

use super::check::{self, Rpc};
use super::error::AuthError;
use super::model::AuthInfo;
use super::storage::AuthWrites;
use super::store::AuthStore;
use super::token::TokenProvider;

/// The Authenticate entry (etcd `InternalAuthenticateRequest`, `keelpb` in the log): the
/// password was checked before proposing, so the entry carries only the user name (`name`)
/// and the simple token's random part (`simple_token`, empty for JWT).
pub type InternalAuthenticate = keelpb::InternalAuthenticateRequest;

/// Declares [`AuthRequest`] and [`AuthResponse`], one variant each per RPC of
/// `etcdserverpb.Auth`: `Variant(request type, response type) = keelpb oneof variant`, and
/// their conversions from and to the raft entry's `oneof`s.
macro_rules! auth_entries {
    ($($rpc:ident($req:ty, $resp:ty) = $wire:ident,)*) => {
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

        impl AuthRequest {
            /// The auth entry a raft request carries; `None` for every other kind.
            pub fn from_raft(r: &raft_request::Request) -> Option<AuthRequest> {
                match r {
                    $(raft_request::Request::$wire(x) => Some(AuthRequest::$rpc(x.clone())),)*
                    _ => None,
                }
            }

            /// The raft request that carries this entry.
            pub fn into_raft(self) -> raft_request::Request {
                match self {
                    $(AuthRequest::$rpc(x) => raft_request::Request::$wire(x),)*
                }
            }
        }

        impl AuthResponse {
            /// The raft response that carries this result.
            pub fn into_raft(self) -> raft_response::Response {
                match self {
                    $(AuthResponse::$rpc(x) => raft_response::Response::$wire(x),)*
                }
            }
        }

        $(impl AuthReply for $resp {
            fn from_raft(r: raft_response::Response) -> Option<Self> {
                match r {
                    raft_response::Response::$wire(x) => Some(x),
                    _ => None,
                }
            }

            fn set_header(&mut self, header: pb::ResponseHeader) {
                self.header = Some(header);
            }
        })*
    };
}

/// A response message of `etcdserverpb.Auth` as the API gets it back from the log.
pub trait AuthReply: Sized {
    /// This response, if `r` carries it.
    fn from_raft(r: raft_response::Response) -> Option<Self>;
    /// Sets etcd's response header.
    fn set_header(&mut self, header: pb::ResponseHeader);
}

auth_entries! {
    Enable(pb::AuthEnableRequest, pb::AuthEnableResponse) = AuthEnable,
    Disable(pb::AuthDisableRequest, pb::AuthDisableResponse) = AuthDisable,
    Status(pb::AuthStatusRequest, pb::AuthStatusResponse) = AuthStatus,
    Authenticate(InternalAuthenticate, pb::AuthenticateResponse) = Authenticate,
    UserAdd(pb::AuthUserAddRequest, pb::AuthUserAddResponse) = UserAdd,
    UserGet(pb::AuthUserGetRequest, pb::AuthUserGetResponse) = UserGet,
    UserList(pb::AuthUserListRequest, pb::AuthUserListResponse) = UserList,
    UserDelete(pb::AuthUserDeleteRequest, pb::AuthUserDeleteResponse) = UserDelete,
    UserChangePassword(pb::AuthUserChangePasswordRequest, pb::AuthUserChangePasswordResponse) = UserChangePassword,
    UserGrantRole(pb::AuthUserGrantRoleRequest, pb::AuthUserGrantRoleResponse) = UserGrantRole,
    UserRevokeRole(pb::AuthUserRevokeRoleRequest, pb::AuthUserRevokeRoleResponse) = UserRevokeRole,
    RoleAdd(pb::AuthRoleAddRequest, pb::AuthRoleAddResponse) = RoleAdd,
    RoleGet(pb::AuthRoleGetRequest, pb::AuthRoleGetResponse) = RoleGet,
    RoleList(pb::AuthRoleListRequest, pb::AuthRoleListResponse) = RoleList,
    RoleDelete(pb::AuthRoleDeleteRequest, pb::AuthRoleDeleteResponse) = RoleDelete,
    RoleGrantPermission(pb::AuthRoleGrantPermissionRequest, pb::AuthRoleGrantPermissionResponse) = RoleGrantPermission,
    RoleRevokePermission(pb::AuthRoleRevokePermissionRequest, pb::AuthRoleRevokePermissionResponse) = RoleRevokePermission,
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
