//! Runs the `keel-chaos` binary from a test, bounded in time, on this repository's port range.
//!
//! Binaries: `keel-chaos` is `CARGO_BIN_EXE_keel-chaos`; `keel` is `$KEEL_BIN`, else the
//! `keel` cargo built next to this test (`target/<profile>/keel`, which `cargo test
//! --workspace` builds).

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Ports the chaos tests' members and proxies use.
pub const PORT_RANGE: &str = "26000-27999";

/// What a finished run printed.
pub struct Finished {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    /// `(ops, faults, violations)` from the last line `chaos: N ops, F faults, V violations`.
    pub fn totals(&self) -> (u64, u64, u64) {
        let last = self.stdout.lines().last().unwrap_or_default();
        let nums: Vec<u64> = last
            .trim_start_matches("chaos: ")
            .split(", ")
            .filter_map(|part| part.split(' ').next()?.parse().ok())
            .collect();
        assert!(
            last.starts_with("chaos: ") && nums.len() == 3,
            "no `chaos: N ops, F faults, V violations` last line:\n{}",
            self.dump()
        );
        (nums[0], nums[1], nums[2])
    }

    /// Both outputs, for assertion messages.
    pub fn dump(&self) -> String {
        format!(
            "exit code {:?}\n---- stdout ----\n{}\n---- stderr ----\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// The `keel` binary of this build (see the module docs).
pub fn keel_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("KEEL_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/keel
    let path = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("keel"))
        .expect("target dir layout");
    assert!(
        path.is_file(),
        "{} is missing: build it first (`cargo build --bin keel`, or run the tests with \
         `cargo test --workspace`), or set KEEL_BIN",
        path.display()
    );
    path
}

/// Runs `keel-chaos <args> --port-range 26000-27999 --keel-bin <keel>`, killing it after
/// `limit`.
pub fn run_chaos(keel: &std::path::Path, args: &[&str], limit: Duration) -> Finished {
    let mut child = Command::new(env!("CARGO_BIN_EXE_keel-chaos"))
        .args(args)
        .args(["--port-range", PORT_RANGE, "--keel-bin"])
        .arg(keel)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn keel-chaos");
    let mut stdout_pipe = child.stdout.take().expect("stdout pipe");
    let mut stderr_pipe = child.stderr.take().expect("stderr pipe");
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout_pipe.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr_pipe.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait keel-chaos") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let finished = Finished {
        code: status.and_then(|s| s.code()),
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    };
    assert!(
        status.is_some(),
        "keel-chaos did not finish within {limit:?}\n{}",
        finished.dump()
    );
    finished
}
