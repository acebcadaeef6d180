//! The watch-cache checker: list + watch must rebuild a fresh list at every checkpoint; a
//! lost, reordered or altered event is a violation.

use keel_chaos::check::{Checker, check_watch_caches};
use keel_chaos::history::{CacheCheckpoint, CacheRecord, CachedKv, EventKind, WatchEvent};

fn kv(key: &str, value: &str, mod_revision: i64) -> CachedKv {
    CachedKv {
        key: key.into(),
        value: value.into(),
        mod_revision,
    }
}

fn put(key: &str, value: &str, mod_revision: i64) -> WatchEvent {
    WatchEvent {
        kind: EventKind::Put,
        key: key.into(),
        value: value.into(),
        mod_revision,
        create_revision: mod_revision,
        version: 1,
    }
}

fn delete(key: &str, mod_revision: i64) -> WatchEvent {
    WatchEvent {
        kind: EventKind::Delete,
        key: key.into(),
        value: String::new(),
        mod_revision,
        create_revision: 0,
        version: 0,
    }
}

/// List at 10 with a and b; then b=2 at 11, a deleted at 12, c at 13; checkpoints at 12
/// and 13 hold the store's true state.
fn record(events: Vec<WatchEvent>) -> CacheRecord {
    CacheRecord {
        cache: 0,
        prefix: "/registry/".into(),
        list_revision: 10,
        listed: vec![kv("/registry/a", "a1", 5), kv("/registry/b", "b1", 7)],
        events,
        checkpoints: vec![
            CacheCheckpoint {
                revision: 12,
                fresh: vec![kv("/registry/b", "b2", 11)],
            },
            CacheCheckpoint {
                revision: 13,
                fresh: vec![kv("/registry/b", "b2", 11), kv("/registry/c", "c1", 13)],
            },
        ],
        redials: 1,
    }
}

fn full() -> Vec<WatchEvent> {
    vec![
        put("/registry/b", "b2", 11),
        delete("/registry/a", 12),
        put("/registry/c", "c1", 13),
    ]
}

#[test]
fn complete_history_passes_every_checkpoint() {
    let (violations, compared) = check_watch_caches(&[record(full())]);
    assert!(violations.is_empty(), "{violations:?}");
    assert_eq!(compared, 2);
}

#[test]
fn lost_watch_event_is_a_violation() {
    let mut events = full();
    events.remove(1); // the delete of a at 12 never arrived
    let (violations, compared) = check_watch_caches(&[record(events)]);
    assert_eq!(compared, 2);
    assert_eq!(violations.len(), 2, "{violations:?}");
    assert_eq!(violations[0].checker, Checker::WatchCache);
    assert!(
        violations[0]
            .message
            .contains("fresh list at revision 12 in 1 keys"),
        "{}",
        violations[0]
    );
    assert!(
        violations[0].details[0].contains("/registry/a"),
        "{}",
        violations[0]
    );
}

#[test]
fn altered_event_value_is_a_violation() {
    let mut events = full();
    events[2].value = "c-other".into();
    let (violations, _) = check_watch_caches(&[record(events)]);
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(
        violations[0].message.contains("revision 13"),
        "{}",
        violations[0]
    );
}

#[test]
fn event_at_or_below_the_list_revision_is_a_violation() {
    let mut events = full();
    events.insert(0, put("/registry/a", "a0", 9));
    let (violations, _) = check_watch_caches(&[record(events)]);
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(
        violations[0].message.contains("revision 9"),
        "{}",
        violations[0]
    );
}

#[test]
fn reordered_events_are_a_violation() {
    let mut events = full();
    events.swap(1, 2);
    let (violations, _) = check_watch_caches(&[record(events)]);
    assert!(!violations.is_empty());
}
