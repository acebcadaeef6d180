//! Property tests: histories generated from a sequential etcd model with random overlapping
//! timings and unknown/failed outcomes pass every checker; one injected stale read makes the
//! key non-linearizable.

mod check_common;

use check_common::*;
use std::time::{Duration, Instant};

use keel_chaos::check::{CheckOptions, Checker, Observations, SearchResult, check_history, search};
use keel_chaos::history::{Input, Outcome, Output};
use proptest::prelude::*;

fn config(clients: u32, keys: usize, ops: usize) -> GenConfig {
    GenConfig {
        clients,
        keys,
        ops,
        unknown: 0.05,
        failed: 0.03,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn generated_histories_pass(seed in any::<u64>(), clients in 1u32..8, keys in 1usize..4, ops in 1usize..300) {
        let history = generate(seed, config(clients, keys, ops));
        let report = check_history(&history, &CheckOptions::default());
        prop_assert!(report.is_ok(), "{}", report.violations.iter().map(|v| v.to_string()).collect::<Vec<_>>().join("\n"));
        prop_assert!(report.inconclusive.is_empty(), "{:?}", report.inconclusive);
        prop_assert_eq!(report.stats.keys, report.stats.keys_checked);
    }

    #[test]
    fn injected_stale_read_is_caught(seed in any::<u64>(), clients in 1u32..8, ops in 20usize..300) {
        let mut history = generate(seed, config(clients, 2, ops));
        // Two acknowledged puts on one key, the second returning before the first's value is
        // read again: a read of the first value after that is stale.
        let puts: Vec<_> = history
            .operations
            .iter()
            .filter(|op| matches!(op.outcome, Outcome::Ok(Output::Put { .. })))
            .cloned()
            .collect();
        let pair = puts.iter().enumerate().find_map(|(i, first)| {
            puts[i + 1..].iter().find(|second| {
                second.input.key() == first.input.key()
                    && matches!((&first.outcome, &second.outcome),
                        (Outcome::Ok(Output::Put { revision: r1 }), Outcome::Ok(Output::Put { revision: r2 })) if r2 > r1)
            }).map(|second| (first.clone(), second.clone()))
        });
        prop_assume!(pair.is_some());
        let (first, second) = pair.unwrap();
        let (Input::Put { key, value }, Outcome::Ok(Output::Put { revision })) = (&first.input, &first.outcome) else {
            unreachable!("filtered to acknowledged puts")
        };
        let Outcome::Ok(Output::Put { revision: newer }) = second.outcome else { unreachable!() };
        let at = second.return_ns + 1;
        history.operations.push(op(1000, at, at + 1, get(key), got(Some((value, *revision)), newer)));
        let report = check_history(&history, &CheckOptions::default());
        let found: Vec<_> = report.violations.iter().filter(|v| v.checker == Checker::Linearizability).collect();
        prop_assert_eq!(found.len(), 1, "{:?}", report.violations);
        prop_assert_eq!(found[0].key.as_deref(), Some(key.as_str()));
        prop_assert!(found[0].sub_history.iter().any(|o| o.client == 1000), "{}", found[0]);
        prop_assert!(found[0].sub_history.iter().any(|o| o.input == first.input), "{}", found[0]);
        // The minimised sub-history is itself refuted, with what the watches told.
        let observations = Observations::from_history(&history);
        let far = Instant::now() + Duration::from_secs(60);
        prop_assert_eq!(
            search(&found[0].sub_history, &observations, far, &mut 0),
            SearchResult::NotLinearizable
        );
    }
}

/// Corrupts a generated history: random outputs (of any kind, with any revisions), returns
/// before invokes, values never written, scrambled watch events.
fn corrupt(history: &mut keel_chaos::history::History, seed: u64) {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    let mut rng = StdRng::seed_from_u64(seed);
    let count = history.operations.len();
    for _ in 0..rng.gen_range(1..10) {
        let i = rng.gen_range(0..count);
        let revision = rng.gen_range(-2..400);
        let op = &mut history.operations[i];
        op.outcome = match rng.gen_range(0..6) {
            0 => got(Some(("never-written", revision)), rng.gen_range(-2..400)),
            1 => got(None, revision),
            2 => put_ok(revision),
            3 => del_ok(rng.gen_range(-1..3), revision),
            4 => cas_ok(rng.r#gen(), revision),
            _ => unknown(),
        };
        if rng.gen_bool(0.3) {
            op.return_ns = op.invoke_ns.saturating_sub(rng.gen_range(0..1_000));
        }
    }
    for record in &mut history.watches {
        for response in &mut record.responses {
            for event in &mut response.events {
                if rng.gen_bool(0.05) {
                    event.mod_revision = rng.gen_range(-2..400);
                    event.version = rng.gen_range(-1..5);
                }
            }
        }
        if rng.gen_bool(0.3) && !record.responses.is_empty() {
            let i = rng.gen_range(0..record.responses.len());
            let moved = record.responses.remove(i);
            record.responses.push(moved);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn corrupted_histories_are_checked_without_panicking(seed in any::<u64>(), ops in 1usize..200) {
        let mut history = generate(seed, config(4, 2, ops));
        corrupt(&mut history, seed);
        let options = CheckOptions {
            linearizability_budget: Duration::from_millis(200),
            minimize_budget: Duration::from_millis(200),
            ..CheckOptions::default()
        };
        let report = check_history(&history, &options);
        prop_assert!(report.stats.keys_checked <= report.stats.keys);
        prop_assert_eq!(report.stats.ops_ok + report.stats.ops_failed + report.stats.ops_unknown, history.operations.len());
    }
}
