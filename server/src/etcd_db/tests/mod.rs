//! Tests of the etcd database codec: round trips (`roundtrip`), a real etcd 3.4.23 snapshot
//! checked in as a fixture (`fixture`), and files checked by etcd's own tools
//! (`etcd_tools`: etcdctl 3.4.23; `etcd_live`: a real etcd 3.4.23 server).

mod etcd_live;
mod etcd_tools;
mod fixture;
mod roundtrip;

use std::path::Path;

use keel_proto::authpb::{Permission, Role, User, permission};
use keel_proto::etcdserverpb::{AlarmMember, AlarmType};
use keel_proto::leasepb::Lease;
use keel_proto::mvccpb::KeyValue;
use prost::Message;

use super::model::{AuthMeta, Cluster, ConfState, Member, Meta, MvccRecord};
use super::writer::{DbWriter, Written};
use crate::mvcc::Revision;

/// Everything a database holds, in memory, for tests.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Contents {
    pub records: Vec<MvccRecord>,
    pub leases: Vec<Lease>,
    pub members: Vec<Member>,
    pub removed: Vec<u64>,
    pub cluster: Cluster,
    pub alarms: Vec<AlarmMember>,
    pub auth: AuthMeta,
    pub users: Vec<User>,
    pub roles: Vec<Role>,
    pub meta: Meta,
}

/// A lease that the sample's keys `lease/*` are attached to.
pub(super) const LEASE_ID: i64 = 0x694d_7a1c_3e2f_0001;

/// Builds MVCC history the way etcd's apply does: one change per main revision, starting at
/// revision 2 (a fresh store is at 1).
#[derive(Default)]
pub(super) struct History {
    pub records: Vec<MvccRecord>,
    /// Live keys: key → (create, version, lease).
    live: std::collections::BTreeMap<Vec<u8>, (i64, i64, i64)>,
    rev: i64,
}

impl History {
    pub fn new() -> History {
        History {
            rev: 1,
            ..Default::default()
        }
    }

    pub fn rev(&self) -> i64 {
        self.rev
    }

    pub fn put(&mut self, key: &[u8], value: &[u8], lease: i64) {
        self.rev += 1;
        let (create, version) = match self.live.get(key) {
            Some(&(c, v, _)) => (c, v + 1),
            None => (self.rev, 1),
        };
        self.live.insert(key.to_vec(), (create, version, lease));
        let kv = KeyValue {
            key: key.to_vec(),
            create_revision: create,
            mod_revision: self.rev,
            version,
            value: value.to_vec(),
            lease,
        };
        self.records.push(MvccRecord {
            rev: Revision::new(self.rev, 0),
            tombstone: false,
            value: kv.encode_to_vec(),
        });
    }

    pub fn delete(&mut self, key: &[u8]) {
        assert!(self.live.remove(key).is_some(), "delete of a missing key");
        self.rev += 1;
        let kv = KeyValue {
            key: key.to_vec(),
            ..Default::default()
        };
        self.records.push(MvccRecord {
            rev: Revision::new(self.rev, 0),
            tombstone: true,
            value: kv.encode_to_vec(),
        });
    }
}

/// A small store with every kind of value: updates, deletes, a leased key, a compaction,
/// two members (one learner), a removed member, auth data and an alarm.
pub(super) fn sample() -> Contents {
    let mut h = History::new();
    h.put(b"foo", b"bar", 0); // 2
    h.put(b"foo", b"bar2", 0); // 3
    h.put(b"lease/a", b"held", LEASE_ID); // 4
    h.delete(b"foo"); // 5
    h.put(b"a", b"1", 0); // 6
    h.put(b"b", &[0xffu8; 5000], 0); // 7: a value larger than a page
    h.put(b"a", b"2", 0); // 8
    let role = Role {
        name: b"reader".to_vec(),
        key_permission: vec![Permission {
            perm_type: permission::Type::Read as i32,
            key: b"/x".to_vec(),
            range_end: b"/y".to_vec(),
        }],
    };
    let user = User {
        name: b"alice".to_vec(),
        password: b"$2a$10$not.a.real.hash".to_vec(),
        roles: vec!["reader".into()],
        options: None,
    };
    Contents {
        records: h.records,
        leases: vec![Lease {
            id: LEASE_ID,
            ttl: 3600,
            remaining_ttl: 0,
        }],
        members: vec![
            Member {
                id: 0x8e9e_05c5_2164_694d,
                peer_urls: vec!["http://127.0.0.1:2380".into()],
                is_learner: false,
                name: "m1".into(),
                client_urls: vec!["http://127.0.0.1:2379".into()],
            },
            Member {
                id: 0x91bc_3c39_8fb3_c146,
                peer_urls: vec!["http://127.0.0.1:2480".into()],
                is_learner: true,
                name: String::new(),
                client_urls: vec![],
            },
        ],
        removed: vec![0xfd42_2379_fda5_0e48],
        cluster: Cluster {
            cluster_version: Some("3.4.0".into()),
            downgrade: None,
        },
        alarms: vec![AlarmMember {
            member_id: 0x8e9e_05c5_2164_694d,
            alarm: AlarmType::Nospace as i32,
        }],
        auth: AuthMeta {
            enabled: false,
            revision: 3,
        },
        users: vec![user],
        roles: vec![role],
        meta: Meta {
            consistent_index: 42,
            term: 3,
            conf_state: Some(ConfState {
                voters: vec![0x8e9e_05c5_2164_694d],
                learners: vec![0x91bc_3c39_8fb3_c146],
                ..Default::default()
            }),
            scheduled_compact_rev: Some(4),
            finished_compact_rev: Some(4),
            storage_version: None,
        },
    }
}

/// Writes `c` to `path` through [`DbWriter`].
pub(super) fn write(c: &Contents, path: &Path) -> Written {
    let mut w = DbWriter::create(path).unwrap();
    let records = c.records.iter().cloned().map(Ok::<_, std::io::Error>);
    assert_eq!(w.put_records(records).unwrap(), c.records.len() as u64);
    assert_eq!(
        w.put_leases(c.leases.iter().cloned()).unwrap(),
        c.leases.len() as u64
    );
    w.put_members(&c.members, &c.removed).unwrap();
    w.put_cluster(&c.cluster).unwrap();
    w.put_alarms(&c.alarms).unwrap();
    w.put_auth(&c.auth, c.users.iter().cloned(), c.roles.iter().cloned())
        .unwrap();
    w.finish(&c.meta).unwrap()
}

/// Reads everything back from `db`.
pub(super) fn read(db: &super::EtcdDb) -> Contents {
    let members = db.members().unwrap();
    Contents {
        records: db.records().unwrap().map(Result::unwrap).collect(),
        leases: db.leases().unwrap().map(Result::unwrap).collect(),
        members: members.members,
        removed: members.removed,
        cluster: db.cluster().unwrap(),
        alarms: db.alarms().unwrap(),
        auth: db.auth_meta().unwrap(),
        users: db.users().unwrap(),
        roles: db.roles().unwrap(),
        meta: db.meta().unwrap(),
    }
}

/// One line per record: `main_sub[t] key=.. value=.. create=.. mod=.. ver=.. lease=..`.
pub(super) fn describe(records: &[MvccRecord]) -> Vec<String> {
    records
        .iter()
        .map(|r| {
            let kv = r.decode().unwrap();
            format!(
                "{}{} key={} value={} create={} mod={} ver={} lease={:x}",
                r.rev,
                if r.tombstone { "t" } else { "" },
                kv.key.escape_ascii(),
                if kv.value.len() > 16 {
                    format!("<{} bytes>", kv.value.len())
                } else {
                    kv.value.escape_ascii().to_string()
                },
                kv.create_revision,
                kv.mod_revision,
                kv.version,
                kv.lease
            )
        })
        .collect()
}

/// Writes `c` as a snapshot file (database + sha256, as `etcdctl snapshot save` stores it)
/// at `dir/keel.snapshot`, through the `Maintenance.Snapshot` framing.
pub(super) fn write_snapshot(c: &Contents, dir: &Path) -> std::path::PathBuf {
    let db = dir.join("keel.db");
    write(c, &db);
    let snap = dir.join("keel.snapshot");
    let stream = super::snapshot::SnapshotStream::open(&db).unwrap();
    super::snapshot::save_stream(stream, &snap).unwrap();
    snap
}

pub(super) use keel_testkit::etcd::{etcdctl_restore, have_programs};
