//! The linearizability, serializable-read and revision checkers on hand-made histories.

mod check_common;

use std::time::Duration;

use check_common::*;
use keel_chaos::check::{CheckOptions, Checker, check_history};
use keel_chaos::history::{History, Input, Operation, Outcome, Output};

fn linearizable(ops: Vec<keel_chaos::history::Operation>) -> bool {
    let report = check_ops(ops);
    of(&report, Checker::Linearizability).is_empty()
}

#[test]
fn concurrent_overlapping_puts_either_order_by_revision() {
    // a (rev 3) and b (rev 2) overlap; a read after both must see the higher revision, a.
    let base = || {
        vec![
            op(1, 0, 10, put("k", "a"), put_ok(3)),
            op(2, 5, 15, put("k", "b"), put_ok(2)),
            op(3, 6, 12, get("k"), got(Some(("b", 2)), 2)),
        ]
    };
    let mut ok = base();
    ok.push(op(3, 20, 25, get("k"), got(Some(("a", 3)), 3)));
    assert!(linearizable(ok));
    let mut bad = base();
    bad.push(op(3, 20, 25, get("k"), got(Some(("b", 2)), 3)));
    assert!(
        !linearizable(bad),
        "b (rev 2) cannot be linearized after a (rev 3)"
    );
}

/// Client 1 puts `k = a` (revision 2), then `k = b` (revision 3); afterwards client 2's `read`
/// answers the overwritten `a` (mod_revision 2) at header revision `revision`.
fn a_overwritten_then_read_as_a(read: Input, revision: i64) -> Vec<Operation> {
    vec![
        op(1, 0, 1, put("k", "a"), put_ok(2)),
        op(1, 2, 3, put("k", "b"), put_ok(3)),
        op(2, 4, 5, read, got(Some(("a", 2)), revision)),
    ]
}

#[test]
fn stale_read_after_completed_write_is_a_violation() {
    let report = check_ops(a_overwritten_then_read_as_a(get("k"), 3));
    let found = of(&report, Checker::Linearizability);
    assert_eq!(found.len(), 1, "{report:?}");
    let violation = &report.violations[0];
    assert_eq!(violation.key.as_deref(), Some("k"));
    // The stale get and the write that overwrote a are the evidence.
    let inputs: Vec<&Input> = violation.sub_history.iter().map(|o| &o.input).collect();
    assert!(inputs.contains(&&get("k")), "{violation}");
    assert!(inputs.contains(&&put("k", "b")), "{violation}");
    assert_mentions(&found[0], "get(k) -> ok a mod_rev 2");
}

#[test]
fn read_of_an_unknown_put_linearizes_it() {
    assert!(linearizable(vec![
        op(1, 0, 1, put("k", "a"), put_ok(2)),
        op(2, 2, 3, put("k", "b"), unknown()),
        op(3, 10, 11, get("k"), got(Some(("b", 3)), 3)),
        op(3, 12, 13, put("k", "c"), put_ok(4)),
    ]));
}

#[test]
fn read_of_an_unknown_put_before_it_was_invoked_is_a_violation() {
    assert!(!linearizable(vec![
        op(3, 0, 1, get("k"), got(Some(("b", 3)), 3)),
        op(2, 2, 3, put("k", "b"), unknown()),
    ]));
}

#[test]
fn read_of_a_value_never_written_is_a_violation() {
    assert!(!linearizable(vec![
        op(1, 0, 1, put("k", "a"), put_ok(2)),
        op(2, 2, 3, get("k"), got(Some(("ghost", 2)), 2)),
    ]));
}

#[test]
fn cas_succeeding_against_an_impossible_state_is_a_violation() {
    // The key holds a; a CAS expecting x, or expecting absence, cannot succeed.
    assert!(!linearizable(vec![
        op(1, 0, 1, put("k", "a"), put_ok(2)),
        op(2, 2, 3, cas("k", Some("x"), "c"), cas_ok(true, 3)),
    ]));
    assert!(!linearizable(vec![
        op(1, 0, 1, put("k", "a"), put_ok(2)),
        op(2, 2, 3, cas("k", None, "c"), cas_ok(true, 3)),
    ]));
    // And one expecting a can, but must then fail a second CAS on a.
    assert!(linearizable(vec![
        op(1, 0, 1, put("k", "a"), put_ok(2)),
        op(2, 2, 3, cas("k", Some("a"), "c"), cas_ok(true, 3)),
        op(2, 4, 5, cas("k", Some("a"), "d"), cas_ok(false, 3)),
        op(2, 6, 7, get("k"), got(Some(("c", 3)), 3)),
    ]));
    assert!(!linearizable(vec![
        op(1, 0, 1, put("k", "a"), put_ok(2)),
        op(2, 2, 3, cas("k", Some("a"), "c"), cas_ok(false, 2)),
    ]));
}

#[test]
fn lost_acknowledged_write_is_a_violation() {
    assert!(!linearizable(vec![
        op(1, 0, 1, put("k", "a"), put_ok(2)),
        op(2, 2, 3, get("k"), got(None, 2)),
    ]));
    assert!(!linearizable(vec![
        op(1, 0, 1, put("k", "a"), put_ok(2)),
        op(1, 2, 3, del("k"), del_ok(0, 2)),
    ]));
}

#[test]
fn unknown_writes_may_be_left_out() {
    assert!(linearizable(vec![
        op(1, 0, 1, put("k", "a"), put_ok(2)),
        op(2, 2, 3, put("k", "b"), unknown()),
        op(2, 4, 5, del("k"), unknown()),
        op(2, 6, 7, cas("k", Some("a"), "c"), unknown()),
        op(3, 10, 11, get("k"), got(Some(("a", 2)), 5)),
    ]));
    // ...or taken in, after the client gave up: the unknown delete explains the absence.
    assert!(linearizable(vec![
        op(1, 0, 1, put("k", "a"), put_ok(2)),
        op(2, 2, 3, del("k"), unknown()),
        op(3, 10, 11, get("k"), got(None, 3)),
    ]));
}

#[test]
fn failed_operations_are_dropped() {
    assert!(linearizable(vec![
        op(1, 0, 1, put("k", "a"), failed()),
        op(2, 2, 3, get("k"), got(None, 1)),
    ]));
    // A failed put's value cannot be read.
    assert!(!linearizable(vec![
        op(1, 0, 1, put("k", "a"), failed()),
        op(2, 2, 3, get("k"), got(Some(("a", 2)), 2)),
    ]));
}

#[test]
fn revision_going_backwards_on_a_key_is_a_violation() {
    assert!(!linearizable(vec![
        op(1, 0, 1, put("k", "a"), put_ok(5)),
        op(1, 2, 3, put("k", "b"), put_ok(4)),
    ]));
    // A read's header revision below the value's mod_revision.
    assert!(!linearizable(vec![
        op(1, 0, 1, put("k", "a"), put_ok(5)),
        op(1, 2, 3, get("k"), got(Some(("a", 5)), 4)),
    ]));
    // A read reporting another mod_revision than the put was acknowledged with.
    assert!(!linearizable(vec![
        op(1, 0, 1, put("k", "a"), put_ok(5)),
        op(1, 2, 3, get("k"), got(Some(("a", 6)), 6)),
    ]));
}

#[test]
fn serializable_reads_may_be_stale_but_not_out_of_thin_air() {
    let stale = check_ops(a_overwritten_then_read_as_a(sget("k"), 2));
    assert!(stale.is_ok(), "{:?}", stale.violations);
    let ghost = check_ops(vec![op(2, 4, 5, sget("k"), got(Some(("ghost", 2)), 2))]);
    assert_eq!(of(&ghost, Checker::SerializableRead).len(), 1);
    let wrong_rev = check_ops(vec![
        op(1, 0, 1, put("k", "a"), put_ok(2)),
        op(2, 4, 5, sget("k"), got(Some(("a", 7)), 7)),
    ]);
    assert_eq!(of(&wrong_rev, Checker::SerializableRead).len(), 1);
}

#[test]
fn revisions_across_keys_and_members() {
    // Two writes to different keys acknowledged at one revision.
    let shared = check_ops(vec![
        op(1, 0, 1, put("a", "x"), put_ok(2)),
        op(2, 0, 1, put("b", "y"), put_ok(2)),
    ]);
    assert_eq!(
        of(&shared, Checker::Revisions).len(),
        1,
        "{:?}",
        shared.violations
    );
    // Real time: a read on another key after a completed write at revision 5 answers 3.
    let backwards = check_ops(vec![
        op(1, 0, 1, put("a", "x"), put_ok(5)),
        op(2, 2, 3, get("b"), got(None, 3)),
    ]);
    let found = of(&backwards, Checker::Revisions);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_mentions(&found[0], "revision went backwards");
    // Per member and epoch; a restart (new epoch) may start lower.
    let history = History {
        member_revisions: vec![
            (0, 1, 10, 7),
            (0, 1, 20, 9),
            (0, 2, 30, 4),
            (0, 2, 40, 3),
            (1, 1, 5, 1),
        ],
        ..History::default()
    };
    let report = check_history(&history, &CheckOptions::default());
    let found = of(&report, Checker::Revisions);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_mentions(&found[0], "member 0 (process epoch 2) answered revision 4");
}

#[test]
fn minimiser_keeps_the_stale_read_and_what_it_contradicts() {
    // 200 clean operations, then one stale read, then more clean operations.
    let mut ops = Vec::new();
    let mut t = 0;
    for i in 0..200 {
        ops.push(op(1, t, t + 5, put("k", &format!("v{i}")), put_ok(i + 2)));
        ops.push(op(
            2,
            t + 1,
            t + 4,
            get("k"),
            got(Some((&format!("v{i}"), i + 2)), i + 2),
        ));
        t += 10;
    }
    ops.push(op(3, t, t + 2, get("k"), got(Some(("v150", 152)), 201)));
    for i in 0..50 {
        ops.push(op(
            1,
            t + 10 + i as u64 * 10,
            t + 15 + i as u64 * 10,
            get("k"),
            got(Some(("v199", 201)), 201),
        ));
    }
    let report = check_ops(ops);
    let violations: Vec<_> = report
        .violations
        .iter()
        .filter(|v| v.checker == Checker::Linearizability)
        .collect();
    assert_eq!(violations.len(), 1);
    let minimal = &violations[0].sub_history;
    // The put of v150, a later acknowledged put with a revision at or below the read's header
    // revision (so it precedes the read whatever the times), and the stale read.
    assert_eq!(minimal.len(), 3, "{}", violations[0]);
    assert_eq!(minimal[0].input, put("k", "v150"));
    assert!(
        matches!(&minimal[1].outcome, Outcome::Ok(Output::Put { revision }) if *revision > 152 && *revision <= 201),
        "{}",
        violations[0]
    );
    assert_eq!(minimal[2].outcome, got(Some(("v150", 152)), 201));
    assert_mentions(&violations[0].to_string(), "put(k, v150) -> ok rev 152");
    // The minimised sub-history is itself non-linearizable.
    assert!(!linearizable(minimal.clone()));
}

#[test]
fn search_out_of_budget_is_inconclusive_not_a_violation() {
    // 24 concurrent unknown puts and an impossible read: the search must try every subset.
    let mut ops: Vec<_> = (0..24)
        .map(|i| op(i, 0, 10, put("k", &format!("v{i}")), unknown()))
        .collect();
    ops.push(op(99, 0, 10, get("k"), got(Some(("ghost", 3)), 3)));
    ops.push(op(99, 20, 30, get("k"), got(None, 3)));
    let options = CheckOptions {
        linearizability_budget: Duration::from_millis(50),
        ..CheckOptions::default()
    };
    let report = check_history(
        &History {
            operations: ops,
            ..History::default()
        },
        &options,
    );
    assert!(
        of(&report, Checker::Linearizability).is_empty(),
        "{:?}",
        report.violations
    );
    assert_eq!(report.inconclusive.len(), 1, "{:?}", report.inconclusive);
    assert!(
        report.inconclusive[0].starts_with("key \"k\""),
        "{}",
        report.inconclusive[0]
    );
    assert_eq!(report.stats.keys_checked, 0);
}

#[test]
fn watches_decide_the_fate_of_unknown_writes() {
    let history = |ops, watches| History {
        operations: ops,
        watches,
        ..History::default()
    };
    let options = CheckOptions::default();
    // Applied: a watch saw the unknown put take effect at revision 2 by t=50, so a read at
    // t=60 that finds the key absent at header revision 2 is stale.
    let ops = vec![
        op(1, 0, 10, put("k", "u"), unknown()),
        op(2, 60, 61, get("k"), got(None, 2)),
    ];
    assert!(
        linearizable(ops.clone()),
        "without the watch the put may not have happened"
    );
    let seen = watch(
        "k",
        0,
        1,
        vec![response(50, 2, vec![put_event("k", "u", 2, 2, 1)])],
    );
    let report = check_history(&history(ops, vec![seen]), &options);
    let found = of(&report, Checker::Linearizability);
    assert_eq!(found.len(), 1, "{:?}", report.violations);
    assert_mentions(&found[0], "a watch saw it applied at revision 2");

    // Not applied: a watch covering the key from revision 1 to the end saw only a delete at
    // revision 3, so the unknown put never happened and the delete had nothing to delete.
    let ops = vec![
        op(1, 0, 10, put("k", "u"), unknown()),
        op(2, 20, 30, del("k"), del_ok(1, 3)),
    ];
    assert!(linearizable(ops.clone()));
    let seen = watch("k", 0, 1, vec![response(25, 3, vec![del_event("k", 3)])]);
    let report = check_history(&history(ops, vec![seen]), &options);
    let found = of(&report, Checker::Linearizability);
    assert_eq!(found.len(), 1, "{:?}", report.violations);
    // The witness is the delete alone: with the put known not to have happened, nothing wrote
    // what it deleted.
    assert_mentions(&found[0], "delete(k) -> ok deleted 1 rev 3");
    assert!(!found[0].contains("put(k, u)"), "{}", found[0]);

    // A watch that ended before the run did proves nothing about a late write.
    let ops = vec![
        op(1, 0, 10, put("k", "u"), unknown()),
        op(2, 20, 30, del("k"), del_ok(1, 3)),
        op(2, 40, 50, put("k", "w"), put_ok(4)),
    ];
    let partial = watch("k", 0, 1, vec![response(25, 3, vec![del_event("k", 3)])]);
    let report = check_history(&history(ops, vec![partial]), &options);
    assert!(
        of(&report, Checker::Linearizability).is_empty(),
        "{:?}",
        report.violations
    );
}
