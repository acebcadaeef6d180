//! A cluster of real `keel` processes on 127.0.0.1 for benchmarks: free ports, temp data
//! dirs, leader lookup, SIGKILL and RSS readings from `/proc`.

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use keel_proto::etcdserverpb::StatusRequest;
use keel_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use tonic::transport::{Channel, Endpoint};

/// One member process.
pub struct Member {
    /// `--name`.
    pub name: String,
    /// Client port on 127.0.0.1.
    pub client_port: u16,
    /// Peer port on 127.0.0.1.
    pub peer_port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Member {
    /// `127.0.0.1:<client port>`.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// The OS process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Resident set size of the process in KiB (`VmRSS`), 0 if it is not running.
    pub fn rss_kib(&self) -> u64 {
        self.pid().map_or(0, rss_kib)
    }

    /// SIGKILLs the member and reaps it.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The member's log file (stdout and stderr).
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("keel.log")
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Resident set size of process `pid` in KiB, from `/proc/<pid>/status` (0 if unreadable).
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
            line.split_whitespace().nth(1)?.parse().ok()
        })
        .unwrap_or(0)
}

/// A running cluster; members are killed when it is dropped.
pub struct Cluster {
    /// The members, in `--initial-cluster` order.
    pub members: Vec<Member>,
}

impl Cluster {
    /// Starts `n` members of `keel` with `extra` flags each, in temp dirs under `parent`.
    ///
    /// Errors: a member cannot be spawned.
    pub fn start(
        keel: &Path,
        n: usize,
        extra: &[String],
        parent: &Path,
    ) -> std::io::Result<Cluster> {
        let listeners: Vec<TcpListener> = (0..2 * n)
            .map(|_| TcpListener::bind("127.0.0.1:0"))
            .collect::<Result<_, _>>()?;
        let ports: Vec<u16> = listeners
            .iter()
            .map(|l| l.local_addr().map(|a| a.port()))
            .collect::<Result<_, _>>()?;
        drop(listeners);
        let mut members = Vec::with_capacity(n);
        for i in 0..n {
            members.push(Member {
                name: format!("m{i}"),
                client_port: ports[2 * i],
                peer_port: ports[2 * i + 1],
                dir: tempfile::Builder::new()
                    .prefix("keel-bench-")
                    .tempdir_in(parent)?,
                child: None,
            });
        }
        let initial = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        for m in &mut members {
            let client = format!("http://127.0.0.1:{}", m.client_port);
            let peer = format!("http://127.0.0.1:{}", m.peer_port);
            let log = File::create(m.log_path())?;
            let child = Command::new(keel)
                .args(["--name", &m.name, "--data-dir"])
                .arg(m.dir.path().join("data"))
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
                .args(["--initial-cluster", &initial, "--log-level", "warn"])
                .args(extra)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()?;
            m.child = Some(child);
        }
        Ok(Cluster { members })
    }

    /// Waits up to `limit` until the running members agree on a leader; returns its index.
    pub async fn leader(&self, limit: Duration) -> Option<usize> {
        let end = Instant::now() + limit;
        while Instant::now() < end {
            let mut seen = Vec::new();
            for (i, m) in self.members.iter().enumerate() {
                if m.pid().is_some() {
                    seen.push((i, status(&m.endpoint()).await));
                }
            }
            if let Some((_, Some((_, leader)))) = seen.first() {
                let leader = *leader;
                let agreed = leader != 0
                    && seen
                        .iter()
                        .all(|(_, s)| s.is_some_and(|(_, l)| l == leader));
                if let Some((i, _)) = seen
                    .iter()
                    .find(|(_, s)| s.is_some_and(|(me, _)| me == leader))
                    && agreed
                {
                    return Some(*i);
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    }
}

/// A channel to `endpoint` with a 30 s per-RPC deadline.
pub async fn channel(endpoint: &str) -> Result<Channel, tonic::transport::Error> {
    Endpoint::from_shared(format!("http://{endpoint}"))?
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(30))
        .tcp_nodelay(true)
        .connect()
        .await
}

/// `(member id, leader id)` as `endpoint` reports them.
async fn status(endpoint: &str) -> Option<(u64, u64)> {
    let ch = channel(endpoint).await.ok()?;
    let s = MaintenanceClient::new(ch)
        .status(StatusRequest {})
        .await
        .ok()?
        .into_inner();
    Some((s.header?.member_id, s.leader))
}
