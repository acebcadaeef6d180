//! Runs the real `etcdctl` (v3 API) against a test member, the way users and the conformance
//! suite (`../shared/conformance/run.py`) run it.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Hard bound on one etcdctl invocation; its own `--command-timeout` is 5 s.
const PROCESS_TIMEOUT: Duration = Duration::from_secs(30);

/// What one etcdctl invocation produced.
#[derive(Debug, Clone)]
pub struct CtlOutput {
    /// Exit code (`None` if killed by a signal).
    pub code: Option<i32>,
    /// Everything written to stdout.
    pub stdout: String,
    /// Everything written to stderr (etcdctl's JSON log lines included).
    pub stderr: String,
}

impl CtlOutput {
    /// stdout split into lines (no trailing empty line).
    pub fn lines(&self) -> Vec<&str> {
        self.stdout.lines().collect()
    }

    /// The `Error: ...` lines of stderr, i.e. what etcdctl reports to the user, without its
    /// structured JSON log lines (retry warnings carry timestamps and client ids).
    pub fn error_lines(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| l.starts_with("Error:"))
            .collect()
    }

    /// Asserts exit code 0 and returns `self`.
    #[track_caller]
    pub fn ok(&self) -> &Self {
        assert_eq!(self.code, Some(0), "etcdctl failed: {self:#?}");
        self
    }

    /// Asserts exit code 1 with exactly one `Error:` line equal to `expected`.
    #[track_caller]
    pub fn fails_with(&self, expected: &str) {
        assert_eq!(
            self.code,
            Some(1),
            "etcdctl should fail with {expected:?}: {self:#?}"
        );
        assert_eq!(
            self.error_lines(),
            vec![expected],
            "etcdctl stderr: {self:#?}"
        );
        assert_eq!(self.stdout, "", "etcdctl stdout on error: {self:#?}");
    }

    /// Parses stdout as one JSON document (after asserting success).
    #[track_caller]
    pub fn json(&self) -> serde_json::Value {
        self.ok();
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("etcdctl stdout is not JSON ({e}): {self:#?}"))
    }
}

/// Path of `etcdctl`: `$ETCDCTL_BIN` if set, else the first `etcdctl` on `PATH`. Panics with
/// the install command if there is none.
pub fn etcdctl_path() -> PathBuf {
    if let Some(bin) = std::env::var_os("ETCDCTL_BIN") {
        return PathBuf::from(bin);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("etcdctl"))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!(
                "etcdctl not found on PATH: these tests drive the real etcd client. Install it \
                 with `apt-get install -y etcd-client` (scripts/test.sh does this), or set \
                 ETCDCTL_BIN=/path/to/etcdctl"
            )
        })
}

/// Runs `etcdctl --endpoints=<endpoint> --dial-timeout=3s --command-timeout=5s <args>` with
/// `ETCDCTL_API=3` and an empty stdin.
pub fn etcdctl(endpoint: &str, args: &[&str]) -> CtlOutput {
    etcdctl_stdin(endpoint, args, "")
}

/// Like [`etcdctl`], feeding `stdin` (e.g. the interactive `txn` form, or a value for
/// `put <key>`). Bounded by [`PROCESS_TIMEOUT`]: a hung etcdctl is killed and the test fails.
pub fn etcdctl_stdin(endpoint: &str, args: &[&str], stdin: &str) -> CtlOutput {
    // Outputs go to temp files, not pipes, so a large output can never block the child while
    // we wait for it.
    let mut out = tempfile::tempfile().expect("temp file for etcdctl stdout");
    let mut err = tempfile::tempfile().expect("temp file for etcdctl stderr");
    let mut cmd = Command::new(etcdctl_path());
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("ETCDCTL_") {
            cmd.env_remove(&key);
        }
    }
    let mut child = cmd
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"))
        .args(["--dial-timeout=3s", "--command-timeout=5s"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(out.try_clone().expect("clone stdout file"))
        .stderr(err.try_clone().expect("clone stderr file"))
        .spawn()
        .unwrap_or_else(|e| panic!("spawn etcdctl: {e}"));
    let mut pipe = child.stdin.take().expect("etcdctl stdin is piped");
    let input = stdin.as_bytes().to_vec();
    // A writer thread, so a child that stops reading cannot block the bounded wait below.
    // etcdctl may exit before reading everything (e.g. on a bad flag); its exit code tells, so
    // a write error is ignored. Dropping the pipe closes stdin, which ends the interactive forms.
    let writer = std::thread::spawn(move || {
        let _ = pipe.write_all(&input);
    });
    let deadline = Instant::now() + PROCESS_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait on etcdctl") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("etcdctl {args:?} did not finish within {PROCESS_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // The child exited, so its end of the pipe is closed and the writer has returned.
    let _ = writer.join();
    CtlOutput {
        code: status.code(),
        stdout: read_all(&mut out),
        stderr: read_all(&mut err),
    }
}

fn read_all(file: &mut std::fs::File) -> String {
    let mut text = String::new();
    file.seek(SeekFrom::Start(0)).expect("rewind output file");
    file.read_to_string(&mut text)
        .expect("etcdctl output is UTF-8");
    text
}
