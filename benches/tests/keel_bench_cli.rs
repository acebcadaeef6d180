//! The `keel-bench` binary's command line (no server needed). Having an integration test
//! also makes `cargo test --workspace --no-run` build `keel-bench`, which CI's smoke run uses.

use std::process::Command;
use std::time::Duration;

use keel_testkit::process::{Output, run_bounded};

/// Runs `keel-bench <args>`, failing the test if it takes more than 60 s.
fn keel_bench(args: &[&str]) -> Output {
    run_bounded(
        Command::new(env!("CARGO_BIN_EXE_keel-bench")).args(args),
        "",
        Duration::from_secs(60),
    )
}

#[test]
fn help_lists_every_workload() {
    let out = keel_bench(&["--help"]);
    assert_eq!(out.code, Some(0), "{}", out.dump());
    let help = &out.stdout;
    for w in [
        "put",
        "range",
        "txn-put",
        "txn-mixed",
        "mixed",
        "watch",
        "lease-keepalive",
    ] {
        assert!(help.contains(w), "{w} missing from:\n{help}");
    }
}

#[test]
fn bad_arguments_and_unreachable_endpoints_fail() {
    let out = keel_bench(&["--total", "1", "--duration", "1s", "put"]);
    assert_eq!(out.code, Some(2), "clap usage error");

    // Port 1 on loopback: nothing listens there, so connecting fails at once.
    let out = keel_bench(&["--endpoints", "127.0.0.1:1", "--total", "1", "put"]);
    assert_eq!(out.code, Some(1));
    let err = &out.stderr;
    assert!(err.contains("not sent"), "{err}");
}
