//! Checks a recovered store against the client history of a crash test.
//!
//! Durability and atomicity rules (etcd's "API guarantees": a write is durable once
//! acknowledged, a txn is atomic, every write advances the revision by exactly one):
//! 1. Every acknowledged write is present, with `mod_revision == create_revision ==` the
//!    acknowledged revision, `version == 1` and its value.
//! 2. A pair txn is all-or-nothing: both keys with the same `mod_revision`, or neither
//!    (acknowledged pairs must be present by rule 1).
//! 3. No key exists that no client wrote, and a present key carries the value it was written
//!    with.
//! 4. Each revision in `(base, store revision]` carries exactly one write: no revision is lost,
//!    reused, or skipped across crashes.
//! 5. Revisions follow real time: if write A was acknowledged before write B was sent, A's
//!    revision is lower (per client this is plain ordering; across clients it is the
//!    linearizability of revision assignment).

use std::collections::{BTreeMap, HashMap};

use keel_proto::mvccpb::KeyValue;

use super::history::{Attempt, Outcome, Write};
use super::store::Store;

/// Applies rules 1-5 and returns one line per violation (empty = the history is consistent).
/// `base` is the store revision before the clients started.
pub fn check(history: &[Attempt], store: &Store, base: i64) -> Vec<String> {
    let mut violations = Vec::new();
    // key -> index of the attempt that wrote it (keys are unique per write).
    let mut owner: HashMap<&[u8], usize> = HashMap::new();
    for (index, attempt) in history.iter().enumerate() {
        for key in attempt.write.keys() {
            owner.insert(key, index);
        }
    }
    for attempt in history {
        check_write(attempt, store, &mut violations);
    }
    check_no_phantoms(&owner, store, &mut violations);
    check_revisions_dense(&owner, store, base, &mut violations);
    check_real_time_order(history, &mut violations);
    violations
}

/// Rules 1 and 2 (and the value part of rule 3) for one attempt.
fn check_write(attempt: &Attempt, store: &Store, violations: &mut Vec<String>) {
    let found: Vec<Option<&KeyValue>> = attempt
        .write
        .keys()
        .iter()
        .map(|k| store.kvs.get(*k))
        .collect();
    let present: Vec<&KeyValue> = found.iter().flatten().copied().collect();
    let acked = attempt.acked_revision();
    if present.is_empty() {
        if let Some(revision) = acked {
            violations.push(format!(
                "LOST acknowledged write at revision {revision}: {attempt:?}"
            ));
        }
        return;
    }
    if present.len() != found.len() {
        violations.push(format!(
            "HALF-APPLIED txn (only {} of {} keys): {attempt:?}",
            present.len(),
            found.len()
        ));
        return;
    }
    let revision = present[0].mod_revision;
    for kv in &present {
        if kv.mod_revision != revision {
            violations.push(format!(
                "txn keys at different revisions ({:?}): {attempt:?}",
                mod_revisions(&present)
            ));
        }
        if kv.create_revision != kv.mod_revision || kv.version != 1 {
            violations.push(format!(
                "key written once has create/mod/version {}/{}/{}: {attempt:?}",
                kv.create_revision, kv.mod_revision, kv.version
            ));
        }
        if kv.value != attempt.write.value() {
            violations.push(format!(
                "WRONG VALUE {:?}: {attempt:?}",
                String::from_utf8_lossy(&kv.value)
            ));
        }
    }
    if let Some(acked) = acked
        && acked != revision
    {
        violations.push(format!(
            "acknowledged at revision {acked} but stored at {revision}: {attempt:?}"
        ));
    }
}

/// Rule 3: every key in the store belongs to a write of the history.
fn check_no_phantoms(owner: &HashMap<&[u8], usize>, store: &Store, violations: &mut Vec<String>) {
    for key in store.kvs.keys() {
        if !owner.contains_key(key.as_slice()) {
            violations.push(format!(
                "PHANTOM key nobody wrote: {:?}",
                String::from_utf8_lossy(key)
            ));
        }
    }
}

/// Rule 4: the present writes occupy every revision in `(base, store.revision]` exactly once.
fn check_revisions_dense(
    owner: &HashMap<&[u8], usize>,
    store: &Store,
    base: i64,
    violations: &mut Vec<String>,
) {
    // revision -> the distinct writes stored at it (a pair txn counts once).
    let mut writes_at: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
    for (key, kv) in &store.kvs {
        if let Some(&index) = owner.get(key.as_slice()) {
            let writes = writes_at.entry(kv.mod_revision).or_default();
            if !writes.contains(&index) {
                writes.push(index);
            }
        }
    }
    for (revision, writes) in &writes_at {
        if writes.len() > 1 {
            violations.push(format!(
                "REUSED revision {revision} by {} different writes",
                writes.len()
            ));
        }
        if *revision <= base || *revision > store.revision {
            violations.push(format!(
                "revision {revision} outside (base {base}, store revision {}]",
                store.revision
            ));
        }
    }
    let missing: Vec<i64> = (base + 1..=store.revision)
        .filter(|r| !writes_at.contains_key(r))
        .collect();
    if !missing.is_empty() {
        let shown: Vec<i64> = missing.iter().take(20).copied().collect();
        violations.push(format!(
            "{} revisions in ({base}, {}] carry no write (first: {shown:?})",
            missing.len(),
            store.revision
        ));
    }
}

/// Rule 5, in O(n log n): sort acknowledged writes by completion time; for each write B, the
/// highest revision among writes completed before B was sent must be below B's revision.
fn check_real_time_order(history: &[Attempt], violations: &mut Vec<String>) {
    let mut acked: Vec<(&Attempt, i64)> = history
        .iter()
        .filter_map(|a| a.acked_revision().map(|r| (a, r)))
        .collect();
    acked.sort_by_key(|(a, _)| a.done);
    let mut max_so_far = Vec::with_capacity(acked.len());
    let mut max = i64::MIN;
    for (_, revision) in &acked {
        max = max.max(*revision);
        max_so_far.push(max);
    }
    for (b, revision) in &acked {
        let before = acked.partition_point(|(a, _)| a.done < b.sent);
        if before > 0 && max_so_far[before - 1] >= *revision {
            violations.push(format!(
                "ORDER: write acknowledged at revision {} finished before this one was sent, \
                 yet it got revision {revision}: {b:?}",
                max_so_far[before - 1]
            ));
        }
    }
}

fn mod_revisions(kvs: &[&KeyValue]) -> Vec<i64> {
    kvs.iter().map(|kv| kv.mod_revision).collect()
}

/// Counts of the history, for the test's summary line: writes sent, acknowledged and unknown
/// (with one sample error), acknowledged writes per writer, and the size of the store.
pub fn summary(history: &[Attempt], store: &Store) -> String {
    let acked = history
        .iter()
        .filter(|a| a.acked_revision().is_some())
        .count();
    let pairs = history
        .iter()
        .filter(|a| matches!(a.write, Write::PairTxn { .. }))
        .count();
    let mut per_writer: BTreeMap<usize, usize> = BTreeMap::new();
    for attempt in history.iter().filter(|a| a.acked_revision().is_some()) {
        *per_writer.entry(attempt.writer).or_default() += 1;
    }
    let sample_error = history.iter().find_map(|a| match &a.outcome {
        Outcome::Unknown { error } => Some(error.as_str()),
        Outcome::Acked { .. } => None,
    });
    format!(
        "{} writes sent ({pairs} pair txns), {acked} acknowledged (per writer {:?}), {} unknown \
         (e.g. {}); store has {} keys at revision {}",
        history.len(),
        per_writer.values().collect::<Vec<_>>(),
        history.len() - acked,
        sample_error.unwrap_or("none"),
        store.kvs.len(),
        store.revision
    )
}

/// The checker itself must catch each kind of violation; synthetic histories and stores.
mod self_test {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::crash_recovery::history::Outcome;

    fn put(key: &str, sent_ms: u64, done_ms: u64, outcome: Outcome) -> Attempt {
        let t0 = Instant::now();
        Attempt {
            writer: 0,
            write: Write::Put {
                key: key.into(),
                value: b"v".to_vec(),
            },
            sent: t0 + Duration::from_millis(sent_ms),
            done: t0 + Duration::from_millis(done_ms),
            outcome,
        }
    }

    fn pair(a: &str, b: &str, outcome: Outcome) -> Attempt {
        let now = Instant::now();
        Attempt {
            writer: 1,
            write: Write::PairTxn {
                a: a.into(),
                b: b.into(),
                value: b"v".to_vec(),
            },
            sent: now,
            done: now,
            outcome,
        }
    }

    fn acked(revision: i64) -> Outcome {
        Outcome::Acked { revision }
    }

    fn unknown() -> Outcome {
        Outcome::Unknown {
            error: "crash".into(),
        }
    }

    fn store(entries: &[(&str, i64)], revision: i64) -> Store {
        let kvs = entries
            .iter()
            .map(|(key, rev)| {
                let kv = KeyValue {
                    key: key.as_bytes().to_vec(),
                    create_revision: *rev,
                    mod_revision: *rev,
                    version: 1,
                    value: b"v".to_vec(),
                    lease: 0,
                };
                (kv.key.clone(), kv)
            })
            .collect();
        Store { kvs, revision }
    }

    #[track_caller]
    fn assert_flags(history: &[Attempt], store: &Store, needle: &str) {
        let violations = check(history, store, 1);
        assert!(
            violations.iter().any(|v| v.contains(needle)),
            "want {needle:?} in {violations:?}"
        );
    }

    #[test]
    fn consistent_history_passes() {
        let history = [
            put("p1", 0, 1, acked(2)),
            pair("a", "b", acked(3)),
            put("p2", 2, 3, unknown()),
            put("p3", 4, 5, unknown()),
        ];
        let violations = check(
            &history,
            &store(&[("p1", 2), ("a", 3), ("b", 3), ("p2", 4)], 4),
            1,
        );
        assert_eq!(violations, Vec::<String>::new());
    }

    #[test]
    fn catches_lost_half_phantom_reused_gap_and_order() {
        assert_flags(&[put("p1", 0, 1, acked(2))], &store(&[], 1), "LOST");
        assert_flags(
            &[pair("a", "b", unknown())],
            &store(&[("a", 2)], 2),
            "HALF-APPLIED",
        );
        assert_flags(&[], &store(&[("x", 2)], 2), "PHANTOM");
        let two = [put("p1", 0, 1, acked(2)), put("p2", 2, 3, acked(2))];
        assert_flags(&two, &store(&[("p1", 2), ("p2", 2)], 2), "REUSED");
        assert_flags(
            &[put("p1", 0, 1, acked(3))],
            &store(&[("p1", 3)], 3),
            "carry no write",
        );
        // p1 finished (t=1) before p2 was sent (t=2) but got the higher revision.
        let inverted = [put("p1", 0, 1, acked(3)), put("p2", 2, 3, acked(2))];
        assert_flags(&inverted, &store(&[("p1", 3), ("p2", 2)], 3), "ORDER");
        assert_flags(
            &[put("p1", 0, 1, acked(2))],
            &store(&[("p1", 3)], 3),
            "acknowledged at revision 2 but stored at 3",
        );
    }
}
