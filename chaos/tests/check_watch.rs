//! The watch checker on hand-made watch histories over the writes
//! put(k, a) @ rev 2, put(k, b) @ rev 3, delete(k) @ rev 4, put(k, c) @ rev 5.

mod check_common;

use check_common::*;
use keel_chaos::check::{CheckOptions, Checker, WatchGuarantee, check_history};
use keel_chaos::history::{History, WatchRecord};

fn writes() -> Vec<keel_chaos::history::Operation> {
    vec![
        op(1, 0, 10, put("k", "a"), put_ok(2)),
        op(1, 20, 30, put("k", "b"), put_ok(3)),
        op(1, 40, 50, del("k"), del_ok(1, 4)),
        op(1, 60, 70, put("k", "c"), put_ok(5)),
    ]
}

fn a() -> keel_chaos::history::WatchEvent {
    put_event("k", "a", 2, 2, 1)
}
fn b() -> keel_chaos::history::WatchEvent {
    put_event("k", "b", 3, 2, 2)
}
fn d() -> keel_chaos::history::WatchEvent {
    del_event("k", 4)
}
fn c() -> keel_chaos::history::WatchEvent {
    put_event("k", "c", 5, 5, 1)
}

/// The watch guarantees broken by `records` over [`writes`], sorted.
fn broken(records: Vec<WatchRecord>) -> Vec<WatchGuarantee> {
    broken_with(writes(), records)
}

fn broken_with(
    operations: Vec<keel_chaos::history::Operation>,
    records: Vec<WatchRecord>,
) -> Vec<WatchGuarantee> {
    let history = History {
        operations,
        watches: records,
        ..History::default()
    };
    let report = check_history(&history, &CheckOptions::default());
    let mut found: Vec<WatchGuarantee> = report
        .violations
        .iter()
        .filter_map(|v| match v.checker {
            Checker::Watch(g) => Some(g),
            _ => None,
        })
        .collect();
    found.sort();
    found
}

#[test]
fn complete_in_order_stream_passes() {
    let responses = vec![
        response(15, 2, vec![a()]),
        response(35, 3, vec![b()]),
        response(36, 3, vec![]),
        response(55, 4, vec![d()]),
        response(75, 5, vec![c()]),
    ];
    assert_eq!(broken(vec![watch("k", 0, 1, responses)]), vec![]);
    // Several revisions in one response are fine too, and so is a resumed watch.
    let resumed = vec![
        watch("k", 0, 1, vec![response(35, 3, vec![a(), b()])]),
        watch("k", 4, 3, vec![response(75, 5, vec![d(), c()])]),
    ];
    assert_eq!(broken(resumed), vec![]);
}

#[test]
fn gap_is_unreliable() {
    let responses = vec![response(15, 2, vec![a()]), response(55, 4, vec![d()])];
    assert_eq!(
        broken(vec![watch("k", 0, 1, responses)]),
        vec![WatchGuarantee::Reliable]
    );
}

#[test]
fn duplicate_is_not_unique() {
    let responses = vec![
        response(15, 2, vec![a()]),
        response(35, 3, vec![b()]),
        response(36, 3, vec![b()]),
    ];
    assert_eq!(
        broken(vec![watch("k", 0, 1, responses)]),
        vec![WatchGuarantee::Unique]
    );
}

#[test]
fn out_of_order_events() {
    let responses = vec![
        response(15, 2, vec![a()]),
        response(55, 4, vec![d()]),
        response(56, 4, vec![b()]),
    ];
    assert_eq!(
        broken(vec![watch("k", 0, 1, responses)]),
        vec![WatchGuarantee::Ordered]
    );
}

#[test]
fn one_revision_split_across_responses_is_not_atomic() {
    // A multi-key revision (as a txn or a lease revoke makes), on a prefix watch.
    let ops = vec![
        op(1, 0, 10, put("k1", "x"), unknown()),
        op(2, 0, 10, put("k2", "y"), unknown()),
    ];
    let mut record = watch(
        "k",
        0,
        1,
        vec![
            response(15, 2, vec![put_event("k1", "x", 2, 2, 1)]),
            response(16, 2, vec![put_event("k2", "y", 2, 2, 1)]),
        ],
    );
    record.range_end = "l".into();
    assert_eq!(
        broken_with(ops.clone(), vec![record.clone()]),
        vec![WatchGuarantee::Atomic]
    );
    record.responses = vec![response(
        16,
        2,
        vec![put_event("k1", "x", 2, 2, 1), put_event("k2", "y", 2, 2, 1)],
    )];
    assert_eq!(broken_with(ops, vec![record]), vec![]);
}

#[test]
fn progress_notification_ahead_of_an_event() {
    let responses = vec![
        response(15, 2, vec![a()]),
        response(16, 3, vec![]),
        response(35, 3, vec![b()]),
    ];
    assert_eq!(
        broken(vec![watch("k", 0, 1, responses)]),
        vec![WatchGuarantee::Progress]
    );
}

#[test]
fn progress_notification_vouches_for_events_up_to_it() {
    // Progress at 4 after only a: b and the delete are missing.
    let responses = vec![response(15, 2, vec![a()]), response(56, 4, vec![])];
    assert_eq!(
        broken(vec![watch("k", 0, 1, responses)]),
        vec![WatchGuarantee::Reliable]
    );
}

#[test]
fn resumed_watch_must_start_at_its_start_revision() {
    // From revision 3: b is missing before the first event.
    let late = watch(
        "k",
        3,
        3,
        vec![response(55, 4, vec![d()]), response(75, 5, vec![c()])],
    );
    assert_eq!(broken(vec![late]), vec![WatchGuarantee::Resumable]);
    // From revision 3: a (revision 2) is before the start.
    let early = watch("k", 3, 3, vec![response(35, 3, vec![a(), b()])]);
    assert_eq!(broken(vec![early]), vec![WatchGuarantee::Resumable]);
}

#[test]
fn events_must_match_writes() {
    // A value never written.
    let ghost = watch(
        "k",
        0,
        1,
        vec![response(15, 2, vec![put_event("k", "ghost", 2, 2, 1)])],
    );
    assert!(broken(vec![ghost]).contains(&WatchGuarantee::Valid));
    // An event before its write was invoked (c is invoked at 60).
    let early = watch(
        "k",
        4,
        3,
        vec![response(55, 4, vec![d()]), response(56, 5, vec![c()])],
    );
    assert_eq!(broken(vec![early]), vec![WatchGuarantee::Valid]);
    // Two watches disagreeing about an unknown write's revision.
    let ops = vec![op(1, 0, 10, put("k", "u"), unknown())];
    let one = watch(
        "k",
        0,
        1,
        vec![response(15, 2, vec![put_event("k", "u", 2, 2, 1)])],
    );
    let mut two = watch(
        "k",
        0,
        1,
        vec![response(
            15,
            3,
            vec![put_event("k", "v", 3, 3, 1), put_event("k", "u", 3, 3, 2)],
        )],
    );
    two.watcher = 2;
    assert!(broken_with(ops, vec![one, two]).contains(&WatchGuarantee::Valid));
}

#[test]
fn unknown_writes_may_appear_in_watches() {
    let ops = vec![
        op(1, 0, 10, put("k", "a"), put_ok(2)),
        op(2, 12, 20, put("k", "u"), unknown()),
        op(3, 12, 20, del("k"), unknown()),
    ];
    let record = watch(
        "k",
        0,
        1,
        vec![
            response(15, 2, vec![a()]),
            response(30, 3, vec![put_event("k", "u", 3, 2, 2)]),
            response(31, 4, vec![del_event("k", 4)]),
        ],
    );
    assert_eq!(broken_with(ops, vec![record]), vec![]);
}

#[test]
fn event_fields_follow_the_key_history() {
    // Version not reset after the delete.
    let after_delete = watch(
        "k",
        4,
        3,
        vec![response(75, 5, vec![d(), put_event("k", "c", 5, 2, 3)])],
    );
    assert_eq!(
        broken(vec![after_delete]),
        vec![WatchGuarantee::EventFields]
    );
    // Version not incremented.
    let stuck = watch(
        "k",
        0,
        1,
        vec![response(35, 3, vec![a(), put_event("k", "b", 3, 2, 1)])],
    );
    assert_eq!(broken(vec![stuck]), vec![WatchGuarantee::EventFields]);
    // Header revision below the events'.
    let header = watch("k", 0, 1, vec![response(15, 1, vec![a()])]);
    assert_eq!(broken(vec![header]), vec![WatchGuarantee::EventFields]);
}
