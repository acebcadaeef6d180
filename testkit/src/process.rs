//! Helper processes run to completion within a time bound (etcdctl, `keel-chaos`, `keel-bench`,
//! `keel --version`), and facts about running processes (signals, resident memory).

use std::io::{Read, Seek, SeekFrom, Write};
use std::ops::{Deref, DerefMut};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What a finished process printed.
#[derive(Debug, Clone)]
pub struct Output {
    /// Exit code (`None` if killed by a signal).
    pub code: Option<i32>,
    /// Everything written to stdout.
    pub stdout: String,
    /// Everything written to stderr.
    pub stderr: String,
}

impl Output {
    /// Both outputs and the exit code, for assertion messages.
    pub fn dump(&self) -> String {
        format!(
            "exit code {:?}\n---- stdout ----\n{}\n---- stderr ----\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Runs `command` with `stdin` fed to its standard input (then closed) and waits for it to
/// exit; a process still running after `limit` is SIGKILLed and the test panics with what it
/// printed so far.
///
/// Outputs go to temp files, not pipes, so a large output can never block the child while it
/// is waited for. Panics if the process cannot be spawned or its output is not UTF-8.
pub fn run_bounded(command: &mut Command, stdin: &str, limit: Duration) -> Output {
    let mut out = tempfile::tempfile().expect("temp file for stdout");
    let mut err = tempfile::tempfile().expect("temp file for stderr");
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(out.try_clone().expect("clone the stdout file"))
        .stderr(err.try_clone().expect("clone the stderr file"))
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {command:?}: {e}"));
    let mut pipe = child.stdin.take().expect("stdin is piped");
    let input = stdin.as_bytes().to_vec();
    // A writer thread, so a child that stops reading cannot block the bounded wait below. The
    // child may exit before reading everything (e.g. on a bad flag); its exit code tells, so a
    // write error is ignored. Dropping the pipe closes stdin, which ends interactive forms.
    let writer = std::thread::spawn(move || {
        let _ = pipe.write_all(&input);
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait on a helper process") {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // The child exited, so its end of the pipe is closed and the writer has returned.
    let _ = writer.join();
    let output = Output {
        code: status.and_then(|s| s.code()),
        stdout: read_all(&mut out),
        stderr: read_all(&mut err),
    };
    assert!(
        status.is_some(),
        "{command:?} did not finish within {limit:?}\n{}",
        output.dump()
    );
    output
}

fn read_all(file: &mut std::fs::File) -> String {
    let mut text = String::new();
    file.seek(SeekFrom::Start(0))
        .expect("rewind an output file");
    file.read_to_string(&mut text)
        .expect("process output is UTF-8");
    text
}

/// A child process (a helper in the background, or a member outside [`crate::Member`]) that is
/// SIGKILLed and reaped when dropped, so a failing assertion never leaks it.
pub struct KillOnDrop(pub Child);

impl Deref for KillOnDrop {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends signal `sig` (e.g. `libc::SIGSTOP`) to process `pid`.
///
/// Callers pass the PID of a child they spawned and have not reaped yet, so it cannot have been
/// recycled for another process. Errors: kill(2)'s.
pub fn signal(pid: u32, sig: libc::c_int) -> std::io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(std::io::Error::other)?;
    // SAFETY: plain kill(2); see the doc comment for why the PID is ours.
    if unsafe { libc::kill(pid, sig) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Resident set size of process `pid` in KiB (`VmRSS` of Linux `/proc/<pid>/status`), `None`
/// if it cannot be read.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_feed_stdin_and_capture_both_outputs() {
        let out = run_bounded(
            Command::new("sh").args(["-c", "cat; echo oops >&2; exit 3"]),
            "hello",
            Duration::from_secs(10),
        );
        assert_eq!(
            (out.code, out.stdout.as_str(), out.stderr.as_str()),
            (Some(3), "hello", "oops\n")
        );
    }

    #[test]
    #[should_panic(expected = "did not finish within")]
    fn a_hung_process_is_killed_and_fails_the_test() {
        run_bounded(
            Command::new("sleep").arg("30"),
            "",
            Duration::from_millis(200),
        );
    }

    #[test]
    fn own_rss_is_readable() {
        assert!(rss_kib(std::process::id()).is_some_and(|kib| kib > 0));
    }
}
