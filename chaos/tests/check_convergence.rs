//! The convergence checker on hand-made member finals.

mod check_common;

use check_common::assert_mentions;
use keel_chaos::check::{CheckOptions, Checker, check_history};
use keel_chaos::history::{History, MemberFinal};

fn member(member: usize, revision: i64, compact_revision: i64, hash: u32) -> MemberFinal {
    MemberFinal {
        member,
        hash,
        revision,
        compact_revision,
    }
}

fn check(finals: Vec<MemberFinal>) -> (Vec<String>, Vec<String>) {
    let report = check_history(
        &History {
            finals,
            ..History::default()
        },
        &CheckOptions::default(),
    );
    assert!(
        report
            .violations
            .iter()
            .all(|v| v.checker == Checker::Convergence)
    );
    (
        report.violations.iter().map(|v| v.to_string()).collect(),
        report.inconclusive,
    )
}

#[test]
fn equal_hashes_at_one_revision_converge() {
    let (violations, inconclusive) = check(vec![
        member(0, 90, 10, 7),
        member(1, 90, 10, 7),
        member(2, 90, 10, 7),
    ]);
    assert_eq!(violations, Vec::<String>::new());
    assert_eq!(inconclusive, Vec::<String>::new());
}

#[test]
fn different_hashes_at_one_revision_are_a_violation() {
    let (violations, _) = check(vec![
        member(0, 90, 10, 7),
        member(1, 90, 10, 8),
        member(2, 90, 10, 7),
    ]);
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert_mentions(&violations[0], "disagree on HashKV at revision 90");
    assert_mentions(
        &violations[0],
        "member 1: revision 90, compact revision 10, hash 0x00000008",
    );
}

#[test]
fn different_revisions_are_a_violation() {
    let (violations, _) = check(vec![
        member(0, 90, 10, 7),
        member(1, 88, 10, 5),
        member(2, 90, 10, 7),
    ]);
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert_mentions(&violations[0], "members ended at different revisions");
    assert_mentions(&violations[0], "revision 88: members [1]");
}

#[test]
fn different_compact_revisions_are_inconclusive() {
    let (violations, inconclusive) = check(vec![member(0, 90, 10, 7), member(1, 90, 20, 5)]);
    assert_eq!(violations, Vec::<String>::new());
    assert_eq!(inconclusive.len(), 1);
    assert_mentions(&inconclusive[0], "different compact revisions");
}
