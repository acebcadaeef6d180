//! Revision checks that span keys and members:
//! - two acknowledged writes never share a revision (every etcd write txn gets its own);
//! - real-time order: when a linearizable operation A returned before B was invoked, B's header
//!   revision is at least A's, and strictly greater when B is a write that changed the store;
//! - per member and process epoch, the header revisions of linearizable answers
//!   ([`History::member_revisions`]) never go backwards.
//!
//! Serializable reads are exempt from the real-time rule (they may be served from a lagging
//! member).

use std::collections::{BTreeMap, HashMap};

use crate::history::{History, Input, Operation, Outcome, Output};

use super::format::format_ns;
use super::report::{Checker, Violation};

/// Header revision of an acknowledged linearizable operation, and whether it created that
/// revision (a write that changed the store).
fn revision_of(op: &Operation) -> Option<(i64, bool)> {
    let Outcome::Ok(output) = &op.outcome else {
        return None;
    };
    match (output, &op.input) {
        (
            Output::Get { .. },
            Input::Get {
                linearizable: false,
                ..
            },
        ) => None,
        (Output::Get { revision, .. }, _) => Some((*revision, false)),
        (Output::Put { revision }, _) => Some((*revision, true)),
        (Output::Delete { deleted, revision }, _) => Some((*revision, *deleted > 0)),
        (
            Output::Cas {
                succeeded,
                revision,
            },
            _,
        ) => Some((*revision, *succeeded)),
    }
}

/// Runs the three revision checks.
pub fn check_revisions(history: &History) -> Vec<Violation> {
    let mut violations = Vec::new();
    let acked: Vec<(&Operation, i64, bool)> = history
        .operations
        .iter()
        .filter_map(|op| revision_of(op).map(|(revision, wrote)| (op, revision, wrote)))
        .collect();

    // Unique write revisions.
    let mut writers: HashMap<i64, &Operation> = HashMap::new();
    for &(op, revision, wrote) in &acked {
        if !wrote {
            continue;
        }
        if let Some(first) = writers.insert(revision, op) {
            let mut v = Violation::new(
                Checker::Revisions,
                None,
                format!("two acknowledged writes share revision {revision}"),
            );
            v.sub_history = vec![first.clone(), op.clone()];
            violations.push(v);
        }
    }

    // Real-time order: sweep invocations in time order, keeping the highest revision among
    // operations that returned strictly before.
    let mut by_return: Vec<&(&Operation, i64, bool)> = acked.iter().collect();
    by_return.sort_by_key(|(op, _, _)| op.return_ns);
    let mut by_invoke: Vec<&(&Operation, i64, bool)> = acked.iter().collect();
    by_invoke.sort_by_key(|(op, _, _)| op.invoke_ns);
    let mut returned = 0;
    let mut highest: Option<(&Operation, i64)> = None;
    for &&(op, revision, wrote) in &by_invoke {
        while returned < by_return.len() && by_return[returned].0.return_ns < op.invoke_ns {
            let (done, done_rev, _) = *by_return[returned];
            if highest.is_none_or(|(_, h)| done_rev > h) {
                highest = Some((done, done_rev));
            }
            returned += 1;
        }
        let Some((before, before_rev)) = highest else {
            continue;
        };
        if revision < before_rev || (wrote && revision == before_rev) {
            let mut v = Violation::new(
                Checker::Revisions,
                Some(op.input.key().to_string()),
                format!(
                    "revision went backwards in real time: an operation returned at revision {before_rev} at {}, \
                     a later one (invoked at {}) answered revision {revision}",
                    format_ns(before.return_ns),
                    format_ns(op.invoke_ns)
                ),
            );
            v.sub_history = vec![before.clone(), op.clone()];
            violations.push(v);
        }
    }

    // Per (member, epoch) monotonicity.
    let mut series: BTreeMap<(usize, u32), Vec<(u64, i64)>> = BTreeMap::new();
    for &(member, epoch, at_ns, revision) in &history.member_revisions {
        series
            .entry((member, epoch))
            .or_default()
            .push((at_ns, revision));
    }
    for ((member, epoch), mut points) in series {
        points.sort_by_key(|&(at, _)| at);
        for pair in points.windows(2) {
            let ((t0, r0), (t1, r1)) = (pair[0], pair[1]);
            if r1 < r0 {
                violations.push(Violation::new(
                    Checker::Revisions,
                    None,
                    format!(
                        "member {member} (process epoch {epoch}) answered revision {r0} at {} then {r1} at {}",
                        format_ns(t0),
                        format_ns(t1)
                    ),
                ));
            }
        }
    }
    violations
}
