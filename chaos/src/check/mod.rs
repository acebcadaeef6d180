//! Checkers over a recorded [`History`]: linearizability of the KV operations (per key, with
//! unknown outcomes), serializable reads, revision monotonicity, etcd's watch guarantees, and
//! end-of-run convergence of the members. The library is pure (no I/O) and bounded in time by
//! [`CheckOptions`]. See docs/chaos.md, section "Checkers".

mod convergence;
mod format;
mod linearizability;
mod minimize;
mod model;
mod observations;
mod report;
mod revisions;
mod serializable;
mod watch;

pub use convergence::check_convergence;
pub use format::{format_input, format_ns, format_operation, format_outcome};
pub use linearizability::{SearchResult, search};
pub use minimize::{RELAXED, minimize};
pub use observations::{Fate, Observations};
pub use report::{CheckOptions, CheckReport, CheckStats, Checker, Violation, WatchGuarantee};
pub use revisions::check_revisions;
pub use serializable::check_serializable_reads;
pub use watch::{check_watches, in_range};

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use crate::history::{History, Input, Operation, Outcome, Output};

/// Runs every checker over `history` and gathers their findings. Never panics on any history.
pub fn check_history(history: &History, opts: &CheckOptions) -> CheckReport {
    let started = Instant::now();
    let mut report = CheckReport::default();
    for op in &history.operations {
        match op.outcome {
            Outcome::Ok(_) => report.stats.ops_ok += 1,
            Outcome::Failed(_) => report.stats.ops_failed += 1,
            Outcome::Unknown(_) => report.stats.ops_unknown += 1,
        }
        if !output_matches_input(op) {
            report.inconclusive.push(format!(
                "answer of the wrong kind, left out of the checks: {}",
                format_operation(op)
            ));
        }
    }
    let mut violations = check_linearizability(history, opts, &mut report);
    violations.extend(check_serializable_reads(&history.operations));
    violations.extend(check_revisions(history));
    let (watch_violations, events) = check_watches(history);
    violations.extend(watch_violations);
    report.stats.watches = history.watches.len();
    report.stats.watch_events = events;
    let (convergence, notes) = check_convergence(&history.finals);
    violations.extend(convergence);
    report.inconclusive.extend(notes);

    // Keep the first few of each checker so one systematic bug does not drown the report.
    let mut per_checker: HashMap<Checker, usize> = HashMap::new();
    for violation in violations {
        let seen = per_checker.entry(violation.checker).or_default();
        *seen += 1;
        if *seen <= opts.max_violations_per_checker {
            report.violations.push(violation);
        } else {
            report.stats.violations_suppressed += 1;
        }
    }
    report.stats.elapsed = started.elapsed();
    report
}

/// Per-key linearizability search, minimising each failing key's sub-history.
fn check_linearizability(
    history: &History,
    opts: &CheckOptions,
    report: &mut CheckReport,
) -> Vec<Violation> {
    let mut by_key: BTreeMap<&str, Vec<Operation>> = BTreeMap::new();
    for op in &history.operations {
        if output_matches_input(op) && !matches!(op.outcome, Outcome::Failed(_)) {
            by_key.entry(op.input.key()).or_default().push(op.clone());
        }
    }
    report.stats.keys = by_key.len();
    let observations = Observations::from_history(history);
    report.stats.unknown_writes_resolved = observations.len();
    let mut violations = Vec::new();
    for (key, ops) in by_key {
        let deadline = Instant::now() + opts.linearizability_budget;
        match search(
            &ops,
            &observations,
            deadline,
            &mut report.stats.search_states,
        ) {
            SearchResult::Linearizable => report.stats.keys_checked += 1,
            SearchResult::Timeout => report.inconclusive.push(format!(
                "key {key:?}: linearizability search of {} operations ran out of its {:?} budget",
                ops.len(),
                opts.linearizability_budget
            )),
            SearchResult::NotLinearizable => {
                report.stats.keys_checked += 1;
                let minimal = minimize(&ops, &observations, opts.minimize_budget);
                let mut v = Violation::new(
                    Checker::Linearizability,
                    Some(key.to_string()),
                    format!(
                        "no linearization of the {} operations on this key; a non-linearizable sub-history of {} of them:",
                        ops.len(),
                        minimal.len()
                    ),
                );
                v.sub_history = minimal;
                violations.push(v);
            }
        }
    }
    violations
}

/// True unless an `Ok` output is of another kind than its input (a harness bug).
fn output_matches_input(op: &Operation) -> bool {
    matches!(
        (&op.input, &op.outcome),
        (_, Outcome::Failed(_) | Outcome::Unknown(_))
            | (Input::Get { .. }, Outcome::Ok(Output::Get { .. }))
            | (Input::Put { .. }, Outcome::Ok(Output::Put { .. }))
            | (Input::Delete { .. }, Outcome::Ok(Output::Delete { .. }))
            | (Input::Cas { .. }, Outcome::Ok(Output::Cas { .. }))
    )
}
