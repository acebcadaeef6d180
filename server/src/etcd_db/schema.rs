//! etcd's bbolt schema: bucket names, key names and value encodings.
//!
//! Sources: `etcd@v3.6.14:server/storage/schema/{bucket,cindex,confstate,lease,membership,
//! alarm,auth,auth_users,auth_roles,version}.go`; for 3.4 `etcd@v3.4.23:mvcc/{kvstore.go,
//! revision.go}`, `auth/store.go`, `etcdserver/api/membership/store.go`, `lease/lessor.go`.
//!
//! | bucket | key | value |
//! |---|---|---|
//! | `key` | revision: `main` u64 BE, `_`, `sub` u64 BE (17 bytes), `t` appended for a tombstone | `mvccpb.KeyValue` (a tombstone holds only `key`) |
//! | `meta` | `consistent_index`, `term` (3.5+) | u64 BE |
//! | `meta` | `scheduledCompactRev`, `finishedCompactRev` | a 17-byte revision with `sub` = 0 |
//! | `meta` | `confState` (3.5+) | JSON of `raftpb.ConfState` |
//! | `meta` | `storageVersion` (3.6+) | `"3.6"` (major.minor) |
//! | `lease` | lease ID, i64 BE | `leasepb.Lease{ID, TTL, RemainingTTL}` |
//! | `alarm` | `etcdserverpb.AlarmMember` bytes | empty |
//! | `cluster` | `clusterVersion` | semver text, e.g. `3.4.0` |
//! | `cluster` | `downgrade` (3.5+) | JSON `{"target-version":..,"enabled":..}` |
//! | `members` | member ID in lowercase hex | member JSON |
//! | `members_removed` | member ID in lowercase hex | `removed` |
//! | `auth` | `authEnabled` | one byte, 1 or 0 |
//! | `auth` | `authRevision` | u64 BE |
//! | `authUsers` | user name | `authpb.User` |
//! | `authRoles` | role name | `authpb.Role` |

use crate::backend::schema::TOMBSTONE_MARK;
use crate::mvcc::Revision;
use crate::mvcc::revision::etcd_rev_bytes;

/// Bucket of MVCC records (etcd `schema.Key`).
pub const KEY: &str = "key";
/// Bucket of store metadata (etcd `schema.Meta`).
pub const META: &str = "meta";
/// Bucket of leases (etcd `schema.Lease`).
pub const LEASE: &str = "lease";
/// Bucket of active alarms (etcd `schema.Alarm`).
pub const ALARM: &str = "alarm";
/// Bucket of cluster-wide values (etcd `schema.Cluster`).
pub const CLUSTER: &str = "cluster";
/// Bucket of members (etcd `schema.Members`).
pub const MEMBERS: &str = "members";
/// Bucket of removed member IDs (etcd `schema.MembersRemoved`).
pub const MEMBERS_REMOVED: &str = "members_removed";
/// Bucket of auth flags (etcd `schema.Auth`).
pub const AUTH: &str = "auth";
/// Bucket of users (etcd `schema.AuthUsers`).
pub const AUTH_USERS: &str = "authUsers";
/// Bucket of roles (etcd `schema.AuthRoles`).
pub const AUTH_ROLES: &str = "authRoles";

/// Every bucket etcd creates (`schema.AllBuckets`); a written file holds all of them.
pub const ALL_BUCKETS: [&str; 10] = [
    KEY,
    META,
    LEASE,
    ALARM,
    CLUSTER,
    MEMBERS,
    MEMBERS_REMOVED,
    AUTH,
    AUTH_USERS,
    AUTH_ROLES,
];

/// `meta` key of the last applied raft index (u64 BE).
pub const CONSISTENT_INDEX: &[u8] = b"consistent_index";
/// `meta` key of the term of that entry (u64 BE, 3.5+).
pub const TERM: &[u8] = b"term";
/// `meta` key of the raft configuration (JSON, 3.5+).
pub const CONF_STATE: &[u8] = b"confState";
/// `meta` key of the revision of a compaction that was requested (revision bytes).
pub const SCHEDULED_COMPACT: &[u8] = b"scheduledCompactRev";
/// `meta` key of the revision of the last finished compaction (revision bytes).
pub const FINISHED_COMPACT: &[u8] = b"finishedCompactRev";
/// `meta` key of the storage schema version (3.6+).
pub const STORAGE_VERSION: &[u8] = b"storageVersion";
/// `cluster` key of the cluster version.
pub const CLUSTER_VERSION: &[u8] = b"clusterVersion";
/// `cluster` key of the downgrade state (JSON, 3.5+).
pub const DOWNGRADE: &[u8] = b"downgrade";
/// `auth` key of the enabled flag.
pub const AUTH_ENABLED: &[u8] = b"authEnabled";
/// `auth` key of the auth revision.
pub const AUTH_REVISION: &[u8] = b"authRevision";
/// Value of every `members_removed` entry.
pub const REMOVED: &[u8] = b"removed";

/// Length of a revision key without the tombstone mark (`revBytesLen`).
pub const REV_KEY_LEN: usize = 17;

/// The `key` bucket key of `rev` (etcd `revToBytes`, plus `markTombstone`).
pub fn rev_key(rev: Revision, tombstone: bool) -> Vec<u8> {
    etcd_rev_bytes(rev, tombstone)
}

/// Decodes a `key` bucket key into its revision and tombstone flag; `None` if it is not
/// 17 bytes with `_` at offset 8, optionally followed by `t`.
pub fn parse_rev_key(key: &[u8]) -> Option<(Revision, bool)> {
    let tombstone = match key.len() {
        REV_KEY_LEN => false,
        18 if key[REV_KEY_LEN] == TOMBSTONE_MARK => true,
        _ => return None,
    };
    if key[8] != b'_' {
        return None;
    }
    let main = i64::try_from(u64::from_be_bytes(key[..8].try_into().ok()?)).ok()?;
    let sub = i64::try_from(u64::from_be_bytes(key[9..17].try_into().ok()?)).ok()?;
    Some((Revision::new(main, sub), tombstone))
}

/// The value of `scheduledCompactRev` / `finishedCompactRev`: revision bytes of `(main, 0)`.
pub fn compact_rev_value(main: i64) -> Vec<u8> {
    etcd_rev_bytes(Revision::new(main, 0), false)
}

/// The main revision of a compact-revision value (etcd `bytesToRev(v).main`; etcd reads only
/// the first 8 bytes, so a shorter value is invalid but a longer one is accepted as etcd does).
pub fn parse_compact_rev(v: &[u8]) -> Option<i64> {
    let b: [u8; 8] = v.get(..8)?.try_into().ok()?;
    if v.len() < REV_KEY_LEN {
        return None;
    }
    i64::try_from(u64::from_be_bytes(b)).ok()
}

/// Decodes a u64 BE value (consistent index, term, auth revision).
pub fn parse_u64(v: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(v.try_into().ok()?))
}

/// The `lease` bucket key of lease `id` (etcd `leaseIDToBytes`).
pub fn lease_key(id: i64) -> [u8; 8] {
    id.to_be_bytes()
}

/// The `members` / `members_removed` key of member `id`: lowercase hex without padding
/// (etcd `types.ID.String()`).
pub fn member_key(id: u64) -> Vec<u8> {
    format!("{id:x}").into_bytes()
}

/// Decodes a member key (etcd `types.IDFromString`).
pub fn parse_member_key(k: &[u8]) -> Option<u64> {
    u64::from_str_radix(std::str::from_utf8(k).ok()?, 16).ok()
}

/// The `authEnabled` value (etcd `authEnabled` / `authDisabled`).
pub fn auth_enabled_value(enabled: bool) -> [u8; 1] {
    [u8::from(enabled)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rev_keys_are_etcds_17_bytes_plus_mark() {
        let k = rev_key(Revision::new(0x0102, 3), false);
        assert_eq!(k, [0, 0, 0, 0, 0, 0, 1, 2, b'_', 0, 0, 0, 0, 0, 0, 0, 3]);
        assert_eq!(parse_rev_key(&k), Some((Revision::new(0x0102, 3), false)));
        let t = rev_key(Revision::new(9, 0), true);
        assert_eq!((t.len(), t[17]), (18, b't'));
        assert_eq!(parse_rev_key(&t), Some((Revision::new(9, 0), true)));
        assert_eq!(parse_rev_key(&k[..16]), None);
        let mut bad = k.clone();
        bad[8] = b'-';
        assert_eq!(parse_rev_key(&bad), None);
        let mut mark = t.clone();
        mark[17] = b'x';
        assert_eq!(parse_rev_key(&mark), None);
    }

    #[test]
    fn small_values_encode_as_etcd_does() {
        assert_eq!(compact_rev_value(5), rev_key(Revision::new(5, 0), false));
        assert_eq!(parse_compact_rev(&compact_rev_value(5)), Some(5));
        assert_eq!(parse_compact_rev(&[0; 8]), None);
        assert_eq!(member_key(0x8e9e05c52164694d), b"8e9e05c52164694d");
        assert_eq!(
            parse_member_key(b"8e9e05c52164694d"),
            Some(0x8e9e05c52164694d)
        );
        assert_eq!(parse_member_key(b"xyz"), None);
        assert_eq!(
            lease_key(0x390da2310d683b07),
            [0x39, 0x0d, 0xa2, 0x31, 0x0d, 0x68, 0x3b, 0x07]
        );
        assert_eq!(parse_u64(&7u64.to_be_bytes()), Some(7));
        assert_eq!(parse_u64(&[1, 2]), None);
        assert_eq!(auth_enabled_value(true), [1]);
        assert_eq!(auth_enabled_value(false), [0]);
    }
}
