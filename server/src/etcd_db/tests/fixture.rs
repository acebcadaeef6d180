//! A snapshot saved from a real etcd 3.4.23 (`testdata/etcd-3.4.23.snapshot.db`, made by
//! `etcd_live::an_etcd_snapshot_reads_back_as_etcd_serves_it` with
//! `KEEL_ETCD_FIXTURE_OUT` set), read without any etcd binary: this pins the reader to
//! bytes written by Go's bbolt (no freelist page, etcd's page layout) in every CI run.
//!
//! History (one etcdctl command each, on a fresh member `e1`): `put foo bar` (2), `put foo
//! bar2` (3), `lease grant 3600`, `put --lease leased v` (4), `del foo` (5), `put a 1` (6),
//! a `txn` putting `x1` and `x2` (7, subs 0 and 1), `put big <5000 bytes>` (8), `compact
//! 4`, `put a 2` (9), `put x1 uno` (10); users `root` (role root) and `alice` (role
//! `reader`: read on `[/x, /y)`); `auth enable`; `snapshot save`.

use super::super::{AuthMeta, Cluster, EtcdDb, HashCheck, Meta};
use super::{Contents, describe, read, write};

use std::path::PathBuf;

/// The fixture file.
pub(super) fn path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/etcd_db/testdata/etcd-3.4.23.snapshot.db")
}

const LEASE: i64 = 0x45ce_a231_1a84_da08;

#[test]
fn an_etcd_snapshot_reads_with_every_revision_version_and_lease() {
    let db = EtcdDb::open(path(), HashCheck::Verify).unwrap();
    let c = read(&db);
    assert_eq!(
        describe(&c.records),
        [
            // foo@2 was removed by the compaction at 4; foo@3 was still live at 4.
            "3_0 key=foo value=bar2 create=2 mod=3 ver=2 lease=0",
            "4_0 key=leased value=v create=4 mod=4 ver=1 lease=45cea2311a84da08",
            "5_0t key=foo value= create=0 mod=0 ver=0 lease=0",
            "6_0 key=a value=1 create=6 mod=6 ver=1 lease=0",
            "7_0 key=x1 value=one create=7 mod=7 ver=1 lease=0",
            "7_1 key=x2 value=two create=7 mod=7 ver=1 lease=0",
            "8_0 key=big value=<5000 bytes> create=8 mod=8 ver=1 lease=0",
            "9_0 key=a value=2 create=6 mod=9 ver=2 lease=0",
            "10_0 key=x1 value=uno create=7 mod=10 ver=2 lease=0",
        ]
    );
    assert_eq!(c.leases.len(), 1);
    assert_eq!(
        (c.leases[0].id, c.leases[0].ttl, c.leases[0].remaining_ttl),
        (LEASE, 3600, 0)
    );
    assert_eq!(
        c.meta,
        Meta {
            consistent_index: 21,
            scheduled_compact_rev: Some(4),
            finished_compact_rev: Some(4),
            ..Default::default()
        }
    );
    assert_eq!(c.meta.compact_revision(), 4);
    assert_eq!(c.members.len(), 1);
    let m = &c.members[0];
    assert_eq!(
        (m.id, m.name.as_str(), m.is_learner),
        (0x3c76_615b_2426_45ce, "e1", false)
    );
    assert_eq!(m.peer_urls, ["http://127.0.0.1:35037"]);
    assert_eq!(m.client_urls, ["http://127.0.0.1:42661"]);
    assert!(c.removed.is_empty() && c.alarms.is_empty());
    assert_eq!(
        c.cluster,
        Cluster {
            cluster_version: Some("3.4.0".into()),
            downgrade: None
        }
    );
    assert_eq!(
        c.auth,
        AuthMeta {
            enabled: true,
            revision: 7
        }
    );
    let users: Vec<_> = c
        .users
        .iter()
        .map(|u| {
            (
                String::from_utf8_lossy(&u.name).into_owned(),
                u.roles.clone(),
            )
        })
        .collect();
    assert_eq!(
        users,
        [
            ("alice".into(), vec!["reader".to_string()]),
            ("root".into(), vec!["root".into()])
        ]
    );
    assert!(c.users.iter().all(|u| u.password.starts_with(b"$2a$10$")));
    assert_eq!(c.roles.len(), 1);
    let p = &c.roles[0].key_permission[0];
    assert_eq!((&p.key[..], &p.range_end[..]), (&b"/x"[..], &b"/y"[..]));
    let s = db.status().unwrap();
    assert_eq!(
        (s.hash, s.revision, s.total_key, s.total_size),
        (2_826_003_600, 10, 20, 49152)
    );
}

/// Everything read from etcd's file and written again by Keel gives etcd's status hash:
/// every key and value is re-encoded byte for byte as etcd wrote it (protobuf, JSON,
/// big-endian integers), and the bucket set is the same.
#[test]
fn rewriting_an_etcd_snapshot_keeps_every_byte() {
    let db = EtcdDb::open(path(), HashCheck::Verify).unwrap();
    let c: Contents = read(&db);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("rewritten.db");
    write(&c, &out);
    let again = EtcdDb::open(&out, HashCheck::Skip).unwrap();
    let (theirs, ours) = (db.status().unwrap(), again.status().unwrap());
    assert_eq!(
        (ours.hash, ours.revision, ours.total_key),
        (theirs.hash, theirs.revision, theirs.total_key)
    );
    assert_eq!(read(&again), c);
}
