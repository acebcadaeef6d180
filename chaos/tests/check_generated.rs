//! Property tests: histories generated from a sequential etcd model with random overlapping
//! timings and unknown/failed outcomes pass every checker; one injected stale read makes the
//! key non-linearizable.

mod check_common;

use check_common::*;
use keel_chaos::check::{CheckOptions, Checker, check_history};
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
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

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
    }
}
