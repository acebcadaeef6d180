//! [`Method`]: the etcd RPCs a QoS rule can name, and [`MethodSet`], a rule's set of them as
//! one bit mask (so matching a method is one `AND`, with no allocation).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::rules::Priority;

/// Declares [`Method`] from one table: each RPC's name (as etcd's `rpc.proto` spells it,
/// which is also its name in a rule file) and whether etcd gates it on the apply lag.
macro_rules! methods {
    ($( $(#[$doc:meta])* $name:ident: $service:literal, $proposal:literal; )+) => {
        /// An etcd v3 RPC, by its `rpc.proto` name (`Range`, `Put`, `LeaseKeepAlive`, ...).
        ///
        /// In a rule file it is written exactly so (`methods: [Put, Txn]`); any other name
        /// is refused. The discriminant is the bit of the method in a [`MethodSet`].
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[repr(u8)]
        pub enum Method {
            $(
                $(#[$doc])*
                #[doc = concat!("Service `", $service, "`.")]
                $name,
            )+
        }

        impl Method {
            /// Every method, in declaration (= bit) order.
            pub const ALL: &'static [Method] = &[$(Method::$name),+];

            /// The RPC name, as in `rpc.proto` and rule files.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Method::$name => stringify!($name),)+
                }
            }

            /// Whether etcd proposes this request through `processInternalRaftRequestOnce`
            /// (`server/etcdserver/v3_server.go`), the path that refuses new proposals with
            /// `etcdserver: too many requests` when the applied index lags the committed
            /// index (see [`super::overload`]). Reads, watches, keep-alives (renewed by the
            /// leader, not proposed) and membership changes (raft `ConfChange`, not gated by
            /// etcd) are not. A read-only `Txn` is not proposed either; the caller says so in
            /// [`super::RequestInfo::proposal`].
            pub const fn is_proposal(self) -> bool {
                match self {
                    $(Method::$name => $proposal,)+
                }
            }
        }
    };
}

methods! {
    // --- KV
    /// A read of one key or a range.
    Range: "KV", false;
    /// A write of one key.
    Put: "KV", true;
    /// A delete of one key or a range.
    DeleteRange: "KV", true;
    /// A transaction (proposed unless read-only).
    Txn: "KV", true;
    /// A compaction.
    Compact: "KV", true;
    /// etcd 3.7's streamed range (KEP-5966).
    RangeStream: "KV", false;
    // --- Watch
    /// A watch create request.
    Watch: "Watch", false;
    // --- Lease
    /// A lease grant.
    LeaseGrant: "Lease", true;
    /// A lease revoke.
    LeaseRevoke: "Lease", true;
    /// A lease keep-alive (renewed by the leader, not proposed).
    LeaseKeepAlive: "Lease", false;
    /// A lease's remaining TTL.
    LeaseTimeToLive: "Lease", false;
    /// The list of leases.
    LeaseLeases: "Lease", false;
    // --- Cluster
    /// A member add (raft `ConfChange`).
    MemberAdd: "Cluster", false;
    /// A member remove (raft `ConfChange`).
    MemberRemove: "Cluster", false;
    /// A member's peer URLs update (raft `ConfChange`).
    MemberUpdate: "Cluster", false;
    /// The member list.
    MemberList: "Cluster", false;
    /// A learner promotion (raft `ConfChange`).
    MemberPromote: "Cluster", false;
    // --- Maintenance
    /// An alarm list, activate or deactivate.
    Alarm: "Maintenance", true;
    /// A member's status.
    Status: "Maintenance", false;
    /// A defragmentation.
    Defragment: "Maintenance", false;
    /// A hash of the backend.
    Hash: "Maintenance", false;
    /// A hash of the MVCC key space.
    HashKV: "Maintenance", false;
    /// A snapshot stream.
    Snapshot: "Maintenance", false;
    /// A leadership transfer.
    MoveLeader: "Maintenance", false;
    /// A downgrade validate, enable or cancel.
    Downgrade: "Maintenance", true;
    // --- Auth
    /// Enable auth.
    AuthEnable: "Auth", true;
    /// Disable auth.
    AuthDisable: "Auth", true;
    /// Whether auth is enabled.
    AuthStatus: "Auth", false;
    /// A user name and password for a token (proposed as `InternalAuthenticateRequest`).
    Authenticate: "Auth", true;
    /// Add a user.
    UserAdd: "Auth", true;
    /// Get a user.
    UserGet: "Auth", false;
    /// List users.
    UserList: "Auth", false;
    /// Delete a user.
    UserDelete: "Auth", true;
    /// Change a user's password.
    UserChangePassword: "Auth", true;
    /// Grant a role to a user.
    UserGrantRole: "Auth", true;
    /// Revoke a role from a user.
    UserRevokeRole: "Auth", true;
    /// Add a role.
    RoleAdd: "Auth", true;
    /// Get a role.
    RoleGet: "Auth", false;
    /// List roles.
    RoleList: "Auth", false;
    /// Delete a role.
    RoleDelete: "Auth", true;
    /// Grant a permission to a role.
    RoleGrantPermission: "Auth", true;
    /// Revoke a permission from a role.
    RoleRevokePermission: "Auth", true;
    // --- Lock and Election (served through the KV path, so proposed like a Txn)
    /// Acquire a lock.
    Lock: "Lock", true;
    /// Release a lock.
    Unlock: "Lock", true;
    /// Campaign for leadership.
    Campaign: "Election", true;
    /// Update the leader's value.
    Proclaim: "Election", true;
    /// The current leader.
    Leader: "Election", false;
    /// Stream leader changes.
    Observe: "Election", false;
    /// Give up leadership.
    Resign: "Election", true;
}

// Every method is one bit of a `u64`.
const _: () = assert!(Method::ALL.len() <= 64);

impl Method {
    /// The priority of a request of this method that no rule gives one: `High` for
    /// `LeaseRevoke` and `LeaseKeepAlive` (so sessions survive an overload, as etcd 3.7's
    /// `PriorityRequest` admits lease revokes), `Normal` for everything else.
    pub const fn default_priority(self) -> Priority {
        match self {
            Method::LeaseRevoke | Method::LeaseKeepAlive => Priority::High,
            _ => Priority::Normal,
        }
    }

    const fn bit(self) -> u64 {
        1 << self as u8
    }
}

/// A name that is none of a kind's names (`unknown method "put"`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} {name:?}")]
pub struct UnknownName {
    /// What was named: `method` or `priority`.
    pub kind: &'static str,
    /// The name given.
    pub name: String,
}

/// The one of `all` whose `name_of` is exactly `name`: the `FromStr` of the QoS
/// vocabularies ([`Method`], [`Priority`]).
pub(super) fn by_name<T: Copy>(
    kind: &'static str,
    all: &[T],
    name_of: impl Fn(T) -> &'static str,
    name: &str,
) -> Result<T, UnknownName> {
    all.iter()
        .copied()
        .find(|&x| name_of(x) == name)
        .ok_or_else(|| UnknownName {
            kind,
            name: name.to_string(),
        })
}

impl FromStr for Method {
    type Err = UnknownName;

    /// The method named exactly `name` (`rpc.proto` spelling).
    fn from_str(name: &str) -> Result<Method, UnknownName> {
        by_name("method", Method::ALL, Method::name, name)
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of [`Method`]s as a bit mask: membership is one `AND`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MethodSet(u64);

impl MethodSet {
    /// Every method (a rule that names none).
    pub const ANY: MethodSet = MethodSet(u64::MAX);

    /// The set of `methods`.
    pub fn of(methods: &[Method]) -> MethodSet {
        MethodSet(methods.iter().fold(0, |m, x| m | x.bit()))
    }

    /// Whether `method` is in the set.
    #[inline]
    pub const fn contains(self, method: Method) -> bool {
        self.0 & method.bit() != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_rpc_names_and_parse_back() {
        assert_eq!(Method::ALL.len(), 49);
        for &m in Method::ALL {
            let parsed: Method = serde_json::from_str(&format!("\"{m}\"")).unwrap();
            assert_eq!(parsed, m);
            assert_eq!(m.name().parse::<Method>(), Ok(m));
        }
        assert_eq!(Method::HashKV.name(), "HashKV");
        assert!(serde_json::from_str::<Method>("\"put\"").is_err());
    }

    #[test]
    fn sets_hold_exactly_their_methods() {
        let s = MethodSet::of(&[Method::Put, Method::Resign]);
        for &m in Method::ALL {
            assert_eq!(
                s.contains(m),
                matches!(m, Method::Put | Method::Resign),
                "{m}"
            );
            assert!(MethodSet::ANY.contains(m));
        }
    }

    #[test]
    fn lease_revoke_and_keepalive_are_high_priority() {
        let high: Vec<_> = Method::ALL
            .iter()
            .filter(|m| m.default_priority() == Priority::High)
            .collect();
        assert_eq!(high, [&Method::LeaseRevoke, &Method::LeaseKeepAlive]);
    }

    #[test]
    fn only_raft_requests_are_gated() {
        assert!(Method::Put.is_proposal() && Method::LeaseRevoke.is_proposal());
        assert!(!Method::Range.is_proposal() && !Method::LeaseKeepAlive.is_proposal());
        assert!(!Method::MemberAdd.is_proposal() && !Method::Watch.is_proposal());
    }
}
