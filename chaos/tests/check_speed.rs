//! Speed of the whole check on large generated histories. Ignored by default (a measurement,
//! not a pass/fail test); run in release:
//! `cargo test --release -p keel-chaos --test check_speed -- --ignored --nocapture`

mod check_common;

use std::time::Instant;

use check_common::*;
use keel_chaos::check::{CheckOptions, CheckReport, check_history};
use keel_chaos::history::{History, Input, Outcome, Output};

fn measure(label: &str, history: &History) -> CheckReport {
    let started = Instant::now();
    let report = check_history(history, &CheckOptions::default());
    println!(
        "{label}: {} ops ({} unknown, {} resolved by watches), {} watch events: checked in {:?}, {} search states",
        history.operations.len(),
        report.stats.ops_unknown,
        report.stats.unknown_writes_resolved,
        report.stats.watch_events,
        started.elapsed(),
        report.stats.search_states
    );
    report
}

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
    let mut history = generate(7, cfg);
    let report = measure("with a watch", &history);
    assert!(report.is_ok(), "{:?}", report.violations);
    assert_eq!(report.stats.keys_checked, 8, "{:?}", report.inconclusive);

    // Without watches every unknown write stays a candidate for the whole search.
    history.watches.clear();
    let report = measure("without watches", &history);
    assert!(report.is_ok(), "{:?}", report.violations);
    assert_eq!(report.stats.keys_checked, 8, "{:?}", report.inconclusive);

    // One stale read on the 10,000-op history: the refutation and the minimisation.
    let mut stale = generate(7, cfg);
    let acked: Vec<_> = stale
        .operations
        .iter()
        .filter(|op| op.input.key() == "k0")
        .filter_map(|op| match (&op.input, &op.outcome) {
            (Input::Put { value, .. }, Outcome::Ok(Output::Put { revision })) => {
                Some((value.clone(), *revision, op.return_ns))
            }
            _ => None,
        })
        .collect();
    let (old_value, old_revision, _) = acked[acked.len() / 2].clone();
    let (_, newer, newer_returned) = acked[acked.len() / 2 + 5].clone();
    stale.operations.push(op(
        1000,
        newer_returned + 1,
        newer_returned + 2,
        get("k0"),
        got(Some((&old_value, old_revision)), newer),
    ));
    let report = measure("10k ops with one stale read", &stale);
    assert_eq!(report.violations.len(), 1, "{:?}", report.violations);
    println!("{}", report.violations[0]);

    let big = generate(
        8,
        GenConfig {
            ops: 100_000,
            ..cfg
        },
    );
    let report = measure("100k ops with a watch", &big);
    assert!(report.is_ok(), "{:?}", report.violations);
}
