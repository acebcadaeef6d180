//! Shrinks a non-linearizable sub-history to a small one that is still non-linearizable, so a
//! report shows the few operations that matter.
//!
//! Every shrinking step is a *relaxation*: it can only make a history easier to linearize, so
//! the result is non-linearizable for a reason the original history also has (plain removal of
//! a write would not be: dropping the write of a value that was read makes a new, bogus
//! violation). The steps:
//! 1. cut at time T: operations invoked after T go, operations still running at T become
//!    unknown; binary search finds the earliest such cut that is still non-linearizable;
//! 2. delta debugging (ddmin's complement step, relaxing instead of removing): chunks of
//!    operations, newest first, halving the chunk size down to single operations when no chunk
//!    can go. Passes: drop read-only operations (gets, failed CAS, deletes that found
//!    nothing); drop writes nothing left depends on (see [`relax`]); free acknowledged writes
//!    of their real-time bound (they keep their revision; shown as returning at "inf"); drop
//!    writes again.
//!    A change is kept while the history stays non-linearizable.
//!
//! Each check runs with at most a tenth of the budget; a check that times out keeps the change
//! undone, so the result is always a proven non-linearizable sub-history.

use std::ops::Range;
use std::time::{Duration, Instant};

use crate::history::{Input, Operation, Outcome, Output};

use super::linearizability::{SearchResult, deadline_after, search};
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
    let deadline = deadline_after(budget);
    let mut states = 0;
    // One check may not eat the whole budget: a relaxed history with many unknown writes can
    // take exponential time to refute, and a check that times out just keeps the change undone.
    let per_check = budget / 10;
    let fails = |candidate: &[Operation], states: &mut u64| {
        let check_deadline = deadline.min(deadline_after(per_check));
        search(candidate, observations, check_deadline, states) == SearchResult::NotLinearizable
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

    // 2. Relax in chunks, newest first, halving the chunk size when no chunk can go (ddmin's
    //    complement step, relaxing instead of removing). Cheap checks first: dropping reads and
    //    writes keeps the search tight; freeing writes of real time makes it costlier, so it
    //    comes last, on what is left, followed by another round of dropping.
    for step in [
        Step::DropReads,
        Step::DropWrites,
        Step::FreeRealTime,
        Step::DropWrites,
    ] {
        let mut chunk = (current.len() / 2).max(1);
        while Instant::now() < deadline {
            let mut progress = false;
            let mut end = current.len();
            while end > 0 && Instant::now() < deadline {
                let start = end.saturating_sub(chunk);
                if let Some(candidate) = relax(&current, start..end, step, observations)
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
            if running && matches!(op.outcome, Outcome::Ok(Output::Put { .. })) {
                // A put's answer only needs its revision above the floor, which dropping later
                // operations can only lower: keep it required, without its real-time bound.
                op.return_ns = u64::MAX;
            } else if running {
                op.outcome = Outcome::Unknown(format!("{RELAXED}: running at the cut"));
            }
            op
        })
        .collect()
}

/// One kind of relaxation.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Step {
    DropReads,
    DropWrites,
    FreeRealTime,
}

/// `ops` with the operations in `range` relaxed by `step`, or `None` when nothing changes:
/// - `DropReads`: read-only operations (gets, failed CAS, deletes that found nothing) are
///   dropped: they only constrain;
/// - `DropWrites`: writes are dropped when nothing kept depends on them: a put or CAS
///   when no kept operation observes its value or the key's mere existence (a delete that
///   deleted, a failed CAS), a delete when no kept operation observes the key's absence (a get
///   of nothing, a delete that found nothing, a CAS that expected absence and succeeded or
///   expected a value and failed). Then, in any linearization, each kept operation still sees
///   the same outcome from the latest kept write before it;
/// - `FreeRealTime`: acknowledged writes lose their real-time bound (`return_ns` becomes
///   `u64::MAX`; they stay required and keep their revision, which orders them).
fn relax(
    ops: &[Operation],
    range: Range<usize>,
    step: Step,
    observations: &Observations,
) -> Option<Vec<Operation>> {
    let mut out: Vec<Option<Operation>> = ops.iter().cloned().map(Some).collect();
    let mut changed = false;
    match step {
        Step::DropReads => {
            for slot in &mut out[range] {
                if slot.as_ref().is_some_and(is_read_only) {
                    *slot = None;
                    changed = true;
                }
            }
            return changed.then(|| out.into_iter().flatten().collect());
        }
        Step::FreeRealTime => {
            for op in out[range].iter_mut().flatten() {
                if matches!(op.outcome, Outcome::Ok(_)) && op.return_ns != u64::MAX {
                    op.return_ns = u64::MAX;
                    changed = true;
                }
            }
            return changed.then(|| out.into_iter().flatten().collect());
        }
        Step::DropWrites => {}
    }
    let candidates: Vec<usize> = range.filter(|&i| out[i].is_some()).collect();
    let dropping = match droppable_by_revision(&out, &candidates, observations) {
        Some(dropping) => dropping,
        None => droppable_by_kind(&out, candidates),
    };
    for i in dropping {
        out[i] = None;
        changed = true;
    }
    changed.then(|| out.into_iter().flatten().collect())
}

/// Writes of `candidates` that nothing kept depends on, by kind of observation: puts/CAS when
/// nothing kept observes their value or the key's existence, deletes when nothing kept observes
/// its absence. Dropping several at once, so the set shrinks to a fixpoint.
fn droppable_by_kind(out: &[Option<Operation>], mut dropping: Vec<usize>) -> Vec<usize> {
    loop {
        let kept: Vec<&Operation> = out
            .iter()
            .enumerate()
            .filter(|(i, _)| !dropping.contains(i))
            .filter_map(|(_, op)| op.as_ref())
            .collect();
        let existence_observed = kept.iter().any(|other| observes_existence(other));
        let absence_observed = kept.iter().any(|other| observes_absence(other));
        let before = dropping.len();
        dropping.retain(|&i| {
            let Some(op) = &out[i] else { return false };
            match &op.input {
                Input::Put { value, .. } | Input::Cas { value, .. } => {
                    !existence_observed && !kept.iter().any(|other| observes_value(other, value))
                }
                Input::Delete { .. } => !absence_observed,
                Input::Get { .. } => false,
            }
        });
        if dropping.len() == before {
            return dropping;
        }
    }
}

/// Writes of `candidates` that nothing kept depends on, when every write that may have taken
/// effect has a known revision (else `None`). The model linearizes in revision order, so an
/// answer about the state at revision b (a read's header revision; a change's revision - 1)
/// depends on exactly one write: the latest at or below b. It also depends on the write of a
/// value it names. Dropping writes nobody depends on leaves every kept answer explained by the
/// same write, with a lower or equal floor.
fn droppable_by_revision(
    out: &[Option<Operation>],
    candidates: &[usize],
    observations: &Observations,
) -> Option<Vec<usize>> {
    let mut writes: Vec<(i64, usize)> = Vec::new();
    for (i, op) in out.iter().enumerate() {
        let Some(op) = op else { continue };
        match effect_revision(op, observations) {
            Some(Some(revision)) => writes.push((revision, i)),
            Some(None) => return None,
            None => {}
        }
    }
    writes.sort_unstable();
    let mut needed = vec![false; out.len()];
    let mut dropping: Vec<usize> = candidates
        .iter()
        .copied()
        .filter(|&i| out[i].as_ref().is_some_and(|op| op.input.is_write()))
        .collect();
    loop {
        for (i, op) in out.iter().enumerate() {
            let Some(op) = op else { continue };
            if dropping.contains(&i) {
                continue;
            }
            if let Some(bound) = observed_revision(op) {
                let latest = writes.partition_point(|&(revision, _)| revision <= bound);
                if latest > 0 {
                    needed[writes[latest - 1].1] = true;
                }
            }
            for &(_, writer) in &writes {
                if let Some(Input::Put { value, .. } | Input::Cas { value, .. }) =
                    out[writer].as_ref().map(|w| &w.input)
                    && observes_value(op, value)
                {
                    needed[writer] = true;
                }
            }
        }
        let before = dropping.len();
        dropping.retain(|&i| !needed[i]);
        if dropping.len() == before {
            return Some(dropping);
        }
    }
}

/// The revision at which `op` changed the store: `Some(Some(r))` when known, `Some(None)` when
/// it may have at an unknown revision, `None` when it did not.
fn effect_revision(op: &Operation, observations: &Observations) -> Option<Option<i64>> {
    match (&op.input, &op.outcome) {
        (Input::Get { .. }, _) | (_, Outcome::Failed(_)) => None,
        (_, Outcome::Ok(output)) => output.write_revision().map(Some),
        (_, Outcome::Unknown(_)) => match observations.fate(op) {
            Some(Fate::NotApplied) => None,
            Some(Fate::Applied { revision, .. }) => Some(Some(revision)),
            None => Some(None),
        },
    }
}

/// The revision of the state `op`'s answer describes, if it describes one.
fn observed_revision(op: &Operation) -> Option<i64> {
    match (&op.input, &op.outcome) {
        (
            Input::Get {
                linearizable: true, ..
            },
            Outcome::Ok(Output::Get { revision, .. }),
        ) => Some(*revision),
        // A CAS or delete describes the state just before its own change or, when it
        // changed nothing, the state at its header revision.
        (
            _,
            Outcome::Ok(
                output @ (Output::Cas { revision, .. }
                | Output::Delete {
                    deleted: 0..,
                    revision,
                }),
            ),
        ) => Some(output.write_revision().map_or(*revision, |r| r - 1)),
        _ => None,
    }
}

/// True when `op`'s answer needs the key to be absent.
fn observes_absence(op: &Operation) -> bool {
    matches!(
        (&op.input, &op.outcome),
        (_, Outcome::Ok(Output::Get { kv: None, .. }))
            | (_, Outcome::Ok(Output::Delete { deleted: 0, .. }))
            | (
                Input::Cas { expect: None, .. },
                Outcome::Ok(Output::Cas {
                    succeeded: true,
                    ..
                })
            )
            | (
                Input::Cas {
                    expect: Some(_),
                    ..
                },
                Outcome::Ok(Output::Cas {
                    succeeded: false,
                    ..
                })
            )
    )
}

/// True for an acknowledged operation that did not change the store.
fn is_read_only(op: &Operation) -> bool {
    matches!(
        (&op.input, &op.outcome),
        (Input::Get { .. }, _)
            | (
                _,
                Outcome::Ok(Output::Cas {
                    succeeded: false,
                    ..
                })
            )
            | (_, Outcome::Ok(Output::Delete { deleted: 0, .. }))
    )
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
