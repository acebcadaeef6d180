//! The checkers' result types: options in, a report of violations and inconclusive checks out.

use std::fmt;
use std::time::Duration;

use crate::history::{Key, Operation};

use super::format::format_operation;

/// Knobs of [`super::check_history`].
#[derive(Clone, Debug)]
pub struct CheckOptions {
    /// Wall-clock budget of the linearizability search for one key's sub-history. When it runs
    /// out the key is listed in [`CheckReport::inconclusive`], never as a violation.
    pub linearizability_budget: Duration,
    /// Wall-clock budget for shrinking one linearizability violation to a minimal offending
    /// sub-history; when it runs out the smallest non-linearizable sub-history found so far is
    /// reported.
    pub minimize_budget: Duration,
    /// At most this many violations of one [`Checker`] are kept in the report; the rest are
    /// counted in [`CheckStats::violations_suppressed`].
    pub max_violations_per_checker: usize,
}

impl Default for CheckOptions {
    /// 10 s per key, 10 s per violation's minimisation, 20 violations per checker.
    fn default() -> Self {
        CheckOptions {
            linearizability_budget: Duration::from_secs(10),
            minimize_budget: Duration::from_secs(10),
            max_violations_per_checker: 20,
        }
    }
}

/// One watch guarantee of etcd's API (https://etcd.io/docs/v3.5/learning/api_guarantees/#watch-apis),
/// plus the event-field consistency checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WatchGuarantee {
    /// Events arrive in increasing revision order.
    Ordered,
    /// No event is delivered twice.
    Unique,
    /// All events of one revision arrive in one response.
    Atomic,
    /// No gaps: every acknowledged change to a watched key inside the watched window arrives,
    /// with the value the store holds at that revision.
    Reliable,
    /// Every event corresponds to a write that was issued before the event arrived (no events
    /// out of thin air, no two different events for one revision).
    Valid,
    /// A watch from `start_revision` starts exactly at the first change at or after it.
    Resumable,
    /// A progress notification at revision R is never followed by an event at or below R.
    Progress,
    /// KeyValue fields of events (create_revision, version) and the response header revision
    /// are consistent with the sequence of changes.
    EventFields,
}

/// Which checker found a violation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Checker {
    /// The per-key KV history is not linearizable (Wing & Gong / Lowe search, porcupine-style).
    Linearizability,
    /// A serializable read returned a value no write could have produced by then.
    SerializableRead,
    /// A watch guarantee was broken.
    Watch(WatchGuarantee),
    /// Members ended at different revisions, or with different `HashKV` at the same revision.
    Convergence,
    /// Revisions went backwards: per member and process epoch, or across acknowledged
    /// operations in real-time order, or two acknowledged writes share a revision.
    Revisions,
    /// A kube-apiserver-style watch cache (list + watch) diverged from a fresh list at the
    /// same revision (`--traffic kubernetes`), or a paginated list was not one snapshot.
    WatchCache,
}

impl fmt::Display for Checker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Checker::Linearizability => f.write_str("linearizability"),
            Checker::SerializableRead => f.write_str("serializable-read"),
            Checker::Watch(g) => write!(f, "watch/{}", format!("{g:?}").to_lowercase()),
            Checker::Convergence => f.write_str("convergence"),
            Checker::Revisions => f.write_str("revisions"),
            Checker::WatchCache => f.write_str("watch-cache"),
        }
    }
}

/// One broken guarantee, with the evidence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The checker (and for watches, the guarantee) that found it.
    pub checker: Checker,
    /// The key concerned, when the violation is about one key.
    pub key: Option<Key>,
    /// One-line explanation.
    pub message: String,
    /// Extra evidence lines (watch responses, member finals, ...), printed after the message.
    pub details: Vec<String>,
    /// The offending operations. For linearizability this is a minimal non-linearizable
    /// sub-history (ops the minimiser relaxed from `Ok` to `Unknown` carry the reason
    /// "relaxed by minimiser"); for other checkers the operations the violation refers to.
    pub sub_history: Vec<Operation>,
}

impl Violation {
    /// A violation with no details or operations yet.
    pub fn new(checker: Checker, key: Option<Key>, message: impl Into<String>) -> Self {
        Violation {
            checker,
            key,
            message: message.into(),
            details: Vec::new(),
            sub_history: Vec::new(),
        }
    }
}

impl fmt::Display for Violation {
    /// Multi-line: `[checker] key: message`, then details and operations indented.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}]", self.checker)?;
        if let Some(key) = &self.key {
            write!(f, " key {key:?}:")?;
        }
        write!(f, " {}", self.message)?;
        for line in &self.details {
            write!(f, "\n    {line}")?;
        }
        for op in &self.sub_history {
            write!(f, "\n    {}", format_operation(op))?;
        }
        Ok(())
    }
}

/// Counters of what was checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckStats {
    /// Operations in the history, by outcome.
    pub ops_ok: usize,
    pub ops_failed: usize,
    pub ops_unknown: usize,
    /// Keys whose sub-history was searched, and how many of them finished within budget.
    pub keys: usize,
    pub keys_checked: usize,
    /// Unknown writes whose fate the watches told (see `Observations`).
    pub unknown_writes_resolved: usize,
    /// Distinct (linearized set, model state) pairs the search visited, over all keys.
    pub search_states: u64,
    /// Watch records and events checked.
    pub watches: usize,
    pub watch_events: usize,
    /// Violations found beyond [`CheckOptions::max_violations_per_checker`] and not listed.
    pub violations_suppressed: usize,
    /// Wall-clock time of the whole check.
    pub elapsed: Duration,
}

/// The result of [`super::check_history`].
#[derive(Clone, Debug, Default)]
pub struct CheckReport {
    pub violations: Vec<Violation>,
    /// Checks that could not conclude (a key whose search ran out of budget, hashes taken at
    /// different compact revisions), one line each. Not violations.
    pub inconclusive: Vec<String>,
    pub stats: CheckStats,
}

impl CheckReport {
    /// True when no violation was found (inconclusive checks do not count).
    pub fn is_ok(&self) -> bool {
        self.violations.is_empty()
    }

    /// All violations found, including the suppressed ones.
    pub fn violation_count(&self) -> usize {
        self.violations.len() + self.stats.violations_suppressed
    }
}
