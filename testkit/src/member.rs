//! A real `keel` member process owned by a test.
//!
//! A [`Member`] runs the binary with a [`MemberSpec`] (or, [`Member::with_config_file`], with
//! `--config-file` alone: the same settings under etcd's YAML keys) on its own temp directory:
//! the data dir is `<dir>/data` unless the spec names one, and the member's stdout and stderr
//! go to `<dir>/keel.log`, appended across restarts with one `==== keel-testkit:` banner line
//! per thing the harness did (start with its flags, SIGKILL, SIGTERM, SIGSTOP, ...), so a
//! failure's log tells what happened when. It can be crashed (SIGKILL), stopped gracefully
//! (SIGTERM), frozen (SIGSTOP/SIGCONT) and started again on the same data dir, ports and flags.
//!
//! Every wait is bounded. Dropping a [`Member`] SIGKILLs the process; when the test is already
//! panicking, the tail of the log is printed first, so the failure explains itself.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::grpc;
use crate::ports::free_ports;
use crate::process::{rss_kib, signal};
use crate::spec::{FAILPOINTS_ENV, MemberSpec};
use crate::tls::ClientTls;

/// How long a member may take from spawn to answering a linearizable Range.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a member may take to exit after SIGTERM.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(15);
/// How many log lines a failure report shows.
const LOG_TAIL_LINES: usize = 60;
/// Member name of single-member tests unless a test picks another (etcd's default,
/// `--name default`).
pub const MEMBER_NAME: &str = "default";

/// A `keel` member process owned by a test. See the module docs.
pub struct Member {
    binary: PathBuf,
    spec: MemberSpec,
    /// `Some(extra YAML)`: started with `--config-file <dir>/keel.yaml` only.
    config_yaml: Option<String>,
    /// Owns the data dir (unless the spec names another) and the log file; removed on drop.
    dir: tempfile::TempDir,
    child: Option<Child>,
    starts: u32,
}

impl Member {
    /// A member of `binary` with `spec`, not started, in a new temp dir. Panics if the temp
    /// dir cannot be created.
    pub fn new(binary: &Path, spec: MemberSpec) -> Member {
        let dir = tempfile::Builder::new()
            .prefix("keel-member-")
            .tempdir()
            .expect("create a temp dir for the member");
        Member::in_dir(binary, spec, dir)
    }

    /// [`Member::new`] with the temp dir created under `parent` (e.g. a benchmark's disk).
    pub fn new_in(binary: &Path, spec: MemberSpec, parent: &Path) -> Member {
        let dir = tempfile::Builder::new()
            .prefix("keel-member-")
            .tempdir_in(parent)
            .unwrap_or_else(|e| panic!("create a temp dir in {}: {e}", parent.display()));
        Member::in_dir(binary, spec, dir)
    }

    fn in_dir(binary: &Path, spec: MemberSpec, dir: tempfile::TempDir) -> Member {
        let spec = match spec.get_data_dir() {
            Some(_) => spec,
            None => spec.data_dir(dir.path().join("data")),
        };
        // The harness's own probes present the member's certificate (it is signed by the CA
        // the member trusts, and usable as a client certificate).
        if let (Some(tls), Some(url)) = (spec.get_client_tls(), spec.get_client_url()) {
            let client = ClientTls {
                ca: tls.ca.clone(),
                identity: Some(tls.files.clone()),
            };
            crate::tls::register(&endpoint_of_url(&url), client);
        }
        Member {
            binary: binary.to_path_buf(),
            spec,
            config_yaml: None,
            dir,
            child: None,
            starts: 0,
        }
    }

    /// Starts a fresh single-member cluster (`--name default`, free loopback ports) and waits
    /// until it is ready. Panics (with the member's log) if it is not ready within
    /// [`READY_TIMEOUT`].
    pub fn start(binary: &Path) -> Member {
        Member::start_with(binary, &[])
    }

    /// [`Member::start`] with `extra_args` appended to the flags (e.g. `["--max-txn-ops",
    /// "2"]`); they are passed again on every restart.
    pub fn start_with(binary: &Path, extra_args: &[&str]) -> Member {
        let mut member = Member::new(binary, single(MEMBER_NAME).args(extra_args));
        member.restart();
        member
    }

    /// Starts a fresh single-member cluster named `name` from `--config-file` alone (see
    /// [`Member::with_config_file`]) and waits until it is ready.
    pub fn start_with_config_file(binary: &Path, name: &str, extra_yaml: &str) -> Member {
        let mut member = Member::new(binary, single(name)).with_config_file(extra_yaml);
        member.restart();
        member
    }

    /// Starts the member with `--config-file <dir>/keel.yaml` only: a YAML file with the
    /// spec's [`MemberSpec::settings`] under etcd's config keys (`name`, `data-dir`,
    /// `listen-client-urls`, ...) followed by `extra_yaml` (e.g. `"max-txn-ops: 2\n"`). (etcd
    /// ignores the other flags when a config file is given, so the spec's other flags are not
    /// passed.)
    pub fn with_config_file(mut self, extra_yaml: &str) -> Member {
        self.config_yaml = Some(extra_yaml.to_string());
        self
    }

    /// Replaces the spec used by later starts (e.g. the same spec with a one-off flag such as
    /// `--force-new-cluster`; the data dir stays the spec's).
    pub fn set_spec(&mut self, spec: MemberSpec) {
        self.spec = spec;
    }

    /// The member's `--name` (empty if the spec has none).
    pub fn name(&self) -> &str {
        self.spec.get_name().unwrap_or_default()
    }

    /// The flags and environment of the next starts.
    pub fn spec(&self) -> &MemberSpec {
        &self.spec
    }

    /// Sets (`Some`) or removes (`None`) environment variable `key` for the next starts
    /// (e.g. `FAILPOINTS` of a failpoint build); the running process is not affected.
    pub fn set_env(&mut self, key: &str, value: Option<&str>) {
        self.spec.set_env(key, value);
    }

    /// Sets (`Some`) or removes (`None`) the failpoints of the next starts of a failpoint
    /// build ([`MemberSpec::failpoints`]); the running process is not affected.
    pub fn set_failpoints(&mut self, spec: Option<&str>) {
        self.spec.set_env(FAILPOINTS_ENV, spec);
    }

    /// `http://127.0.0.1:<client port>`, the advertised client URL.
    pub fn client_url(&self) -> String {
        self.spec
            .get_client_url()
            .expect("the member has a client URL")
    }

    /// `127.0.0.1:<client port>`, the form etcdctl's `--endpoints` and the gRPC helpers take
    /// (for a TLS member they speak TLS to it, see [`crate::tls`]).
    pub fn endpoint(&self) -> String {
        endpoint_of_url(&self.client_url())
    }

    /// The advertised peer URL (see [`MemberSpec::peer_urls`]).
    pub fn peer_url(&self) -> String {
        self.spec.get_peer_url().expect("the member has a peer URL")
    }

    /// The member's `--data-dir` (created by `keel` itself on first start).
    pub fn data_dir(&self) -> PathBuf {
        self.spec
            .get_data_dir()
            .expect("Member::new sets a data dir")
            .to_path_buf()
    }

    /// The file that collects the member's stdout and stderr over all starts.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("keel.log")
    }

    /// Path of the YAML config file of a member started [`Member::with_config_file`].
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("keel.yaml")
    }

    /// The OS process id of the running member, `None` while it is stopped.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process runs, as far as the harness knows (it may have exited by itself
    /// since; [`Member::wait_exit`] and [`Member::wait_ready`] notice that).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Resident set size of the running process in KiB (`None` when stopped or unreadable).
    pub fn rss_kib(&self) -> Option<u64> {
        self.pid().and_then(rss_kib)
    }

    /// Starts the process (the first time, or again after a stop) on the same data dir, ports
    /// and flags, without waiting for readiness, and returns the time of spawn (for tests
    /// that measure recovery time or expect a failed start). Panics if it is running.
    pub fn spawn(&mut self) -> Instant {
        assert!(
            self.child.is_none(),
            "spawn: {} is running; stop it first",
            self.name()
        );
        self.starts += 1;
        let args = match &self.config_yaml {
            Some(extra_yaml) => {
                self.write_config_file(extra_yaml);
                vec![
                    "--config-file".to_string(),
                    self.config_path().display().to_string(),
                ]
            }
            None => self.spec.to_args(),
        };
        self.note(&format!(
            "start #{} with {args:?} env {:?}",
            self.starts,
            self.spec.get_env()
        ));
        let log = open_append(&self.log_path());
        let child = std::process::Command::new(&self.binary)
            .args(&args)
            .envs(self.spec.get_env().iter().map(|(k, v)| (k, v)))
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone the log file handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", self.binary.display()));
        self.child = Some(child);
        Instant::now()
    }

    /// Starts the member (see [`Member::spawn`]) and waits until it is ready
    /// ([`Member::wait_ready`]). The previous process must have been stopped
    /// ([`Member::kill9`], [`Member::terminate`]).
    pub fn restart(&mut self) {
        self.spawn();
        self.wait_ready();
    }

    /// Crashes the member: SIGKILL, then reaps it. No-op when it is stopped.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            // `Child::kill` is SIGKILL on Unix (also for a SIGSTOPped process). An error means
            // it already exited; reap it anyway.
            let _ = child.kill();
            let status = child.wait().expect("reap the killed member");
            self.note(&format!("SIGKILLed by the test ({status})"));
        }
    }

    /// Graceful shutdown: SIGTERM, then waits up to [`SHUTDOWN_TIMEOUT`] for the exit and
    /// returns its status. Panics (after SIGKILL) if it does not exit in time, or if the member
    /// is not running.
    pub fn terminate(&mut self) -> ExitStatus {
        let mut child = self
            .child
            .take()
            .expect("terminate: the member is not running");
        if let Err(e) = signal(child.id(), libc::SIGTERM) {
            panic!("kill(SIGTERM) failed: {e}");
        }
        let deadline = Instant::now() + SHUTDOWN_TIMEOUT;
        loop {
            if let Some(status) = child.try_wait().expect("try_wait on the member") {
                self.note(&format!("exited after SIGTERM ({status})"));
                return status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{} did not exit within {SHUTDOWN_TIMEOUT:?} after SIGTERM\n{}",
                    self.name(),
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Freezes the process with SIGSTOP: it keeps its sockets but answers nothing. Panics if
    /// it is not running or the signal fails.
    pub fn pause(&mut self) {
        self.send(libc::SIGSTOP, "SIGSTOP");
    }

    /// SIGCONT after [`Member::pause`].
    pub fn resume(&mut self) {
        self.send(libc::SIGCONT, "SIGCONT");
    }

    fn send(&mut self, sig: libc::c_int, what: &str) {
        let pid = self
            .pid()
            .unwrap_or_else(|| panic!("{what}: {} is not running", self.name()));
        signal(pid, sig).unwrap_or_else(|e| panic!("{what} to {}: {e}", self.name()));
        self.note(what);
    }

    /// Waits up to [`READY_TIMEOUT`] until the member answers a linearizable Range (which needs
    /// an elected leader and an applied log).
    pub fn wait_ready(&mut self) {
        self.wait_ready_within(READY_TIMEOUT);
    }

    /// [`Member::wait_ready`] with another bound (members of a cluster need a quorum first).
    /// Panics with the log tail if the process exits or the time runs out.
    pub fn wait_ready_within(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let endpoint = self.endpoint();
        let mut last_error = String::from("no probe finished");
        while Instant::now() < deadline {
            self.assert_alive();
            match grpc::probe_ready(&endpoint, Duration::from_secs(2)) {
                Ok(()) => return,
                Err(e) => last_error = e,
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "{} was not ready within {timeout:?} on {endpoint}: last probe error: \
             {last_error}\n{}",
            self.name(),
            self.log_tail()
        );
    }

    /// Panics (with the log tail) if the process exited by itself.
    pub fn assert_alive(&mut self) {
        if let Some(child) = self.child.as_mut()
            && let Some(status) = child.try_wait().expect("try_wait on the member")
        {
            self.child = None;
            panic!(
                "{} exited ({status}); args {:?}\n{}",
                self.name(),
                self.spec.to_args(),
                self.log_tail()
            );
        }
    }

    /// Waits up to `timeout` for the process to exit by itself and returns its status, or
    /// `None` if it still runs (it is left running).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let child = self.child.as_mut()?;
            if let Some(status) = child.try_wait().expect("try_wait on the member") {
                self.child = None;
                self.note(&format!("exited by itself ({status})"));
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The whole member log so far (all starts).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Waits up to `limit` for `needle` to appear in the member log; true once it has. Lines
    /// reach the file after the work they report, so a test that saw the work's effect through
    /// the API still waits for the line.
    pub fn wait_for_log(&self, needle: &str, limit: Duration) -> bool {
        self.wait_for_log_line(|line| line.contains(needle), limit)
    }

    /// Waits up to `limit` for a line of the member log that `matches`; true once one has.
    pub fn wait_for_log_line(&self, matches: impl Fn(&str) -> bool, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            if self.log().lines().any(&matches) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits up to `limit` for the member to compact its raft log to index `at_least` or
    /// beyond (its `compacted Raft logs compact_index=N` line, etcd's line for the step); true
    /// once it has. A leader compacts only while no replication to a follower needs the
    /// entries, so a test that wants a stopped follower to be sent a snapshot waits for this
    /// before restarting it.
    pub fn wait_for_raft_log_compaction(&self, at_least: u64, limit: Duration) -> bool {
        self.wait_for_log_line(
            |line| compact_index(line).is_some_and(|index| index >= at_least),
            limit,
        )
    }

    /// The last lines of the member log, framed for a panic message.
    pub fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        let from = lines.len().saturating_sub(LOG_TAIL_LINES);
        format!(
            "---- {}: last {} lines of {} ----\n{}\n---- end of the log of {} ----",
            self.name(),
            lines.len() - from,
            self.log_path().display(),
            lines[from..].join("\n"),
            self.name()
        )
    }

    fn write_config_file(&self, extra_yaml: &str) {
        // Single-quoted so YAML reads every value (URLs, paths) as a plain string.
        let mut yaml: String = self
            .spec
            .settings()
            .into_iter()
            .map(|(key, value)| format!("{key}: '{value}'\n"))
            .collect();
        yaml.push_str(extra_yaml);
        std::fs::write(self.config_path(), yaml).expect("write the member's config file");
    }

    /// Appends a banner line to the member log, so restarts and signals are visible in it.
    pub fn note(&self, what: &str) {
        let mut log = open_append(&self.log_path());
        let _ = writeln!(log, "==== keel-testkit: {what}");
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        if self.spec.get_client_tls().is_some() {
            crate::tls::unregister(&self.endpoint());
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("{}", self.log_tail());
        }
    }
}

/// A single-member cluster named `name` on two free loopback ports.
fn single(name: &str) -> MemberSpec {
    let ports = free_ports(2);
    MemberSpec::single(name, ports[0], ports[1])
}

/// `host:port` of a client URL.
fn endpoint_of_url(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.trim_end_matches('/').to_string()
}

fn open_append(path: &Path) -> File {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}

/// The index of a `compacted Raft logs` log line, if `line` is one.
fn compact_index(line: &str) -> Option<u64> {
    let (_, rest) = line.split_once("compacted Raft logs compact_index=")?;
    rest.split_whitespace().next()?.parse().ok()
}
