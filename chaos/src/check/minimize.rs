//! Shrinks a non-linearizable sub-history to a small one that is still non-linearizable, so a
//! report shows the few operations that matter.
//!
//! Every shrinking step is a *relaxation*: it can only make a history easier to linearize, so
//! the result is non-linearizable for a reason the original history also has (plain removal of
//! a write would not be: dropping the write of a value that was read makes a new, bogus
//! violation). The steps:
//! 1. cut at time T: operations invoked after T go, operations still running at T become
//!    unknown; binary search finds the earliest such cut that is still non-linearizable;
//! 2. chunks of operations, newest first, halving the chunk size down to single operations
//!    when no chunk can go (delta debugging's complement step): drop reads, turn acknowledged
//!    writes into unknown ones, and drop unknown writes whose
//!    value no remaining operation observes (only when no `delete` that deleted and no failed
//!    `cas` is left: those can be explained by the unknown write alone);
//!    a change is kept while the history stays non-linearizable.
//!
//! Each check runs with what is left of the budget; a check that times out keeps the change
//! undone, so the result is always a proven non-linearizable sub-history.

use std::ops::Range;
use std::time::{Duration, Instant};

use crate::history::{Input, Operation, Outcome, Output};

use super::linearizability::{SearchResult, search};
use super::observations::{Fate, Observations};

/// Marker put in the reason of operations the minimiser relaxed from `Ok` to `Unknown`.
pub const RELAXED: &str = "relaxed by minimiser";

/// Returns a non-linearizable sub-history of `ops` (which must be non-linearizable), as small
/// as `budget` allows, sorted by invoke time.
pub fn minimize(
    ops: &[Operation],
    observations: &Observations,
    budget: Duration,
) -> Vec<Operation> {
    let deadline = Instant::now() + budget;
    let mut states = 0;
    let fails = |candidate: &[Operation], states: &mut u64| {
        search(candidate, observations, deadline, states) == SearchResult::NotLinearizable
    };
    let mut current: Vec<Operation> = ops
        .iter()
        .filter(|op| !matches!(op.outcome, Outcome::Failed(_)))
        .cloned()
        .collect();
    current.sort_by_key(|op| (op.invoke_ns, op.return_ns));

    // 1. Earliest failing cut. Failing is monotone in T: cut(T) is a cut of cut(T') for T < T'.
    let mut cuts: Vec<u64> = current
        .iter()
        .filter(|op| matches!(op.outcome, Outcome::Ok(_)))
        .map(|op| op.return_ns)
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    let (mut low, mut high) = (0, cuts.len());
    while low < high && Instant::now() < deadline {
        let mid = (low + high) / 2;
        if fails(&cut(&current, cuts[mid], observations), &mut states) {
            high = mid;
        } else {
            low = mid + 1;
        }
    }
    if high < cuts.len() {
        let candidate = cut(&current, cuts[high], observations);
        if fails(&candidate, &mut states) {
            current = candidate;
        }
    }

    // 2. Relax chunks of operations, newest first, halving the chunk size when no chunk can
    //    go (ddmin's complement step, with relaxation instead of removal).
    let mut chunk = (current.len() / 2).max(1);
    while Instant::now() < deadline {
        let mut progress = false;
        let mut end = current.len();
        while end > 0 && Instant::now() < deadline {
            let start = end.saturating_sub(chunk);
            if let Some(candidate) = relax(&current, start..end)
                && fails(&candidate, &mut states)
            {
                current = candidate;
                progress = true;
            }
            end = start.min(current.len());
        }
        if !progress {
            if chunk == 1 {
                break;
            }
            chunk = (chunk / 2).max(1);
        }
    }
    current
}

/// The history as seen at time `t`: later invocations dropped, operations running at `t`
/// unknown, and unknown writes the watches saw take effect only after `t` freed of that fate
/// (what enabled them may have been invoked after `t`).
fn cut(ops: &[Operation], t: u64, observations: &Observations) -> Vec<Operation> {
    ops.iter()
        .filter(|op| op.invoke_ns <= t)
        .map(|op| {
            let mut op = op.clone();
            let running = match (&op.outcome, observations.fate(&op)) {
                (Outcome::Ok(_), _) => op.return_ns > t,
                (_, Some(Fate::Applied { at_ns, .. })) => at_ns > t,
                _ => false,
            };
            if running {
                op.outcome = Outcome::Unknown(format!("{RELAXED}: running at the cut"));
            }
            op
        })
        .collect()
}

/// `ops` with the operations in `range` relaxed one step (reads dropped, acknowledged writes
/// made unknown, unknown writes nobody observes dropped), or `None` when nothing changes.
fn relax(ops: &[Operation], range: Range<usize>) -> Option<Vec<Operation>> {
    let mut out: Vec<Option<Operation>> = ops.iter().cloned().map(Some).collect();
    let mut changed = false;
    for slot in &mut out[range.clone()] {
        let Some(op) = slot else { continue };
        match (&op.input, &op.outcome) {
            (Input::Get { .. }, _) => *slot = None,
            (_, Outcome::Ok(output)) => {
                op.outcome = Outcome::Unknown(format!("{RELAXED}: was ok {output:?}"))
            }
            _ => continue,
        }
        changed = true;
    }
    let kept: Vec<&Operation> = out.iter().flatten().collect();
    let existence_observed = kept.iter().any(|other| observes_existence(other));
    let mut removable = Vec::new();
    for i in range {
        let Some(op) = &out[i] else { continue };
        if let (Input::Put { value, .. } | Input::Cas { value, .. }, Outcome::Unknown(_)) =
            (&op.input, &op.outcome)
            && !existence_observed
            && !kept.iter().any(|other| observes_value(other, value))
        {
            removable.push(i);
        }
    }
    for i in removable {
        out[i] = None;
        changed = true;
    }
    changed.then(|| out.into_iter().flatten().collect())
}

/// True when `op` saw `value` (read it, or a CAS expecting it succeeded).
fn observes_value(op: &Operation, value: &str) -> bool {
    match (&op.input, &op.outcome) {
        (
            Input::Get { .. },
            Outcome::Ok(Output::Get {
                kv: Some((v, _)), ..
            }),
        ) => v == value,
        (
            Input::Cas {
                expect: Some(e), ..
            },
            _,
        ) => e == value,
        _ => false,
    }
}

/// True when `op`'s answer could be explained by an unknown write of any value (a delete that
/// found the key, a CAS whose compare failed).
fn observes_existence(op: &Operation) -> bool {
    matches!(
        (&op.input, &op.outcome),
        (
            Input::Delete { .. },
            Outcome::Ok(Output::Delete { deleted: 1.., .. })
        ) | (
            Input::Cas { .. },
            Outcome::Ok(Output::Cas {
                succeeded: false,
                ..
            })
        )
    )
}
