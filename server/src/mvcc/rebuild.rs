//! Rebuilding the key index from the revision records when the store opens (etcd
//! `store.restore`), once, on 2 threads.
//!
//! 1. The main-revision span of the records is cut into chunks; 2 scoped threads take
//!    chunks from a shared counter (so one giant revision cannot leave a thread idle for
//!    long), scan them from sled and decode each record's key, create revision, version and
//!    lease without copying its value.
//! 2. Each thread sorts its records by (key, revision): it sorts `(8 key bytes after the
//!    run's common prefix, position)` pairs, so most comparisons never touch the key arena,
//!    then rewrites its run with the keys in sorted order, so later passes read memory
//!    sequentially.
//! 3. Both sorted runs are split at a pivot key; each thread merges one half, groups it per
//!    key into histories and packs it into index blocks; the halves are concatenated.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::MvccError;
use super::codec::decode_meta;
use super::index::Index;
use super::key_index::{KeyHistory, RevInfo};
use super::revision::{parse_record_key, record_key_lower_bound};
use crate::backend::schema::RECORD_PREFIX;

/// Threads used for the rebuild (the target machine class has 2 cores).
const THREADS: usize = 2;
/// Chunks of main revisions handed out to the threads.
const CHUNKS: i64 = 64;

/// The rebuilt index and the newest main revision found (0 if there is no record).
pub(super) struct Rebuilt {
    pub index: Index,
    pub max_main: i64,
    /// Records read.
    pub records: usize,
    /// Slowest thread's scan+decode time, slowest thread's sort time, merge+build time.
    pub times: [Duration; 3],
}

/// Records read by one thread: keys packed in one arena.
#[derive(Default)]
struct Run {
    arena: Vec<u8>,
    items: Vec<Item>,
}

#[derive(Clone, Copy)]
struct Item {
    start: usize,
    len: u32,
    rev: RevInfo,
}

impl Run {
    fn key(&self, it: &Item) -> &[u8] {
        &self.arena[it.start..it.start + it.len as usize]
    }
}

/// Rebuilds the index from every `k` record of `tree`.
///
/// Errors: sled I/O or a corrupt record.
pub(super) fn rebuild(tree: &sled::Tree) -> Result<Rebuilt, MvccError> {
    // No record removal may run while the records are scanned (see compactor.rs).
    let _gate = super::compactor::REBUILD_GATE
        .write()
        .unwrap_or_else(|e| e.into_inner());
    let first = first_main(tree.scan_prefix([RECORD_PREFIX]).next())?;
    let last = first_main(tree.scan_prefix([RECORD_PREFIX]).next_back())?;
    let (Some(lo), Some(hi)) = (first, last) else {
        return Ok(Rebuilt {
            index: Index::new(),
            max_main: 0,
            records: 0,
            times: [Duration::ZERO; 3],
        });
    };
    let span = hi - lo + 1;
    let chunks = span.min(CHUNKS);
    let bound = |i: i64| lo + (span as i128 * i as i128 / chunks as i128) as i64;
    let next = AtomicUsize::new(0);
    let runs = on_threads(|| -> Result<(Run, Duration, Duration), MvccError> {
        let started = Instant::now();
        let mut run = Run::default();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed) as i64;
            if i >= chunks {
                break;
            }
            scan(tree, bound(i), bound(i + 1), &mut run)?;
        }
        let scanned = started.elapsed();
        let run = sort_run(run);
        Ok((run, scanned, started.elapsed() - scanned))
    })?;
    let scan_time = runs.iter().map(|r| r.1).max().unwrap_or_default();
    let sort_time = runs.iter().map(|r| r.2).max().unwrap_or_default();
    let runs: Vec<Run> = runs.into_iter().map(|r| r.0).collect();
    let records = runs.iter().map(|r| r.items.len()).sum();

    let built = Instant::now();
    let halves = split_at_pivot(&runs);
    let next = AtomicUsize::new(0);
    let mut parts = on_threads(|| -> Result<Vec<(usize, Index)>, MvccError> {
        let mut mine = Vec::new();
        loop {
            let h = next.fetch_add(1, Ordering::Relaxed);
            let Some(half) = halves.get(h) else { break };
            mine.push((h, Index::from_sorted(Histories::new(half.clone()))));
        }
        Ok(mine)
    })?
    .into_iter()
    .flatten()
    .collect::<Vec<_>>();
    parts.sort_by_key(|(h, _)| *h);
    let mut index = Index::new();
    for (_, part) in parts {
        index.append(part);
    }
    Ok(Rebuilt {
        index,
        max_main: hi,
        records,
        times: [scan_time, sort_time, built.elapsed()],
    })
}

/// Runs `work` on [`THREADS`] scoped threads and collects the results.
fn on_threads<T: Send>(
    work: impl Fn() -> Result<T, MvccError> + Sync,
) -> Result<Vec<T>, MvccError> {
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS).map(|_| s.spawn(&work)).collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .map_err(|_| MvccError::Rebuild("rebuild thread panicked".into()))?
            })
            .collect()
    })
}

fn first_main(
    item: Option<sled::Result<(sled::IVec, sled::IVec)>>,
) -> Result<Option<i64>, MvccError> {
    match item {
        None => Ok(None),
        Some(r) => {
            let (k, _) = r?;
            let (rev, _) = parse_record_key(&k)
                .ok_or_else(|| MvccError::corrupt(&k, "malformed record key"))?;
            Ok(Some(rev.main))
        }
    }
}

/// Reads the records with main revision in `[lo, hi)` into `run`.
fn scan(tree: &sled::Tree, lo: i64, hi: i64, run: &mut Run) -> Result<(), MvccError> {
    for item in tree.range(record_key_lower_bound(lo)..record_key_lower_bound(hi)) {
        let (k, v) = item?;
        let m = decode_meta(&k, &v)?;
        let rev = if m.tombstone {
            RevInfo::tombstone(m.rev)
        } else {
            RevInfo::put(m.rev, m.create, m.version, m.lease)
        };
        let start = run.arena.len();
        run.arena.extend_from_slice(m.key);
        let len = u32::try_from(m.key.len())
            .map_err(|_| MvccError::corrupt(&k, "key longer than 4 GiB"))?;
        run.items.push(Item { start, len, rev });
    }
    Ok(())
}

/// Sorts a run by (key, revision) and rewrites it with its keys in that order.
fn sort_run(run: Run) -> Run {
    let n = run.items.len();
    if n == 0 {
        return run;
    }
    // Every key shares the common prefix of the smallest and the largest key.
    let (mut min, mut max) = (&run.items[0], &run.items[0]);
    for it in &run.items[1..] {
        if run.key(it) < run.key(min) {
            min = it;
        }
        if run.key(it) > run.key(max) {
            max = it;
        }
    }
    let common = run
        .key(min)
        .iter()
        .zip(run.key(max))
        .take_while(|(a, b)| a == b)
        .count();
    let mut order: Vec<(u64, u32)> = run
        .items
        .iter()
        .enumerate()
        .map(|(i, it)| (prefix8(&run.key(it)[common..]), i as u32))
        .collect();
    order.sort_unstable_by(|a, b| {
        a.0.cmp(&b.0).then_with(|| {
            let (x, y) = (&run.items[a.1 as usize], &run.items[b.1 as usize]);
            run.key(x)
                .cmp(run.key(y))
                .then(x.rev.revision().cmp(&y.rev.revision()))
        })
    });
    let mut sorted = Run {
        arena: Vec::with_capacity(run.arena.len()),
        items: Vec::with_capacity(n),
    };
    for (_, i) in order {
        let it = run.items[i as usize];
        let start = sorted.arena.len();
        sorted.arena.extend_from_slice(run.key(&it));
        sorted.items.push(Item { start, ..it });
    }
    sorted
}

/// The first 8 bytes of `rest`, zero-padded, as a big-endian number: comparing these
/// numbers orders keys with a common prefix like comparing the keys, up to ties.
fn prefix8(rest: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = rest.len().min(8);
    b[..n].copy_from_slice(&rest[..n]);
    u64::from_be_bytes(b)
}

/// A sorted run, or a slice of one.
type Part<'a> = Vec<(&'a Run, &'a [Item])>;

/// Splits the sorted runs into two key-disjoint halves at a pivot key: the middle key of
/// the largest run. Every record of a key lands in the same half.
fn split_at_pivot(runs: &[Run]) -> [Part<'_>; 2] {
    let Some(big) = runs
        .iter()
        .max_by_key(|r| r.items.len())
        .filter(|r| !r.items.is_empty())
    else {
        return [Vec::new(), Vec::new()];
    };
    let pivot = big.key(&big.items[big.items.len() / 2]);
    let (mut low, mut high) = (Vec::new(), Vec::new());
    for run in runs {
        let cut = run.items.partition_point(|it| run.key(it) < pivot);
        low.push((run, &run.items[..cut]));
        high.push((run, &run.items[cut..]));
    }
    [low, high]
}

/// Merges sorted runs into `(key, history)` in key order.
struct Histories<'a> {
    runs: Part<'a>,
    pos: Vec<usize>,
    revs: Vec<RevInfo>,
}

impl<'a> Histories<'a> {
    fn new(runs: Part<'a>) -> Histories<'a> {
        let pos = vec![0; runs.len()];
        Histories {
            runs,
            pos,
            revs: Vec::new(),
        }
    }

    /// The run whose next record is smallest by (key, revision), with that record.
    fn smallest(&self) -> Option<(usize, &'a [u8], RevInfo)> {
        let mut best: Option<(usize, &'a [u8], RevInfo)> = None;
        for (r, &(run, items)) in self.runs.iter().enumerate() {
            let Some(it) = items.get(self.pos[r]) else {
                continue;
            };
            let key = run.key(it);
            if best.is_none_or(|(_, k, rv)| (key, it.rev.revision()) < (k, rv.revision())) {
                best = Some((r, key, it.rev));
            }
        }
        best
    }
}

impl<'a> Iterator for Histories<'a> {
    type Item = (&'a [u8], KeyHistory);

    fn next(&mut self) -> Option<Self::Item> {
        let (_, key, _) = self.smallest()?;
        self.revs.clear();
        while let Some((r, k, rev)) = self.smallest() {
            if k != key {
                break;
            }
            self.revs.push(rev);
            self.pos[r] += 1;
        }
        let history = match self.revs.as_slice() {
            [only] => KeyHistory::new(*only),
            revs => KeyHistory::from_revisions(revs.to_vec())?,
        };
        Some((key, history))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::Revision;
    use crate::mvcc::codec::{encode_put, encode_tombstone};
    use crate::mvcc::revision::record_key;
    use crate::mvcc::test_support::temp_tree;
    use keel_proto::mvccpb::KeyValue;

    fn put(t: &sled::Tree, key: &str, main: i64, sub: i64, create: i64, version: i64) {
        let kv = KeyValue {
            key: key.as_bytes().to_vec(),
            create_revision: create,
            mod_revision: main,
            version,
            value: b"v".to_vec(),
            lease: 0,
        };
        t.insert(record_key(Revision::new(main, sub), false), encode_put(&kv))
            .unwrap();
    }

    #[test]
    fn empty_tree_rebuilds_to_an_empty_index() {
        let t = temp_tree();
        t.insert(b"c/other-module", b"x".as_slice()).unwrap();
        let r = rebuild(&t).unwrap();
        assert_eq!((r.index.keys(), r.max_main), (0, 0));
    }

    #[test]
    fn rebuild_groups_histories_across_chunks_and_threads() {
        let t = temp_tree();
        // 200 revisions over 20 keys, with deletes, spanning more revisions than CHUNKS.
        let mut expect: std::collections::BTreeMap<String, Vec<i64>> = Default::default();
        let mut version: std::collections::HashMap<String, (i64, i64)> = Default::default();
        for main in 2..202i64 {
            let key = format!("key{:02}", (main * 7) % 20);
            if main % 11 == 0 && version.contains_key(&key) {
                t.insert(
                    record_key(Revision::new(main, 0), true),
                    encode_tombstone(key.as_bytes()),
                )
                .unwrap();
                version.remove(&key);
            } else {
                let (create, v) = version.get(&key).map_or((main, 1), |&(c, v)| (c, v + 1));
                put(&t, &key, main, 0, create, v);
                version.insert(key.clone(), (create, v));
            }
            expect.entry(key).or_default().push(main);
        }
        let r = rebuild(&t).unwrap();
        r.index.check_invariants();
        assert_eq!(r.max_main, 201);
        let got: std::collections::BTreeMap<String, Vec<i64>> = r
            .index
            .iter_all()
            .map(|(k, h)| {
                (
                    String::from_utf8(k.to_vec()).unwrap(),
                    h.revisions().map(|x| x.main).collect(),
                )
            })
            .collect();
        assert_eq!(got, expect);
        for (k, (create, v)) in version {
            let h = r.index.get(k.as_bytes()).unwrap();
            assert_eq!((h.latest().create, h.latest().version), (create, v), "{k}");
        }
    }

    #[test]
    fn sub_revisions_of_one_main_revision_stay_ordered() {
        let t = temp_tree();
        put(&t, "a", 2, 0, 2, 1);
        t.insert(
            record_key(Revision::new(2, 1), true),
            encode_tombstone(b"a"),
        )
        .unwrap();
        put(&t, "a", 2, 2, 2, 1);
        let r = rebuild(&t).unwrap();
        let subs: Vec<u32> = r
            .index
            .get(b"a")
            .unwrap()
            .revisions()
            .map(|x| x.sub)
            .collect();
        assert_eq!(subs, vec![0, 1, 2]);
    }

    #[test]
    fn sort_run_orders_keys_that_share_long_prefixes_or_prefix_each_other() {
        let base = "/registry/very/long/common/prefix/";
        let mut keys: Vec<Vec<u8>> = vec![
            format!("{base}a").into_bytes(),
            format!("{base}a\0").into_bytes(),
            format!("{base}a\0\0").into_bytes(),
            format!("{base}a\0\0\0\0\0\0\0\0\x01").into_bytes(),
            format!("{base}a\0\0\0\0\0\0\0\0").into_bytes(),
            format!("{base}ab").into_bytes(),
            format!("{base}abcdefgh1").into_bytes(),
            format!("{base}abcdefgh0").into_bytes(),
            [base.as_bytes(), &[0xff]].concat(),
            base.as_bytes().to_vec(),
        ];
        keys.extend((0..300).map(|i| format!("{base}k{:05}", (i * 37) % 300).into_bytes()));
        let mut run = Run::default();
        for (i, k) in keys.iter().enumerate() {
            let start = run.arena.len();
            run.arena.extend_from_slice(k);
            let rev = RevInfo::put(Revision::new(2 + (i % 7) as i64, i as i64), 2, 1, 0);
            run.items.push(Item {
                start,
                len: k.len() as u32,
                rev,
            });
        }
        // The same key twice, revisions out of order.
        let start = run.arena.len();
        run.arena.extend_from_slice(&keys[0]);
        run.items.push(Item {
            start,
            len: keys[0].len() as u32,
            rev: RevInfo::put(Revision::new(1, 0), 1, 1, 0),
        });
        let sorted = sort_run(run);
        let got: Vec<(Vec<u8>, Revision)> = sorted
            .items
            .iter()
            .map(|it| (sorted.key(it).to_vec(), it.rev.revision()))
            .collect();
        let mut want = got.clone();
        want.sort();
        assert_eq!(got, want);
        assert_eq!(got.len(), keys.len() + 1);
    }

    #[test]
    fn corrupt_record_fails_the_open() {
        let t = temp_tree();
        t.insert(record_key(Revision::new(2, 0), false), vec![0xff, 0xff])
            .unwrap();
        assert!(matches!(rebuild(&t), Err(MvccError::Corrupt { .. })));
    }
}
