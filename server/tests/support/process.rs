//! A real `keel` member process for end-to-end tests.
//!
//! [`Keel`] starts the binary cargo built for this test run (`CARGO_BIN_EXE_keel`) as a
//! single-member cluster with etcd's flags, on a fresh temp data dir and free 127.0.0.1 ports.
//! It can kill the member with SIGKILL (a crash), stop it with SIGTERM (a graceful shutdown),
//! and restart it on the same data dir and ports. The member's stdout and stderr go to
//! `<tempdir>/keel.log` (appended across restarts, one banner line per start), and dropping a
//! [`Keel`] SIGKILLs the member; when the test is already panicking, the tail of that log is
//! printed so the failure explains itself.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::grpc;
use super::ports::free_ports;

/// How long a member may take from spawn to answering a linearizable Range.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a member may take to exit after SIGTERM.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(15);
/// How many log lines a failure report shows.
const LOG_TAIL_LINES: usize = 60;
/// Member name of test members unless a test picks another (etcd's default, `--name default`).
pub const MEMBER_NAME: &str = "default";

/// How the member gets its settings.
enum Launch {
    /// etcd's command-line flags ([`Keel::cluster_args`]) plus extra flags.
    Flags(Vec<String>),
    /// `--config-file <tempdir>/keel.yaml` only: the same settings in etcd's YAML keys, plus
    /// extra YAML lines. (etcd ignores the other flags when a config file is given.)
    ConfigFile(String),
}

/// A `keel` member process owned by a test. See the module docs.
pub struct Keel {
    child: Option<Child>,
    /// Owns the data dir and the log file; removed on drop.
    dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
    name: String,
    launch: Launch,
    starts: u32,
    /// Extra environment variables of the next starts (see [`Keel::set_env`]).
    env: Vec<(String, String)>,
}

impl Keel {
    /// Starts a fresh member with the default flags and waits until it is ready.
    ///
    /// Panics (with the member's log) if it is not ready within [`READY_TIMEOUT`].
    pub fn start() -> Keel {
        Keel::start_with(&[])
    }

    /// Starts a fresh member with `extra_args` appended to the cluster flags (e.g.
    /// `["--max-txn-ops", "2"]`); they are passed again on every restart.
    pub fn start_with(extra_args: &[&str]) -> Keel {
        let extra = extra_args.iter().map(|s| s.to_string()).collect();
        Keel::launch(MEMBER_NAME, Launch::Flags(extra))
    }

    /// Starts a fresh member named `name` from `--config-file` alone: a YAML file with the
    /// cluster settings of [`Keel::cluster_args`] under etcd's config keys (`name`, `data-dir`,
    /// `listen-client-urls`, ...) followed by `extra_yaml` (e.g. `"max-txn-ops: 2\n"`).
    pub fn start_with_config_file(name: &str, extra_yaml: &str) -> Keel {
        Keel::launch(name, Launch::ConfigFile(extra_yaml.to_string()))
    }

    fn launch(name: &str, launch: Launch) -> Keel {
        let dir = tempfile::Builder::new()
            .prefix("keel-e2e-")
            .tempdir()
            .expect("create a temp dir for the member");
        let ports = free_ports(2);
        let mut keel = Keel {
            child: None,
            dir,
            client_port: ports[0],
            peer_port: ports[1],
            name: name.to_string(),
            launch,
            starts: 0,
            env: Vec::new(),
        };
        keel.spawn();
        keel.wait_ready();
        keel
    }

    /// `127.0.0.1:<client port>`, the form etcdctl's `--endpoints` takes.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// `http://127.0.0.1:<client port>`, as given to `--advertise-client-urls`.
    pub fn client_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// `http://127.0.0.1:<peer port>`, as given to `--initial-advertise-peer-urls`.
    pub fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }

    /// The member's `--data-dir` (created by `keel` itself on first start).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The file that collects the member's stdout and stderr over all starts.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("keel.log")
    }

    /// The OS process id of the running member, `None` while it is stopped.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sets (`Some`) or removes (`None`) environment variable `key` for the next starts
    /// (e.g. `FAILPOINTS` of a failpoint build); the running process is not affected.
    pub fn set_env(&mut self, key: &str, value: Option<&str>) {
        self.env.retain(|(k, _)| k != key);
        if let Some(v) = value {
            self.env.push((key.to_string(), v.to_string()));
        }
    }

    /// The member's `--name`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The settings of a single-member cluster on this member's ports and data dir, as
    /// (etcd flag name without `--`, value) pairs; the same names are etcd's YAML config keys.
    pub fn cluster_settings(&self) -> Vec<(&'static str, String)> {
        let (client, peer) = (self.client_url(), self.peer_url());
        vec![
            ("name", self.name.clone()),
            ("data-dir", self.data_dir().display().to_string()),
            ("listen-client-urls", client.clone()),
            ("advertise-client-urls", client),
            ("listen-peer-urls", peer.clone()),
            ("initial-advertise-peer-urls", peer.clone()),
            ("initial-cluster", format!("{}={peer}", self.name)),
            ("initial-cluster-state", "new".to_string()),
        ]
    }

    /// [`Keel::cluster_settings`] as command-line flags.
    pub fn cluster_args(&self) -> Vec<String> {
        self.cluster_settings()
            .into_iter()
            .flat_map(|(flag, value)| [format!("--{flag}"), value])
            .collect()
    }

    /// Path of the YAML config file of members started with [`Keel::start_with_config_file`].
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("keel.yaml")
    }

    /// Crashes the member: SIGKILL to its PID, then reaps it. No-op when it is stopped.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            // `Child::kill` is SIGKILL on Unix. An error means it already exited; reap it anyway.
            let _ = child.kill();
            let status = child.wait().expect("reap the killed member");
            self.note(&format!("SIGKILLed by the test ({status})"));
        }
    }

    /// Graceful shutdown: SIGTERM to the member's PID, then waits up to [`SHUTDOWN_TIMEOUT`]
    /// for it to exit and returns its exit status. Panics (after SIGKILL) if it does not exit
    /// in time, or if the member is not running.
    pub fn terminate(&mut self) -> ExitStatus {
        let mut child = self
            .child
            .take()
            .expect("terminate: the member is not running");
        let pid = libc::pid_t::try_from(child.id()).expect("pid fits pid_t");
        // SAFETY: plain kill(2) on the PID of a child we spawned and have not reaped yet, so
        // the PID cannot have been recycled for another process.
        let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
        assert_eq!(
            rc,
            0,
            "kill(SIGTERM) failed: {}",
            std::io::Error::last_os_error()
        );
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
                    "keel did not exit within {SHUTDOWN_TIMEOUT:?} after SIGTERM\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the member again on the same data dir, ports and flags, and waits until it is
    /// ready. The previous process must have been stopped ([`Keel::kill9`],
    /// [`Keel::terminate`]).
    pub fn restart(&mut self) {
        assert!(
            self.child.is_none(),
            "restart: stop the running member first"
        );
        self.spawn();
        self.wait_ready();
    }

    /// Starts the member again without waiting for readiness and returns the time of spawn
    /// (for tests that measure recovery time or expect a failed start).
    pub fn respawn(&mut self) -> Instant {
        assert!(
            self.child.is_none(),
            "respawn: stop the running member first"
        );
        self.spawn();
        Instant::now()
    }

    /// Waits up to [`READY_TIMEOUT`] until the member answers a linearizable Range (which needs
    /// an elected leader and an applied log). Panics with the log tail if the process exits or
    /// the time runs out.
    pub fn wait_ready(&mut self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        let endpoint = self.endpoint();
        let mut last_error = String::from("no probe finished");
        while Instant::now() < deadline {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().transpose()) {
                let status = status.expect("try_wait on the member");
                self.child = None;
                panic!(
                    "keel exited during start-up ({status}); args {:?}\n{}",
                    self.all_args(),
                    self.log_tail()
                );
            }
            match grpc::probe_ready(&endpoint, Duration::from_secs(2)) {
                Ok(()) => return,
                Err(e) => last_error = e,
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "keel was not ready within {READY_TIMEOUT:?} on {endpoint}: last probe error: \
             {last_error}\n{}",
            self.log_tail()
        );
    }

    /// Waits up to `timeout` for the member process to exit by itself and returns its status,
    /// or `None` if it is still running (it is left running).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let child = self.child.as_mut()?;
            if let Some(status) = child.try_wait().expect("try_wait on the member") {
                self.child = None;
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

    /// The last lines of the member log, framed for a panic message.
    pub fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        let from = lines.len().saturating_sub(LOG_TAIL_LINES);
        format!(
            "---- last {} lines of {} ----\n{}\n---- end of keel log ----",
            lines.len() - from,
            self.log_path().display(),
            lines[from..].join("\n")
        )
    }

    fn all_args(&self) -> Vec<String> {
        match &self.launch {
            Launch::Flags(extra) => {
                let mut args = self.cluster_args();
                args.extend(extra.iter().cloned());
                args
            }
            Launch::ConfigFile(_) => {
                vec![
                    "--config-file".to_string(),
                    self.config_path().display().to_string(),
                ]
            }
        }
    }

    fn write_config_file(&self, extra_yaml: &str) {
        // Single-quoted so YAML reads every value (URLs, paths) as a plain string.
        let mut yaml: String = self
            .cluster_settings()
            .into_iter()
            .map(|(key, value)| format!("{key}: '{value}'\n"))
            .collect();
        yaml.push_str(extra_yaml);
        std::fs::write(self.config_path(), yaml).expect("write the member's config file");
    }

    fn spawn(&mut self) {
        self.starts += 1;
        if let Launch::ConfigFile(extra_yaml) = &self.launch {
            self.write_config_file(extra_yaml);
        }
        let args = self.all_args();
        self.note(&format!(
            "start #{} with {:?} env {:?}",
            self.starts, args, self.env
        ));
        let log = open_append(&self.log_path());
        let binary = member_binary();
        let child = Command::new(&binary)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone the log file handle"))
            .stderr(log)
            .env("RUST_BACKTRACE", "1")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", binary.display()));
        self.child = Some(child);
    }

    /// Appends a banner line to the member log so restarts are visible in it.
    fn note(&self, what: &str) {
        let mut log = open_append(&self.log_path());
        let _ = writeln!(log, "==== keel-e2e harness: {what}");
    }
}

impl Drop for Keel {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("{}", self.log_tail());
        }
    }
}

/// The member binary: the `keel` cargo built for this test run, or `$KEEL_E2E_BIN` if set.
///
/// The override runs the same tests against any binary with etcd's flags; pointing it at a real
/// etcd (`KEEL_E2E_BIN=$(command -v etcd)`) checks the tests' own expectations.
pub fn member_binary() -> PathBuf {
    std::env::var_os("KEEL_E2E_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_keel")))
}

fn open_append(path: &Path) -> File {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}
