//! Start-up behaviour a new etcd user relies on: `--name` alone is enough, and a start that
//! cannot listen fails before it creates anything.

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::etcdctl::etcdctl;
use support::ports::free_ports;
use support::process::member_binary;

/// Kills the child on drop, so a failing assertion never leaks a server.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// As in etcd, `--name foo` with the initial cluster left at its default bootstraps a
/// one-member cluster named `foo` on the advertised peer URL.
#[test]
fn name_alone_bootstraps_a_single_member() {
    let dir = tempfile::tempdir().unwrap();
    let ports = free_ports(2);
    let (client, peer) = (
        format!("http://127.0.0.1:{}", ports[0]),
        format!("http://127.0.0.1:{}", ports[1]),
    );
    let child = Command::new(member_binary())
        .current_dir(dir.path())
        .args([
            "--name",
            "foo",
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
        ])
        .args([
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start keel");
    let _child = Child(child);
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
    let peer = format!("http://127.0.0.1:{}", free_ports(1)[0]);
    let data = dir.path().join("d");
    let out = Command::new(member_binary())
        .args(["--data-dir", data.to_str().unwrap()])
        .args([
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
        ])
        .args([
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
        ])
        .args(["--initial-cluster", &format!("default={peer}")])
        .output()
        .expect("run keel");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let addr = busy.local_addr().unwrap().to_string();
    assert!(
        stderr.contains(&format!("cannot listen on {addr}")),
        "{stderr}"
    );
    assert!(!data.exists(), "no data dir after a failed start");
}
