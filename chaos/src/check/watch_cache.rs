//! The watch-cache contract kube-apiserver relies on (k8s.io/apiserver
//! `pkg/storage/cacher`): the state rebuilt from a list at revision L plus the watch events
//! after L equals, at every revision R the watch reported progress at, a fresh list at R.
//! A lost, duplicated, reordered or wrong event, or a list that is not a snapshot, breaks it.

use std::collections::BTreeMap;

use crate::history::{CacheRecord, CachedKv, EventKind};

use super::report::{Checker, Violation};

/// Differences shown per violation.
const MAX_DIFFS: usize = 5;

/// Checks every cache record; returns the violations and the number of checkpoints compared.
pub fn check_watch_caches(records: &[CacheRecord]) -> (Vec<Violation>, usize) {
    let mut violations = Vec::new();
    let mut compared = 0;
    for record in records {
        compared += check_record(record, &mut violations);
    }
    (violations, compared)
}

type State = BTreeMap<String, (String, i64)>;

fn check_record(record: &CacheRecord, violations: &mut Vec<Violation>) -> usize {
    let mut state: State = record
        .listed
        .iter()
        .map(|kv| (kv.key.clone(), (kv.value.clone(), kv.mod_revision)))
        .collect();
    let mut checkpoints: Vec<_> = record.checkpoints.iter().collect();
    checkpoints.sort_by_key(|c| c.revision);
    let mut next_checkpoint = 0;
    let mut compared = 0;
    let mut last_revision = record.list_revision;
    for event in &record.events {
        if event.mod_revision <= record.list_revision || event.mod_revision < last_revision {
            violations.push(violation(
                record,
                format!(
                    "event at revision {} on {:?} arrived after revision {last_revision} \
                     (list at {})",
                    event.mod_revision, event.key, record.list_revision
                ),
                Vec::new(),
            ));
            return compared;
        }
        last_revision = event.mod_revision;
        while let Some(c) = checkpoints.get(next_checkpoint)
            && c.revision < event.mod_revision
        {
            compared += 1;
            compare(record, &state, c.revision, &c.fresh, violations);
            next_checkpoint += 1;
        }
        match event.kind {
            EventKind::Put => {
                state.insert(event.key.clone(), (event.value.clone(), event.mod_revision));
            }
            EventKind::Delete => {
                state.remove(&event.key);
            }
        }
    }
    for c in &checkpoints[next_checkpoint..] {
        compared += 1;
        compare(record, &state, c.revision, &c.fresh, violations);
    }
    compared
}

/// Pushes a violation when `state` (the cache at `revision`) differs from `fresh`.
fn compare(
    record: &CacheRecord,
    state: &State,
    revision: i64,
    fresh: &[CachedKv],
    violations: &mut Vec<Violation>,
) {
    let fresh: State = fresh
        .iter()
        .map(|kv| (kv.key.clone(), (kv.value.clone(), kv.mod_revision)))
        .collect();
    if *state == fresh {
        return;
    }
    let mut diffs = Vec::new();
    for (key, cached) in state {
        match fresh.get(key) {
            None => diffs.push(format!("{key:?}: cache has {cached:?}, list has nothing")),
            Some(listed) if listed != cached => diffs.push(format!(
                "{key:?}: cache has {cached:?}, list has {listed:?}"
            )),
            Some(_) => {}
        }
    }
    for (key, listed) in &fresh {
        if !state.contains_key(key) {
            diffs.push(format!("{key:?}: cache has nothing, list has {listed:?}"));
        }
    }
    let total = diffs.len();
    diffs.truncate(MAX_DIFFS);
    violations.push(violation(
        record,
        format!(
            "state rebuilt from the list at {} and {} events differs from a fresh list at \
             revision {revision} in {total} keys",
            record.list_revision,
            record.events.len()
        ),
        diffs,
    ));
}

fn violation(record: &CacheRecord, message: String, details: Vec<String>) -> Violation {
    let mut v = Violation::new(
        Checker::WatchCache,
        Some(record.prefix.clone()),
        format!("cache {}: {message}", record.cache),
    );
    v.details = details;
    v
}
