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
use keel_testkit::tls::TestCa;

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

/// An etcd flag Keel does not implement stops the start with a message naming it (exit 2,
/// no data dir); any other unknown flag gets clap's message naming it.
#[test]
fn an_unsupported_etcd_flag_is_named_and_nothing_starts() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let run = |flag: &str| {
        let mut cmd = std::process::Command::new(keel_bin());
        cmd.arg("--data-dir").arg(&data).arg(flag);
        run_bounded(&mut cmd, "", Duration::from_secs(20))
    };
    let out = run("--discovery=https://discovery.etcd.io/x");
    assert_eq!(out.code, Some(2), "{out:?}");
    assert_eq!(
        out.stderr.trim_end(),
        "keel: etcd flag --discovery is not supported by Keel (docs/compat.md lists what is)"
    );
    let out = run("--no-such-flag");
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(out.stderr.contains("--no-such-flag"), "{}", out.stderr);
    assert!(!data.exists(), "no data dir after a refused start");
}

/// A `TOKIO_WORKER_THREADS` the runtime cannot use stops the start with a message naming it
/// (exit 2, no data dir) instead of tokio's panic.
#[test]
fn an_unusable_tokio_worker_threads_is_named_and_nothing_starts() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    for value in ["abc", "0", ""] {
        let mut cmd = std::process::Command::new(keel_bin());
        cmd.arg("--data-dir")
            .arg(&data)
            .env("TOKIO_WORKER_THREADS", value);
        let out = run_bounded(&mut cmd, "", Duration::from_secs(20));
        assert_eq!(out.code, Some(2), "{value:?}: {out:?}");
        assert_eq!(
            out.stderr.trim_end(),
            format!("keel: TOKIO_WORKER_THREADS must be a positive integer, got {value:?}")
        );
    }
    assert!(!data.exists(), "no data dir after a refused start");
}

/// Runs keel with `extra` flags on free loopback ports (an `https://` client URL if
/// `https`) and returns (exit code, last stderr line, whether the data dir exists).
fn failed_start(extra: &[&str], initial: Option<&str>, https: bool) -> (Option<i32>, String, bool) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let ports = free_ports(2);
    let peer = loopback_url(ports[1]);
    let own = initial_cluster([("default", &peer)]);
    let client = loopback_url(ports[0]);
    let client = if https {
        client.replace("http://", "https://")
    } else {
        client
    };
    let spec = MemberSpec::new()
        .data_dir(&data)
        .client_url(&client)
        .peer_url(&peer)
        .initial_cluster(initial.unwrap_or(&own));
    let mut cmd = spec.command(&keel_bin());
    cmd.args(extra);
    let out = run_bounded(&mut cmd, "", Duration::from_secs(20));
    let last = out.stderr.lines().last().unwrap_or("").to_string();
    (out.code, last, data.exists())
}

/// Start-up refusals a fresh etcd user meets, with etcd 3.4.23's texts (after Keel's
/// `keel: ` prefix) and exit status 1, as `/usr/bin/etcd` gives them.
#[test]
fn bad_start_up_flags_get_etcds_texts() {
    let _guard = shared();
    let (code, last, _) = failed_start(&["--election-timeout", "60000"], None, false);
    assert_eq!(
        (code, last.as_str()),
        (
            Some(1),
            "keel: --election-timeout[60000ms] is too long, and should be set less than 50000ms"
        )
    );
    let (code, last, _) = failed_start(&[], Some("other=http://127.0.0.1:9"), false);
    assert_eq!(
        (code, last.as_str()),
        (
            Some(1),
            "keel: couldn't find local name \"default\" in the initial cluster configuration"
        )
    );
}

/// TLS files etcd refuses at start-up, with its texts (Go's `crypto/tls` ones for the
/// pair) and exit status 1, before the data dir is created.
#[test]
fn bad_tls_files_get_etcds_texts() {
    let _guard = shared();
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "ca");
    let a = ca.issue("a", "a");
    let b = ca.issue("b", "b");
    let (cert, key) = (a.cert.to_str().unwrap(), a.key.to_str().unwrap());
    let cases: [(&[&str], String); 5] = [
        (
            &["--cert-file", cert],
            format!("KeyFile and CertFile must both be present[key: , cert: {cert}]"),
        ),
        (
            &["--key-file", key],
            format!("KeyFile and CertFile must both be present[key: {key}, cert: ]"),
        ),
        (
            &["--cert-file", key, "--key-file", cert],
            "tls: failed to find certificate PEM data in certificate input, but did find a \
             private key; PEM inputs may have been switched"
                .into(),
        ),
        (
            &["--cert-file", cert, "--key-file", cert],
            "tls: found a certificate rather than a key in the PEM for the private key".into(),
        ),
        (
            &["--cert-file", cert, "--key-file", b.key.to_str().unwrap()],
            "tls: private key does not match public key".into(),
        ),
    ];
    for (flags, text) in cases {
        let (code, last, data) = failed_start(flags, None, true);
        assert_eq!(
            (code, last),
            (Some(1), format!("keel: {text}")),
            "{flags:?}"
        );
        assert!(!data, "{flags:?}: a data dir after a refused start");
    }
}
