//! End-of-run convergence: the harness waits for the members to catch up, then records each
//! member's `HashKV` (etcd's `Maintenance.HashKV`: a hash of the MVCC key space up to a
//! revision). All members must then stand at one revision with one hash. `HashKV` covers only
//! revisions above the compact revision, so hashes taken at different compact revisions are
//! not comparable: that case is reported as inconclusive, not as a violation.

use std::collections::BTreeMap;

use crate::history::MemberFinal;

use super::report::{Checker, Violation};

/// Checks the members' final states; returns violations and inconclusive notes.
pub fn check_convergence(finals: &[MemberFinal]) -> (Vec<Violation>, Vec<String>) {
    let mut violations = Vec::new();
    let mut inconclusive = Vec::new();
    let describe = |f: &MemberFinal| {
        format!(
            "member {}: revision {}, compact revision {}, hash {:#010x}",
            f.member, f.revision, f.compact_revision, f.hash
        )
    };
    let revisions: BTreeMap<i64, Vec<usize>> = finals.iter().fold(BTreeMap::new(), |mut by, f| {
        by.entry(f.revision).or_insert_with(Vec::new).push(f.member);
        by
    });
    if revisions.len() > 1 {
        let mut v = Violation::new(
            Checker::Convergence,
            None,
            format!(
                "members ended at different revisions ({}) although the harness waited for them to converge",
                revisions
                    .iter()
                    .map(|(r, m)| format!("revision {r}: members {m:?}"))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        );
        v.details = finals.iter().map(describe).collect();
        violations.push(v);
    }
    // Among members at one revision, compare hashes per compact revision.
    let mut groups: BTreeMap<(i64, i64), Vec<&MemberFinal>> = BTreeMap::new();
    for f in finals {
        groups
            .entry((f.revision, f.compact_revision))
            .or_default()
            .push(f);
    }
    for ((revision, compact), group) in &groups {
        if group.iter().any(|f| f.hash != group[0].hash) {
            let mut v = Violation::new(
                Checker::Convergence,
                None,
                format!(
                    "members disagree on HashKV at revision {revision} (compact revision {compact})"
                ),
            );
            v.details = group.iter().map(|f| describe(f)).collect();
            violations.push(v);
        }
    }
    let compacts: BTreeMap<i64, BTreeMap<i64, Vec<usize>>> =
        groups.iter().fold(BTreeMap::new(), |mut by, ((r, c), g)| {
            by.entry(*r)
                .or_default()
                .insert(*c, g.iter().map(|f| f.member).collect());
            by
        });
    for (revision, by_compact) in compacts {
        if by_compact.len() > 1 {
            inconclusive.push(format!(
                "HashKV at revision {revision} taken at different compact revisions ({by_compact:?}: compact revision -> members); not compared across them"
            ));
        }
    }
    (violations, inconclusive)
}
