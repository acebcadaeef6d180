//! Real multi-member Keel clusters for end-to-end tests.
//!
//! [`TestCluster::start`] runs N `keel` processes on 127.0.0.1 (names `m1`..`mN`, free ports,
//! one temp data dir each) with the same `--initial-cluster` and `--initial-cluster-state new`,
//! and waits until every member serves a linearizable read. Members can be crashed (SIGKILL),
//! stopped (SIGTERM) and restarted with the same flags; [`TestCluster::join`] starts a member
//! that was added with `MemberAdd` (`--initial-cluster-state existing`). Each member logs to
//! `<its dir>/keel.log`; when a test panics, the tail of every member's log is printed.
//!
//! Every wait is bounded; the binary is [`member_binary`] (`$KEEL_E2E_BIN` overrides it).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use keel_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use keel_proto::etcdserverpb::{StatusRequest, StatusResponse};

use super::grpc;
use super::ports::free_ports;
use super::process::member_binary;

/// How long a cluster may take to serve linearizable reads on every member.
pub const CLUSTER_READY_TIMEOUT: Duration = Duration::from_secs(40);
/// How many log lines a failure report shows per member.
const LOG_TAIL_LINES: usize = 40;

/// One member process of a [`TestCluster`].
pub struct Member {
    /// `--name`.
    pub name: String,
    client_port: u16,
    peer_port: u16,
    dir: tempfile::TempDir,
    args: Vec<String>,
    child: Option<Child>,
    /// Extra environment variables of the next starts (see [`Member::set_env`]).
    env: Vec<(String, String)>,
}

impl Member {
    /// `127.0.0.1:<client port>`, the form etcdctl's `--endpoints` takes.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// `http://127.0.0.1:<peer port>`.
    pub fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }

    /// The member's log file (all starts).
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("keel.log")
    }

    /// The whole log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Sets (`Some`) or removes (`None`) environment variable `key` for the next starts
    /// (e.g. `FAILPOINTS` of a failpoint build); the running process is not affected.
    pub fn set_env(&mut self, key: &str, value: Option<&str>) {
        self.env.retain(|(k, _)| k != key);
        if let Some(v) = value {
            self.env.push((key.to_string(), v.to_string()));
        }
    }

    /// The OS process id of the running member, `None` while it is stopped.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process runs (as far as this harness knows).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Crashes the member (SIGKILL) and reaps it. No-op when it is stopped.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            self.note("SIGKILLed by the test");
        }
    }

    /// SIGTERM, then waits up to 15 s for the exit status (SIGKILL and panic after that).
    pub fn terminate(&mut self) -> ExitStatus {
        let mut child = self
            .child
            .take()
            .expect("terminate: the member is not running");
        let pid = libc::pid_t::try_from(child.id()).expect("pid fits pid_t");
        // SAFETY: kill(2) on the PID of our own unreaped child.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                self.note(&format!("exited after SIGTERM ({status})"));
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{} did not exit after SIGTERM\n{}",
                    self.name,
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits up to `timeout` for the process to exit on its own; `None` if it still runs.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let child = self.child.as_mut()?;
            if let Some(status) = child.try_wait().expect("try_wait") {
                self.child = None;
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the member again with the same flags (without waiting for readiness).
    pub fn respawn(&mut self) {
        assert!(self.child.is_none(), "respawn: stop {} first", self.name);
        self.spawn();
    }

    /// The last lines of the log, framed for a panic message.
    pub fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        let from = lines.len().saturating_sub(LOG_TAIL_LINES);
        format!(
            "---- {}: last {} lines of {} ----\n{}",
            self.name,
            lines.len() - from,
            self.log_path().display(),
            lines[from..].join("\n")
        )
    }

    /// Panics (with the log) if the process exited.
    fn check_alive(&mut self) {
        if let Some(child) = self.child.as_mut()
            && let Some(status) = child.try_wait().expect("try_wait")
        {
            self.child = None;
            panic!("{} exited ({status})\n{}", self.name, self.log_tail());
        }
    }

    fn spawn(&mut self) {
        self.note(&format!("start with {:?} env {:?}", self.args, self.env));
        let log = open_append(&self.log_path());
        let binary = member_binary();
        let child = Command::new(&binary)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log)
            .env("RUST_BACKTRACE", "1")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", binary.display()));
        self.child = Some(child);
    }

    fn note(&self, what: &str) {
        let _ = writeln!(
            open_append(&self.log_path()),
            "==== keel-e2e harness: {what}"
        );
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A cluster of real `keel` processes. See the module docs.
pub struct TestCluster {
    /// Members in start order (`m1` is index 0).
    pub members: Vec<Member>,
    token: String,
    extra: Vec<String>,
}

impl TestCluster {
    /// Starts `n` members with `extra` flags (passed to every member, also on restarts) and
    /// waits until each serves a linearizable read.
    pub fn start(n: usize, extra: &[&str]) -> TestCluster {
        let ports = free_ports(2 * n);
        let token = format!("keel-test-{}", ports[0]);
        let names: Vec<String> = (1..=n).map(|i| format!("m{i}")).collect();
        let initial = names
            .iter()
            .enumerate()
            .map(|(i, name)| format!("{name}=http://127.0.0.1:{}", ports[2 * i + 1]))
            .collect::<Vec<_>>()
            .join(",");
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let mut cluster = TestCluster {
            members: Vec::new(),
            token,
            extra,
        };
        for (i, name) in names.iter().enumerate() {
            let member = cluster.new_member(name, ports[2 * i], ports[2 * i + 1], &initial, "new");
            cluster.members.push(member);
        }
        for m in &mut cluster.members {
            m.spawn();
        }
        cluster.wait_ready(&(0..n).collect::<Vec<_>>());
        cluster
    }

    fn new_member(
        &self,
        name: &str,
        client_port: u16,
        peer_port: u16,
        initial: &str,
        state: &str,
    ) -> Member {
        let dir = tempfile::Builder::new()
            .prefix("keel-cluster-")
            .tempdir()
            .expect("temp dir");
        let client = format!("http://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let mut args: Vec<String> = [
            ("--name", name.to_string()),
            ("--data-dir", dir.path().join("data").display().to_string()),
            ("--listen-client-urls", client.clone()),
            ("--advertise-client-urls", client),
            ("--listen-peer-urls", peer.clone()),
            ("--initial-advertise-peer-urls", peer),
            ("--initial-cluster", initial.to_string()),
            ("--initial-cluster-state", state.to_string()),
            ("--initial-cluster-token", self.token.clone()),
        ]
        .into_iter()
        .flat_map(|(f, v)| [f.to_string(), v])
        .collect();
        args.extend(self.extra.iter().cloned());
        Member {
            name: name.to_string(),
            client_port,
            peer_port,
            dir,
            args,
            child: None,
            env: Vec::new(),
        }
    }

    /// Free ports for a member to be added: (client, peer).
    pub fn reserve_ports() -> (u16, u16) {
        let p = free_ports(2);
        (p[0], p[1])
    }

    /// Starts member `name` on `(client, peer)` ports with `--initial-cluster-state existing`
    /// and an `--initial-cluster` of every running member plus itself; it must have been added
    /// with `MemberAdd` first. Returns its index; does not wait for readiness.
    pub fn join(&mut self, name: &str, ports: (u16, u16)) -> usize {
        let mut initial: Vec<String> = self
            .members
            .iter()
            .filter(|m| m.is_running())
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect();
        initial.push(format!("{name}=http://127.0.0.1:{}", ports.1));
        let mut member = self.new_member(name, ports.0, ports.1, &initial.join(","), "existing");
        member.spawn();
        self.members.push(member);
        self.members.len() - 1
    }

    /// All client endpoints of running members, comma-separated (etcdctl `--endpoints`).
    pub fn endpoints(&self) -> String {
        self.running()
            .iter()
            .map(|i| self.members[*i].endpoint())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Indexes of the running members.
    pub fn running(&self) -> Vec<usize> {
        (0..self.members.len())
            .filter(|i| self.members[*i].is_running())
            .collect()
    }

    /// Waits until each member in `which` answers a linearizable Range.
    pub fn wait_ready(&mut self, which: &[usize]) {
        let deadline = Instant::now() + CLUSTER_READY_TIMEOUT;
        for &i in which {
            loop {
                self.members[i].check_alive();
                let last =
                    match grpc::probe_ready(&self.members[i].endpoint(), Duration::from_secs(2)) {
                        Ok(()) => break,
                        Err(e) => e,
                    };
                if Instant::now() > deadline {
                    panic!(
                        "{} not ready within {CLUSTER_READY_TIMEOUT:?}: {last}\n{}",
                        self.members[i].name,
                        self.log_tails()
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Maintenance.Status of member `i` (bounded by the RPC timeout).
    pub fn status(&self, i: usize) -> Result<StatusResponse, String> {
        status(&self.members[i].endpoint())
    }

    /// Index of the member that every running member names as leader, once they agree
    /// (waits up to `timeout`).
    pub fn leader(&self, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
            let leaders: Vec<u64> = self
                .running()
                .iter()
                .filter_map(|i| self.status(*i).ok().map(|s| s.leader))
                .collect();
            let agreed = leaders.len() == self.running().len()
                && leaders[0] != 0
                && leaders.iter().all(|l| *l == leaders[0]);
            if agreed
                && let Some(i) = self
                    .running()
                    .into_iter()
                    .find(|i| self.member_id(*i) == Some(leaders[0]))
            {
                return i;
            }
            if Instant::now() > deadline {
                panic!(
                    "members do not agree on a leader: {leaders:x?}\n{}",
                    self.log_tails()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The member ID of member `i` (from its Status), if it answers.
    pub fn member_id(&self, i: usize) -> Option<u64> {
        self.status(i)
            .ok()
            .and_then(|s| s.header.map(|h| h.member_id))
    }

    /// Waits until every running member applied at least `index` (Status.raft_applied_index).
    pub fn wait_applied(&self, index: u64, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        for i in self.running() {
            loop {
                if self.status(i).is_ok_and(|s| s.raft_applied_index >= index) {
                    break;
                }
                if Instant::now() > deadline {
                    panic!(
                        "{} did not apply index {index}\n{}",
                        self.members[i].name,
                        self.log_tails()
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// The log tails of all members.
    pub fn log_tails(&self) -> String {
        self.members
            .iter()
            .map(Member::log_tail)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            if let Some(mut child) = m.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if std::thread::panicking() {
            eprintln!("{}", self.log_tails());
        }
    }
}

/// Maintenance.Status of `endpoint`, on its own thread and runtime (callable anywhere).
pub fn status(endpoint: &str) -> Result<StatusResponse, String> {
    let endpoint = endpoint.to_string();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async {
            let channel = grpc::channel(&endpoint, Duration::from_secs(2)).await?;
            MaintenanceClient::new(channel)
                .status(StatusRequest {})
                .await
                .map(|r| r.into_inner())
                .map_err(|s| format!("status: {s:?}"))
        })
    })
    .join()
    .map_err(|_| "status thread panicked".to_string())?
}

fn open_append(path: &Path) -> File {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}
