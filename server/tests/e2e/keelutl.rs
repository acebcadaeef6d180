//! `keelutl snapshot restore` (issue 15 part 3), the way in: an etcd 3.4.23 snapshot (the
//! fixture, and one taken live from a real etcd) restored into a Keel data dir gives a member
//! serving the same keys with the same revisions, versions and leases; a Keel snapshot
//! restored into three data dirs (each with its own `--name`) gives a 3-member cluster that
//! elects a leader and serves the data. `keelutl snapshot status` prints what etcdctl
//! prints; `keelutl hashkv` and `keelutl defrag` work on a stopped member. A restore killed
//! with SIGKILL leaves no `member` dir (only its staging dir), and the rerun restores it all.
//!
//! The live etcd part needs `etcd` and `etcdctl` (skips without them unless
//! `KEEL_REQUIRE_ETCD=1`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use keel_testkit::etcd::{Etcd, etcd_binary, served};
use keel_testkit::etcdctl::{etcdctl, etcdctl_stdin};
use keel_testkit::process::{Output, run_bounded};
use keel_testkit::schedule::shared;
use keel_testkit::{Cluster, Member, MemberSpec, b64, ports};

use crate::{cluster, keel_bin};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/src/etcd_db/testdata/etcd-3.4.23.snapshot.db"
);

fn keelutl(args: &[&str]) -> Output {
    let mut cmd = std::process::Command::new(keel_testkit::keelutl_binary!());
    cmd.args(args);
    let out = run_bounded(&mut cmd, "", Duration::from_secs(60));
    assert_eq!(out.code, Some(0), "keelutl {args:?}: {out:#?}");
    out
}

/// `keelutl snapshot restore FILE` with the cluster flags of `spec`.
fn restore(file: &Path, spec: &MemberSpec, extra: &[&str]) {
    let wanted = [
        "name",
        "data-dir",
        "initial-cluster",
        "initial-advertise-peer-urls",
        "initial-cluster-token",
    ];
    let flags: Vec<String> = spec
        .settings()
        .into_iter()
        .filter(|(flag, _)| wanted.contains(flag))
        .map(|(flag, value)| format!("--{flag}={value}"))
        .collect();
    let mut args = vec!["snapshot", "restore", file.to_str().unwrap()];
    args.extend(flags.iter().map(String::as_str));
    args.extend_from_slice(extra);
    let out = keelutl(&args);
    assert!(out.stdout.starts_with("restored "), "{out:#?}");
}

/// A single member restored from `file`, started and ready.
fn restored_member(file: &Path, extra: &[&str]) -> Member {
    let p = ports::free_ports(2);
    let mut m = Member::new(&keel_bin(), MemberSpec::single("r1", p[0], p[1]));
    restore(file, m.spec(), extra);
    m.restart();
    m
}

#[test]
fn the_etcd_fixture_restores_into_a_member_with_its_revisions() {
    let _guard = shared();
    // snapshot status as etcdctl prints it (etcd_db's tests pin etcdctl's own output).
    let table = keelutl(&["snapshot", "status", FIXTURE, "-w", "table"]);
    assert_eq!(
        table.stdout.lines().nth(3),
        Some("| a8716490 |       10 |         20 |      49 kB |")
    );
    let json = keelutl(&["snapshot", "status", FIXTURE, "-w", "json"]);
    assert_eq!(
        json.stdout.trim(),
        r#"{"hash":2826003600,"revision":10,"totalKey":20,"totalSize":49152}"#
    );
    let m = restored_member(Path::new(FIXTURE), &["--skip-hash-check"]);
    let ep = m.endpoint();
    // The fixture's etcd had auth enabled with users root and alice: the restored member
    // enforces it (users, roles and the enabled flag came with the snapshot).
    etcdctl(&ep, &["get", "a"]).fails_with("Error: etcdserver: user name is empty");
    etcdctl(&ep, &["get", "a", "--user=alice:alicepw"])
        .fails_with("Error: etcdserver: permission denied");
    const ROOT: &str = "--user=root:rootpw";
    let (rev, kvs) = served(&ep, &[ROOT]);
    assert_eq!(rev, 10);
    let enc = |s: &str| b64::encode(s);
    assert_eq!(
        kvs,
        [
            format!("{} = {} create=6 mod=9 ver=2 lease=0", enc("a"), enc("2")),
            format!(
                "{} = {} create=8 mod=8 ver=1 lease=0",
                enc("big"),
                enc("b".repeat(5000).as_str())
            ),
            format!(
                "{} = {} create=4 mod=4 ver=1 lease=5030136165601434120",
                enc("leased"),
                enc("v")
            ),
            format!(
                "{} = {} create=7 mod=10 ver=2 lease=0",
                enc("x1"),
                enc("uno")
            ),
            format!(
                "{} = {} create=7 mod=7 ver=1 lease=0",
                enc("x2"),
                enc("two")
            ),
        ]
    );
    etcdctl(&ep, &["get", "foo", "--rev=3", ROOT])
        .fails_with("Error: etcdserver: mvcc: required revision has been compacted");
    let at4 = etcdctl(&ep, &["get", "", "--prefix", "--rev=4", "-w", "json", ROOT]).json();
    assert_eq!(at4["kvs"].as_array().map(Vec::len), Some(2), "{at4}");
    let ttl = etcdctl(
        &ep,
        &[
            "lease",
            "timetolive",
            "45cea2311a84da08",
            "--keys",
            "-w",
            "json",
            ROOT,
        ],
    )
    .json();
    assert_eq!(ttl["granted-ttl"].as_i64(), Some(3600), "{ttl}");
    etcdctl(&ep, &["put", "after", "restore", ROOT]).ok();
    assert_eq!(served(&ep, &[ROOT]).0, 11);
}

#[test]
fn a_live_etcd_snapshot_restores_into_a_member_that_serves_the_same_keys() {
    let Some(bin) =
        etcd_binary("a_live_etcd_snapshot_restores_into_a_member_that_serves_the_same_keys")
    else {
        return;
    };
    let _guard = shared();
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(&bin, &dir.path().join("e1"), "e1", ports::free_port());
    etcd.ctl(&["put", "foo", "bar"]);
    etcd.ctl(&["put", "foo", "bar2"]);
    let lease = etcd.ctl(&["lease", "grant", "600", "-w", "json"]).json()["ID"]
        .as_i64()
        .unwrap();
    etcd.ctl(&["put", "--lease", &format!("{lease:x}"), "leased", "v"]);
    etcd.ctl(&["del", "foo"]);
    etcdctl_stdin(&etcd.endpoint, &["txn"], "\nput t1 one\nput t2 two\n\n\n").ok();
    etcd.ctl(&["compaction", "3"]);
    etcd.ctl(&["put", "t1", "uno"]);
    let snap: PathBuf = dir.path().join("etcd.snapshot");
    etcd.ctl(&["snapshot", "save", snap.to_str().unwrap()]);
    let (rev, kvs) = served(&etcd.endpoint, &[]);
    drop(etcd);

    let m = restored_member(&snap, &[]);
    let (got_rev, got) = served(&m.endpoint(), &[]);
    assert_eq!((got_rev, got), (rev, kvs));
    etcdctl(&m.endpoint(), &["get", "foo", "--rev=2"])
        .fails_with("Error: etcdserver: mvcc: required revision has been compacted");
    let leases = etcdctl(&m.endpoint(), &["lease", "list"]);
    // etcdctl prints lease IDs as %016x (one ID in 16 has a leading zero).
    assert_eq!(leases.ok().lines()[1], format!("{lease:016x}"));
    // --bump-revision --mark-compacted: the next write lands above the bump, and every
    // older revision is compacted.
    let bumped = restored_member(&snap, &["--bump-revision=1000", "--mark-compacted"]);
    etcdctl(&bumped.endpoint(), &["put", "next", "1"]).ok();
    assert_eq!(served(&bumped.endpoint(), &[]).0, rev + 1001);
    etcdctl(&bumped.endpoint(), &["get", "t1", &format!("--rev={rev}")])
        .fails_with("Error: etcdserver: mvcc: required revision has been compacted");
}

#[test]
fn a_keel_snapshot_restores_into_a_three_member_cluster() {
    let (guard, source) = cluster(1, &[]);
    let ep = source.members[0].endpoint();
    for i in 0..50 {
        etcdctl(&ep, &["put", &format!("k{i:02}"), &format!("v{i}")]).ok();
    }
    etcdctl(&ep, &["put", "k00", "again"]).ok();
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("keel.snapshot");
    etcdctl(&ep, &["snapshot", "save", snap.to_str().unwrap()]).ok();
    let (rev, kvs) = served(&ep, &[]);
    drop(source);
    drop(guard);

    let (_alone, restored) = {
        let guard = keel_testkit::schedule::exclusive();
        let template = MemberSpec::new();
        let c = Cluster::start_prepared(&keel_bin(), 3, template, None, &|m| {
            restore(&snap, m.spec(), &[]);
        });
        (guard, c)
    };
    let leader = restored.leader(Duration::from_secs(10));
    for m in &restored.members {
        let (got_rev, got) = served(&m.endpoint(), &[]);
        assert_eq!(
            (got_rev, &got),
            (rev, &kvs),
            "{} (leader {leader})",
            m.name()
        );
    }
    etcdctl(
        &restored.members[2].endpoint(),
        &["put", "after", "restore"],
    )
    .ok();
    assert_eq!(served(&restored.endpoints(), &[]).0, rev + 1);

    // Offline tools on a stopped member: hashkv is stable, defrag keeps every key.
    let mut restored = restored;
    let hash_before = etcdctl(
        &restored.members[0].endpoint(),
        &["endpoint", "hashkv", "-w", "json"],
    )
    .json()[0]["HashKV"]["hash"]
        .as_u64();
    restored.members[0].terminate();
    let data = restored.members[0].data_dir();
    let data = data.to_str().unwrap();
    let offline = keelutl(&["hashkv", "--data-dir", data, "-w", "json"]);
    let offline: serde_json::Value = serde_json::from_str(&offline.stdout).unwrap();
    assert_eq!(offline["hash"].as_u64(), hash_before, "{offline}");
    assert_eq!(offline["hashRevision"].as_i64(), Some(rev + 1));
    let out = keelutl(&["defrag", "--data-dir", data]);
    assert!(out.stdout.starts_with("Finished defragmenting"), "{out:#?}");
    restored.members[0].restart();
    let (_, after) = served(&restored.members[0].endpoint(), &[]);
    assert_eq!(after.len(), kvs.len() + 1);
}

/// `keelutl snapshot restore` builds `member.restoring` and renames it to `member` at the end:
/// SIGKILL while it writes the store leaves no `member` dir for keel to start on with part of
/// the data, and running the same restore again discards the leftover and restores every key.
#[test]
fn a_restore_killed_midway_leaves_no_member_dir_and_a_rerun_restores_everything() {
    let (guard, source) = crate::member(&[]);
    let ep = source.endpoint();
    let rt = keel_testkit::grpc::runtime();
    rt.block_on(async {
        let mut kv = keel_testkit::grpc::kv(&ep).await;
        let kvs = (0..40_000).map(|i| (format!("key/{i:06}").into_bytes(), vec![b'v'; 200]));
        keel_testkit::grpc::put_all(&mut kv, kvs, 100).await;
    });
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("big.snapshot");
    etcdctl(&ep, &["snapshot", "save", snap.to_str().unwrap()]).ok();
    let (rev, kvs) = served(&ep, &["--keys-only"]);
    assert_eq!(kvs.len(), 40_000);
    drop(source);
    drop(guard);

    let p = ports::free_ports(2);
    let mut m = Member::new(&keel_bin(), MemberSpec::single("r1", p[0], p[1]));
    let data = m.data_dir();
    let member_dir = data.join("member");
    let staging = data.join("member.restoring");
    let restore_args = |spec: &MemberSpec| -> Vec<String> {
        let mut args = vec![
            "snapshot".to_string(),
            "restore".into(),
            snap.display().to_string(),
        ];
        for (flag, value) in spec.settings() {
            if [
                "name",
                "data-dir",
                "initial-cluster",
                "initial-advertise-peer-urls",
            ]
            .contains(&flag)
            {
                args.push(format!("--{flag}={value}"));
            }
        }
        args
    };
    // Kill as soon as the store exists, then once 5 ms into writing it (40,000 records take
    // far longer even in release).
    for extra_wait in [Duration::ZERO, Duration::from_millis(5)] {
        let mut child = std::process::Command::new(keel_testkit::keelutl_binary!())
            .args(restore_args(m.spec()))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !staging.join("db").exists() {
            assert!(
                child.try_wait().unwrap().is_none(),
                "keelutl ended before writing the store"
            );
            assert!(std::time::Instant::now() < deadline, "no store after 60 s");
            std::thread::sleep(Duration::from_millis(2));
        }
        std::thread::sleep(extra_wait);
        let finished = child.try_wait().unwrap().is_some();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(
            !finished,
            "the restore finished within {extra_wait:?}; the test needs a bigger store"
        );
        assert!(
            !member_dir.exists(),
            "a killed restore left {}",
            member_dir.display()
        );
    }
    // The rerun discards the leftover staging dir and restores everything.
    let out = keelutl(
        &restore_args(m.spec())
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert!(out.stdout.starts_with("restored "), "{out:#?}");
    assert!(member_dir.exists() && !staging.exists());
    m.restart();
    assert_eq!(served(&m.endpoint(), &["--keys-only"]), (rev, kvs));
}
