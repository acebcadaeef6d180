//! The values an etcd database holds, as plain Rust types.
//!
//! Protobuf values use the proto crate's types (`mvccpb::KeyValue`, `leasepb::Lease`,
//! `authpb::User`/`Role`, `etcdserverpb::AlarmMember`); JSON values (members, `confState`,
//! `downgrade`) are serde types whose field names, order and omissions follow the Go structs,
//! so that the bytes written equal what etcd's `json.Marshal` writes.

use keel_proto::mvccpb::KeyValue;
use prost::Message;
use serde::{Deserialize, Deserializer, Serialize};

use super::schema::{self, parse_rev_key};
use super::{EtcdDbError, Result};
use crate::mvcc::Revision;
use crate::mvcc::revision::{parse_record_key, record_key};

/// One entry of the `key` bucket: a revision and its `mvccpb.KeyValue` bytes, kept encoded
/// so that they are copied byte for byte between Keel's store and etcd's file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MvccRecord {
    /// The revision of the change.
    pub rev: Revision,
    /// Whether the change is a delete (the key carries etcd's `t` mark).
    pub tombstone: bool,
    /// `mvccpb.KeyValue` bytes: all fields of a put, only `key` for a tombstone.
    pub value: Vec<u8>,
}

impl MvccRecord {
    /// The etcd `key` bucket key of this record (17 bytes, 18 for a tombstone).
    pub fn etcd_key(&self) -> Vec<u8> {
        schema::rev_key(self.rev, self.tombstone)
    }

    /// The record stored under etcd key `key`. Errors if `key` is not a revision key.
    pub fn from_etcd(key: &[u8], value: Vec<u8>) -> Result<MvccRecord> {
        let (rev, tombstone) = parse_rev_key(key).ok_or_else(|| EtcdDbError::Corrupt {
            bucket: schema::KEY,
            key: key.to_vec(),
            why: "not a revision key".into(),
        })?;
        Ok(MvccRecord {
            rev,
            tombstone,
            value,
        })
    }

    /// The record stored under Keel's sled record key (`k` + main + sub [+ `t`],
    /// `mvcc::revision`); the value bytes are the same in both stores.
    pub fn from_keel(key: &[u8], value: Vec<u8>) -> Result<MvccRecord> {
        let (rev, tombstone) = parse_record_key(key).ok_or_else(|| EtcdDbError::Corrupt {
            bucket: schema::KEY,
            key: key.to_vec(),
            why: "not a Keel record key".into(),
        })?;
        Ok(MvccRecord {
            rev,
            tombstone,
            value,
        })
    }

    /// Keel's sled record key of this record.
    pub fn keel_key(&self) -> Vec<u8> {
        record_key(self.rev, self.tombstone)
    }

    /// Decodes the value. Errors on malformed protobuf, an empty key, or a put whose
    /// `mod_revision` differs from the record's revision (etcd writes them equal).
    pub fn decode(&self) -> Result<KeyValue> {
        let bad = |why: String| EtcdDbError::Corrupt {
            bucket: schema::KEY,
            key: self.etcd_key(),
            why,
        };
        let kv = KeyValue::decode(self.value.as_slice()).map_err(|e| bad(e.to_string()))?;
        if kv.key.is_empty() {
            return Err(bad("empty key".into()));
        }
        if !self.tombstone && kv.mod_revision != self.rev.main {
            return Err(bad(format!(
                "mod_revision {} differs from the record revision",
                kv.mod_revision
            )));
        }
        Ok(kv)
    }
}

/// The `meta` bucket. A zero index or term means "absent": etcd never writes 0
/// (`unsafeUpdateConsistentIndex`) and reads an absent key as 0.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Meta {
    /// `consistent_index`: the last applied raft index.
    pub consistent_index: u64,
    /// `term` (3.5+): the term of that entry.
    pub term: u64,
    /// `confState` (3.5+): the raft configuration at that entry.
    pub conf_state: Option<ConfState>,
    /// `scheduledCompactRev`: the revision of the last requested compaction.
    pub scheduled_compact_rev: Option<i64>,
    /// `finishedCompactRev`: the revision of the last finished compaction.
    pub finished_compact_rev: Option<i64>,
    /// `storageVersion` (3.6+), e.g. `3.6`. 3.5 files have none; 3.6 then infers 3.5 from
    /// `term` (`schema.UnsafeDetectSchemaVersion`).
    pub storage_version: Option<String>,
}

impl Meta {
    /// The compact revision etcd restores (`finishedCompactRev`, `store.restore`), 0 if none.
    pub fn compact_revision(&self) -> i64 {
        self.finished_compact_rev.unwrap_or(0)
    }
}

/// Declares [`ConfState`] with its node-ID lists, which etcd's JSON encodes alike: omitted
/// when empty, `null` read as empty.
macro_rules! conf_state {
    ($($(#[doc = $doc:literal])* $list:ident,)*) => {
        /// `raftpb.ConfState` as etcd stores it in `meta/confState`: Go's JSON of the gogo
        /// struct (lists omitted when empty, `auto_leave` always present).
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
        pub struct ConfState {
            $(
                $(#[doc = $doc])*
                #[serde(
                    default,
                    skip_serializing_if = "Vec::is_empty",
                    deserialize_with = "null_default"
                )]
                pub $list: Vec<u64>,
            )*
            /// Whether the joint configuration is left automatically.
            #[serde(default)]
            pub auto_leave: bool,
        }
    };
}

conf_state! {
    /// Voters of the incoming configuration.
    voters,
    /// Learners of the incoming configuration.
    learners,
    /// Voters of the outgoing configuration (joint consensus).
    voters_outgoing,
    /// Nodes that become learners when the outgoing configuration is left.
    learners_next,
}

/// A member as etcd stores it in the `members` bucket: Go's JSON of
/// `membership.Member{ID, RaftAttributes{PeerURLs, IsLearner}, Attributes{Name, ClientURLs}}`
/// (`etcd@v3.4.23:etcdserver/api/membership/member.go`), fields in that order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Member ID (a JSON number; the bucket key is its hex form).
    #[serde(default)]
    pub id: u64,
    /// Peer URLs.
    #[serde(rename = "peerURLs", default, deserialize_with = "null_default")]
    pub peer_urls: Vec<String>,
    /// Whether the member is a raft learner (omitted when false).
    #[serde(rename = "isLearner", default, skip_serializing_if = "is_false")]
    pub is_learner: bool,
    /// Member name (omitted when empty: not yet published).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Client URLs (omitted when empty).
    #[serde(
        rename = "clientURLs",
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_default"
    )]
    pub client_urls: Vec<String>,
}

/// The `members` and `members_removed` buckets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Members {
    /// Current members, in key order.
    pub members: Vec<Member>,
    /// IDs of removed members, in key order.
    pub removed: Vec<u64>,
}

/// `cluster/downgrade` (3.5+): Go's JSON of `DowngradeInfo`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DowngradeInfo {
    /// Target version; empty when no downgrade is in progress.
    #[serde(rename = "target-version", default)]
    pub target_version: String,
    /// Whether a downgrade is in progress.
    #[serde(default)]
    pub enabled: bool,
}

/// The `cluster` bucket.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cluster {
    /// `clusterVersion`, e.g. `3.4.0`.
    pub cluster_version: Option<String>,
    /// `downgrade` (3.5+).
    pub downgrade: Option<DowngradeInfo>,
}

/// The `auth` bucket.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthMeta {
    /// `authEnabled`.
    pub enabled: bool,
    /// `authRevision`: bumped by every user or role change and by AuthDisable.
    pub revision: u64,
}

/// What `etcdctl snapshot status` reports for a file (`etcd@v3.4.23:clientv3/snapshot`
/// `v3Manager.Status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// CRC-32C over every bucket name, then each of its keys and values, buckets in order.
    pub hash: u32,
    /// Main revision of the last `key` bucket entry (0 if empty).
    pub revision: i64,
    /// Number of entries in all buckets.
    pub total_key: u64,
    /// Size of the database (`tx.Size()`: high-water page × page size), in bytes.
    pub total_size: u64,
}

fn is_false(b: &bool) -> bool {
    !b
}

/// Go encodes a nil slice as `null`; read it as empty.
fn null_default<'de, D, T>(d: D) -> std::result::Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_json_is_gos() {
        let m = Member {
            id: 0x8e9e05c52164694d,
            peer_urls: vec!["http://127.0.0.1:2380".into()],
            is_learner: false,
            name: "default".into(),
            client_urls: vec!["http://127.0.0.1:2379".into()],
        };
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(
            json,
            r#"{"id":10276657743932975437,"peerURLs":["http://127.0.0.1:2380"],"name":"default","clientURLs":["http://127.0.0.1:2379"]}"#
        );
        assert_eq!(serde_json::from_str::<Member>(&json).unwrap(), m);
        let learner: Member =
            serde_json::from_str(r#"{"id":1,"peerURLs":null,"isLearner":true}"#).unwrap();
        assert_eq!((learner.id, learner.is_learner), (1, true));
        assert!(learner.peer_urls.is_empty() && learner.name.is_empty());
        assert_eq!(
            serde_json::to_string(&learner).unwrap(),
            r#"{"id":1,"peerURLs":[],"isLearner":true}"#
        );
    }

    #[test]
    fn conf_state_and_downgrade_json_are_gos() {
        let cs = ConfState {
            voters: vec![1, 2],
            ..Default::default()
        };
        let json = serde_json::to_string(&cs).unwrap();
        assert_eq!(json, r#"{"voters":[1,2],"auto_leave":false}"#);
        assert_eq!(serde_json::from_str::<ConfState>(&json).unwrap(), cs);
        let d = DowngradeInfo::default();
        assert_eq!(
            serde_json::to_string(&d).unwrap(),
            r#"{"target-version":"","enabled":false}"#
        );
    }

    #[test]
    fn records_map_between_keel_and_etcd_keys() {
        let r = MvccRecord {
            rev: Revision::new(7, 2),
            tombstone: true,
            value: vec![0x0a, 1, b'a'],
        };
        assert_eq!(
            MvccRecord::from_keel(&r.keel_key(), r.value.clone()).unwrap(),
            r
        );
        assert_eq!(
            MvccRecord::from_etcd(&r.etcd_key(), r.value.clone()).unwrap(),
            r
        );
        assert!(MvccRecord::from_etcd(&r.keel_key(), vec![]).is_err());
        assert!(MvccRecord::from_keel(&r.etcd_key(), vec![]).is_err());
        assert_eq!(r.decode().unwrap().key, b"a");
    }

    #[test]
    fn decode_rejects_what_etcd_never_writes() {
        let kv = KeyValue {
            key: b"k".to_vec(),
            mod_revision: 3,
            ..Default::default()
        };
        let put = |main| MvccRecord {
            rev: Revision::new(main, 0),
            tombstone: false,
            value: kv.encode_to_vec(),
        };
        assert_eq!(put(3).decode().unwrap(), kv);
        assert!(put(4).decode().is_err());
        let garbage = MvccRecord {
            value: vec![0x0f],
            ..put(3)
        };
        assert!(garbage.decode().is_err());
    }
}
