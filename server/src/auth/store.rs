//! The auth store: users, roles, the enabled flag and the auth revision, as a deterministic
//! state machine over committed requests (etcd `server/auth/store.go`, `authStore`).
//!
//! Each `apply_*` takes one Auth request of `etcdserverpb` as it came out of the raft log
//! (passwords already bcrypt-hashed by the proposer, base64 in `hashedPassword`, as etcd
//! 3.5+ proposes them), changes the in-memory state, stages the durable change through
//! [`AuthWrites`], and returns etcd's response (header left unset: the applier fills it) or
//! etcd's error. A failed request changes nothing and stages nothing.
//!
//! Invariants:
//! - Results depend only on the request and the state: no clock, no randomness, no local
//!   configuration. Every member that applies the same log holds the same store.
//! - The in-memory state always equals what its staged writes describe (after the batch
//!   lands, [`AuthStore::load`] gives an equal store).
//! - Every user and role mutation, and an AuthDisable that disables, moves the revision up
//!   by exactly 1 (etcd `commitRevision`); nothing else moves it.
//! - The permission cache equals [`PermCache::build`] of the current users and roles.
//! - While auth is enabled: user `root` exists, holds role `root`, and role `root` is not
//!   deleted (the rules that enforce it: AuthEnable, UserDelete, UserRevokeRole, RoleDelete).

use std::collections::BTreeMap;

use base64::Engine as _;
use keel_proto::authpb::{Permission, Role, User, UserAddOptions};
use keel_proto::etcdserverpb::{
    AuthDisableRequest, AuthDisableResponse, AuthEnableRequest, AuthEnableResponse,
    AuthRoleAddRequest, AuthRoleAddResponse, AuthRoleDeleteRequest, AuthRoleDeleteResponse,
    AuthRoleGetRequest, AuthRoleGetResponse, AuthRoleGrantPermissionRequest,
    AuthRoleGrantPermissionResponse, AuthRoleListRequest, AuthRoleListResponse,
    AuthRoleRevokePermissionRequest, AuthRoleRevokePermissionResponse, AuthStatusRequest,
    AuthStatusResponse, AuthUserAddRequest, AuthUserAddResponse, AuthUserChangePasswordRequest,
    AuthUserChangePasswordResponse, AuthUserDeleteRequest, AuthUserDeleteResponse,
    AuthUserGetRequest, AuthUserGetResponse, AuthUserGrantRoleRequest, AuthUserGrantRoleResponse,
    AuthUserListRequest, AuthUserListResponse, AuthUserRevokeRoleRequest,
    AuthUserRevokeRoleResponse,
};
use keel_proto::rpctypes::RpcError;

use super::error::AuthError;
use super::model::{
    AuthInfo, ROOT_ROLE, ROOT_USER, has_root_role, is_valid_permission_range, root_permission,
};
use super::perm::{PermCache, UserPerms};
use super::storage::{self, AuthWrites, StorageError, Stored};

/// What the password check needs from the store, copied out so that bcrypt runs after the
/// store's lock is released (etcd #11735).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PasswordCheck {
    /// The user's bcrypt hash (`$2a$…`).
    pub hash: Vec<u8>,
    /// The auth revision the hash was read at: the proposer retries its Authenticate if the
    /// store's revision moved by the time the token is issued.
    pub revision: u64,
}

/// The auth state machine (see the module doc for its invariants).
#[derive(Debug, Clone, PartialEq)]
pub struct AuthStore {
    enabled: bool,
    revision: u64,
    users: BTreeMap<String, User>,
    roles: BTreeMap<String, Role>,
    cache: PermCache,
}

impl Default for AuthStore {
    fn default() -> AuthStore {
        AuthStore::from_stored(Stored {
            revision: 1,
            ..Default::default()
        })
    }
}

impl AuthStore {
    /// A store with no users or roles, auth disabled, at revision 1 (etcd's `NewAuthStore`
    /// on an empty backend).
    pub fn new() -> AuthStore {
        AuthStore::default()
    }

    /// The store persisted in `tree`, with its permission cache rebuilt.
    ///
    /// Errors: sled I/O or a corrupt record (see [`storage::decode`]).
    pub fn load(tree: &sled::Tree) -> Result<AuthStore, StorageError> {
        Ok(AuthStore::from_stored(storage::read_tree(tree)?))
    }

    /// The store held by a snapshot's key-value `pairs` (other components' keys are
    /// skipped), with its permission cache rebuilt (etcd `Recover`, fixed by #14574 for
    /// #14571).
    ///
    /// Errors: a corrupt record (see [`storage::decode`]).
    pub fn load_pairs<K, V>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Result<AuthStore, StorageError>
    where
        K: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        Ok(AuthStore::from_stored(storage::decode(pairs)?))
    }

    fn from_stored(s: Stored) -> AuthStore {
        let cache = PermCache::build(&s.users, &s.roles);
        AuthStore {
            enabled: s.enabled,
            revision: s.revision,
            users: s.users,
            roles: s.roles,
            cache,
        }
    }

    /// True when auth is enabled: requests are then checked against users and roles.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// The auth revision (etcd `authStore.Revision`): starts at 1, moves on every change.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// User `name`, if it exists.
    pub fn user(&self, name: &str) -> Option<&User> {
        self.users.get(name)
    }

    /// Role `name`, if it exists.
    pub fn role(&self, name: &str) -> Option<&Role> {
        self.roles.get(name)
    }

    /// Every user, by name.
    pub fn users(&self) -> &BTreeMap<String, User> {
        &self.users
    }

    /// Every role, by name.
    pub fn roles(&self) -> &BTreeMap<String, Role> {
        &self.roles
    }

    /// User `name`'s merged permissions; `None` when the user does not exist.
    pub fn perms(&self, name: &str) -> Option<&UserPerms> {
        self.cache.user(name)
    }

    /// The permission cache (for tests and the reload check).
    pub fn cache(&self) -> &PermCache {
        &self.cache
    }

    /// The part of etcd's `CheckPassword` that reads the store: the user's hash and the
    /// current revision. Call it under the store's lock, release the lock, then run
    /// [`super::password::verify`].
    ///
    /// Errors: auth disabled ([`RpcError::AuthNotEnabled`]), unknown user
    /// ([`RpcError::AuthFailed`]), a `no_password` user ([`AuthError::NoPasswordUser`]).
    pub fn password_check(&self, name: &str) -> Result<PasswordCheck, AuthError> {
        if !self.enabled {
            return Err(RpcError::AuthNotEnabled.into());
        }
        let user = self.users.get(name).ok_or(RpcError::AuthFailed)?;
        if no_password(user) {
            return Err(AuthError::NoPasswordUser);
        }
        Ok(PasswordCheck {
            hash: user.password.clone(),
            revision: self.revision,
        })
    }

    /// Applies the Authenticate entry of user `name` (etcd `authStore.Authenticate`; the
    /// password was checked before proposing). Returns who the token must be issued to.
    ///
    /// Errors: auth disabled ([`RpcError::AuthNotEnabled`]), the user is gone or has
    /// `no_password` ([`RpcError::AuthFailed`]).
    pub fn apply_authenticate(&self, name: &str) -> Result<AuthInfo, AuthError> {
        if !self.enabled {
            return Err(RpcError::AuthNotEnabled.into());
        }
        let user = self.users.get(name).ok_or(RpcError::AuthFailed)?;
        if no_password(user) {
            return Err(RpcError::AuthFailed.into());
        }
        Ok(AuthInfo::new(name, self.revision))
    }

    /// AuthEnable: needs user `root` holding role `root`; already enabled is a no-op. Does not
    /// move the revision (etcd).
    ///
    /// Errors: [`RpcError::RootUserNotExist`], [`RpcError::RootRoleNotExist`].
    pub fn apply_auth_enable(
        &mut self,
        _req: &AuthEnableRequest,
        w: &mut impl AuthWrites,
    ) -> Result<AuthEnableResponse, AuthError> {
        if self.enabled {
            return Ok(AuthEnableResponse::default());
        }
        let root = self
            .users
            .get(ROOT_USER)
            .ok_or(RpcError::RootUserNotExist)?;
        if !has_root_role(root) {
            return Err(RpcError::RootRoleNotExist.into());
        }
        self.enabled = true;
        storage::put_enabled(w, true);
        Ok(AuthEnableResponse::default())
    }

    /// AuthDisable: disables and moves the revision; already disabled is a no-op.
    pub fn apply_auth_disable(
        &mut self,
        _req: &AuthDisableRequest,
        w: &mut impl AuthWrites,
    ) -> Result<AuthDisableResponse, AuthError> {
        if self.enabled {
            self.enabled = false;
            storage::put_enabled(w, false);
            self.commit_revision(w);
        }
        Ok(AuthDisableResponse::default())
    }

    /// AuthStatus: whether auth is enabled, and the revision.
    pub fn apply_auth_status(&self, _req: &AuthStatusRequest) -> AuthStatusResponse {
        AuthStatusResponse {
            header: None,
            enabled: self.enabled,
            auth_revision: self.revision,
        }
    }

    /// UserAdd: a user with no roles; its password is `hashedPassword` (base64 of the bcrypt
    /// hash) unless `options.no_password`.
    ///
    /// Errors: empty name ([`RpcError::UserEmpty`]), existing name
    /// ([`RpcError::UserAlreadyExist`]), a hash that is not base64
    /// ([`AuthError::NoPasswordUser`], etcd's choice), a plaintext password
    /// ([`AuthError::PlaintextPassword`]).
    pub fn apply_user_add(
        &mut self,
        req: &AuthUserAddRequest,
        w: &mut impl AuthWrites,
    ) -> Result<AuthUserAddResponse, AuthError> {
        if req.name.is_empty() {
            return Err(RpcError::UserEmpty.into());
        }
        if self.users.contains_key(&req.name) {
            return Err(RpcError::UserAlreadyExist.into());
        }
        let options = req.options.unwrap_or(UserAddOptions { no_password: false });
        let password = if options.no_password {
            Vec::new()
        } else {
            select_password(&req.password, &req.hashed_password)?
        };
        let user = User {
            name: req.name.as_bytes().to_vec(),
            password,
            roles: Vec::new(),
            options: Some(options),
        };
        self.put_user(&req.name, user, w);
        self.commit_revision(w);
        Ok(AuthUserAddResponse::default())
    }

    /// UserDelete. The caller drops the user's tokens (etcd `invalidateUser`).
    ///
    /// Errors: `root` while auth is enabled ([`RpcError::InvalidAuthMgmt`]), unknown user
    /// ([`RpcError::UserNotFound`]).
    pub fn apply_user_delete(
        &mut self,
        req: &AuthUserDeleteRequest,
        w: &mut impl AuthWrites,
    ) -> Result<AuthUserDeleteResponse, AuthError> {
        if self.enabled && req.name == ROOT_USER {
            return Err(RpcError::InvalidAuthMgmt.into());
        }
        if self.users.remove(&req.name).is_none() {
            return Err(RpcError::UserNotFound.into());
        }
        w.remove(&storage::user_key(&req.name));
        self.cache.refresh_user(&req.name, &self.users, &self.roles);
        self.commit_revision(w);
        Ok(AuthUserDeleteResponse::default())
    }

    /// UserChangePassword: replaces the hash (kept empty for a `no_password` user, whose
    /// change still moves the revision). The caller drops the user's tokens.
    ///
    /// Errors: unknown user ([`RpcError::UserNotFound`]), a hash that is not base64
    /// ([`AuthError::NoPasswordUser`]), a plaintext password
    /// ([`AuthError::PlaintextPassword`]).
    pub fn apply_user_change_password(
        &mut self,
        req: &AuthUserChangePasswordRequest,
        w: &mut impl AuthWrites,
    ) -> Result<AuthUserChangePasswordResponse, AuthError> {
        let user = self.users.get(&req.name).ok_or(RpcError::UserNotFound)?;
        let password = if no_password(user) {
            Vec::new()
        } else {
            select_password(&req.password, &req.hashed_password)?
        };
        let user = User {
            password,
            ..user.clone()
        };
        self.put_user(&req.name, user, w);
        self.commit_revision(w);
        Ok(AuthUserChangePasswordResponse::default())
    }

    /// UserGrantRole: adds the role to the user's sorted roles. Role `root` need not exist;
    /// a role the user already holds is a no-op (no revision move).
    ///
    /// Errors: unknown user ([`RpcError::UserNotFound`]), unknown role other than `root`
    /// ([`RpcError::RoleNotFound`]).
    pub fn apply_user_grant_role(
        &mut self,
        req: &AuthUserGrantRoleRequest,
        w: &mut impl AuthWrites,
    ) -> Result<AuthUserGrantRoleResponse, AuthError> {
        let user = self.users.get(&req.user).ok_or(RpcError::UserNotFound)?;
        if req.role != ROOT_ROLE && !self.roles.contains_key(&req.role) {
            return Err(RpcError::RoleNotFound.into());
        }
        let Err(at) = user.roles.binary_search(&req.role) else {
            return Ok(AuthUserGrantRoleResponse::default());
        };
        let mut user = user.clone();
        user.roles.insert(at, req.role.clone());
        self.put_user(&req.user, user, w);
        self.commit_revision(w);
        Ok(AuthUserGrantRoleResponse::default())
    }

    /// UserRevokeRole.
    ///
    /// Errors: role `root` from user `root` while enabled ([`RpcError::InvalidAuthMgmt`]),
    /// unknown user ([`RpcError::UserNotFound`]), a role the user does not hold
    /// ([`RpcError::RoleNotGranted`]).
    pub fn apply_user_revoke_role(
        &mut self,
        req: &AuthUserRevokeRoleRequest,
        w: &mut impl AuthWrites,
    ) -> Result<AuthUserRevokeRoleResponse, AuthError> {
        if self.enabled && req.name == ROOT_USER && req.role == ROOT_ROLE {
            return Err(RpcError::InvalidAuthMgmt.into());
        }
        let user = self.users.get(&req.name).ok_or(RpcError::UserNotFound)?;
        let mut user = user.clone();
        let before = user.roles.len();
        user.roles.retain(|r| *r != req.role);
        if user.roles.len() == before {
            return Err(RpcError::RoleNotGranted.into());
        }
        self.put_user(&req.name, user, w);
        self.commit_revision(w);
        Ok(AuthUserRevokeRoleResponse::default())
    }

    /// UserGet: the user's roles, sorted.
    ///
    /// Errors: unknown user ([`RpcError::UserNotFound`]).
    pub fn apply_user_get(
        &self,
        req: &AuthUserGetRequest,
    ) -> Result<AuthUserGetResponse, AuthError> {
        let user = self.users.get(&req.name).ok_or(RpcError::UserNotFound)?;
        Ok(AuthUserGetResponse {
            header: None,
            roles: user.roles.clone(),
        })
    }

    /// UserList: every user name, sorted by bytes.
    pub fn apply_user_list(&self, _req: &AuthUserListRequest) -> AuthUserListResponse {
        AuthUserListResponse {
            header: None,
            users: self.users.keys().cloned().collect(),
        }
    }

    /// RoleAdd: a role with no permissions.
    ///
    /// Errors: empty name ([`RpcError::RoleEmpty`]), existing name
    /// ([`RpcError::RoleAlreadyExist`]).
    pub fn apply_role_add(
        &mut self,
        req: &AuthRoleAddRequest,
        w: &mut impl AuthWrites,
    ) -> Result<AuthRoleAddResponse, AuthError> {
        if req.name.is_empty() {
            return Err(RpcError::RoleEmpty.into());
        }
        if self.roles.contains_key(&req.name) {
            return Err(RpcError::RoleAlreadyExist.into());
        }
        let role = Role {
            name: req.name.as_bytes().to_vec(),
            key_permission: Vec::new(),
        };
        self.put_role(&req.name, role, w);
        self.commit_revision(w);
        Ok(AuthRoleAddResponse::default())
    }

    /// RoleGet: the role's permissions; for role `root` only its implicit READWRITE on every
    /// key (etcd `rootPerm`), whatever is stored.
    ///
    /// Errors: unknown role ([`RpcError::RoleNotFound`]).
    pub fn apply_role_get(
        &self,
        req: &AuthRoleGetRequest,
    ) -> Result<AuthRoleGetResponse, AuthError> {
        let role = self.roles.get(&req.role).ok_or(RpcError::RoleNotFound)?;
        let perm = if req.role == ROOT_ROLE {
            vec![root_permission()]
        } else {
            role.key_permission.clone()
        };
        Ok(AuthRoleGetResponse { header: None, perm })
    }

    /// RoleList: every role name, sorted by bytes.
    pub fn apply_role_list(&self, _req: &AuthRoleListRequest) -> AuthRoleListResponse {
        AuthRoleListResponse {
            header: None,
            roles: self.roles.keys().cloned().collect(),
        }
    }

    /// RoleDelete: removes the role and takes it from every user holding it.
    ///
    /// Errors: `root` while enabled ([`RpcError::InvalidAuthMgmt`]), unknown role
    /// ([`RpcError::RoleNotFound`]).
    pub fn apply_role_delete(
        &mut self,
        req: &AuthRoleDeleteRequest,
        w: &mut impl AuthWrites,
    ) -> Result<AuthRoleDeleteResponse, AuthError> {
        if self.enabled && req.role == ROOT_ROLE {
            return Err(RpcError::InvalidAuthMgmt.into());
        }
        if self.roles.remove(&req.role).is_none() {
            return Err(RpcError::RoleNotFound.into());
        }
        w.remove(&storage::role_key(&req.role));
        let holders: Vec<String> = self
            .users
            .iter()
            .filter(|(_, u)| u.roles.contains(&req.role))
            .map(|(name, _)| name.clone())
            .collect();
        for name in holders {
            let mut user = self.users[&name].clone();
            user.roles.retain(|r| *r != req.role);
            self.put_user(&name, user, w);
        }
        self.commit_revision(w);
        Ok(AuthRoleDeleteResponse::default())
    }

    /// RoleGrantPermission: adds the permission, or changes the type of the one on the same
    /// key and range end. Permissions stay sorted by key, then range end. Moves the revision
    /// even when nothing changes (etcd).
    ///
    /// Errors: no permission ([`RpcError::PermissionNotGiven`]), an invalid range
    /// ([`RpcError::InvalidAuthMgmt`]), unknown role ([`RpcError::RoleNotFound`]).
    pub fn apply_role_grant_permission(
        &mut self,
        req: &AuthRoleGrantPermissionRequest,
        w: &mut impl AuthWrites,
    ) -> Result<AuthRoleGrantPermissionResponse, AuthError> {
        let perm = req.perm.as_ref().ok_or(RpcError::PermissionNotGiven)?;
        if !is_valid_permission_range(&perm.key, &perm.range_end) {
            return Err(RpcError::InvalidAuthMgmt.into());
        }
        let mut role = self
            .roles
            .get(&req.name)
            .ok_or(RpcError::RoleNotFound)?
            .clone();
        let position = role.key_permission.binary_search_by(|p| {
            (p.key.as_slice(), p.range_end.as_slice())
                .cmp(&(perm.key.as_slice(), perm.range_end.as_slice()))
        });
        match position {
            Ok(at) => role.key_permission[at].perm_type = perm.perm_type,
            Err(at) => role.key_permission.insert(
                at,
                Permission {
                    perm_type: perm.perm_type,
                    key: perm.key.clone(),
                    range_end: perm.range_end.clone(),
                },
            ),
        }
        self.put_role(&req.name, role, w);
        self.commit_revision(w);
        Ok(AuthRoleGrantPermissionResponse::default())
    }

    /// RoleRevokePermission: removes the permission on exactly `key` and `range_end`.
    ///
    /// Errors: unknown role ([`RpcError::RoleNotFound`]), no such permission
    /// ([`RpcError::PermissionNotGranted`]).
    pub fn apply_role_revoke_permission(
        &mut self,
        req: &AuthRoleRevokePermissionRequest,
        w: &mut impl AuthWrites,
    ) -> Result<AuthRoleRevokePermissionResponse, AuthError> {
        let mut role = self
            .roles
            .get(&req.role)
            .ok_or(RpcError::RoleNotFound)?
            .clone();
        let before = role.key_permission.len();
        role.key_permission
            .retain(|p| p.key != req.key || p.range_end != req.range_end);
        if role.key_permission.len() == before {
            return Err(RpcError::PermissionNotGranted.into());
        }
        self.put_role(&req.role, role, w);
        self.commit_revision(w);
        Ok(AuthRoleRevokePermissionResponse::default())
    }

    /// Stores `user` under `name` (memory, staged write, cache).
    fn put_user(&mut self, name: &str, user: User, w: &mut impl AuthWrites) {
        debug_assert!(user.roles.is_sorted(), "roles of {name} must stay sorted");
        storage::put_user(w, name, &user);
        self.users.insert(name.to_string(), user);
        self.cache.refresh_user(name, &self.users, &self.roles);
    }

    /// Stores `role` under `name` (memory, staged write, cache of its holders).
    fn put_role(&mut self, name: &str, role: Role, w: &mut impl AuthWrites) {
        storage::put_role(w, name, &role);
        self.roles.insert(name.to_string(), role);
        self.cache.refresh_role(name, &self.users, &self.roles);
    }

    /// Moves the revision by one and stages it (etcd `commitRevision`).
    fn commit_revision(&mut self, w: &mut impl AuthWrites) {
        self.revision += 1;
        storage::put_revision(w, self.revision);
    }
}

/// True for a user created with `no_password`.
fn no_password(user: &User) -> bool {
    user.options.is_some_and(|o| o.no_password)
}

/// The stored password of a UserAdd/UserChangePassword entry (etcd `selectPassword`, without
/// its pre-3.5 branch that hashes a plaintext password at apply).
fn select_password(password: &str, hashed_password: &str) -> Result<Vec<u8>, AuthError> {
    if !password.is_empty() && hashed_password.is_empty() {
        return Err(AuthError::PlaintextPassword);
    }
    base64::engine::general_purpose::STANDARD
        .decode(hashed_password)
        .map_err(|_| AuthError::NoPasswordUser)
}
