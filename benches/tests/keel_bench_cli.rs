//! The `keel-bench` binary's command line (no server needed). Having an integration test
//! also makes `cargo test --workspace --no-run` build `keel-bench`, which CI's smoke run uses.

use std::process::Command;

fn keel_bench(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_keel-bench"))
        .args(args)
        .output()
        .expect("run keel-bench")
}

#[test]
fn help_lists_every_workload() {
    let out = keel_bench(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
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
    assert_eq!(out.status.code(), Some(2), "clap usage error");

    // Port 1 on loopback: nothing listens there, so connecting fails at once.
    let out = keel_bench(&["--endpoints", "127.0.0.1:1", "--total", "1", "put"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not sent"), "{err}");
}
