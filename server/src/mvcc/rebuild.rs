//! Rebuilding the key index from the revision records when the store opens (etcd
//! `store.restore`), once, on 2 threads.
//!
//! 1. The main-revision span of the records is cut into chunks; 2 scoped threads take
//!    chunks from a shared counter (so one giant revision cannot leave a thread idle for
//!    long), scan them from sled and decode each record's key, create revision, version and
//!    lease without copying its value.
//! 2. Each thread sorts its records by (key, revision).
//! 3. The two sorted runs are merged, grouped per key into histories and packed into index
//!    blocks.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::MvccError;
use super::backend::decode_meta;
use super::index::Index;
use super::key_index::{KeyHistory, RevInfo};
use super::revision::{RECORD_PREFIX, Revision, parse_record_key, record_key_lower_bound};

/// Threads used for the rebuild (the target machine class has 2 cores).
const THREADS: usize = 2;
/// Chunks of main revisions handed out to the threads.
const CHUNKS: i64 = 64;

/// The rebuilt index and the newest main revision found (0 if there is no record).
pub(super) struct Rebuilt {
    pub index: Index,
    pub max_main: i64,
}

/// Records read by one thread: keys packed in one arena.
#[derive(Default)]
struct Run {
    arena: Vec<u8>,
    items: Vec<Item>,
}

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
    let first = first_main(tree.scan_prefix([RECORD_PREFIX]).next())?;
    let last = first_main(tree.scan_prefix([RECORD_PREFIX]).next_back())?;
    let (Some(lo), Some(hi)) = (first, last) else {
        return Ok(Rebuilt {
            index: Index::new(),
            max_main: 0,
        });
    };
    let span = hi - lo + 1;
    let chunks = span.min(CHUNKS);
    let bound = |i: i64| lo + (span as i128 * i as i128 / chunks as i128) as i64;
    let next = AtomicUsize::new(0);
    let runs: Vec<Run> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| -> Result<Run, MvccError> {
                    let mut run = Run::default();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed) as i64;
                        if i >= chunks {
                            break;
                        }
                        scan(tree, bound(i), bound(i + 1), &mut run)?;
                    }
                    let arena = &run.arena;
                    let key = |it: &Item| &arena[it.start..it.start + it.len as usize];
                    run.items.sort_unstable_by(|a, b| {
                        key(a)
                            .cmp(key(b))
                            .then(a.rev.revision().cmp(&b.rev.revision()))
                    });
                    Ok(run)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .map_err(|_| MvccError::Rebuild("rebuild thread panicked".into()))?
            })
            .collect::<Result<Vec<_>, _>>()
    })?;
    let index = Index::from_sorted(Histories::new(&runs));
    Ok(Rebuilt {
        index,
        max_main: hi,
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

/// Merges sorted runs into `(key, history)` in key order.
struct Histories<'a> {
    runs: &'a [Run],
    pos: Vec<usize>,
}

impl<'a> Histories<'a> {
    fn new(runs: &'a [Run]) -> Histories<'a> {
        Histories {
            runs,
            pos: vec![0; runs.len()],
        }
    }

    /// The run whose next record is smallest by (key, revision).
    fn smallest(&self) -> Option<usize> {
        let mut best: Option<(usize, &[u8], Revision)> = None;
        for (r, run) in self.runs.iter().enumerate() {
            let Some(it) = run.items.get(self.pos[r]) else {
                continue;
            };
            let cand = (run.key(it), it.rev.revision());
            if best.is_none_or(|(_, k, rv)| cand < (k, rv)) {
                best = Some((r, cand.0, cand.1));
            }
        }
        best.map(|(r, _, _)| r)
    }
}

impl<'a> Iterator for Histories<'a> {
    type Item = (&'a [u8], KeyHistory);

    fn next(&mut self) -> Option<Self::Item> {
        let first = self.smallest()?;
        let runs = self.runs;
        let key = runs[first].key(&runs[first].items[self.pos[first]]);
        let mut revs = Vec::new();
        while let Some(r) = self.smallest() {
            let it = &runs[r].items[self.pos[r]];
            if runs[r].key(it) != key {
                break;
            }
            revs.push(it.rev);
            self.pos[r] += 1;
        }
        KeyHistory::from_revisions(revs).map(|h| (key, h))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::backend::{encode_put, encode_tombstone};
    use crate::mvcc::revision::record_key;
    use keel_proto::mvccpb::KeyValue;

    fn tree() -> sled::Tree {
        sled::Config::new()
            .temporary(true)
            .open()
            .unwrap()
            .open_tree("t")
            .unwrap()
    }

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
        let t = tree();
        t.insert(b"c/other-module", b"x".as_slice()).unwrap();
        let r = rebuild(&t).unwrap();
        assert_eq!((r.index.keys(), r.max_main), (0, 0));
    }

    #[test]
    fn rebuild_groups_histories_across_chunks_and_threads() {
        let t = tree();
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
        let t = tree();
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
    fn corrupt_record_fails_the_open() {
        let t = tree();
        t.insert(record_key(Revision::new(2, 0), false), vec![0xff, 0xff])
            .unwrap();
        assert!(matches!(rebuild(&t), Err(MvccError::Corrupt { .. })));
    }
}
