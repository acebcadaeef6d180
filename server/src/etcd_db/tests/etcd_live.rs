//! Against a real etcd 3.4.23 server (Debian's `etcd-server`), both ways:
//! - an etcd snapshot reads back with exactly the keys, revisions, versions and leases etcd
//!   serves;
//! - a Keel-written snapshot, restored with `etcdctl snapshot restore`, is served by etcd
//!   with the same values, revisions, versions and leases.
//!
//! They need `etcd` and `etcdctl` on `PATH` (or `ETCD_BIN` / `ETCDCTL_BIN`): `apt-get
//! install -y etcd-server etcd-client`. Without `etcd` they print why and pass, unless
//! `KEEL_REQUIRE_ETCD=1` is set (then a missing binary fails the test). etcd listens on
//! 127.0.0.1 only, on free ports, in a temporary data dir, and is killed when the test ends.
//!
//! `KEEL_ETCD_FIXTURE_OUT=<file>` makes the first test save its snapshot there: that is how
//! `testdata/etcd-3.4.23.snapshot.db` (read by `fixture.rs`) was made.

use std::collections::BTreeMap;

use keel_proto::mvccpb::KeyValue;
use keel_testkit::etcd::{Etcd, etcd_binary as binaries, etcdctl_restore, served};
use keel_testkit::etcdctl::{etcdctl, etcdctl_stdin};
use keel_testkit::{b64, ports};

use super::super::{EtcdDb, HashCheck, MvccRecord};
use super::{LEASE_ID, sample, write_snapshot};

/// The live keys of a record history: each key's latest put, unless deleted after it.
fn replay(records: &[MvccRecord]) -> BTreeMap<Vec<u8>, KeyValue> {
    let mut live = BTreeMap::new();
    for r in records {
        let kv = r.decode().unwrap();
        if r.tombstone {
            live.remove(&kv.key);
        } else {
            live.insert(kv.key.clone(), kv);
        }
    }
    live
}

/// What `etcd` serves ([`served`] on its endpoint).
fn served_by(etcd: &Etcd, auth: &[&str]) -> (i64, Vec<String>) {
    served(&etcd.endpoint, auth)
}

fn describe_kv(kv: &KeyValue) -> String {
    format!(
        "{} = {} create={} mod={} ver={} lease={}",
        b64::encode(&kv.key),
        if kv.value.is_empty() {
            String::new()
        } else {
            b64::encode(&kv.value)
        },
        kv.create_revision,
        kv.mod_revision,
        kv.version,
        kv.lease,
    )
}

/// The history the fixture was made with (see `fixture.rs`). Returns the lease ID.
fn make_history(etcd: &Etcd) -> i64 {
    etcd.ctl(&["put", "foo", "bar"]); // 2
    etcd.ctl(&["put", "foo", "bar2"]); // 3
    let grant = etcd.ctl(&["lease", "grant", "3600", "-w", "json"]).json();
    let lease = grant["ID"].as_i64().unwrap();
    etcd.ctl(&["put", "--lease", &format!("{lease:x}"), "leased", "v"]); // 4
    etcd.ctl(&["del", "foo"]); // 5
    etcd.ctl(&["put", "a", "1"]); // 6
    // One revision, two changes: subs 0 and 1. (Interactive form: compares, success ops,
    // failure ops, each ended by an empty line.)
    let txn = etcdctl_stdin(&etcd.endpoint, &["txn"], "\nput x1 one\nput x2 two\n\n\n");
    txn.ok();
    etcd.ctl(&["put", "big", &"b".repeat(5000)]); // 8: overflow page
    etcd.ctl(&["compact", "4"]);
    etcd.ctl(&["put", "a", "2"]); // 9
    etcd.ctl(&["put", "x1", "uno"]); // 10
    etcd.ctl(&["user", "add", "root:rootpw"]);
    etcd.ctl(&["user", "add", "alice:alicepw"]);
    etcd.ctl(&["role", "add", "reader"]);
    etcd.ctl(&["role", "grant-permission", "reader", "read", "/x", "/y"]);
    etcd.ctl(&["user", "grant-role", "alice", "reader"]);
    etcd.ctl(&["user", "grant-role", "root", "root"]);
    lease
}

#[test]
fn an_etcd_snapshot_reads_back_as_etcd_serves_it() {
    let Some(bin) = binaries("an_etcd_snapshot_reads_back_as_etcd_serves_it") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(&bin, &dir.path().join("e1"), "e1", ports::free_port());
    let lease = make_history(&etcd);
    let (rev, kvs) = served_by(&etcd, &[]);
    assert_eq!(rev, 10);
    let leases = etcd.ctl(&["lease", "list", "-w", "json"]).json();
    let status = etcd.ctl(&["endpoint", "status", "-w", "json"]).json();
    let version = status[0]["Status"]["version"].as_str().unwrap().to_string();
    etcd.ctl(&["auth", "enable"]);
    let snap = dir.path().join("snap.db");
    etcd.ctl(&[
        "--user",
        "root:rootpw",
        "snapshot",
        "save",
        snap.to_str().unwrap(),
    ]);
    if let Some(out) = std::env::var_os("KEEL_ETCD_FIXTURE_OUT") {
        std::fs::copy(&snap, out).unwrap();
    }

    let db = EtcdDb::open(&snap, HashCheck::Verify).unwrap();
    let records: Vec<MvccRecord> = db.records().unwrap().map(Result::unwrap).collect();
    let live: Vec<String> = replay(&records).values().map(describe_kv).collect();
    assert_eq!(live, kvs);
    assert_eq!(records.last().unwrap().rev.main, rev);
    // Compaction at 4 dropped what it superseded: foo@2 (overwritten at 3).
    assert!(records.iter().all(|r| r.rev.main != 2));
    let meta = db.meta().unwrap();
    assert_eq!(
        (meta.scheduled_compact_rev, meta.finished_compact_rev),
        (Some(4), Some(4))
    );
    assert!(meta.consistent_index > 10, "{meta:?}");
    let members = db.members().unwrap();
    if version.starts_with("3.4.") {
        // 3.4 keeps neither the term nor the raft configuration in the database.
        assert_eq!((meta.term, &meta.conf_state), (0, &None), "{version}");
    } else {
        assert!(meta.term > 0, "{version}: {meta:?}");
        let voters = meta.conf_state.as_ref().map(|c| c.voters.clone());
        assert_eq!(voters, Some(vec![members.members[0].id]), "{version}");
    }
    let got: Vec<_> = db.leases().unwrap().map(Result::unwrap).collect();
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].id, got[0].ttl), (lease, 3600));
    assert_eq!(leases["leases"][0]["id"].as_i64(), Some(lease));
    let users: Vec<String> = db
        .users()
        .unwrap()
        .iter()
        .map(|u| format!("{} {:?}", u.name.escape_ascii(), u.roles))
        .collect();
    assert_eq!(users, ["alice [\"reader\"]", "root [\"root\"]"]);
    // etcd 3.4 grants the root role without storing it.
    let roles = db.roles().unwrap();
    assert_eq!(roles.len(), 1);
    assert_eq!(roles[0].name, b"reader");
    assert_eq!(roles[0].key_permission[0].key, b"/x");
    let auth = db.auth_meta().unwrap();
    assert!(auth.enabled && auth.revision > 1, "{auth:?}");
    assert_eq!(members.members.len(), 1);
    assert_eq!(members.members[0].name, "e1");
    let status = etcdctl(
        &etcd.endpoint,
        &["snapshot", "status", snap.to_str().unwrap(), "-w", "json"],
    )
    .json();
    let ours = serde_json::to_value(db.status().unwrap()).unwrap();
    assert_eq!(ours, status);
}

#[test]
fn a_keel_snapshot_restored_with_etcdctl_is_served_by_etcd() {
    let Some(bin) = binaries("a_keel_snapshot_restored_with_etcdctl_is_served_by_etcd") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut c = sample();
    // An active NOSPACE alarm would only make etcd refuse puts; keep the restored member
    // writable.
    c.alarms.clear();
    let snap = write_snapshot(&c, dir.path());
    let data = dir.path().join("restored");
    let peer_port = ports::free_port();
    etcdctl_restore(&snap, &data, "r1", &format!("http://127.0.0.1:{peer_port}"));
    let etcd = Etcd::start(&bin, &data, "r1", peer_port);
    let (rev, kvs) = served_by(&etcd, &[]);
    let expected: Vec<String> = replay(&c.records).values().map(describe_kv).collect();
    assert_eq!(kvs, expected);
    assert_eq!(rev, c.records.last().unwrap().rev.main);
    // The compaction survived: revision 3 is gone, revision 4 is readable.
    etcdctl(&etcd.endpoint, &["get", "foo", "--rev=3"])
        .fails_with("Error: etcdserver: mvcc: required revision has been compacted");
    let at4 = etcd.ctl(&["get", "foo", "--rev=4", "-w", "json"]).json();
    assert_eq!(at4["kvs"][0]["version"].as_i64(), Some(2));
    // The lease and its key.
    let ttl = etcd
        .ctl(&[
            "lease",
            "timetolive",
            &format!("{LEASE_ID:x}"),
            "--keys",
            "-w",
            "json",
        ])
        .json();
    assert_eq!(ttl["granted-ttl"].as_i64(), Some(3600));
    assert_eq!(
        ttl["keys"][0].as_str(),
        Some(b64::encode("lease/a").as_str())
    );
    // Users and roles.
    assert_eq!(etcd.ctl(&["user", "list"]).lines(), ["alice"]);
    let role = etcd.ctl(&["role", "get", "reader"]).stdout.clone();
    assert!(role.contains("[/x, /y)"), "{role}");
    // Writes go on from the restored revision.
    etcd.ctl(&["put", "after", "restore"]);
    let (rev2, _) = served_by(&etcd, &[]);
    assert_eq!(rev2, rev + 1);
}
