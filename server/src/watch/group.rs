//! The synced watcher group: which watchers an event on a given key reaches (etcd
//! `watcherGroup`).
//!
//! - Single-key watchers sit in a hash map from key to watcher set: one lookup per event.
//! - Range watchers sit in a [`RangeIndex`]: intervals sorted by `(start, end)` in chunks of
//!   at most [`CHUNK`] entries, each chunk caching the largest end of its intervals. A stab
//!   query skips every chunk whose largest end is `<= key` and stops at the first chunk that
//!   starts after `key`, so it costs `O(chunks + matches·CHUNK)` instead of a scan of every
//!   range watcher (etcd uses an augmented interval tree for the same purpose).
//!
//! Watchers with the same key (or the same interval) share one entry, so a thousand
//! watchers on one prefix cost one interval plus a thousand set members.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::key_range::WatchKeyRange;
use super::watcher::WatcherId;

/// Most intervals per chunk of a [`RangeIndex`].
pub const CHUNK: usize = 64;

/// A set of watcher handles, stored inline when it holds one.
#[derive(Debug)]
enum IdSet {
    One(WatcherId),
    Many(HashSet<WatcherId>),
}

impl IdSet {
    fn insert(&mut self, id: WatcherId) {
        match self {
            IdSet::One(first) => {
                let mut set = HashSet::with_capacity(2);
                set.insert(*first);
                set.insert(id);
                *self = IdSet::Many(set);
            }
            IdSet::Many(set) => {
                set.insert(id);
            }
        }
    }

    /// Removes `id`; returns `(removed, now_empty)`.
    fn remove(&mut self, id: WatcherId) -> (bool, bool) {
        match self {
            IdSet::One(only) => {
                let hit = *only == id;
                (hit, hit)
            }
            IdSet::Many(set) => {
                let hit = set.remove(&id);
                if set.len() == 1 {
                    let last = *set.iter().next().expect("one element");
                    *self = IdSet::One(last);
                }
                (hit, false)
            }
        }
    }

    fn for_each(&self, f: &mut impl FnMut(WatcherId)) {
        match self {
            IdSet::One(id) => f(*id),
            IdSet::Many(set) => set.iter().copied().for_each(f),
        }
    }

    fn heap_bytes(&self) -> usize {
        match self {
            IdSet::One(_) => 0,
            // hashbrown: one control byte plus the element per bucket, buckets ≈ 8/7 · cap.
            IdSet::Many(set) => set.capacity() * 8 / 7 * (std::mem::size_of::<WatcherId>() + 1),
        }
    }
}

/// The synced watchers, indexed by what they watch.
#[derive(Debug, Default)]
pub struct WatcherIndex {
    keys: HashMap<Arc<[u8]>, IdSet>,
    ranges: RangeIndex,
    len: usize,
}

impl WatcherIndex {
    /// Adds watcher `id` watching `range`.
    pub fn insert(&mut self, range: &WatchKeyRange, id: WatcherId) {
        self.len += 1;
        match range {
            WatchKeyRange::Single(key) => match self.keys.get_mut(&**key) {
                Some(set) => set.insert(id),
                None => {
                    self.keys.insert(key.clone(), IdSet::One(id));
                }
            },
            WatchKeyRange::Span { start, end } => self.ranges.insert(start, end.as_ref(), id),
        }
    }

    /// Removes watcher `id` watching `range`; returns whether it was present.
    pub fn remove(&mut self, range: &WatchKeyRange, id: WatcherId) -> bool {
        let removed = match range {
            WatchKeyRange::Single(key) => match self.keys.get_mut(&**key) {
                Some(set) => {
                    let (hit, empty) = set.remove(id);
                    if empty {
                        self.keys.remove(&**key);
                    }
                    hit
                }
                None => false,
            },
            WatchKeyRange::Span { start, end } => self.ranges.remove(start, end.as_deref(), id),
        };
        if removed {
            self.len -= 1;
        }
        removed
    }

    /// Calls `f` for every watcher whose range contains `key` (each once).
    pub fn for_each_match(&self, key: &[u8], mut f: impl FnMut(WatcherId)) {
        if let Some(set) = self.keys.get(key) {
            set.for_each(&mut f);
        }
        self.ranges.stab(key, &mut f);
    }

    /// Number of watchers.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the group is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Approximate heap bytes of the index itself (key bytes are owned by the watchers).
    pub fn heap_bytes(&self) -> usize {
        let entry = std::mem::size_of::<(Arc<[u8]>, IdSet)>() + 1;
        self.keys.capacity() * 8 / 7 * entry
            + self.keys.values().map(IdSet::heap_bytes).sum::<usize>()
            + self.ranges.heap_bytes()
    }
}

/// One interval with its watchers.
#[derive(Debug)]
struct Interval {
    start: Arc<[u8]>,
    /// `None` = unbounded.
    end: Option<Arc<[u8]>>,
    ids: IdSet,
}

/// Compares two interval ends; `None` (unbounded) is the largest.
fn cmp_end(a: Option<&[u8]>, b: Option<&[u8]>) -> std::cmp::Ordering {
    match (a, b) {
        (None, None) => std::cmp::Ordering::Equal,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (Some(_), None) => std::cmp::Ordering::Less,
        (Some(x), Some(y)) => x.cmp(y),
    }
}

/// Order of intervals in the index: by start, then by end.
fn cmp_interval(s1: &[u8], e1: Option<&[u8]>, s2: &[u8], e2: Option<&[u8]>) -> std::cmp::Ordering {
    s1.cmp(s2).then_with(|| cmp_end(e1, e2))
}

#[derive(Debug, Default)]
struct Chunk {
    intervals: Vec<Interval>,
    /// Largest end of `intervals` (`None` = unbounded); meaningless when empty.
    max_end: Option<Arc<[u8]>>,
}

impl Chunk {
    fn recompute_max(&mut self) {
        self.max_end = None;
        let mut best: Option<&Interval> = None;
        for iv in &self.intervals {
            if iv.end.is_none() {
                self.max_end = None;
                return;
            }
            if best.is_none_or(|b| cmp_end(iv.end.as_deref(), b.end.as_deref()).is_gt()) {
                best = Some(iv);
            }
        }
        self.max_end = best.and_then(|b| b.end.clone());
    }

    /// Whether the largest end of this chunk lies above `key` (else no interval of it can
    /// contain `key`).
    fn reaches_past(&self, key: &[u8]) -> bool {
        self.max_end.as_deref().is_none_or(|e| e > key)
    }

    fn position(&self, start: &[u8], end: Option<&[u8]>) -> Result<usize, usize> {
        self.intervals
            .binary_search_by(|iv| cmp_interval(&iv.start, iv.end.as_deref(), start, end))
    }
}

/// Range watchers: see the module docs.
#[derive(Debug, Default)]
pub struct RangeIndex {
    chunks: Vec<Chunk>,
}

impl RangeIndex {
    /// The chunk that holds, or would receive, the interval `(start, end)`.
    fn chunk_for(&self, start: &[u8], end: Option<&[u8]>) -> usize {
        let n = self.chunks.partition_point(|c| {
            let last = c.intervals.last().expect("chunks are never empty");
            cmp_interval(&last.start, last.end.as_deref(), start, end).is_lt()
        });
        n.min(self.chunks.len().saturating_sub(1))
    }

    fn insert(&mut self, start: &Arc<[u8]>, end: Option<&Arc<[u8]>>, id: WatcherId) {
        if self.chunks.is_empty() {
            let mut chunk = Chunk {
                intervals: vec![Interval {
                    start: start.clone(),
                    end: end.cloned(),
                    ids: IdSet::One(id),
                }],
                max_end: None,
            };
            chunk.recompute_max();
            self.chunks.push(chunk);
            return;
        }
        let c = self.chunk_for(start, end.map(|e| &**e));
        let chunk = &mut self.chunks[c];
        match chunk.position(start, end.map(|e| &**e)) {
            Ok(i) => chunk.intervals[i].ids.insert(id),
            Err(i) => {
                chunk.intervals.insert(
                    i,
                    Interval {
                        start: start.clone(),
                        end: end.cloned(),
                        ids: IdSet::One(id),
                    },
                );
                chunk.recompute_max();
                if chunk.intervals.len() > CHUNK {
                    let tail = chunk.intervals.split_off(CHUNK / 2);
                    chunk.recompute_max();
                    let mut right = Chunk {
                        intervals: tail,
                        max_end: None,
                    };
                    right.recompute_max();
                    self.chunks.insert(c + 1, right);
                }
            }
        }
    }

    fn remove(&mut self, start: &[u8], end: Option<&[u8]>, id: WatcherId) -> bool {
        if self.chunks.is_empty() {
            return false;
        }
        let c = self.chunk_for(start, end);
        let chunk = &mut self.chunks[c];
        let Ok(i) = chunk.position(start, end) else {
            return false;
        };
        let (hit, empty) = chunk.intervals[i].ids.remove(id);
        if empty {
            chunk.intervals.remove(i);
            if chunk.intervals.is_empty() {
                self.chunks.remove(c);
            } else {
                chunk.recompute_max();
            }
        }
        hit
    }

    fn stab(&self, key: &[u8], f: &mut impl FnMut(WatcherId)) {
        for chunk in &self.chunks {
            let first = &chunk.intervals[0];
            if *first.start > *key {
                break;
            }
            if !chunk.reaches_past(key) {
                continue;
            }
            for iv in &chunk.intervals {
                if *iv.start > *key {
                    break;
                }
                if iv.end.as_deref().is_none_or(|e| e > key) {
                    iv.ids.for_each(f);
                }
            }
        }
    }

    fn heap_bytes(&self) -> usize {
        self.chunks.capacity() * std::mem::size_of::<Chunk>()
            + self
                .chunks
                .iter()
                .map(|c| {
                    c.intervals.capacity() * std::mem::size_of::<Interval>()
                        + c.intervals
                            .iter()
                            .map(|iv| iv.ids.heap_bytes())
                            .sum::<usize>()
                })
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::watcher::Slab;
    use proptest::prelude::*;

    /// Handles without watchers behind them: the index only stores and returns them.
    fn ids(n: usize) -> Vec<WatcherId> {
        let mut slab = Slab::default();
        (0..n).map(|_| slab.insert(test_watcher())).collect()
    }

    fn test_watcher() -> crate::watch::watcher::Watcher {
        use crate::watch::{WatchConfig, hub::SyncSignal, outbox::Outbox, watcher::*};
        Watcher {
            outbox: Outbox::new(&WatchConfig::default(), Arc::new(SyncSignal::default())),
            watch_id: 0,
            range: WatchKeyRange::from_request(b"k", b"").unwrap(),
            next_rev: 1,
            filter: Default::default(),
            flags: WatcherFlags::default(),
            state: WatcherState::Synced,
            events_since_tick: false,
        }
    }

    fn matches(index: &WatcherIndex, key: &[u8]) -> Vec<WatcherId> {
        let mut out = Vec::new();
        index.for_each_match(key, |id| out.push(id));
        out.sort();
        out
    }

    #[test]
    fn single_keys_ranges_and_from_key() {
        let id = ids(4);
        let mut index = WatcherIndex::default();
        let single = WatchKeyRange::from_request(b"b", b"").unwrap();
        let span = WatchKeyRange::from_request(b"a", b"c").unwrap();
        let from = WatchKeyRange::from_request(b"b", b"\0").unwrap();
        index.insert(&single, id[0]);
        index.insert(&span, id[1]);
        index.insert(&from, id[2]);
        index.insert(&single, id[3]);
        assert_eq!(index.len(), 4);
        assert_eq!(matches(&index, b"a"), vec![id[1]]);
        assert_eq!(matches(&index, b"b"), vec![id[0], id[1], id[2], id[3]]);
        assert_eq!(matches(&index, b"c"), vec![id[2]]);
        assert!(matches(&index, b"0").is_empty());
        assert!(index.remove(&single, id[0]));
        assert!(
            !index.remove(&single, id[0]),
            "second removal finds nothing"
        );
        assert!(index.remove(&span, id[1]));
        assert_eq!(matches(&index, b"b"), vec![id[2], id[3]]);
        assert_eq!(index.len(), 2);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// The chunked index answers exactly what a linear scan over all watchers answers,
        /// through inserts and removals that split and empty chunks.
        #[test]
        fn stab_matches_a_linear_scan(
            ops in prop::collection::vec((0u8..24, 0u8..26, any::<bool>(), any::<bool>()), 1..400),
            probes in prop::collection::vec(0u8..26, 1..30),
        ) {
            let handles = ids(ops.len());
            let mut index = WatcherIndex::default();
            let mut model: Vec<(WatchKeyRange, WatcherId)> = Vec::new();
            for (i, (a, len, unbounded, remove_one)) in ops.iter().enumerate() {
                let start = [b'a' + a];
                let end = [b'a' + a + 1 + len % 3];
                let range = if *unbounded {
                    WatchKeyRange::from_request(&start, b"\0").unwrap()
                } else if len % 4 == 0 {
                    WatchKeyRange::from_request(&start, b"").unwrap()
                } else {
                    WatchKeyRange::from_request(&start, &end).unwrap()
                };
                index.insert(&range, handles[i]);
                model.push((range, handles[i]));
                if *remove_one && !model.is_empty() {
                    let victim = model.remove((*len as usize * 7 + i) % model.len());
                    prop_assert!(index.remove(&victim.0, victim.1));
                }
            }
            prop_assert_eq!(index.len(), model.len());
            for p in probes {
                let key = [b'a' + p];
                let mut want: Vec<WatcherId> =
                    model.iter().filter(|(r, _)| r.contains(&key)).map(|(_, id)| *id).collect();
                want.sort();
                prop_assert_eq!(matches(&index, &key), want);
            }
        }
    }
}
