//! etcd's watch guarantees (https://etcd.io/docs/v3.5/learning/api_guarantees/#watch-apis, and
//! the checks of etcd's robustness tests, `tests/robustness/validate/watch.go`), per recorded
//! watch stream, against the KV history:
//! - ordered: event revisions never decrease across the stream;
//! - unique: no (revision, key) event is delivered twice;
//! - atomic: the events of one revision arrive in one response;
//! - reliable: every acknowledged change of a watched key with a revision in the watched
//!   window — from `created_revision` (or `start_revision - 1`) exclusive to the last revision
//!   the stream saw (its last event or progress notification) inclusive — arrives, with the
//!   acknowledged value;
//! - valid: every event matches a write to that key invoked before the event arrived (an
//!   acknowledged write at that very revision, or an unknown one), and two streams never
//!   disagree about what happened at a revision;
//! - resumable: no event below the start (`start_revision`, or above `created_revision` for
//!   "from now" watches), and no acknowledged change missing between the start and the first
//!   event;
//! - progress: after a progress notification at header revision R, no event at or below R;
//! - event fields: a response's header revision is at least its events' revisions; a delete
//!   event carries only the key and mod_revision (create_revision = version = 0); a put has
//!   version 1 and create_revision = mod_revision exactly when it creates the key, and
//!   following the key's previous event on the stream, version + 1 and the same create_revision.
//!
//! Problems of one kind on one stream are reported as one violation with the first few cases.

use std::collections::{BTreeMap, HashMap};

use crate::history::{
    EventKind, History, Input, Operation, Outcome, Output, WatchEvent, WatchRecord,
};

use super::format::format_ns;
use super::report::{Checker, Violation, WatchGuarantee};

/// How many cases of one problem kind a violation lists.
const CASES_SHOWN: usize = 5;

/// An acknowledged change to the store, from the KV history.
struct Change<'a> {
    key: &'a str,
    kind: EventKind,
    value: &'a str,
    op: &'a Operation,
}

/// What the KV history tells about writes, indexed for the watch checks.
struct Writes<'a> {
    /// Acknowledged changes by revision (each operation touches one key, so one per revision).
    by_revision: BTreeMap<i64, Change<'a>>,
    /// Puts and CAS (not failed) by value; values are unique per run.
    by_value: HashMap<&'a str, &'a Operation>,
    /// Deletes (not failed) by key.
    deletes: HashMap<&'a str, Vec<&'a Operation>>,
}

impl<'a> Writes<'a> {
    fn new(ops: &'a [Operation]) -> Self {
        let mut writes = Writes {
            by_revision: BTreeMap::new(),
            by_value: HashMap::new(),
            deletes: HashMap::new(),
        };
        for op in ops {
            if matches!(op.outcome, Outcome::Failed(_)) {
                continue;
            }
            match &op.input {
                Input::Put { value, .. } | Input::Cas { value, .. } => {
                    writes.by_value.insert(value, op);
                }
                Input::Delete { key } => writes.deletes.entry(key).or_default().push(op),
                Input::Get { .. } => {}
            }
            let key = op.input.key();
            let change = match (&op.input, &op.outcome) {
                (Input::Put { value, .. }, Outcome::Ok(Output::Put { revision }))
                | (
                    Input::Cas { value, .. },
                    Outcome::Ok(Output::Cas {
                        succeeded: true,
                        revision,
                    }),
                ) => Some((
                    *revision,
                    Change {
                        key,
                        kind: EventKind::Put,
                        value,
                        op,
                    },
                )),
                (
                    Input::Delete { .. },
                    Outcome::Ok(Output::Delete {
                        deleted: 1..,
                        revision,
                    }),
                ) => Some((
                    *revision,
                    Change {
                        key,
                        kind: EventKind::Delete,
                        value: "",
                        op,
                    },
                )),
                _ => None,
            };
            if let Some((revision, change)) = change {
                writes.by_revision.insert(revision, change);
            }
        }
        writes
    }
}

/// Whether `key` is in the watched range: `range_end` empty means the single key, `"\0"` means
/// every key at or after `key` (etcd's WatchCreateRequest.range_end).
pub fn in_range(record: &WatchRecord, key: &str) -> bool {
    if record.range_end.is_empty() {
        key == record.key
    } else if record.range_end == "\0" {
        key >= record.key.as_str()
    } else {
        key >= record.key.as_str() && key < record.range_end.as_str()
    }
}

/// Problems found on one stream, grouped by guarantee.
#[derive(Default)]
struct Findings {
    cases: BTreeMap<WatchGuarantee, (usize, Vec<String>, Vec<Operation>)>,
}

impl Findings {
    fn add(&mut self, guarantee: WatchGuarantee, case: String, op: Option<&Operation>) {
        let entry = self.cases.entry(guarantee).or_default();
        entry.0 += 1;
        if entry.1.len() < CASES_SHOWN {
            entry.1.push(case);
            if let Some(op) = op {
                entry.2.push(op.clone());
            }
        }
    }
}

fn describe(event: &WatchEvent) -> String {
    match event.kind {
        EventKind::Put => format!(
            "put {}={} rev {} (create {}, version {})",
            event.key, event.value, event.mod_revision, event.create_revision, event.version
        ),
        EventKind::Delete => format!("delete {} rev {}", event.key, event.mod_revision),
    }
}

/// Checks every watch record of `history`; returns the violations and the number of events.
pub fn check_watches(history: &History) -> (Vec<Violation>, usize) {
    let writes = Writes::new(&history.operations);
    // (revision, key) -> (kind, value, watcher) as first seen by any stream.
    let mut seen_anywhere: HashMap<(i64, &str), (EventKind, &str, u32)> = HashMap::new();
    let mut violations = Vec::new();
    let mut events = 0;
    for record in &history.watches {
        let mut findings = Findings::default();
        events += check_record(record, &writes, &mut seen_anywhere, &mut findings);
        let title = format!(
            "watcher {} on member {} of [{:?}, {:?}) from {}",
            record.watcher,
            record.member,
            record.key,
            record.range_end,
            if record.start_revision > 0 {
                format!("revision {}", record.start_revision)
            } else {
                format!("now (created at revision {})", record.created_revision)
            }
        );
        for (guarantee, (count, cases, ops)) in findings.cases {
            let mut v = Violation::new(
                Checker::Watch(guarantee),
                (record.range_end.is_empty()).then(|| record.key.clone()),
                format!("{title}: {count} case(s)"),
            );
            v.details = cases;
            v.sub_history = ops;
            violations.push(v);
        }
    }
    (violations, events)
}

/// Checks one stream; returns how many events it received.
fn check_record<'a>(
    record: &'a WatchRecord,
    writes: &Writes<'a>,
    seen_anywhere: &mut HashMap<(i64, &'a str), (EventKind, &'a str, u32)>,
    findings: &mut Findings,
) -> usize {
    use WatchGuarantee::*;
    let mut received: HashMap<(i64, &str), &WatchEvent> = HashMap::new();
    let mut last: Option<(i64, usize)> = None; // (revision, response index) of the last event
    let mut progress: i64 = 0;
    let mut first_event: Option<i64> = None;
    let mut previous_on_key: HashMap<&str, &WatchEvent> = HashMap::new();
    let mut count = 0;
    for (index, response) in record.responses.iter().enumerate() {
        if response.compact_revision > 0 {
            continue;
        }
        if response.events.is_empty() {
            progress = progress.max(response.header_revision);
            continue;
        }
        let at = format_ns(response.at_ns);
        for event in &response.events {
            count += 1;
            let rev = event.mod_revision;
            let what = describe(event);
            if response.header_revision < rev {
                findings.add(
                    EventFields,
                    format!(
                        "{what} arrived at {at} in a response with header revision {}",
                        response.header_revision
                    ),
                    None,
                );
            }
            if !in_range(record, &event.key) {
                findings.add(
                    Valid,
                    format!("{what} at {at}: key outside the watched range"),
                    None,
                );
            }
            let before_start = if record.start_revision > 0 {
                rev < record.start_revision
            } else {
                rev <= record.created_revision
            };
            if before_start {
                findings.add(
                    Resumable,
                    format!("{what} at {at} is before the watch's start"),
                    None,
                );
            }
            if received.insert((rev, &event.key), event).is_some() {
                findings.add(Unique, format!("{what} delivered again at {at}"), None);
                continue;
            }
            match last {
                Some((last_rev, _)) if rev < last_rev => {
                    findings.add(
                        Ordered,
                        format!("{what} at {at} after an event at revision {last_rev}"),
                        None,
                    );
                }
                Some((last_rev, last_index)) if rev == last_rev && last_index != index => {
                    findings.add(
                        Atomic,
                        format!("{what} at {at}: revision {rev} split across responses {last_index} and {index}"),
                        None,
                    );
                }
                _ => {}
            }
            if rev <= progress {
                findings.add(
                    Progress,
                    format!("{what} at {at} after a progress notification at revision {progress}"),
                    None,
                );
            }
            last = Some((last.map_or(rev, |(r, _)| r.max(rev)), index));
            first_event.get_or_insert(rev);
            check_valid(event, response.at_ns, writes, findings);
            match seen_anywhere.get(&(rev, event.key.as_str())) {
                Some(&(kind, value, watcher)) if kind != event.kind || value != event.value => findings.add(
                    Valid,
                    format!("{what} at {at}, but watcher {watcher} saw {kind:?} {value:?} at that revision"),
                    None,
                ),
                Some(_) => {}
                None => {
                    seen_anywhere.insert((rev, &event.key), (event.kind, &event.value, record.watcher));
                }
            }
            // Fields are compared with the key's previous change; out-of-order events are
            // reported as such above, not again here.
            let previous = previous_on_key
                .get(event.key.as_str())
                .copied()
                .filter(|p| p.mod_revision < rev);
            check_fields(event, previous, &at, findings);
            if previous.is_some() || !previous_on_key.contains_key(event.key.as_str()) {
                previous_on_key.insert(&event.key, event);
            }
        }
    }
    check_reliable(
        record,
        writes,
        &received,
        last.map(|(r, _)| r).unwrap_or(0).max(progress),
        first_event,
        findings,
    );
    count
}

/// The event names a write to its key issued before it arrived, matching any acknowledgement.
fn check_valid(event: &WatchEvent, at_ns: u64, writes: &Writes<'_>, findings: &mut Findings) {
    let what = describe(event);
    let at = format_ns(at_ns);
    if let Some(change) = writes.by_revision.get(&event.mod_revision) {
        if change.key != event.key || change.kind != event.kind || change.value != event.value {
            findings.add(
                WatchGuarantee::Valid,
                format!(
                    "{what} at {at}, but revision {} was acknowledged to this write:",
                    event.mod_revision
                ),
                Some(change.op),
            );
        } else if change.op.invoke_ns > at_ns {
            findings.add(
                WatchGuarantee::Valid,
                format!("{what} arrived at {at}, before its write was invoked:"),
                Some(change.op),
            );
        }
        return;
    }
    let problem = match event.kind {
        EventKind::Put => match writes.by_value.get(event.value.as_str()) {
            None => Some("no write of this value exists".to_string()),
            Some(write) if write.input.key() != event.key => {
                Some(format!("the value was written to {:?}", write.input.key()))
            }
            Some(write) if write.invoke_ns > at_ns => {
                Some("the write was invoked after the event arrived".to_string())
            }
            Some(write) if matches!(write.outcome, Outcome::Ok(_)) => Some(
                "the write was acknowledged at another revision, or its compare failed".to_string(),
            ),
            Some(_) => None,
        },
        EventKind::Delete => {
            let possible = writes
                .deletes
                .get(event.key.as_str())
                .is_some_and(|deletes| {
                    deletes
                        .iter()
                        .any(|d| d.invoke_ns <= at_ns && matches!(d.outcome, Outcome::Unknown(_)))
                });
            (!possible).then(|| {
                "no delete of this key with an unknown outcome was invoked before it".to_string()
            })
        }
    };
    if let Some(problem) = problem {
        let op = match event.kind {
            EventKind::Put => writes.by_value.get(event.value.as_str()).copied(),
            EventKind::Delete => None,
        };
        findings.add(
            WatchGuarantee::Valid,
            format!("{what} at {at} out of thin air: {problem}"),
            op,
        );
    }
}

/// KeyValue fields against the key's previous event on this stream.
fn check_fields(
    event: &WatchEvent,
    previous: Option<&WatchEvent>,
    at: &str,
    findings: &mut Findings,
) {
    let what = describe(event);
    let mut bad = |why: String| {
        findings.add(
            WatchGuarantee::EventFields,
            format!("{what} at {at}: {why}"),
            None,
        )
    };
    match event.kind {
        EventKind::Delete => {
            if event.create_revision != 0 || event.version != 0 {
                bad("a delete event carries only the key and mod_revision".to_string());
            }
        }
        EventKind::Put => {
            let creates = event.create_revision == event.mod_revision;
            if event.version < 1
                || event.create_revision < 1
                || event.create_revision > event.mod_revision
            {
                bad("impossible create_revision/version".to_string());
            } else if creates != (event.version == 1) {
                bad("version 1 exactly when create_revision = mod_revision".to_string());
            }
            match previous {
                Some(p) if p.kind == EventKind::Delete && !creates => {
                    bad(format!(
                        "follows a delete at revision {}, so it must create the key",
                        p.mod_revision
                    ));
                }
                Some(p)
                    if p.kind == EventKind::Put
                        && (event.create_revision != p.create_revision
                            || event.version != p.version + 1) =>
                {
                    bad(format!(
                        "follows {}: expected create_revision {} and version {} (a change in between was not delivered, or the fields are wrong)",
                        describe(p),
                        p.create_revision,
                        p.version + 1
                    ));
                }
                _ => {}
            }
        }
    }
}

/// Every acknowledged change in the watched window arrived, with the acknowledged value.
fn check_reliable(
    record: &WatchRecord,
    writes: &Writes<'_>,
    received: &HashMap<(i64, &str), &WatchEvent>,
    upper: i64,
    first_event: Option<i64>,
    findings: &mut Findings,
) {
    let lower = if record.start_revision > 0 {
        record.start_revision - 1
    } else {
        record.created_revision
    };
    if upper <= lower {
        return;
    }
    for (&rev, change) in writes.by_revision.range(lower + 1..=upper) {
        if !in_range(record, change.key) {
            continue;
        }
        match received.get(&(rev, change.key)) {
            None => {
                let guarantee =
                    if record.start_revision > 0 && first_event.is_none_or(|first| rev < first) {
                        WatchGuarantee::Resumable
                    } else {
                        WatchGuarantee::Reliable
                    };
                findings.add(
                    guarantee,
                    format!("missing {:?} of {} at revision {rev} (the stream saw up to revision {upper})", change.kind, change.key),
                    Some(change.op),
                );
            }
            Some(event) if event.kind != change.kind || event.value != change.value => {
                findings.add(
                    WatchGuarantee::Reliable,
                    format!(
                        "{} does not match the acknowledged write at that revision",
                        describe(event)
                    ),
                    Some(change.op),
                );
            }
            Some(_) => {}
        }
    }
}
