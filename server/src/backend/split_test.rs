//! The vendored sled's split point (`third_party/sled`, `Node::split_for`, a Keel patch):
//! a node too big splits just before the key being looked up when that key lands in its
//! right half, so appended record keys fill leaves. Any split point keeps a B-link tree
//! correct only if both halves, the parent's separator and the prefix encoding agree; these
//! tests check that against a `BTreeMap` through every path that splits: appends ahead of
//! other prefixes (Keel's member tree: `k` records, then `l`, `m`, `s`, `x` keys), random
//! inserts, removals (merges), and reopening from disk.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::Batch;

/// A record key as mvcc writes it (`k` + main + sub, 17 bytes): appends in revision order.
fn record(main: u64, sub: u64) -> Vec<u8> {
    let mut k = vec![b'k'];
    k.extend_from_slice(&main.to_be_bytes());
    k.extend_from_slice(&sub.to_be_bytes());
    k
}

/// Opens the database in `dir`. sled's flusher thread lets go of the directory's lock a
/// moment after the last handle drops, so a reopen retries for up to 5 s.
fn open(dir: &std::path::Path) -> (sled::Db, sled::Tree) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let db = loop {
        match sled::Config::new().path(dir).open() {
            Ok(db) => break db,
            Err(e) if std::time::Instant::now() < deadline => {
                assert!(e.to_string().contains("could not acquire lock"), "{e}");
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => panic!("{e}"),
        }
    };
    let tree = db.open_tree("keel").unwrap();
    (db, tree)
}

fn assert_same(tree: &sled::Tree, model: &BTreeMap<Vec<u8>, Vec<u8>>) {
    let got: Vec<(Vec<u8>, Vec<u8>)> = tree
        .iter()
        .map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())).unwrap())
        .collect();
    let want: Vec<(Vec<u8>, Vec<u8>)> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    assert_eq!(got.len(), want.len(), "entry count");
    assert!(got == want, "tree and model differ");
    assert_eq!(tree.len(), model.len());
}

#[test]
fn appends_before_other_prefixes_stay_ordered_and_readable_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = BTreeMap::new();
    {
        let (_db, tree) = open(dir.path());
        // Keys after the records, as the member tree has them (lease, mvcc meta, system).
        for k in [
            &b"l\0\0\0\0\0\0\0\x07"[..],
            b"mcompact",
            b"mformat",
            b"s/cluster_id",
            b"x/alarm/1",
        ] {
            tree.insert(k, b"meta".as_slice()).unwrap();
            model.insert(k.to_vec(), b"meta".to_vec());
        }
        // 60,000 records in groups of 100 (an apply group's batch): > 256 leaves, so index
        // nodes split too.
        for main in 1..=600u64 {
            let mut batch = Batch::default();
            for sub in 0..100u64 {
                let v = format!("{main}/{sub}").into_bytes();
                batch.insert(record(main, sub), v.clone());
                model.insert(record(main, sub), v);
            }
            batch.commit(&tree).unwrap();
        }
        assert_same(&tree, &model);
        // Every record is found by a point read and by a range scan starting at it.
        for main in (1..=600u64).step_by(37) {
            for sub in [0, 1, 50, 99] {
                let k = record(main, sub);
                assert_eq!(
                    tree.get(&k).unwrap().unwrap().as_ref(),
                    model[&k].as_slice()
                );
                let (first, _) = tree.range(k.clone()..).next().unwrap().unwrap();
                assert_eq!(first.as_ref(), k.as_slice());
            }
        }
        // The last record, then the first key after the records.
        let (last, _) = tree.range(..record(601, 0)).next_back().unwrap().unwrap();
        assert_eq!(last.as_ref(), record(600, 99).as_slice());
        let (after, _) = tree.range(record(601, 0)..).next().unwrap().unwrap();
        assert_eq!(after.as_ref(), b"l\0\0\0\0\0\0\0\x07");
        tree.flush().unwrap();
    }
    let (_db, tree) = open(dir.path());
    assert_same(&tree, &model);
}

#[derive(Debug, Clone)]
enum Op {
    /// `n` records at the next main revision (one batch).
    Append(u16),
    /// A key of another prefix, anywhere (lease IDs, users...).
    Insert(u8, u16),
    /// Removes the `i`-th key of the model (modulo its size), as compaction does.
    Remove(u16),
    /// Removes a run of `n` keys from the `i`-th (a compaction of old revisions).
    RemoveRun(u16, u16),
    /// One batch of sets and removals of keys anywhere: existing keys overwritten, new
    /// keys between them, several leaves (the vendored sled writes a run of sets into one
    /// leaf as one node replacement, `Tree::keel_set_run`).
    Mixed(Vec<(u8, u16, bool)>),
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u16..400).prop_map(Op::Append),
        2 => (prop::sample::select(vec![b'a', b'c', b'l', b'm', b's', b'x']), any::<u16>())
            .prop_map(|(p, n)| Op::Insert(p, n)),
        1 => any::<u16>().prop_map(Op::Remove),
        1 => (any::<u16>(), 1u16..300).prop_map(|(i, n)| Op::RemoveRun(i, n)),
        1 => Just(Op::Reopen),
        2 => prop::collection::vec(
            (prop::sample::select(vec![b'a', b'k', b'l', b'm']), 0u16..600, prop::bool::weighted(0.8)),
            1..200,
        )
        .prop_map(Op::Mixed),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, max_shrink_iters: 100, ..ProptestConfig::default() })]

    #[test]
    fn any_mix_of_appends_inserts_and_removals_matches_a_model(ops in prop::collection::vec(op(), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let (mut db, mut tree) = open(dir.path());
        let mut main = 0u64;
        for op in ops {
            match op {
                Op::Append(n) => {
                    main += 1;
                    let mut batch = Batch::default();
                    for sub in 0..u64::from(n) {
                        batch.insert(record(main, sub), sub.to_be_bytes().to_vec());
                        model.insert(record(main, sub), sub.to_be_bytes().to_vec());
                    }
                    batch.commit(&tree).unwrap();
                }
                Op::Insert(prefix, n) => {
                    let k = [&[prefix][..], &n.to_be_bytes()].concat();
                    tree.insert(&k, b"x".as_slice()).unwrap();
                    model.insert(k, b"x".to_vec());
                }
                Op::Remove(i) => {
                    if let Some(k) = model.keys().nth(usize::from(i) % model.len().max(1)).cloned() {
                        tree.remove(&k).unwrap();
                        model.remove(&k);
                    }
                }
                Op::RemoveRun(i, n) => {
                    let start = usize::from(i) % model.len().max(1);
                    let keys: Vec<Vec<u8>> = model.keys().skip(start).take(usize::from(n)).cloned().collect();
                    let mut batch = Batch::default();
                    for k in keys {
                        batch.remove(k.clone());
                        model.remove(&k);
                    }
                    batch.commit(&tree).unwrap();
                }
                Op::Mixed(writes) => {
                    let mut batch = Batch::default();
                    for (prefix, n, set) in writes {
                        let k = [&[prefix][..], &n.to_be_bytes()].concat();
                        if set {
                            let v = format!("{prefix}/{n}/{main}").into_bytes();
                            batch.insert(k.clone(), v.clone());
                            model.insert(k, v);
                        } else {
                            batch.remove(k.clone());
                            model.remove(&k);
                        }
                    }
                    batch.commit(&tree).unwrap();
                }
                Op::Reopen => {
                    tree.flush().unwrap();
                    drop(tree);
                    drop(db);
                    (db, tree) = open(dir.path());
                }
            }
        }
        assert_same(&tree, &model);
        // Point reads of every tenth key, and a reverse scan's order.
        for (k, v) in model.iter().step_by(10) {
            prop_assert_eq!(tree.get(k).unwrap().map(|v| v.to_vec()), Some(v.clone()));
        }
        let back: Vec<Vec<u8>> = tree.iter().rev().map(|r| r.unwrap().0.to_vec()).collect();
        let want: Vec<Vec<u8>> = model.keys().rev().cloned().collect();
        prop_assert!(back == want);
    }
}
