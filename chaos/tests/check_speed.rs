//! Speed of the whole check on a large generated history. Ignored by default (a measurement,
//! not a pass/fail test); run in release:
//! `cargo test --release -p keel-chaos --test check_speed -- --ignored --nocapture`

mod check_common;

use std::time::Instant;

use check_common::*;
use keel_chaos::check::{CheckOptions, check_history};

#[test]
#[ignore = "measurement; run explicitly in release"]
fn ten_thousand_ops_eight_keys_sixteen_clients() {
    let cfg = GenConfig {
        clients: 16,
        keys: 8,
        ops: 10_000,
        unknown: 0.05,
        failed: 0.02,
    };
    let history = generate(7, cfg);
    let started = Instant::now();
    let report = check_history(&history, &CheckOptions::default());
    let elapsed = started.elapsed();
    println!(
        "check of {} ops ({} unknown, {} resolved by watches), {} watch events: {:?}, {} search states",
        history.operations.len(),
        report.stats.ops_unknown,
        report.stats.unknown_writes_resolved,
        report.stats.watch_events,
        elapsed,
        report.stats.search_states
    );
    assert!(report.is_ok(), "{:?}", report.violations);
    assert_eq!(report.stats.keys_checked, 8, "{:?}", report.inconclusive);
}
