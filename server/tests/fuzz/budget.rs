//! Runs a proptest strategy for a wall-clock budget instead of a case count, shrinking the
//! first failure as `proptest!` would.

use std::time::{Duration, Instant};

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestCaseResult, TestRunner};

/// Default seconds per target in `cargo test` (CI runs 9 targets on 2 cores).
const DEFAULT_SECS: u64 = 4;

/// The budget of one target: `KEEL_FUZZ_SECS` seconds, else [`DEFAULT_SECS`].
pub fn budget() -> Duration {
    let secs = std::env::var("KEEL_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SECS);
    Duration::from_secs(secs)
}

/// Feeds values of `strategy` to `test` until the budget is spent, and panics with the
/// shrunk input if one fails. Returns the number of inputs tried (at least one).
pub fn fuzz<S: Strategy>(name: &str, strategy: S, test: impl Fn(S::Value) -> TestCaseResult) -> u64
where
    S::Value: std::fmt::Debug,
{
    let config = Config {
        failure_persistence: None,
        // Shrinking a failure may take a while; it only happens when something is broken.
        max_shrink_time: 60_000,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let deadline = Instant::now() + budget();
    let mut tried = 0u64;
    while tried == 0 || Instant::now() < deadline {
        let tree = strategy
            .new_tree(&mut runner)
            .unwrap_or_else(|e| panic!("{name}: cannot generate an input: {e}"));
        match runner.run_one(tree, &test) {
            Ok(_) => tried += 1,
            Err(e) => panic!("{name}: failed after {tried} inputs: {e}"),
        }
    }
    eprintln!("fuzz {name}: {tried} inputs in {:?}", budget());
    tried
}
