//! What the watches tell about writes whose outcome is unknown, as etcd's robustness tests do
//! when they patch a history before checking it (`tests/robustness/validate/patch_history.go`):
//! - an unknown put/CAS whose (unique) value a watch delivered did take effect, at the event's
//!   revision and before the event arrived;
//! - an unknown write that no watch delivered, on a key that watches covered without a break
//!   from before the write was invoked to the end of the run, did not take effect.
//!
//! Without this, every unknown write stays a candidate forever, and proving a history *not*
//! linearizable costs up to 2^(unknown writes) search states. The inference trusts the watches'
//! reliability, which the watch checker verifies separately.

use std::collections::{HashMap, HashSet};

use crate::history::{EventKind, History, Input, Operation, Outcome, Output};

use super::minimize::RELAXED;
use super::watch::in_range;

/// What became of one unknown write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// A watch delivered it: it took effect at `revision`, before `at_ns`.
    Applied { at_ns: u64, revision: i64 },
    /// Complete watch coverage never delivered it: it did not take effect.
    NotApplied,
}

/// Fates of unknown writes, keyed by (client, invoke_ns), which names one operation because a
/// client runs one operation at a time.
#[derive(Clone, Debug, Default)]
pub struct Observations {
    fates: HashMap<(u32, u64), Fate>,
}

impl Observations {
    /// No knowledge: every unknown write may or may not have taken effect.
    pub fn none() -> Self {
        Observations::default()
    }

    /// The fate of `op` if it is an unknown write the watches tell about.
    pub fn fate(&self, op: &Operation) -> Option<Fate> {
        // Operations the minimiser relaxed carry no fate: the relaxation must add freedom.
        match &op.outcome {
            Outcome::Unknown(why) if !why.starts_with(RELAXED) => {}
            _ => return None,
        }
        self.fates.get(&(op.client, op.invoke_ns)).copied()
    }

    /// Number of unknown writes with a known fate.
    pub fn len(&self) -> usize {
        self.fates.len()
    }

    /// True when no fate is known.
    pub fn is_empty(&self) -> bool {
        self.fates.is_empty()
    }

    /// Infers fates from `history`'s watch records.
    pub fn from_history(history: &History) -> Self {
        let mut fates = HashMap::new();
        let unknown_writes: Vec<&Operation> = history
            .operations
            .iter()
            .filter(|op| op.input.is_write() && matches!(op.outcome, Outcome::Unknown(_)))
            .collect();
        if unknown_writes.is_empty() || history.watches.is_empty() {
            return Observations { fates };
        }
        let final_revision = final_revision(history);
        let floor = RevisionFloor::new(&history.operations);
        // Put events by value; delete events by key.
        let mut puts: HashMap<&str, (u64, i64)> = HashMap::new();
        let mut deletes: HashMap<&str, Vec<i64>> = HashMap::new();
        for record in &history.watches {
            for response in &record.responses {
                for event in &response.events {
                    match event.kind {
                        EventKind::Put => {
                            let seen = puts
                                .entry(&event.value)
                                .or_insert((response.at_ns, event.mod_revision));
                            seen.0 = seen.0.min(response.at_ns);
                        }
                        EventKind::Delete => deletes
                            .entry(&event.key)
                            .or_default()
                            .push(event.mod_revision),
                    }
                }
            }
        }
        let acked_deletes: HashSet<i64> = history
            .operations
            .iter()
            .filter_map(|op| match &op.outcome {
                Outcome::Ok(Output::Delete {
                    deleted: 1..,
                    revision,
                }) => Some(*revision),
                _ => None,
            })
            .collect();
        let mut coverage: HashMap<&str, Vec<(i64, i64)>> = HashMap::new();
        for op in unknown_writes {
            let key = op.input.key();
            let covered = coverage.entry(key).or_insert_with(|| windows(history, key));
            let since = floor.at(op.invoke_ns);
            let fully_watched = covers(covered, since, final_revision);
            let fate = match &op.input {
                Input::Put { value, .. } | Input::Cas { value, .. } => {
                    match puts.get(value.as_str()) {
                        Some(&(at_ns, revision)) => Some(Fate::Applied { at_ns, revision }),
                        None => fully_watched.then_some(Fate::NotApplied),
                    }
                }
                Input::Delete { .. } => {
                    let unexplained = deletes.get(key).is_some_and(|revs| {
                        revs.iter()
                            .any(|r| *r > since && !acked_deletes.contains(r))
                    });
                    (fully_watched && !unexplained).then_some(Fate::NotApplied)
                }
                Input::Get { .. } => None,
            };
            if let Some(fate) = fate {
                fates.insert((op.client, op.invoke_ns), fate);
            }
        }
        Observations { fates }
    }
}

/// The highest revision the run is known to have reached.
fn final_revision(history: &History) -> i64 {
    let finals = history.finals.iter().map(|f| f.revision);
    let ops = history
        .operations
        .iter()
        .filter_map(|op| match &op.outcome {
            Outcome::Ok(Output::Get { revision, .. } | Output::Put { revision })
            | Outcome::Ok(Output::Delete { revision, .. } | Output::Cas { revision, .. }) => {
                Some(*revision)
            }
            _ => None,
        });
    let watches = history
        .watches
        .iter()
        .flat_map(|w| w.responses.iter().map(|r| r.header_revision));
    finals.chain(ops).chain(watches).max().unwrap_or(0)
}

/// The revision windows `(lower, upper]` the watches covering `key` saw completely, merged.
fn windows(history: &History, key: &str) -> Vec<(i64, i64)> {
    let mut spans: Vec<(i64, i64)> = history
        .watches
        .iter()
        .filter(|w| in_range(w, key))
        .filter_map(|w| {
            let lower = if w.start_revision > 0 {
                w.start_revision - 1
            } else {
                w.created_revision
            };
            let upper = w
                .responses
                .iter()
                .filter(|r| r.compact_revision == 0)
                .flat_map(|r| {
                    r.events
                        .iter()
                        .map(|e| e.mod_revision)
                        .chain(r.events.is_empty().then_some(r.header_revision))
                })
                .max()?;
            (upper > lower).then_some((lower, upper))
        })
        .collect();
    spans.sort_unstable();
    let mut merged: Vec<(i64, i64)> = Vec::new();
    for (lower, upper) in spans {
        match merged.last_mut() {
            Some(last) if lower <= last.1 => last.1 = last.1.max(upper),
            _ => merged.push((lower, upper)),
        }
    }
    merged
}

/// True when one merged window contains `(from, to]`.
fn covers(windows: &[(i64, i64)], from: i64, to: i64) -> bool {
    windows
        .iter()
        .any(|&(lower, upper)| lower <= from && upper >= to)
}

/// The highest header revision of linearizable answers returned before an instant: a lower
/// bound of the store revision then, so a write invoked at that instant gets a higher one.
struct RevisionFloor {
    /// (return_ns, running max revision), sorted by return_ns.
    points: Vec<(u64, i64)>,
}

impl RevisionFloor {
    fn new(ops: &[Operation]) -> Self {
        let mut points: Vec<(u64, i64)> = ops
            .iter()
            .filter_map(|op| match (&op.input, &op.outcome) {
                (
                    Input::Get {
                        linearizable: false,
                        ..
                    },
                    _,
                ) => None,
                (_, Outcome::Ok(Output::Get { revision, .. } | Output::Put { revision })) => {
                    Some((op.return_ns, *revision))
                }
                (
                    _,
                    Outcome::Ok(Output::Delete { revision, .. } | Output::Cas { revision, .. }),
                ) => Some((op.return_ns, *revision)),
                _ => None,
            })
            .collect();
        points.sort_unstable();
        let mut highest = 0;
        for point in &mut points {
            highest = highest.max(point.1);
            point.1 = highest;
        }
        RevisionFloor { points }
    }

    /// Highest revision answered strictly before `t`; at least 1, the revision of a fresh
    /// store, so the first write of a run has revision 2 or more.
    fn at(&self, t: u64) -> i64 {
        let returned = self.points.partition_point(|&(at, _)| at < t);
        if returned == 0 {
            1
        } else {
            self.points[returned - 1].1.max(1)
        }
    }
}
