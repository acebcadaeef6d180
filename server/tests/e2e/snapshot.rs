//! `Maintenance.Snapshot` of a real `keel` member is an etcd snapshot (issue 15 part 2):
//! `etcdctl snapshot save` and `snapshot status` work on it, and `etcdctl snapshot restore`
//! (3.4.23) and, with `ETCDUTL_BIN` set, `etcdutl snapshot restore` (3.5.1) turn it into an
//! etcd data dir that etcd serves with every key, value, create/mod revision, version and
//! lease of the snapshot's revision, taken while writes go on.
//!
//! Needs `etcd` and `etcdctl` (Debian's `etcd-server`, `etcd-client`); skips without them
//! unless `KEEL_REQUIRE_ETCD=1`.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use keel_testkit::etcd::{Etcd, etcd_binary, etcdctl_restore, find_program, served};
use keel_testkit::etcdctl::{etcdctl, etcdctl_stdin};
use keel_testkit::{b64, grpc, ports};

use crate::member;

/// A history with overwrites, a lease, a delete, a two-change txn, an overflow-page value
/// and a compaction; returns the lease ID.
fn make_history(ep: &str) -> i64 {
    let ctl = |args: &[&str]| etcdctl(ep, args).ok().clone();
    ctl(&["put", "foo", "bar"]);
    ctl(&["put", "foo", "bar2"]);
    let lease = ctl(&["lease", "grant", "3600", "-w", "json"]).json()["ID"]
        .as_i64()
        .unwrap();
    ctl(&["put", "--lease", &format!("{lease:x}"), "leased", "v"]);
    ctl(&["del", "foo"]);
    etcdctl_stdin(ep, &["txn"], "\nput x1 one\nput x2 two\n\n\n").ok();
    ctl(&["put", "big", &"b".repeat(5000)]);
    ctl(&["compaction", "4"]);
    ctl(&["put", "x1", "uno"]);
    lease
}

/// Saves a snapshot of `ep` with `etcdctl snapshot save` while another thread keeps
/// writing; returns the snapshot's revision (from `etcdctl snapshot status`).
fn save_while_writing(ep: &str, snap: &Path) -> i64 {
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (ep, stop) = (ep.to_string(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) && n < 500 {
                etcdctl(&ep, &["put", &format!("bg/{n:03}"), "x"]).ok();
                n += 1;
            }
            n
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let saved = etcdctl(ep, &["snapshot", "save", snap.to_str().unwrap()]);
    assert_eq!(
        saved.ok().lines(),
        [format!("Snapshot saved at {}", snap.display())]
    );
    stop.store(true, Ordering::Relaxed);
    let written = writer.join().unwrap();
    assert!(written > 0, "no write ran next to the snapshot");
    let status = etcdctl(
        ep,
        &["snapshot", "status", snap.to_str().unwrap(), "-w", "json"],
    );
    let status = status.json();
    assert!(status["totalKey"].as_u64().unwrap() > 8, "{status}");
    status["revision"].as_i64().unwrap()
}

/// etcd on the restored `data` serves exactly what Keel served at `rev`.
fn assert_etcd_serves(
    bin: &Path,
    data: &Path,
    name: &str,
    peer_port: u16,
    keel: &str,
    rev: i64,
    lease: i64,
) {
    let etcd = Etcd::start(bin, data, name, peer_port);
    let (_, want) = served(keel, &[&format!("--rev={rev}")]);
    let (got_rev, got) = served(&etcd.endpoint, &[]);
    assert_eq!(got, want);
    assert_eq!(got_rev, rev, "etcd resumes at the snapshot's revision");
    assert!(
        want.iter().any(|k| k.starts_with(&b64::encode("bg/"))),
        "{want:?}"
    );
    etcdctl(&etcd.endpoint, &["get", "foo", "--rev=3"])
        .fails_with("Error: etcdserver: mvcc: required revision has been compacted");
    let ttl = etcd
        .ctl(&[
            "lease",
            "timetolive",
            &format!("{lease:x}"),
            "--keys",
            "-w",
            "json",
        ])
        .json();
    assert_eq!(ttl["granted-ttl"].as_i64(), Some(3600), "{ttl}");
    assert_eq!(
        ttl["keys"][0].as_str(),
        Some(b64::encode("leased").as_str())
    );
    etcd.ctl(&["put", "after", "restore"]);
    assert_eq!(served(&etcd.endpoint, &[]).0, rev + 1);
}

#[test]
fn a_keel_snapshot_taken_during_writes_restores_into_etcd() {
    let test = "a_keel_snapshot_taken_during_writes_restores_into_etcd";
    let Some(etcd) = etcd_binary(test) else {
        return;
    };
    let (_guard, keel) = member(&[]);
    let ep = keel.endpoint();
    let lease = make_history(&ep);
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("keel.snapshot");
    let rev = save_while_writing(&ep, &snap);
    // The temp file is gone once the stream ended.
    let tmp = keel.data_dir().join("member").join("tmp");
    assert_eq!(std::fs::read_dir(&tmp).unwrap().count(), 0);

    // etcdctl 3.4.23 restore, etcd 3.4.23 serves it.
    let data = dir.path().join("r1");
    let peer_port = ports::free_port();
    etcdctl_restore(&snap, &data, "r1", &format!("http://127.0.0.1:{peer_port}"));
    assert_etcd_serves(&etcd, &data, "r1", peer_port, &ep, rev, lease);

    // etcdutl 3.5.1 (if given) restores it too.
    let Some(etcdutl) = find_program("etcdutl", "ETCDUTL_BIN") else {
        eprintln!("SKIPPED {test} (etcdutl part): set ETCDUTL_BIN to etcdutl 3.5.1");
        return;
    };
    let data = dir.path().join("r2");
    let peer_port = ports::free_port();
    let peer = format!("http://127.0.0.1:{peer_port}");
    let out = std::process::Command::new(etcdutl)
        .args(["snapshot", "restore", snap.to_str().unwrap()])
        .arg(format!("--data-dir={}", data.display()))
        .args(["--name=r2", &format!("--initial-cluster=r2={peer}")])
        .arg(format!("--initial-advertise-peer-urls={peer}"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let etcd35 = find_program("etcd", "ETCD35_BIN").unwrap_or(etcd);
    assert_etcd_serves(&etcd35, &data, "r2", peer_port, &ep, rev, lease);
}

#[test]
fn a_member_killed_while_streaming_a_snapshot_restarts_with_every_write_and_no_temp_file() {
    let (_guard, mut keel) = member(&[]);
    let ep = keel.endpoint();
    let put_ep = ep.clone();
    grpc::block_on_thread(async move {
        let mut kv = grpc::kv(&put_ep).await;
        for i in 0..64 {
            grpc::put(&mut kv, &format!("big/{i:02}"), vec![b'v'; 256 << 10]).await;
        }
    })
    .unwrap();
    let tmp = keel.data_dir().join("member").join("tmp");
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("cut.snapshot");
    let saver = {
        let (ep, snap) = (ep.clone(), snap.clone());
        std::thread::spawn(move || etcdctl(&ep, &["snapshot", "save", snap.to_str().unwrap()]))
    };
    // SIGKILL once the export file exists (the snapshot is being written or streamed).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::fs::read_dir(&tmp).map_or(0, |d| d.count()) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no snapshot file appeared"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    keel.kill9();
    // Usually the cut stream fails; if the whole file got out first it must be valid.
    if saver.join().unwrap().code == Some(0) {
        etcdctl(&ep, &["snapshot", "status", snap.to_str().unwrap()]).ok();
    }
    keel.restart();
    assert_eq!(
        std::fs::read_dir(&tmp).unwrap().count(),
        0,
        "stale files are removed"
    );
    let count = etcdctl(
        &ep,
        &["get", "big/", "--prefix", "--keys-only", "-w", "json"],
    )
    .json();
    assert_eq!(count["count"].as_i64(), Some(64));
    etcdctl(&ep, &["snapshot", "save", snap.to_str().unwrap()]).ok();
}
