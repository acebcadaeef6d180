//! Every sled tree and key of a member's store, declared in one place (etcd
//! `server/storage/schema`). The modules that own a part of the key space encode and decode
//! their values; this file says which keys exist, who owns them and what their bytes are.
//! Nothing here may change without a format version bump: existing data dirs must still
//! open, so every name and byte below is frozen (`names_are_frozen` pins them).
//!
//! A member's sled database (`<data-dir>/member/db/`) holds two trees:
//!
//! - [`MEMBER_TREE`] (`keel`): the replicated state. Every key is written by apply, in the
//!   apply group's batch, together with the consistent index (except [`CLUSTER_ID`], written
//!   once at bootstrap with the same value on every member). A snapshot carries this whole
//!   tree.
//! - [`LOCAL_TREE`] (`local`): this member's own facts, never replicated and never part of a
//!   snapshot.
//!
//! Keys of [`MEMBER_TREE`], by first byte (each first byte has one owner):
//!
//! | key | owner | value |
//! |---|---|---|
//! | `k` + main (u64 BE) + sub (u64 BE) (17 bytes) | mvcc | prost `mvccpb.KeyValue` of a put, all fields |
//! | the same + `t` (18 bytes) | mvcc | prost `mvccpb.KeyValue` holding only `key` (a delete) |
//! | `mformat` | mvcc | MVCC format version, 8 bytes BE (1) |
//! | `mcompact` | mvcc | compact revision, i64 BE; absent = never compacted |
//! | `c/consistent_index` | cindex | bincode `ConsistentIndex { applied: Option<LogId>, partial: Option<(LogId, u32)> }` |
//! | `l` + lease ID (i64 BE, 8 bytes) | lease | `[1][TTL: i64 BE][remaining TTL: i64 BE]`, seconds |
//! | `s/membership` | apply | bincode openraft `StoredMembership<u64, MemberNode>`: the last applied raft membership config |
//! | `s/attr/` + member ID (u64 BE) | membership | prost `keelpb.MemberAttributes` (name, client URLs) |
//! | `s/cluster_id` | cluster bootstrap | cluster ID, u64 BE |
//! | `a/format` | auth | auth format version, u64 BE (1) |
//! | `a/enabled` | auth | `[1]` auth enabled, `[0]` (or absent) disabled |
//! | `a/revision` | auth | the auth revision, u64 BE; absent = 1 |
//! | `a/user/` + user name (UTF-8) | auth | prost `authpb.User` (bcrypt hash, sorted roles, options) |
//! | `a/role/` + role name (UTF-8) | auth | prost `authpb.Role` (permissions sorted by key, then range end) |
//! | `q/rules` | qos (staged by apply) | the QoS rule set, `qos::RuleSet::encode` (canonical JSON `{"format":1,"version":V,"rules":[...]}`); absent = no rules, version 0 |
//! | `x/alarm/` + member ID (u64 BE) + alarm type (i32 BE) | alarm | empty: that member raised that alarm (etcd's `alarm` bucket) |
//! | `s/cluster_version` | version (staged by apply) | the cluster version, `major.minor` UTF-8; absent = not decided (0.1) |
//! | `s/downgrade` | version (staged by apply) | the target of an enabled downgrade, `major.minor` UTF-8; absent = none |
//!
//! No key starts with `0xff`: the defragment's fence (`backend/defrag.rs`, `FENCE`) is such a
//! key, and it is never stored (a change event with nothing written).
//!
//! Keys of [`LOCAL_TREE`]:
//!
//! | key | owner | value |
//! |---|---|---|
//! | `member_id` | cluster bootstrap | this member's ID, u64 BE |
//! | `storage_version` | version | the data dir's schema release, `major.minor` UTF-8; absent in a dir with state = 0.1 |
//!
//! MVCC record values are the bytes etcd stores in its `key` bucket (gogo-proto and prost
//! both write set fields in field order), so `HashKV` hashes the same bytes as etcd.
//! Big-endian revisions make sled's key order equal revision order: a scan of the `k` prefix
//! walks history oldest first. The WAL (`member/wal/`) and snapshot files (`member/snap/`)
//! are not sled; their formats are documented next to their code (`wal/`, `raft/snapshot.rs`).

/// The replicated tree: MVCC, consistent index, leases, membership, auth (see the module
/// docs).
pub const MEMBER_TREE: &str = "keel";
/// The member-local tree, never replicated.
pub const LOCAL_TREE: &str = "local";

/// First byte of every MVCC revision record key.
pub const RECORD_PREFIX: u8 = b'k';
/// Last byte of a tombstone record key (etcd's `markTombstone`).
pub const TOMBSTONE_MARK: u8 = b't';
/// First byte of MVCC meta keys.
pub const MVCC_META_PREFIX: u8 = b'm';
/// MVCC format version.
pub const MVCC_FORMAT: &[u8] = b"mformat";
/// MVCC compact revision.
pub const MVCC_COMPACT: &[u8] = b"mcompact";
/// The consistent index.
pub const CONSISTENT_INDEX: &[u8] = b"c/consistent_index";
/// First byte of every lease record key (`l` + lease ID, 8 bytes BE).
pub const LEASE_PREFIX: u8 = b'l';
/// The last applied raft membership config.
pub const RAFT_MEMBERSHIP: &[u8] = b"s/membership";
/// Prefix of the member attribute keys (`s/attr/` + member ID, 8 bytes BE).
pub const MEMBER_ATTRIBUTES_PREFIX: &[u8] = b"s/attr/";
/// The cluster ID (the same on every member).
pub const CLUSTER_ID: &[u8] = b"s/cluster_id";
/// First byte of every auth key (users, roles, the auth revision and flags).
pub const AUTH_PREFIX: u8 = b'a';
/// Auth format version.
pub const AUTH_FORMAT: &[u8] = b"a/format";
/// Whether auth is enabled.
pub const AUTH_ENABLED: &[u8] = b"a/enabled";
/// The auth revision.
pub const AUTH_REVISION: &[u8] = b"a/revision";
/// Prefix of the user records (`a/user/` + user name).
pub const AUTH_USER_PREFIX: &[u8] = b"a/user/";
/// Prefix of the role records (`a/role/` + role name).
pub const AUTH_ROLE_PREFIX: &[u8] = b"a/role/";

/// The replicated QoS rule set (`qos::RuleSet::encode`), written by apply with the
/// consistent index of the rule change that made it.
pub const QOS_RULES: &[u8] = b"q/rules";
/// Prefix of the raised alarms (`x/alarm/` + member ID, 8 bytes BE, + alarm type, 4 bytes
/// BE; empty value).
pub const ALARM_PREFIX: &[u8] = b"x/alarm/";

/// The cluster version (`version::ClusterVersion`), written by apply.
pub const CLUSTER_VERSION: &[u8] = b"s/cluster_version";

/// The target of an enabled downgrade (`version::Downgrade`), written by apply.
pub const DOWNGRADE_TARGET: &[u8] = b"s/downgrade";

/// In [`LOCAL_TREE`]: this member's ID.
pub const MEMBER_ID: &[u8] = b"member_id";
/// In [`LOCAL_TREE`]: the data dir's storage version (`version::check_and_migrate`).
pub const STORAGE_VERSION: &[u8] = b"storage_version";

/// The part of the schema a key of [`MEMBER_TREE`] belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// An MVCC revision record (`k…`).
    MvccRecord,
    /// MVCC meta (`mformat`, `mcompact`).
    MvccMeta,
    /// The consistent index.
    ConsistentIndex,
    /// A lease record.
    Lease,
    /// The raft membership config.
    RaftMembership,
    /// A member's published attributes.
    MemberAttributes,
    /// The cluster ID.
    ClusterId,
    /// Auth: its flags, revision, users and roles.
    Auth,
    /// The QoS rule set.
    Qos,
    /// A raised alarm.
    Alarm,
    /// The cluster version and the downgrade job.
    ClusterVersion,
}

/// Which part of the schema `key` (of [`MEMBER_TREE`]) belongs to; `None` for a key the
/// schema does not declare (a foreign or corrupt store).
pub fn owner(key: &[u8]) -> Option<Owner> {
    match key {
        [RECORD_PREFIX, ..] => Some(Owner::MvccRecord),
        k if k == MVCC_FORMAT || k == MVCC_COMPACT => Some(Owner::MvccMeta),
        k if k == CONSISTENT_INDEX => Some(Owner::ConsistentIndex),
        [LEASE_PREFIX, ..] => Some(Owner::Lease),
        k if k == RAFT_MEMBERSHIP => Some(Owner::RaftMembership),
        k if k.starts_with(MEMBER_ATTRIBUTES_PREFIX) => Some(Owner::MemberAttributes),
        k if k == CLUSTER_ID => Some(Owner::ClusterId),
        k if k == CLUSTER_VERSION || k == DOWNGRADE_TARGET => Some(Owner::ClusterVersion),
        [AUTH_PREFIX, ..] => Some(Owner::Auth),
        k if k == QOS_RULES => Some(Owner::Qos),
        k if k.starts_with(ALARM_PREFIX) => Some(Owner::Alarm),
        _ => None,
    }
}

/// `prefix` followed by `id` as 8 big-endian bytes: the key layout of lease records and
/// member attributes.
pub fn id_key(prefix: &[u8], id: [u8; 8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(prefix.len() + 8);
    key.extend_from_slice(prefix);
    key.extend_from_slice(&id);
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Data dirs written by earlier releases use exactly these names: changing one is a
    /// format change (bump a version and migrate), never a rename.
    #[test]
    fn names_are_frozen() {
        assert_eq!((MEMBER_TREE, LOCAL_TREE), ("keel", "local"));
        assert_eq!(MEMBER_ID, b"member_id");
        assert_eq!(STORAGE_VERSION, b"storage_version");
        assert_eq!(CLUSTER_VERSION, b"s/cluster_version");
        assert_eq!(DOWNGRADE_TARGET, b"s/downgrade");
        assert_eq!(
            [
                RECORD_PREFIX,
                TOMBSTONE_MARK,
                MVCC_META_PREFIX,
                LEASE_PREFIX,
                AUTH_PREFIX
            ],
            *b"ktmla"
        );
        assert_eq!(MVCC_FORMAT, b"mformat");
        assert_eq!(MVCC_COMPACT, b"mcompact");
        assert_eq!(CONSISTENT_INDEX, b"c/consistent_index");
        assert_eq!(RAFT_MEMBERSHIP, b"s/membership");
        assert_eq!(MEMBER_ATTRIBUTES_PREFIX, b"s/attr/");
        assert_eq!(CLUSTER_ID, b"s/cluster_id");
        assert_eq!(
            [AUTH_FORMAT, AUTH_ENABLED, AUTH_REVISION],
            [b"a/format".as_slice(), b"a/enabled", b"a/revision"]
        );
        assert_eq!(AUTH_USER_PREFIX, b"a/user/");
        assert_eq!(AUTH_ROLE_PREFIX, b"a/role/");
        assert_eq!(QOS_RULES, b"q/rules");
        assert_eq!(ALARM_PREFIX, b"x/alarm/");
    }

    #[test]
    fn every_key_has_one_owner() {
        let cases: [(&[u8], Option<Owner>); 18] = [
            (
                b"k\0\0\0\0\0\0\0\x02\0\0\0\0\0\0\0\0",
                Some(Owner::MvccRecord),
            ),
            (b"mformat", Some(Owner::MvccMeta)),
            (b"mcompact", Some(Owner::MvccMeta)),
            (b"mother", None),
            (b"c/consistent_index", Some(Owner::ConsistentIndex)),
            (b"l\0\0\0\0\0\0\0\x07", Some(Owner::Lease)),
            (b"s/membership", Some(Owner::RaftMembership)),
            (b"s/attr/\0\0\0\0\0\0\0\x01", Some(Owner::MemberAttributes)),
            (b"s/cluster_id", Some(Owner::ClusterId)),
            (b"s/cluster_version", Some(Owner::ClusterVersion)),
            (b"c/other", None),
            (b"a/revision", Some(Owner::Auth)),
            (b"a/user/alice", Some(Owner::Auth)),
            (b"q/rules", Some(Owner::Qos)),
            (b"q/other", None),
            (b"x/alarm/\0\0\0\0\0\0\0\x01\0\0\0\x01", Some(Owner::Alarm)),
            (b"x/other", None),
            (b"", None),
        ];
        for (key, want) in cases {
            assert_eq!(owner(key), want, "{}", key.escape_ascii());
        }
        // The 8-byte ID keys keep sled's order equal to the IDs' unsigned order.
        assert_eq!(
            id_key(b"s/attr/", 1u64.to_be_bytes()),
            b"s/attr/\0\0\0\0\0\0\0\x01"
        );
        assert_eq!(
            id_key(&[LEASE_PREFIX], 7i64.to_be_bytes()),
            b"l\0\0\0\0\0\0\0\x07"
        );
    }
}
