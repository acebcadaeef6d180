//! Proof that the harness can fail: with every member answering linearizable reads from local
//! state (`--inject stale-read`, failpoint `linearizable_read_stale`) and partitions isolating
//! members that clients keep reading from, the checkers must report violations and
//! `keel-chaos` must exit with status 1.
//!
//! Needs a `keel` built with the `failpoints` feature: `$KEEL_FAILPOINTS_BIN`, else
//! `keel-failpoints` next to the `keel` of this build. scripts/test.sh builds it; by hand:
//! `cargo build --release -p keel-server --features failpoints --bin keel && cp
//! target/release/keel target/release/keel-failpoints && cargo build --release --bin keel`.

mod harness;

use std::path::PathBuf;
use std::time::Duration;

fn failpoints_binary() -> PathBuf {
    let path = match std::env::var_os("KEEL_FAILPOINTS_BIN") {
        Some(p) => PathBuf::from(p),
        None => harness::keel_binary().with_file_name("keel-failpoints"),
    };
    assert!(
        path.is_file(),
        "{} is missing: this test needs `keel` built with the `failpoints` feature. Run \
         scripts/test.sh (it builds it), or set KEEL_FAILPOINTS_BIN (see this file's docs)",
        path.display()
    );
    path
}

#[test]
fn stale_reads_are_reported_as_violations() {
    let keel = failpoints_binary();
    let run = harness::run_chaos(
        &keel,
        &[
            "--nodes",
            "3",
            "--duration",
            "20s",
            "--faults",
            "partition",
            "--inject",
            "stale-read",
        ],
        Duration::from_secs(200),
    );
    let (ops, faults, violations) = run.totals();
    assert!(faults >= 1, "no partition was injected\n{}", run.dump());
    assert!(ops > 0, "{}", run.dump());
    assert!(violations > 0, "stale reads went unnoticed\n{}", run.dump());
    assert_eq!(run.code, Some(1), "{}", run.dump());
}
