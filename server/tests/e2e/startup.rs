//! Start-up behaviour a new etcd user relies on: `--name` alone is enough, and a start that
//! cannot listen fails before it creates anything.

use std::process::Stdio;
use std::time::{Duration, Instant};

use keel_testkit::MemberSpec;
use keel_testkit::etcdctl::etcdctl;
use keel_testkit::ports::{free_port, free_ports};
use keel_testkit::process::{KillOnDrop, run_bounded};
use keel_testkit::schedule::shared;
use keel_testkit::spec::{initial_cluster, loopback_url};

use crate::keel_bin;

/// As in etcd, `--name foo` with the initial cluster left at its default bootstraps a
/// one-member cluster named `foo` on the advertised peer URL.
#[test]
fn name_alone_bootstraps_a_single_member() {
    let _guard = shared();
    let dir = tempfile::tempdir().unwrap();
    let ports = free_ports(2);
    // No --data-dir and no cluster flags: only the name and where to listen.
    let child = MemberSpec::loopback("foo", ports[0], ports[1])
        .command(&keel_bin())
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start keel");
    let _child = KillOnDrop(child);
    let endpoint = format!("127.0.0.1:{}", ports[0]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = etcdctl(&endpoint, &["member", "list"]);
        if out.code == Some(0) && out.stdout.contains(", started, foo, ") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "member foo never listed: {out:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        dir.path().join("foo.keel/member/wal").is_dir(),
        "data in <name>.keel"
    );
}

/// A busy client port fails the start with a message naming the address, and leaves no data
/// dir behind (so a later start with other flags is a clean first start).
#[test]
fn busy_port_fails_before_the_data_dir_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let client = format!("http://{}", busy.local_addr().unwrap());
    let peer = loopback_url(free_port());
    let data = dir.path().join("d");
    let spec = MemberSpec::new()
        .data_dir(&data)
        .client_url(&client)
        .peer_url(&peer)
        .initial_cluster(&initial_cluster([("default", &peer)]));
    let out = run_bounded(&mut spec.command(&keel_bin()), "", Duration::from_secs(20));
    assert_ne!(out.code, Some(0), "{out:?}");
    let addr = busy.local_addr().unwrap().to_string();
    assert!(
        out.stderr.contains(&format!("cannot listen on {addr}")),
        "{}",
        out.stderr
    );
    assert!(!data.exists(), "no data dir after a failed start");
}

/// Runs keel with `args` on free loopback ports and returns (exit code, last stderr line).
fn failed_start(extra: &[&str], initial: Option<&str>) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let ports = free_ports(2);
    let peer = loopback_url(ports[1]);
    let own = initial_cluster([("default", &peer)]);
    let spec = MemberSpec::new()
        .data_dir(dir.path().join("d"))
        .client_url(&loopback_url(ports[0]))
        .peer_url(&peer)
        .initial_cluster(initial.unwrap_or(&own));
    let mut cmd = spec.command(&keel_bin());
    cmd.args(extra);
    let out = run_bounded(&mut cmd, "", Duration::from_secs(20));
    let last = out.stderr.lines().last().unwrap_or("").to_string();
    (out.code, last)
}

/// Start-up refusals a fresh etcd user meets, with etcd 3.4.23's texts (after Keel's
/// `keel: ` prefix).
#[test]
fn bad_start_up_flags_get_etcds_texts() {
    let _guard = shared();
    let (code, last) = failed_start(&["--election-timeout", "60000"], None);
    assert_ne!(code, Some(0));
    assert_eq!(
        last,
        "keel: --election-timeout[60000ms] is too long, and should be set less than 50000ms"
    );
    let (code, last) = failed_start(&[], Some("other=http://127.0.0.1:9"));
    assert_ne!(code, Some(0));
    assert_eq!(
        last,
        "keel: couldn't find local name \"default\" in the initial cluster configuration"
    );
}
