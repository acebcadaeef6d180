//! One `keel` member process of the cluster under test: spawn with a fixed flag set, SIGKILL,
//! SIGSTOP/SIGCONT, graceful stop, restart. Output goes to `<run dir>/<name>.log`, appended
//! across starts with one `==== keel-chaos:` banner line per event, so a failed run's logs tell
//! what the harness did to the member and when.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

/// How long a SIGTERMed member may take to exit before it is SIGKILLed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// A member process and how to start it again.
pub struct MemberProcess {
    binary: PathBuf,
    log_path: PathBuf,
    child: Option<Child>,
    paused: bool,
    /// Process starts so far (the `epoch` of `History::member_revisions`).
    starts: u32,
}

impl MemberProcess {
    /// A member that is not started yet; `log_path` collects its output.
    pub fn new(binary: PathBuf, log_path: PathBuf) -> MemberProcess {
        MemberProcess {
            binary,
            log_path,
            child: None,
            paused: false,
            starts: 0,
        }
    }

    /// Starts the process with `args` and extra environment `env` (e.g. `FAILPOINTS`).
    /// Returns the new epoch (start count).
    ///
    /// Errors: when it is already running, or the binary cannot be spawned.
    pub fn start(&mut self, args: &[String], env: &[(String, String)]) -> anyhow::Result<u32> {
        anyhow::ensure!(self.child.is_none(), "member is already running");
        let env_note: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        self.note(&format!("start {env_note:?} {args:?}"));
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)?;
        let child = Command::new(&self.binary)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| anyhow::anyhow!("spawn {}: {e}", self.binary.display()))?;
        self.child = Some(child);
        self.paused = false;
        self.starts += 1;
        Ok(self.starts)
    }

    /// Whether a process runs (it may be paused); reaps it if it exited on its own.
    pub fn is_running(&mut self) -> bool {
        if let Some(child) = self.child.as_mut()
            && let Ok(Some(status)) = child.try_wait()
        {
            self.note(&format!("exited on its own: {status}"));
            self.child = None;
            self.paused = false;
        }
        self.child.is_some()
    }

    /// The OS process ID while a process runs (it may be paused or have exited unreaped).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// Whether the process is stopped by SIGSTOP.
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// SIGKILL and reap (a crash). No-op when not running.
    pub async fn kill(&mut self, why: &str) {
        if let Some(mut child) = self.child.take() {
            self.note(&format!("SIGKILL ({why})"));
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
        self.paused = false;
    }

    /// SIGTERM, wait up to 10 s, then SIGKILL. No-op when not running.
    pub async fn stop(&mut self) {
        if self.paused {
            self.resume();
        }
        let Some(mut child) = self.child.take() else {
            return;
        };
        self.note("SIGTERM");
        if let Some(pid) = child.id() {
            signal(pid, libc::SIGTERM);
        }
        if tokio::time::timeout(STOP_TIMEOUT, child.wait())
            .await
            .is_err()
        {
            self.note("no exit within 10 s of SIGTERM: SIGKILL");
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// Runs `binary` from the next start on (a rolling upgrade or downgrade swaps it while
    /// the member is stopped).
    pub fn set_binary(&mut self, binary: PathBuf) {
        self.note(&format!("binary is now {}", binary.display()));
        self.binary = binary;
    }

    /// SIGSTOP (the process keeps its sockets but answers nothing).
    pub fn pause(&mut self) {
        if let Some(pid) = self.child.as_ref().and_then(Child::id) {
            self.note("SIGSTOP");
            signal(pid, libc::SIGSTOP);
            self.paused = true;
        }
    }

    /// SIGCONT after [`MemberProcess::pause`].
    pub fn resume(&mut self) {
        if let Some(pid) = self.child.as_ref().and_then(Child::id) {
            self.note("SIGCONT");
            signal(pid, libc::SIGCONT);
        }
        self.paused = false;
    }

    /// Waits up to `timeout` for the process to exit on its own; true if it did.
    pub async fn wait_exit(&mut self, timeout: Duration) -> bool {
        let Some(child) = self.child.as_mut() else {
            return true;
        };
        match tokio::time::timeout(timeout, child.wait()).await {
            Ok(status) => {
                self.note(&format!("exited: {status:?}"));
                self.child = None;
                self.paused = false;
                true
            }
            Err(_) => false,
        }
    }

    /// The binary the next start runs.
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// The member's log file.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Appends a harness banner line to the member's log.
    pub fn note(&self, what: &str) {
        if let Ok(mut f) = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
        {
            let _ = writeln!(f, "==== keel-chaos: {what}");
        }
    }
}

fn signal(pid: u32, sig: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill(2) on the PID of our own child, which we have not reaped yet.
        unsafe { libc::kill(pid, sig) };
    }
}
