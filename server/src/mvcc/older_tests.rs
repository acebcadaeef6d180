use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::mvcc::revision::Revision;

fn rev(main: i64) -> RevInfo {
    RevInfo::put(Revision::new(main, 0), 1, main, 0)
}

fn mains(o: &Older) -> Vec<i64> {
    o.iter().map(|r| r.main).collect()
}

#[test]
fn from_vec_seals_full_runs_and_keeps_the_rest_in_the_tail() {
    let o = Older::from_vec((1..=2 * RUN as i64 + 5).map(rev).collect());
    assert_eq!(o.runs.as_deref().map(|r| r.len()), Some(2));
    assert_eq!(o.tail.len(), 5);
    assert_eq!(o.len(), 2 * RUN + 5);
    assert_eq!(o.get(RUN).map(|r| r.main), Some(RUN as i64 + 1));
    assert_eq!(o.get(2 * RUN + 4).map(|r| r.main), Some(2 * RUN as i64 + 5));
    assert_eq!(o.get(2 * RUN + 5), None);
}

#[test]
fn a_history_handle_stays_small() {
    // Every key with older revisions holds one `Older`: a thin run pointer and the tail.
    assert_eq!(std::mem::size_of::<Older>(), 32);
}

#[test]
fn from_vec_keeps_no_spare_capacity() {
    let mut revs = Vec::with_capacity(1000);
    revs.extend((1..=3).map(rev));
    assert_eq!(Older::from_vec(revs).tail.capacity(), 3);
    let mut revs = Vec::with_capacity(1000);
    revs.extend((1..=RUN as i64 + 2).map(rev));
    assert_eq!(Older::from_vec(revs).tail.capacity(), 2);
}

#[test]
fn an_append_to_a_shared_version_shares_its_runs_and_leaves_it_unchanged() {
    let mut v1 = Arc::new(Older::from_vec((1..=3 * RUN as i64).map(rev).collect()));
    let mut v2 = v1.clone();
    Older::push(&mut v2, rev(3 * RUN as i64 + 1));
    assert_eq!(v1.len(), 3 * RUN);
    assert_eq!(v2.len(), 3 * RUN + 1);
    for i in 0..3 {
        assert!(v1.shares_run(&v2, i), "run {i} was copied");
    }
    // Filling the tail seals a run; the earlier runs are still the same allocations.
    let mut v3 = v2.clone();
    for m in 3 * RUN as i64 + 2..=4 * RUN as i64 {
        let before = v3.clone();
        Older::push(&mut v3, rev(m));
        assert!(before.shares_run(&v3, 0));
    }
    assert_eq!(v3.runs.as_deref().map(|r| r.len()), Some(4));
    assert!(v1.shares_run(&v3, 2));
    assert_eq!(mains(&v3), (1..=4 * RUN as i64).collect::<Vec<_>>());
    // A unique value is appended in place.
    let before = Arc::as_ptr(&v3);
    Older::push(&mut v3, rev(4 * RUN as i64 + 1));
    assert_eq!(Arc::as_ptr(&v3), before);
    Older::push(&mut v1, rev(3 * RUN as i64 + 1));
    assert_eq!(mains(&v1), mains(&v2));
}

#[derive(Debug, Clone)]
enum Op {
    /// Append to version `v % versions`, keeping the old one (a published index).
    Fork(usize),
    /// Append to version `v % versions` in place when nothing else shares it.
    Push(usize),
    /// Drop version `v % versions` (a reader finished).
    Drop(usize),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            3 => any::<usize>().prop_map(Op::Fork),
            6 => any::<usize>().prop_map(Op::Push),
            1 => any::<usize>().prop_map(Op::Drop),
        ],
        0..300,
    )
}

proptest! {
    /// Every version behaves like the plain vector it models, whatever other versions were
    /// appended to: appends never change a version another holder still sees.
    #[test]
    fn versions_match_their_models(start in 0usize..80, ops in ops(), probe in 0i64..1000) {
        let first: Vec<RevInfo> = (1..=start as i64).map(rev).collect();
        let mut versions: Vec<(Arc<Older>, Vec<RevInfo>)> =
            vec![(Arc::new(Older::from_vec(first.clone())), first)];
        for op in ops {
            match op {
                Op::Fork(v) => {
                    let (o, m) = versions[v % versions.len()].clone();
                    let mut o = o;
                    let mut m = m;
                    let next = m.last().map_or(1, |r| r.main + 1);
                    Older::push(&mut o, rev(next));
                    m.push(rev(next));
                    versions.push((o, m));
                }
                Op::Push(v) => {
                    let i = v % versions.len();
                    let (o, m) = &mut versions[i];
                    let next = m.last().map_or(1, |r| r.main + 1);
                    Older::push(o, rev(next));
                    m.push(rev(next));
                }
                Op::Drop(v) => {
                    if versions.len() > 1 {
                        versions.swap_remove(v % versions.len());
                    }
                }
            }
        }
        for (o, m) in &versions {
            prop_assert_eq!(o.len(), m.len());
            prop_assert_eq!(o.iter().copied().collect::<Vec<_>>(), m.clone());
            prop_assert_eq!(o.iter().rev().copied().collect::<Vec<_>>(),
                m.iter().rev().copied().collect::<Vec<_>>());
            for (i, r) in m.iter().enumerate() {
                prop_assert_eq!(o.get(i), Some(r));
            }
            prop_assert_eq!(o.get(m.len()), None);
            prop_assert_eq!(o.partition_point(|r| r.main <= probe),
                m.partition_point(|r| r.main <= probe));
            let from = (probe as usize) % (m.len() + 2);
            prop_assert_eq!(o.suffix(from).map(|s| mains(&s)).unwrap_or_default(),
                m.iter().skip(from).map(|r| r.main).collect::<Vec<_>>());
            prop_assert!(o.tail.len() < RUN);
            for run in o.runs.as_deref().map_or(&[][..], Vec::as_slice) {
                prop_assert_eq!(run.len(), RUN);
            }
        }
    }
}
