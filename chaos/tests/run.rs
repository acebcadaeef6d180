//! `keel-chaos` runs from `cargo test`, bounded in time, on this repository's port range
//! (26000-27999), against the `keel` of this build (keel-testkit: `$KEEL_BIN`, else
//! `target/<profile>/keel`, which `cargo test --workspace` builds):
//!
//! - the CI smoke: a 20 s run with kill, pause and partition faults on 3 members must inject
//!   faults, record operations, and end with 0 violations and exit status 0;
//! - the proof that the harness can fail: with every member answering linearizable reads from
//!   local state (`--inject stale-read`, failpoint `linearizable_read_stale`) and partitions
//!   isolating members that clients keep reading from, the checkers must report violations and
//!   `keel-chaos` must exit with status 1. It needs a `keel` built with the `failpoints`
//!   feature: `$KEEL_FAILPOINTS_BIN`, else `keel-failpoints` next to the `keel` of this build.
//!   scripts/test.sh builds it; by hand: `cargo build --release -p keel-server --features
//!   failpoints --bin keel && cp target/release/keel target/release/keel-failpoints && cargo
//!   build --release --bin keel`;
//! - the Kubernetes short form: 20 s of `--traffic kubernetes` under partitions, 0 violations
//!   and at least one watch-cache checkpoint compared.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use keel_chaos::run::resources::read_json_lines;
use keel_chaos::run::summary::{Totals, parse_totals};
use keel_testkit::process::{Output, run_bounded};

/// Ports the chaos tests' members and proxies use.
const PORT_RANGE: &str = "26000-27999";

/// Runs `keel-chaos --nodes 3 --duration 20s --faults <faults> <args> --port-range
/// 26000-27999 --keel-bin <keel>`, killing it (and failing the test) after `limit`; returns its
/// output and the totals of its last line.
fn run_chaos(keel: &Path, faults: &str, args: &[&str], limit: Duration) -> (Output, Totals) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel-chaos"));
    command
        .args(["--nodes", "3", "--duration", "20s", "--faults", faults])
        .args(args)
        .args(["--port-range", PORT_RANGE, "--keel-bin"])
        .arg(keel);
    let run = run_bounded(&mut command, "", limit);
    let last = run.stdout.lines().last().unwrap_or_default();
    let totals = parse_totals(last).unwrap_or_else(|| {
        panic!(
            "no `chaos: N ops, F faults, V violations` last line:\n{}",
            run.dump()
        )
    });
    (run, totals)
}

/// The smoke also samples resources (docs/chaos.md, "Soak") every 2 s: every member must
/// have samples over the run with a live process's RSS and fds and its preallocated WAL.
#[test]
fn kill_pause_partition_run_has_no_violations() {
    let keel = keel_testkit::keel_binary!();
    let dir = tempfile::tempdir().expect("temp dir");
    let samples_path = dir.path().join("resources.jsonl");
    let (run, totals) = run_chaos(
        &keel,
        "kill,pause,partition",
        &[
            "--sample-every",
            "2s",
            "--resources-out",
            samples_path.to_str().expect("utf-8 temp path"),
        ],
        Duration::from_secs(150),
    );
    let dump = run.dump();
    assert_eq!(run.code, Some(0), "{dump}");
    assert_eq!(totals.violations, 0, "{dump}");
    assert!(totals.faults >= 3, "only {totals:?} in 20 s\n{dump}");
    assert!(totals.ops >= 200, "only {totals:?} in 20 s\n{dump}");
    assert!(run.stdout.contains("seed: "), "{dump}");

    let samples = read_json_lines(&samples_path).expect("the --resources-out file");
    // The sampler ran to the end. (Not per member: a member killed in the last seconds may
    // still be down when the run ends; seen once in a local test run.)
    assert!(
        samples.iter().any(|s| s.t_secs >= 15.0),
        "no sample after 15 s\n{dump}"
    );
    for member in ["m1", "m2", "m3"] {
        let mine: Vec<_> = samples.iter().filter(|s| s.member == member).collect();
        // 20 s at one sample per 2 s; a killed member misses some while it is down.
        assert!(mine.len() >= 5, "{member}: {} samples\n{dump}", mine.len());
        for s in &mine {
            assert!(s.rss_kib > 1024, "{member}: {s:?}");
            assert!(s.fds >= 10, "{member}: {s:?}");
            assert!(s.pid > 0 && s.epoch >= 1, "{member}: {s:?}");
            // The first WAL segment is preallocated (docs/wal.md) from the first start.
            assert!(s.wal_bytes >= 1 << 20, "{member}: {s:?}");
        }
        assert!(
            run.stdout
                .lines()
                .any(|l| l.starts_with(&format!("  {member} samples "))),
            "no resources line for {member}\n{dump}"
        );
    }
}

/// The CI short form of `--traffic kubernetes` (docs/kubernetes.md): 20 s of apiserver-shaped
/// traffic under partitions; the watch caches must have been compared with fresh lists.
#[test]
fn kubernetes_traffic_run_has_no_violations() {
    let keel = keel_testkit::keel_binary!();
    let (run, totals) = run_chaos(
        &keel,
        "partition",
        &["--traffic", "kubernetes", "--clients", "4"],
        Duration::from_secs(150),
    );
    let dump = run.dump();
    assert_eq!(run.code, Some(0), "{dump}");
    assert_eq!(totals.violations, 0, "{dump}");
    assert!(totals.faults >= 1, "no partition was injected\n{dump}");
    let kube_ops: u64 = run
        .stdout
        .lines()
        .find_map(|l| {
            l.strip_prefix("kubernetes traffic (")?
                .strip_suffix(" ops):")
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no `kubernetes traffic (N ops):` line\n{dump}"));
    assert!(
        kube_ops >= 200,
        "only {kube_ops} kubernetes ops in 20 s\n{dump}"
    );
    let line = run
        .stdout
        .lines()
        .find(|l| l.starts_with("watch caches: "))
        .unwrap_or_else(|| panic!("no watch cache line\n{dump}"));
    let checkpoints: u64 = line
        .split(", ")
        .find_map(|p| p.strip_suffix(" checkpoints compared"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("cannot parse {line:?}"));
    assert!(checkpoints >= 1, "no cache checkpoint compared\n{dump}");
}

/// The `keel` with failpoints (see the module docs).
fn failpoints_binary() -> PathBuf {
    let path = match std::env::var_os("KEEL_FAILPOINTS_BIN") {
        Some(p) => PathBuf::from(p),
        None => keel_testkit::keel_binary!().with_file_name("keel-failpoints"),
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
    let (run, totals) = run_chaos(
        &keel,
        "partition",
        &["--inject", "stale-read"],
        Duration::from_secs(200),
    );
    let dump = run.dump();
    assert!(totals.faults >= 1, "no partition was injected\n{dump}");
    assert!(totals.ops > 0, "{dump}");
    assert!(totals.violations > 0, "stale reads went unnoticed\n{dump}");
    assert_eq!(run.code, Some(1), "{dump}");
}

/// The CI short form of `--faults slow-fsync` (docs/chaos.md, "Slow disks"): 20 s with one
/// member at a time (the leader half the time) delaying each WAL fdatasync by 100-500 ms,
/// 0 violations.
#[test]
fn slow_fsync_run_has_no_violations() {
    let keel = failpoints_binary();
    let (run, totals) = run_chaos(&keel, "slow-fsync", &[], Duration::from_secs(150));
    let dump = run.dump();
    assert_eq!(run.code, Some(0), "{dump}");
    assert_eq!(totals.violations, 0, "{dump}");
    assert!(totals.faults >= 2, "only {totals:?} in 20 s\n{dump}");
    assert!(totals.ops >= 100, "only {totals:?} in 20 s\n{dump}");
    assert!(run.stderr.contains("wal_slow_fsync=sleep("), "{dump}");
}

/// `keel-chaos resource-summary` re-reads a `--resources-out` file and applies the bounds
/// (docs/chaos.md, "Soak"): a member over `--max-fds` fails it with exit status 1 and names
/// the member; within the bounds it exits 0.
#[test]
fn resource_summary_applies_the_bounds_to_a_samples_file() {
    use keel_chaos::run::resources::{Sample, write_json_lines};
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("resources.jsonl");
    // m1: 100 MiB flat for 10 minutes with 40 fds; m2: 120 fds at one sample.
    let mut samples: Vec<Sample> = (0..=10u32)
        .map(|i| Sample {
            t_secs: f64::from(i) * 60.0,
            member: "m1".into(),
            epoch: 1,
            pid: 11,
            rss_kib: 100 * 1024,
            fds: 40,
            wal_bytes: 64 << 20,
            snap_bytes: 0,
            db_bytes: 1 << 20,
        })
        .collect();
    samples.push(Sample {
        member: "m2".into(),
        pid: 12,
        fds: 120,
        ..samples[3].clone()
    });
    write_json_lines(&path, &samples).expect("write samples");
    let summary = |bounds: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_keel-chaos"));
        command
            .args(["--duration", "12m"])
            .args(bounds)
            .arg("resource-summary")
            .arg(&path);
        run_bounded(&mut command, "", Duration::from_secs(30))
    };
    let over = summary(&["--max-fds", "100", "--max-rss-growth-mib-per-min", "0.5"]);
    let dump = over.dump();
    assert_eq!(over.code, Some(1), "{dump}");
    assert!(
        over.stdout
            .contains("resource bound exceeded: m2: 120 open fds, bound 100"),
        "{dump}"
    );
    assert!(!over.stdout.contains("bound exceeded: m1"), "{dump}");
    // The default warm-up of a 12 minute run is 2 minutes.
    assert!(over.stdout.contains("resources (warm-up 120s;"), "{dump}");
    assert!(
        over.stdout
            .contains("  m1 samples 11 processes 1 rss warm-up 100.0 max 100.0 slope +0.000"),
        "{dump}"
    );
    let within = summary(&["--max-fds", "120", "--max-disk-mib", "65"]);
    assert_eq!(within.code, Some(0), "{}", within.dump());
}
