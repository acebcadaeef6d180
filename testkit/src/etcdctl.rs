//! Runs the real `etcdctl` (v3 API) against a test member, the way users and the conformance
//! suite (`../shared/conformance/run.py`) run it.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::process::{Output, run_bounded};

/// Hard bound on one etcdctl invocation; its own `--command-timeout` is 5 s.
pub const PROCESS_TIMEOUT: Duration = Duration::from_secs(30);

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

impl From<Output> for CtlOutput {
    fn from(out: Output) -> CtlOutput {
        CtlOutput {
            code: out.code,
            stdout: out.stdout,
            stderr: out.stderr,
        }
    }
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

/// `etcdctl --endpoints=<endpoints> --dial-timeout=3s <args>` with `ETCDCTL_API=3` and no other
/// `ETCDCTL_*` variable of the test's environment, not started: for the long-running forms
/// (`watch`, `lease keep-alive`) a test runs in the background. `endpoints` is one
/// `127.0.0.1:P` or several joined by commas; for a registered TLS member
/// ([`crate::tls::register`]) they become `https://` and the client's `--cacert --cert --key`
/// are added.
pub fn command(endpoints: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(etcdctl_path());
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("ETCDCTL_") {
            cmd.env_remove(&key);
        }
    }
    // A TLS member (crate::tls): https:// endpoints and the registered client's files.
    let first = endpoints.split(',').next().unwrap_or_default();
    let (endpoints, tls_flags) = match crate::tls::lookup(first) {
        Some(client) => {
            let https: Vec<String> = endpoints
                .split(',')
                .map(|e| format!("https://{e}"))
                .collect();
            (https.join(","), client.etcdctl_flags())
        }
        None => (endpoints.to_string(), Vec::new()),
    };
    cmd.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoints}"))
        .args(tls_flags)
        .arg("--dial-timeout=3s")
        .args(args);
    cmd
}

/// Runs `etcdctl --endpoints=<endpoints> --dial-timeout=3s --command-timeout=5s <args>` (see
/// [`command`]) with an empty stdin.
pub fn etcdctl(endpoints: &str, args: &[&str]) -> CtlOutput {
    etcdctl_stdin(endpoints, args, "")
}

/// Like [`etcdctl`], feeding `stdin` (e.g. the interactive `txn` form, or a value for
/// `put <key>`). Bounded by [`PROCESS_TIMEOUT`]: a hung etcdctl is killed and the test fails.
pub fn etcdctl_stdin(endpoints: &str, args: &[&str], stdin: &str) -> CtlOutput {
    let mut cmd = command(endpoints, &["--command-timeout=5s"]);
    cmd.args(args);
    run_bounded(&mut cmd, stdin, PROCESS_TIMEOUT).into()
}

/// The store revision `endpoints` report: `header.revision` of `get <probe key> -w json` (a
/// linearizable read).
pub fn revision(endpoints: &str) -> i64 {
    let out = etcdctl(endpoints, &["get", "keel-e2e-revision-probe", "-w", "json"]).json();
    out["header"]["revision"]
        .as_i64()
        .unwrap_or_else(|| panic!("no header.revision in {out}"))
}

/// The KV hash of the member at `endpoint` at revision `rev`: `HashKV.hash` of `etcdctl
/// endpoint hashkv --rev <rev> -w json` (etcd's `Maintenance.HashKV`, equal on members that
/// applied the same history).
pub fn hashkv(endpoint: &str, rev: i64) -> u64 {
    let rev = rev.to_string();
    let out = etcdctl(
        endpoint,
        &["endpoint", "hashkv", "--rev", &rev, "-w", "json"],
    )
    .json();
    out[0]["HashKV"]["hash"]
        .as_u64()
        .unwrap_or_else(|| panic!("no HashKV.hash in {out}"))
}

/// [`hashkv`] of each of `endpoints` at `rev`, in order.
pub fn hashkvs<S: AsRef<str>>(endpoints: impl IntoIterator<Item = S>, rev: i64) -> Vec<u64> {
    endpoints
        .into_iter()
        .map(|endpoint| hashkv(endpoint.as_ref(), rev))
        .collect()
}
