//! Data dirs written by earlier Keel releases open with their data intact (issue 16 part 7,
//! docs/upgrades.md "Fixtures"). Each release adds `server/tests/fixtures/v<version>.tar.gz`
//! (written by `scripts/make-fixtures.sh <commit> <version>`) and a test here; none is ever
//! removed.
//!
//! v0.1.0 (commit 0fddff7), one member `fixture`, `--snapshot-count 20`, written through
//! etcdctl: `k01`..`k30` = `v01`..`v30` (revisions 2..31), `multi` = `one` then `two` (32, 33),
//! `k01` deleted (34), a lease of TTL 100000 s with key `leased` = `yes` (35), compaction at
//! revision 10, `late01`..`late10` = `x01`..`x10` (36..45); stopped with SIGTERM. The data dir
//! holds a snapshot file (`member/snap/…-0000000000000027.snap`) and the WAL after it.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use keel_proto::etcdserverpb::RangeRequest;
use keel_server::apply::Applier;
use keel_server::backend::Backend;
use keel_server::membership::Attributes;
use keel_server::mvcc::MvccStore;
use keel_server::raft::snapshot;
use keel_server::version::{StorageCheck, Version, check_and_migrate, server_version};

/// The lease of the v0.1.0 fixture (etcdctl printed `5137a23236dade01`).
const V010_LEASE: i64 = 0x5137a23236dade01;

/// Unpacks `fixtures/<name>.tar.gz` into a fresh temp dir; returns it and the data dir.
fn unpack(name: &str) -> (tempfile::TempDir, PathBuf) {
    let archive = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(format!("{name}.tar.gz"));
    let dir = tempfile::tempdir().expect("temp dir");
    let out = std::process::Command::new("tar")
        .arg("-xzf")
        .arg(&archive)
        .arg("-C")
        .arg(dir.path())
        .output()
        .expect("run tar");
    assert!(out.status.success(), "tar: {out:?}");
    let data = dir.path().join("data");
    (dir, data)
}

/// Every key and value at the current revision, in key order.
fn all_kvs(store: &MvccStore) -> Vec<(String, String, i64)> {
    let all = store
        .range(&RangeRequest {
            key: vec![0],
            range_end: vec![0],
            ..Default::default()
        })
        .expect("range");
    all.kvs
        .iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(&kv.key).into_owned(),
                String::from_utf8_lossy(&kv.value).into_owned(),
                kv.mod_revision,
            )
        })
        .collect()
}

#[test]
fn v0_1_0_data_dir_opens_with_its_data_after_one_migration() {
    let (_dir, data) = unpack("v0.1.0");
    let member = data.join("member");
    let backend = Backend::open(&member.join("db")).expect("open the 0.1.0 store");
    let local = backend.local().unwrap();
    assert_eq!(
        check_and_migrate(&local, backend.tree(), server_version()).unwrap(),
        StorageCheck::Migrated(Version::MIN),
        "a 0.1.0 dir has no storage version and is migrated forward"
    );
    assert_eq!(
        check_and_migrate(&local, backend.tree(), server_version()).unwrap(),
        StorageCheck::Current
    );

    let store = Arc::new(MvccStore::open(backend.tree().clone()).expect("mvcc"));
    let applier = Applier::open(
        backend.tree().clone(),
        store.clone(),
        Arc::new(Attributes::default()),
    )
    .expect("the whole applied state loads");
    assert_eq!(store.current_revision(), 45);
    assert_eq!(store.compact_revision(), 10);
    let mut want: Vec<(String, String, i64)> = (2..=30)
        .map(|i| (format!("k{i:02}"), format!("v{i:02}"), i as i64 + 1))
        .collect();
    want.push(("leased".into(), "yes".into(), 35));
    want.push(("multi".into(), "two".into(), 33));
    want.extend((1..=10).map(|i| (format!("late{i:02}"), format!("x{i:02}"), 35 + i as i64)));
    want.sort();
    assert_eq!(all_kvs(&store), want);
    // History above the compaction is kept, below it is gone.
    let at = |rev: i64, key: &str| {
        store.range(&RangeRequest {
            key: key.as_bytes().to_vec(),
            revision: rev,
            ..Default::default()
        })
    };
    assert_eq!(at(32, "multi").unwrap().kvs[0].value, b"one");
    assert_eq!(at(33, "k01").unwrap().kvs[0].value, b"v01");
    assert!(at(9, "k01").is_err(), "revision 9 is compacted");
    // The lease and its key.
    let lease = applier.lessor().info(V010_LEASE, true).expect("the lease");
    assert_eq!((lease.ttl, lease.keys), (100000, vec![b"leased".to_vec()]));
    assert_eq!(applier.lessor().ids(), [V010_LEASE]);
    // Nothing 0.2-only is set: the cluster version is undecided (0.1).
    assert_eq!(applier.cluster_version().decided(), None);
    assert_eq!(applier.last_applied().map(|l| l.index), Some(48));
}

#[test]
fn v0_1_0_snapshot_file_verifies_and_holds_the_store_at_its_index() {
    let (_dir, data) = unpack("v0.1.0");
    let snap_dir = data.join("member/snap");
    let path = snapshot::latest(&snap_dir)
        .unwrap()
        .expect("a snapshot file");
    let mut file = File::open(&path).unwrap();
    let meta = snapshot::verify(&mut file).expect("CRC and format of a 0.1.0 snapshot");
    assert_eq!(meta.last_log_id.map(|l| l.index), Some(0x27));
    let mut keys = 0;
    let mut file = File::open(&path).unwrap();
    snapshot::read_records(&mut file, |k, _| {
        if k.first() == Some(&b'k') {
            keys += 1;
        }
        Ok(())
    })
    .unwrap();
    assert!(keys > 20, "the snapshot carries the MVCC records ({keys})");
}
