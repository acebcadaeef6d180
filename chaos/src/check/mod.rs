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
mod watch_cache;

pub use convergence::check_convergence;
pub use format::{format_input, format_ns, format_operation, format_outcome};
pub use linearizability::{SearchResult, deadline_after, search};
pub use minimize::{RELAXED, minimize};
pub use observations::{Fate, Observations};
pub use report::{CheckOptions, CheckReport, CheckStats, Checker, Violation, WatchGuarantee};
pub use revisions::check_revisions;
pub use serializable::check_serializable_reads;
pub use watch::{check_watches, in_range};
pub use watch_cache::check_watch_caches;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
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

/// The result of one key's search (and minimisation when it failed).
enum KeyVerdict {
    Linearizable,
    Inconclusive(String),
    Violation(Violation),
}

/// Per-key linearizability search, minimising each failing key's sub-history. Keys are
/// independent, so they are spread over the available cores.
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
    let keys: Vec<(&str, Vec<Operation>)> = by_key.into_iter().collect();
    let next = AtomicUsize::new(0);
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(keys.len())
        .max(1);
    let mut verdicts: Vec<(usize, KeyVerdict)> = Vec::with_capacity(keys.len());
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    let mut states = 0;
                    loop {
                        let index = next.fetch_add(1, Ordering::Relaxed);
                        let Some((key, ops)) = keys.get(index) else {
                            break;
                        };
                        done.push((index, check_key(key, ops, &observations, opts, &mut states)));
                    }
                    (done, states)
                })
            })
            .collect();
        for handle in handles {
            match handle.join() {
                Ok((done, states)) => {
                    verdicts.extend(done);
                    report.stats.search_states += states;
                }
                // Only a bug in this module panics; the keys that worker held stay unchecked.
                Err(_) => report
                    .inconclusive
                    .push("a linearizability worker panicked; some keys are unchecked".to_string()),
            }
        }
    });
    verdicts.sort_by_key(|(index, _)| *index);
    let mut violations = Vec::new();
    for (_, verdict) in verdicts {
        match verdict {
            KeyVerdict::Linearizable => report.stats.keys_checked += 1,
            KeyVerdict::Inconclusive(note) => report.inconclusive.push(note),
            KeyVerdict::Violation(v) => {
                report.stats.keys_checked += 1;
                violations.push(v);
            }
        }
    }
    violations
}

/// Searches one key's sub-history and minimises it when it is not linearizable.
fn check_key(
    key: &str,
    ops: &[Operation],
    observations: &Observations,
    opts: &CheckOptions,
    states: &mut u64,
) -> KeyVerdict {
    let deadline = deadline_after(opts.linearizability_budget);
    match search(ops, observations, deadline, states) {
        SearchResult::Linearizable => KeyVerdict::Linearizable,
        SearchResult::Timeout => KeyVerdict::Inconclusive(format!(
            "key {key:?}: linearizability search of {} operations ran out of its {:?} budget",
            ops.len(),
            opts.linearizability_budget
        )),
        SearchResult::NotLinearizable => {
            let minimal = minimize(ops, observations, opts.minimize_budget);
            let mut v = Violation::new(
                Checker::Linearizability,
                Some(key.to_string()),
                format!(
                    "no linearization of the {} operations on this key; a non-linearizable sub-history of {} of them:",
                    ops.len(),
                    minimal.len()
                ),
            );
            v.sub_history = minimal
                .into_iter()
                .map(|op| annotate_fate(op, observations))
                .collect();
            KeyVerdict::Violation(v)
        }
    }
}

/// Adds what the watches told about an unknown write to its reason, so a reader sees why the
/// search treated it as applied or not.
fn annotate_fate(mut op: Operation, observations: &Observations) -> Operation {
    let note = match observations.fate(&op) {
        Some(Fate::Applied { at_ns, revision }) => {
            format!(
                "; a watch saw it applied at revision {revision} by {}",
                format_ns(at_ns)
            )
        }
        Some(Fate::NotApplied) => {
            "; watches covering the key never saw it: not applied".to_string()
        }
        None => return op,
    };
    if let Outcome::Unknown(why) = &mut op.outcome {
        why.push_str(&note);
    }
    op
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
