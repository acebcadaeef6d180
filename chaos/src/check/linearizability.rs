//! Linearizability of one key's sub-history: Wing & Gong's search with Lowe's memoisation, as
//! in porcupine (anishathalye/porcupine, `checker.go`, `checkSingle`). Operations become call
//! and return entries in a doubly linked list ordered by time; the search linearizes the first
//! pending call whose step the model accepts, lifting its entries out of the list, and
//! backtracks when it reaches a return entry (that operation ran out of time). A cache of
//! (linearized set, model state) pairs prunes states already explored.
//!
//! Unknown outcomes: an operation that may or may not have taken effect returns at +infinity,
//! and the search succeeds once every *required* operation is linearized, so unknown ones may
//! be left out. An unknown write whose (unique) value is later observed is required and must
//! be linearized before the earliest return of an operation that observed it.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::history::{Input, Operation, Outcome, Output};

use super::model::{KeyState, Step, Values, step_of};
use super::observations::{Fate, Observations};

/// The outcome of one search.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SearchResult {
    Linearizable,
    NotLinearizable,
    /// The deadline passed first.
    Timeout,
}

/// One operation prepared for the search.
#[derive(Clone, Copy, Debug)]
struct SearchOp {
    step: Step,
    invoke: u64,
    /// `u64::MAX` for unknown outcomes nobody observed.
    ret: u64,
    /// Must be linearized for the search to succeed.
    required: bool,
}

/// Reduces one key's operations to search ops, tightening unknown writes whose fate the
/// watches tell, or whose value a read observed (values are unique per run, so an observation
/// names its write).
fn prepare(ops: &[Operation], observations: &Observations) -> Vec<SearchOp> {
    let mut values = Values::default();
    let mut prepared: Vec<SearchOp> = Vec::with_capacity(ops.len());
    for op in ops {
        let Some(step) = step_of(op, &mut values) else {
            continue;
        };
        let known = matches!(op.outcome, Outcome::Ok(_));
        let mut prepared_op = SearchOp {
            step,
            invoke: op.invoke_ns,
            // A return before the invoke (a recording error) is read as an instant operation.
            ret: if known {
                op.return_ns.max(op.invoke_ns)
            } else {
                u64::MAX
            },
            required: known,
        };
        match observations.fate(op) {
            Some(Fate::NotApplied) => continue,
            Some(Fate::Applied { at_ns, revision }) => {
                prepared_op.required = true;
                prepared_op.ret = at_ns.max(op.invoke_ns);
                prepared_op.step = applied(step, revision);
            }
            None => {}
        }
        prepared.push(prepared_op);
    }
    // Earliest observation of each value: (return time, mod_revision if a read told it).
    let mut observed: HashMap<&str, (u64, Option<i64>)> = HashMap::new();
    for op in ops {
        let seen = match (&op.input, &op.outcome) {
            (
                Input::Get { .. },
                Outcome::Ok(Output::Get {
                    kv: Some((v, r)), ..
                }),
            ) => Some((v.as_str(), Some(*r))),
            (
                Input::Cas {
                    expect: Some(v), ..
                },
                Outcome::Ok(Output::Cas {
                    succeeded: true, ..
                }),
            ) => Some((v.as_str(), None)),
            _ => None,
        };
        if let Some((value, revision)) = seen {
            let entry = observed.entry(value).or_insert((op.return_ns, revision));
            entry.0 = entry.0.min(op.return_ns);
            entry.1 = entry.1.or(revision);
        }
    }
    let mut by_id: HashMap<u32, (u64, Option<i64>)> = HashMap::new();
    for (value, seen) in observed {
        by_id.insert(values.id(value), seen);
    }
    for op in &mut prepared {
        let Some(value) = op.step.written_value() else {
            continue;
        };
        if op.required {
            continue;
        }
        let Some(&(first_seen, revision)) = by_id.get(&value) else {
            continue;
        };
        op.required = true;
        op.ret = first_seen.max(op.invoke);
        if let Some(revision) = revision {
            op.step = applied(op.step, revision);
        }
    }
    prepared
}

/// An unknown put or CAS known to have taken effect at `revision`.
fn applied(step: Step, revision: i64) -> Step {
    match step {
        Step::PutUnknown { value } => Step::Put { value, revision },
        Step::CasUnknown { expect, value } => Step::Cas {
            expect,
            value,
            succeeded: true,
            revision,
        },
        other => other,
    }
}

const NONE: usize = usize::MAX;

/// `budget` from now, saturating far in the future for huge budgets.
pub fn deadline_after(budget: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(budget)
        .unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600))
}

/// The entry list: node 0 is the head sentinel, then one call and one return node per op.
struct Entries {
    prev: Vec<usize>,
    next: Vec<usize>,
    /// For a call node, its return node; `NONE` for return nodes and the head.
    matching: Vec<usize>,
    op: Vec<usize>,
}

impl Entries {
    fn new(ops: &[SearchOp]) -> Self {
        // (time, is_return, op): calls sort before returns at equal times, so operations that
        // touch at one instant count as concurrent (the lenient reading, as in porcupine).
        let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(ops.len() * 2);
        for (i, op) in ops.iter().enumerate() {
            events.push((op.invoke, false, i));
            events.push((op.ret, true, i));
        }
        events.sort_unstable();
        let n = events.len() + 1;
        let mut entries = Entries {
            prev: vec![NONE; n],
            next: vec![NONE; n],
            matching: vec![NONE; n],
            op: vec![NONE; n],
        };
        let mut call_node = vec![NONE; ops.len()];
        for (pos, &(_, is_return, op)) in events.iter().enumerate() {
            let node = pos + 1;
            entries.prev[node] = pos;
            entries.next[pos] = node;
            entries.op[node] = op;
            if is_return {
                entries.matching[call_node[op]] = node;
            } else {
                call_node[op] = node;
            }
        }
        entries
    }

    fn unlink(&mut self, node: usize) {
        let (p, n) = (self.prev[node], self.next[node]);
        self.next[p] = n;
        if n != NONE {
            self.prev[n] = p;
        }
    }

    fn relink(&mut self, node: usize) {
        let (p, n) = (self.prev[node], self.next[node]);
        self.next[p] = node;
        if n != NONE {
            self.prev[n] = node;
        }
    }

    /// Removes a call node and its return node.
    fn lift(&mut self, call: usize) {
        self.unlink(call);
        self.unlink(self.matching[call]);
    }

    /// Undoes [`Self::lift`] (in reverse order).
    fn unlift(&mut self, call: usize) {
        self.relink(self.matching[call]);
        self.relink(call);
    }
}

/// Fixed-size bitset of linearized operations.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Bits(Box<[u64]>);

impl Bits {
    fn new(n: usize) -> Self {
        Bits(vec![0; n.div_ceil(64)].into_boxed_slice())
    }
    fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    fn clear(&mut self, i: usize) {
        self.0[i / 64] &= !(1 << (i % 64));
    }
}

/// Searches for a linearization of `ops` (one key's operations, any order) before `deadline`,
/// using what `observations` tell about unknown writes. `states` is increased by the number of
/// distinct (linearized set, state) pairs visited.
pub fn search(
    ops: &[Operation],
    observations: &Observations,
    deadline: Instant,
    states: &mut u64,
) -> SearchResult {
    let ops = prepare(ops, observations);
    let mut remaining = ops.iter().filter(|op| op.required).count();
    if remaining == 0 {
        return SearchResult::Linearizable;
    }
    let mut entries = Entries::new(&ops);
    let mut linearized = Bits::new(ops.len());
    let mut cache: HashSet<(Bits, KeyState)> = HashSet::new();
    let mut stack: Vec<(usize, KeyState)> = Vec::new();
    let mut state = KeyState::default();
    let mut node = entries.next[0];
    let mut iterations: u64 = 0;
    loop {
        iterations += 1;
        if iterations.is_multiple_of(1024) && Instant::now() >= deadline {
            *states += cache.len() as u64;
            return SearchResult::Timeout;
        }
        if node == NONE {
            // Only unobserved unknown operations are left and every required one is done.
            break;
        }
        let op = entries.op[node];
        if entries.matching[node] != NONE {
            // A call entry: try to linearize the operation here.
            if let Some(next_state) = ops[op].step.apply(&state) {
                let mut candidate = linearized.clone();
                candidate.set(op);
                if cache.insert((candidate.clone(), next_state)) {
                    stack.push((node, state));
                    state = next_state;
                    linearized = candidate;
                    entries.lift(node);
                    if ops[op].required {
                        remaining -= 1;
                        if remaining == 0 {
                            break;
                        }
                    }
                    node = entries.next[0];
                    continue;
                }
            }
            node = entries.next[node];
        } else {
            // A return entry: this operation can no longer be linearized later; backtrack.
            let Some((call, previous)) = stack.pop() else {
                *states += cache.len() as u64;
                return SearchResult::NotLinearizable;
            };
            let undone = entries.op[call];
            if ops[undone].required {
                remaining += 1;
            }
            state = previous;
            linearized.clear(undone);
            entries.unlift(call);
            node = entries.next[call];
        }
    }
    *states += cache.len() as u64;
    SearchResult::Linearizable
}
