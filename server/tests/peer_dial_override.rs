//! `--experimental-peer-dial-override` end to end: a 3-member cluster whose advertised peer
//! URLs point at ports nobody listens on, and which works only because every member dials the
//! real listen URLs through the override. Membership still shows the advertised URLs.

mod support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use keel_proto::etcdserverpb::MemberListRequest;
use keel_proto::etcdserverpb::cluster_client::ClusterClient;
use support::grpc;
use support::ports::free_ports;
use support::process::member_binary;

/// How long the cluster may take to elect a leader and serve linearizable reads.
const READY_TIMEOUT: Duration = Duration::from_secs(40);

/// Member processes, SIGKILLed on drop; their logs are printed when the test fails.
struct Members {
    children: Vec<Child>,
    dir: tempfile::TempDir,
}

impl Drop for Members {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            for i in 0..self.children.len() {
                let log = std::fs::read_to_string(self.dir.path().join(format!("m{i}.log")));
                eprintln!("---- m{i} ----\n{}", log.unwrap_or_default());
            }
        }
    }
}

#[test]
fn members_dial_peers_through_the_override() {
    let n = 3;
    // Per member: client port, listen (real) peer port, advertised (dead) peer port.
    let ports = free_ports(3 * n);
    let client = |i: usize| ports[3 * i];
    let listen = |i: usize| format!("http://127.0.0.1:{}", ports[3 * i + 1]);
    let advertised = |i: usize| format!("http://127.0.0.1:{}", ports[3 * i + 2]);
    let initial = (0..n)
        .map(|i| format!("m{i}={}", advertised(i)))
        .collect::<Vec<_>>()
        .join(",");
    let overrides = (0..n)
        .map(|i| format!("{}={}", advertised(i), listen(i)))
        .collect::<Vec<_>>()
        .join(",");
    let dir = tempfile::tempdir().unwrap();
    let mut members = Members {
        children: Vec::new(),
        dir,
    };
    for i in 0..n {
        let log = std::fs::File::create(members.dir.path().join(format!("m{i}.log"))).unwrap();
        let client_url = format!("http://127.0.0.1:{}", client(i));
        let child = Command::new(member_binary())
            .args(["--name", &format!("m{i}")])
            .arg("--data-dir")
            .arg(members.dir.path().join(format!("m{i}")))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &listen(i)])
            .args(["--initial-advertise-peer-urls", &advertised(i)])
            .args(["--initial-cluster", &initial])
            .args(["--initial-cluster-token", "dial-override-test"])
            .args(["--experimental-peer-dial-override", &overrides])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        members.children.push(child);
    }

    let deadline = Instant::now() + READY_TIMEOUT;
    for i in 0..n {
        let endpoint = format!("127.0.0.1:{}", client(i));
        while let Err(e) = grpc::probe_ready(&endpoint, Duration::from_secs(2)) {
            assert!(Instant::now() < deadline, "m{i} not ready: {e}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut kv0 = grpc::kv(&format!("127.0.0.1:{}", client(0))).await;
        let rev = grpc::put(&mut kv0, "k", "through-the-override").await;
        // A linearizable read on another member needs a ReadIndex round over the peer links.
        let mut kv2 = grpc::kv(&format!("127.0.0.1:{}", client(2))).await;
        let got = grpc::range(&mut kv2, b"k", b"").await;
        assert_eq!(got.kvs.len(), 1);
        assert_eq!(got.kvs[0].value, b"through-the-override");
        assert_eq!(got.kvs[0].mod_revision, rev);

        let channel = grpc::channel(&format!("127.0.0.1:{}", client(1)), grpc::RPC_TIMEOUT)
            .await
            .unwrap();
        let list = ClusterClient::new(channel)
            .member_list(MemberListRequest::default())
            .await
            .unwrap()
            .into_inner();
        let mut urls: Vec<String> = list
            .members
            .iter()
            .flat_map(|m| m.peer_ur_ls.clone())
            .collect();
        urls.sort();
        let mut want: Vec<String> = (0..n).map(advertised).collect();
        want.sort();
        assert_eq!(urls, want, "membership keeps the advertised peer URLs");
    });
}

#[test]
fn a_malformed_override_fails_the_start_with_a_flag_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(member_binary())
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["--experimental-peer-dial-override", "http://127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "invalid value \"http://127.0.0.1:1\" for flag --experimental-peer-dial-override: \
             \"http://127.0.0.1:1\" is not of the form ADVERTISED_PEER_URL=DIAL_URL"
        ),
        "{stderr}"
    );
    assert!(
        !dir.path().join("data").exists(),
        "nothing is created on a bad flag"
    );
}
