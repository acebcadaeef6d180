//! The vocabulary of auth: who asks ([`AuthInfo`]), what they may ask for ([`Access`]), the
//! root user and role, and which permission ranges are valid (etcd `server/auth/store.go`,
//! `range_perm_cache.go`).

use keel_proto::authpb::{Permission, User, permission::Type as PermType};

/// Name of the superuser (etcd `rootUser`). AuthEnable needs it, with role [`ROOT_ROLE`].
pub const ROOT_USER: &str = "root";

/// Name of the superuser role (etcd `rootRole`): implicit READWRITE on every key, and the only
/// role that may manage auth, members and maintenance.
pub const ROOT_ROLE: &str = "root";

/// Who a request runs as: the user name and the auth revision its token was issued at
/// (etcd `auth.AuthInfo`, stamped into the raft entry's `RequestHeader`).
///
/// The default (empty name, revision 0) is "no credentials": with auth enabled, etcd
/// answers it with `ErrGRPCUserEmpty` ([`keel_proto::rpctypes::RpcError::UserEmpty`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct AuthInfo {
    /// The user name ("" = no credentials).
    pub username: String,
    /// The auth revision the credentials were checked at (0 = none).
    pub revision: u64,
}

impl AuthInfo {
    /// Credentials of `username` checked at auth revision `revision`.
    pub fn new(username: impl Into<String>, revision: u64) -> AuthInfo {
        AuthInfo {
            username: username.into(),
            revision,
        }
    }

    /// True for "no credentials" (etcd `authInfo == nil` or an empty user name).
    pub fn is_anonymous(&self) -> bool {
        self.username.is_empty()
    }
}

/// The kind of access a key operation needs (etcd `authpb.READ` / `authpb.WRITE` as passed to
/// `isOpPermitted`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// Range, watch, txn compares, `prev_kv`, lease listing.
    Read,
    /// Put, delete, lease revoke and keep-alive.
    Write,
}

/// The permission the root role holds implicitly: READWRITE on `["", "\0")` (etcd
/// `rootPerm`). RoleGet of `root` answers with this alone, whatever is stored.
pub fn root_permission() -> Permission {
    Permission {
        perm_type: PermType::Readwrite as i32,
        key: Vec::new(),
        range_end: vec![0],
    }
}

/// True when `user` holds role `root` (etcd `hasRootRole`). The role need not exist as a
/// role: granting `root` is allowed without one.
pub fn has_root_role(user: &User) -> bool {
    user.roles
        .binary_search_by(|r| r.as_str().cmp(ROOT_ROLE))
        .is_ok()
}

/// True when `range_end` means "every key from `key` on" (etcd `isOpenEnded`: `"\0"`).
pub fn is_open_ended(range_end: &[u8]) -> bool {
    range_end == [0]
}

/// Whether a permission on `[key, range_end)` may be granted (etcd `isValidPermissionRange`):
/// a non-empty key, and a single key (empty `range_end`), a non-empty range
/// (`key < range_end`), or from-key (`range_end == "\0"`).
pub fn is_valid_permission_range(key: &[u8], range_end: &[u8]) -> bool {
    if key.is_empty() {
        return false;
    }
    range_end.is_empty() || key < range_end || is_open_ended(range_end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permission_ranges_follow_etcds_rules() {
        assert!(is_valid_permission_range(b"a", b""), "single key");
        assert!(is_valid_permission_range(b"a", b"b"), "range");
        assert!(is_valid_permission_range(b"a", b"\0"), "from key");
        assert!(is_valid_permission_range(b"\0", b"\0"), "every key");
        assert!(!is_valid_permission_range(b"", b""), "empty key");
        assert!(
            !is_valid_permission_range(b"", b"\0"),
            "empty key, open end"
        );
        assert!(!is_valid_permission_range(b"b", b"a"), "inverted");
        assert!(!is_valid_permission_range(b"a", b"a"), "empty range");
    }

    #[test]
    fn root_role_is_found_in_sorted_roles() {
        let user = |roles: &[&str]| User {
            roles: roles.iter().map(|r| r.to_string()).collect(),
            ..Default::default()
        };
        assert!(has_root_role(&user(&["a", "root", "z"])));
        assert!(!has_root_role(&user(&["a", "roots"])));
        assert!(!has_root_role(&user(&[])));
    }
}
