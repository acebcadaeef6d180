//! CI smoke of the harness: a 20 s run with kill, pause and partition faults on 3 members
//! must inject faults, record operations, and end with 0 violations and exit status 0.

mod harness;

use std::time::Duration;

#[test]
fn kill_pause_partition_run_has_no_violations() {
    let keel = harness::keel_binary();
    let run = harness::run_chaos(
        &keel,
        &[
            "--nodes",
            "3",
            "--duration",
            "20s",
            "--faults",
            "kill,pause,partition",
        ],
        Duration::from_secs(150),
    );
    let (ops, faults, violations) = run.totals();
    assert_eq!(run.code, Some(0), "{}", run.dump());
    assert_eq!(violations, 0, "{}", run.dump());
    assert!(faults >= 3, "only {faults} faults in 20 s\n{}", run.dump());
    assert!(ops >= 200, "only {ops} operations in 20 s\n{}", run.dump());
    assert!(run.stdout.contains("seed: "), "{}", run.dump());
}
