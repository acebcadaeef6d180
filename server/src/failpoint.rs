//! Failpoints for crash and fault testing (docs/failpoints.md), from the `fail` crate.
//!
//! They exist only in builds with the `failpoints` cargo feature of keel-server; without it
//! [`crash_point!`] expands to nothing and [`hit`] is a constant `false`, so the normal build
//! pays nothing. With the feature, `keel` reads the `FAILPOINTS` environment variable at
//! start-up (`fail::FailScenario::setup`), e.g. `FAILPOINTS='wal_before_fsync=20*off->return'`
//! or `FAILPOINTS='wal_slow_fsync=sleep(200)'` (the `fail` crate's action syntax: `off`,
//! `return`, `sleep(ms)`, `delay(ms)`, `panic`, `print`, `pause`, with `N%` and `N*` prefixes
//! and `->` chains).

/// Evaluates failpoint `$name` (a string literal): its `return` action aborts the process
/// ([`crash`]); `sleep(ms)`/`delay(ms)` and the other actions behave as in the `fail` crate.
/// Expands to nothing without the `failpoints` feature.
macro_rules! crash_point {
    ($name:literal) => {
        #[cfg(feature = "failpoints")]
        {
            if $crate::failpoint::hit($name) {
                $crate::failpoint::crash($name);
            }
        }
    };
}
pub(crate) use crash_point;

/// Whether failpoint `name` fired with a `return` action (other actions, such as `sleep`, run
/// inside and yield `false`). Always `false` without the `failpoints` feature.
#[inline(always)]
pub fn hit(name: &str) -> bool {
    #[cfg(feature = "failpoints")]
    {
        fail::eval(name, |_| ()).is_some()
    }
    #[cfg(not(feature = "failpoints"))]
    {
        let _ = name;
        false
    }
}

/// Ends the process at once with `abort(2)` (SIGABRT), like a SIGKILL: no destructors run and
/// nothing buffered is flushed. Prints the failpoint's name to stderr first, so a test can
/// tell this crash from any other.
pub fn crash(name: &str) -> ! {
    eprintln!("keel: failpoint {name} fired: aborting");
    std::process::abort()
}

/// An injected I/O error: when failpoint `name` fires with `return`, the `errno` error
/// (`libc::ENOSPC`, `libc::EIO`, ...) the caller must report in place of the real call's
/// result, exactly as if the kernel had returned it. `None` otherwise, and always without the
/// `failpoints` feature.
#[inline(always)]
pub fn io_error(name: &str, errno: i32) -> Option<std::io::Error> {
    if hit(name) {
        eprintln!("keel: failpoint {name} fired: injecting os error {errno}");
        Some(std::io::Error::from_raw_os_error(errno))
    } else {
        None
    }
}

/// Failpoint builds only: re-reads `path` about every 100 ms and, whenever its text changes,
/// puts its configuration in force at run time (the `FAILPOINTS` syntax, `name=actions`
/// separated by `;` or newlines; a point that is no longer listed is switched off). `keel`
/// watches `<data-dir>/failpoints`; keel-chaos's `slow-fsync` fault writes it (docs/failpoints.md,
/// "At run time"). A bad entry is reported on stderr and skipped.
#[cfg(feature = "failpoints")]
pub fn watch_file(path: std::path::PathBuf) {
    let apply = move || {
        let mut armed: Vec<String> = Vec::new();
        let mut last: Option<String> = None;
        loop {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if last.as_deref() != Some(text.as_str()) {
                for name in armed.drain(..) {
                    fail::remove(name);
                }
                for entry in text
                    .split([';', '\n'])
                    .map(str::trim)
                    .filter(|e| !e.is_empty())
                {
                    let Some((name, actions)) = entry.split_once('=') else {
                        eprintln!(
                            "keel: failpoint file {}: bad entry {entry:?}",
                            path.display()
                        );
                        continue;
                    };
                    match fail::cfg(name.trim(), actions.trim()) {
                        Ok(()) => armed.push(name.trim().to_string()),
                        Err(e) => {
                            eprintln!("keel: failpoint file {}: {entry:?}: {e}", path.display())
                        }
                    }
                }
                if last.is_some() || !text.trim().is_empty() {
                    eprintln!(
                        "keel: failpoints from {}: {:?}",
                        path.display(),
                        text.trim()
                    );
                }
                last = Some(text);
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    };
    std::thread::Builder::new()
        .name("keel-failpoint-file".into())
        .spawn(apply)
        .expect("spawn the failpoint file watcher");
}
