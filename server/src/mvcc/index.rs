//! The in-memory key index: every key with its history, in key order.
//!
//! # Layout
//! A two-level, copy-on-write structure: [`Index`] is a vector of `Arc<Block>`, and each
//! [`Block`] holds up to [`MAX_ENTRIES`] consecutive keys (built at [`TARGET_ENTRIES`]):
//! the key bytes packed in one arena, the end offsets, and one [`KeyHistory`] per key. Each
//! block caches its *live* key count at the newest revision, so counting any key range at the
//! current revision costs two partial block scans plus a sum over whole blocks, never a walk
//! over all keys. Each block also caches the highest main revision of its newest revisions
//! (`max_main`): a block with `max_main <= rev` looks at `rev` exactly as it does now, so
//! historical counts reuse the cached count for every block untouched since `rev`.
//!
//! # Sharing
//! `Index: Clone` clones only the block vector (reference counts). The single writer clones
//! the published index, changes it (`Arc::make_mut` copies a block the first time it is
//! touched), and publishes the result; readers keep using the index they started with,
//! unchanged. This is how readers never block the writer and never see half an entry.
//!
//! # Invariants
//! - keys are strictly ascending within a block and across blocks; no block is empty;
//! - `Block::live` / `with_history` / `Index::{keys, live}` equal what their entries imply;
//! - `Block::max_main` ≥ the main revision of every newest revision in the block.

use std::cmp::Ordering;
use std::sync::Arc;

use super::key_index::{KeyHistory, RevInfo};

/// Keys per block when blocks are built or merged.
pub const TARGET_ENTRIES: usize = 1024;
/// A block holding more keys than this is split in two.
pub const MAX_ENTRIES: usize = 2048;
/// A block whose key bytes exceed this is split in two (when it holds ≥ 2 keys).
pub const MAX_KEY_BYTES: usize = 128 * 1024;
/// Key bytes per block when blocks are built or merged.
pub const TARGET_KEY_BYTES: usize = 64 * 1024;
/// After compaction, a block with fewer keys than this is merged into its right neighbour
/// when the result stays within the targets.
pub const MIN_ENTRIES: usize = TARGET_ENTRIES / 4;

/// A resolved key range (etcd `RangeRequest.key` / `range_end` semantics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRange<'a> {
    /// Exactly one key (`range_end` empty).
    Single(&'a [u8]),
    /// `[start, end)`; `end == None` means no upper bound (`range_end == "\0"`).
    Span {
        /// Inclusive lower bound.
        start: &'a [u8],
        /// Exclusive upper bound, or none.
        end: Option<&'a [u8]>,
    },
}

impl<'a> KeyRange<'a> {
    /// etcd's interpretation of `key` and `range_end` (rpc.proto `RangeRequest`): an empty
    /// `range_end` selects `key` alone, `"\0"` selects every key `>= key`, anything else the
    /// half-open range `[key, range_end)` (empty when `range_end <= key`).
    pub fn from_request(key: &'a [u8], range_end: &'a [u8]) -> KeyRange<'a> {
        match range_end {
            [] => KeyRange::Single(key),
            [0] => KeyRange::Span {
                start: key,
                end: None,
            },
            end => KeyRange::Span {
                start: key,
                end: Some(end),
            },
        }
    }

    /// Whether `key` lies in this range.
    pub fn contains(&self, key: &[u8]) -> bool {
        match *self {
            KeyRange::Single(k) => k == key,
            KeyRange::Span { start, end } => key >= start && end.is_none_or(|e| key < e),
        }
    }
}

/// A run of consecutive keys with their histories.
#[derive(Debug, Clone, Default)]
pub struct Block {
    keys: Vec<u8>,
    ends: Vec<u32>,
    hist: Vec<KeyHistory>,
    live: u32,
    with_history: u32,
    max_main: i64,
}

impl Block {
    /// Number of keys.
    pub fn len(&self) -> usize {
        self.hist.len()
    }

    /// Whether the block holds no key (only transiently, never in a published index).
    pub fn is_empty(&self) -> bool {
        self.hist.is_empty()
    }

    /// Key `i`.
    pub fn key(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.keys[start..self.ends[i] as usize]
    }

    /// History of key `i`.
    pub fn history(&self, i: usize) -> &KeyHistory {
        &self.hist[i]
    }

    fn first_key(&self) -> &[u8] {
        self.key(0)
    }

    fn search(&self, key: &[u8]) -> Result<usize, usize> {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.key(mid).cmp(key) {
                Ordering::Less => lo = mid + 1,
                Ordering::Greater => hi = mid,
                Ordering::Equal => return Ok(mid),
            }
        }
        Err(lo)
    }

    fn lower_bound(&self, key: &[u8]) -> usize {
        self.search(key).unwrap_or_else(|i| i)
    }

    fn add_stats(&mut self, h: &KeyHistory) {
        self.live += u32::from(h.is_live());
        self.with_history += u32::from(h.has_history());
        self.max_main = self.max_main.max(h.latest().main);
    }

    /// Appends a key greater than every key in the block.
    fn push(&mut self, key: &[u8], h: KeyHistory) {
        debug_assert!(self.is_empty() || self.key(self.len() - 1) < key);
        self.keys.extend_from_slice(key);
        self.ends.push(arena_offset(self.keys.len()));
        self.add_stats(&h);
        self.hist.push(h);
    }

    fn insert(&mut self, i: usize, key: &[u8], h: KeyHistory) {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        self.keys.splice(start..start, key.iter().copied());
        let shift = arena_offset(key.len());
        for e in &mut self.ends[i..] {
            *e += shift;
        }
        self.ends.insert(i, arena_offset(start + key.len()));
        self.add_stats(&h);
        self.hist.insert(i, h);
    }

    /// Appends `rev` to the history of key `i`, keeping the statistics exact.
    fn push_rev(&mut self, i: usize, rev: RevInfo) {
        let h = &mut self.hist[i];
        let (was_live, had_history) = (h.is_live(), h.has_history());
        h.push(rev);
        let (is_live, has_history) = (h.is_live(), h.has_history());
        self.live = self.live + u32::from(is_live) - u32::from(was_live);
        self.with_history = self.with_history + u32::from(has_history) - u32::from(had_history);
        self.max_main = self.max_main.max(rev.main);
    }

    fn too_big(&self) -> bool {
        self.len() > MAX_ENTRIES || (self.len() >= 2 && self.keys.len() > MAX_KEY_BYTES)
    }

    /// Moves keys `[at..]` into a new block.
    fn split_off(&mut self, at: usize) -> Block {
        let mut right = Block::default();
        let hist = self.hist.split_off(at);
        let byte_at = if at == 0 {
            0
        } else {
            self.ends[at - 1] as usize
        };
        for (i, h) in hist.into_iter().enumerate() {
            right.push(self.key(at + i), h);
        }
        self.keys.truncate(byte_at);
        self.ends.truncate(at);
        self.recompute_stats();
        right
    }

    fn recompute_stats(&mut self) {
        self.live = 0;
        self.with_history = 0;
        self.max_main = 0;
        let hist = std::mem::take(&mut self.hist);
        for h in &hist {
            self.add_stats(h);
        }
        self.hist = hist;
    }

    fn heap_bytes(&self) -> usize {
        self.keys.capacity()
            + self.ends.capacity() * std::mem::size_of::<u32>()
            + self.hist.capacity() * std::mem::size_of::<KeyHistory>()
            + self.hist.iter().map(KeyHistory::heap_bytes).sum::<usize>()
    }
}

/// Arena offsets are u32: a block splits long before its key bytes reach 4 GiB (a single key
/// is bounded by the request size limit).
fn arena_offset(n: usize) -> u32 {
    u32::try_from(n).expect("mvcc index: block key arena exceeds 4 GiB")
}

/// A position in the index: key `idx` of block `block`. The end position is
/// `(blocks.len(), 0)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Pos {
    block: usize,
    idx: usize,
}

/// The ordered key index. See the module docs.
#[derive(Debug, Clone, Default)]
pub struct Index {
    blocks: Vec<Arc<Block>>,
    keys: usize,
    live: usize,
}

impl Index {
    /// An empty index.
    pub fn new() -> Index {
        Index::default()
    }

    /// Number of keys held (live or ending in a tombstone not yet compacted away).
    pub fn keys(&self) -> usize {
        self.keys
    }

    /// Number of keys that exist at the newest revision.
    pub fn live(&self) -> usize {
        self.live
    }

    /// Number of blocks.
    pub fn blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Builds an index from `(key, history)` pairs in strictly ascending key order.
    ///
    /// Panics if the keys are not strictly ascending (the rebuild sorts them; anything else
    /// would silently break every lookup).
    pub fn from_sorted<K: AsRef<[u8]>>(
        entries: impl IntoIterator<Item = (K, KeyHistory)>,
    ) -> Index {
        let mut index = Index::new();
        let mut cur = Block::default();
        for (key, h) in entries {
            let key = key.as_ref();
            if !cur.is_empty() {
                assert!(
                    cur.key(cur.len() - 1) < key,
                    "mvcc index: keys out of order in build"
                );
            } else if let Some(last) = index.blocks.last() {
                assert!(
                    last.key(last.len() - 1) < key,
                    "mvcc index: keys out of order in build"
                );
            }
            index.keys += 1;
            index.live += usize::from(h.is_live());
            cur.push(key, h);
            if cur.len() >= TARGET_ENTRIES || cur.keys.len() >= TARGET_KEY_BYTES {
                index.blocks.push(Arc::new(std::mem::take(&mut cur)));
            }
        }
        if !cur.is_empty() {
            index.blocks.push(Arc::new(cur));
        }
        index
    }

    /// The history of `key`, if the index holds it.
    pub fn get(&self, key: &[u8]) -> Option<&KeyHistory> {
        let b = self.block_for(key)?;
        let block = &self.blocks[b];
        block.search(key).ok().map(|i| block.history(i))
    }

    /// The block that holds `key` or would receive it.
    fn block_for(&self, key: &[u8]) -> Option<usize> {
        if self.blocks.is_empty() {
            return None;
        }
        Some(
            self.blocks
                .partition_point(|b| b.first_key() <= key)
                .saturating_sub(1),
        )
    }

    fn end_pos(&self) -> Pos {
        Pos {
            block: self.blocks.len(),
            idx: 0,
        }
    }

    /// Position of the first key `>= key`.
    fn lower_bound(&self, key: &[u8]) -> Pos {
        let Some(b) = self.block_for(key) else {
            return self.end_pos();
        };
        let i = self.blocks[b].lower_bound(key);
        if i == self.blocks[b].len() {
            Pos {
                block: b + 1,
                idx: 0,
            }
        } else {
            Pos { block: b, idx: i }
        }
    }

    /// Positions `[from, to)` covering `range`.
    fn bounds(&self, range: &KeyRange<'_>) -> (Pos, Pos) {
        match *range {
            KeyRange::Single(key) => {
                let from = self.lower_bound(key);
                let hit = self.at(from).is_some_and(|(k, _)| k == key);
                let to = if hit { self.next(from) } else { from };
                (from, to)
            }
            KeyRange::Span { start, end } => {
                let from = self.lower_bound(start);
                let to = end.map_or_else(|| self.end_pos(), |e| self.lower_bound(e));
                (from, to.max(from))
            }
        }
    }

    fn at(&self, p: Pos) -> Option<(&[u8], &KeyHistory)> {
        let block = self.blocks.get(p.block)?;
        Some((block.key(p.idx), block.history(p.idx)))
    }

    fn next(&self, p: Pos) -> Pos {
        if p.idx + 1 < self.blocks[p.block].len() {
            Pos {
                block: p.block,
                idx: p.idx + 1,
            }
        } else {
            Pos {
                block: p.block + 1,
                idx: 0,
            }
        }
    }

    /// Keys in `range`, ascending, with their histories.
    pub fn iter(&self, range: &KeyRange<'_>) -> Iter<'_> {
        let (from, to) = self.bounds(range);
        Iter {
            index: self,
            from,
            to,
        }
    }

    /// Keys of the whole index, ascending.
    pub fn iter_all(&self) -> Iter<'_> {
        Iter {
            index: self,
            from: Pos { block: 0, idx: 0 },
            to: self.end_pos(),
        }
    }

    /// Number of keys in `range` that exist at revision `rev`. `rev >= ` the newest revision
    /// in the index counts from the cached per-block counts; older revisions reuse them for
    /// every block untouched since `rev` and walk the others.
    pub fn count(&self, range: &KeyRange<'_>, rev: i64) -> usize {
        let (from, to) = self.bounds(range);
        if from >= to {
            return 0;
        }
        let partial = |b: usize, lo: usize, hi: usize| -> usize {
            let block = &self.blocks[b];
            if block.max_main <= rev {
                block.hist[lo..hi].iter().filter(|h| h.is_live()).count()
            } else {
                block.hist[lo..hi]
                    .iter()
                    .filter(|h| h.visible_at(rev).is_some())
                    .count()
            }
        };
        if from.block == to.block {
            return partial(from.block, from.idx, to.idx);
        }
        let mut n = partial(from.block, from.idx, self.blocks[from.block].len());
        for b in from.block + 1..to.block {
            let block = &self.blocks[b];
            n += if block.max_main <= rev {
                block.live as usize
            } else {
                partial(b, 0, block.len())
            };
        }
        if to.block < self.blocks.len() {
            n += partial(to.block, 0, to.idx);
        }
        n
    }

    /// Appends revision `rev` to `key`, adding the key if the index does not hold it.
    pub fn push(&mut self, key: &[u8], rev: RevInfo) {
        let Some(b) = self.block_for(key) else {
            let mut block = Block::default();
            block.push(key, KeyHistory::new(rev));
            self.keys += 1;
            self.live += usize::from(!rev.tombstone);
            self.blocks.push(Arc::new(block));
            return;
        };
        let block = Arc::make_mut(&mut self.blocks[b]);
        match block.search(key) {
            Ok(i) => {
                let was_live = block.hist[i].is_live();
                block.push_rev(i, rev);
                self.live = self.live + usize::from(!rev.tombstone) - usize::from(was_live);
            }
            Err(i) => {
                block.insert(i, key, KeyHistory::new(rev));
                self.keys += 1;
                self.live += usize::from(!rev.tombstone);
                if block.too_big() {
                    let right = block.split_off(block.len() / 2);
                    self.blocks.insert(b + 1, Arc::new(right));
                }
            }
        }
    }

    /// Compacts every key at `at_rev` (see [`KeyHistory::compact`]), appending the removed
    /// revisions to `removed`. Blocks without removable history are left shared (not
    /// copied); emptied blocks are dropped and small ones merged.
    pub fn compact(&mut self, at_rev: i64, removed: &mut Vec<RevInfo>) {
        let mut changed = false;
        for slot in &mut self.blocks {
            if slot.with_history == 0 || !slot.hist.iter().any(|h| h.compacts_at(at_rev)) {
                continue;
            }
            changed = true;
            let mut fresh = Block::default();
            for i in 0..slot.len() {
                if let Some(kept) = slot.history(i).clone().compact(at_rev, removed) {
                    fresh.push(slot.key(i), kept);
                }
            }
            self.keys = self.keys - slot.len() + fresh.len();
            self.live = self.live - slot.live as usize + fresh.live as usize;
            *slot = Arc::new(fresh);
        }
        if changed {
            self.blocks.retain(|b| !b.is_empty());
            self.merge_small_blocks();
        }
    }

    fn merge_small_blocks(&mut self) {
        let mut i = 0;
        while i + 1 < self.blocks.len() {
            let (a, b) = (&self.blocks[i], &self.blocks[i + 1]);
            let small = a.len() < MIN_ENTRIES || b.len() < MIN_ENTRIES;
            let fits = a.len() + b.len() <= TARGET_ENTRIES
                && a.keys.len() + b.keys.len() <= TARGET_KEY_BYTES;
            if small && fits {
                let right = self.blocks.remove(i + 1);
                let left = Arc::make_mut(&mut self.blocks[i]);
                for j in 0..right.len() {
                    left.push(right.key(j), right.history(j).clone());
                }
            } else {
                i += 1;
            }
        }
    }

    /// Approximate heap bytes of the index (blocks, key arenas, histories), for the
    /// bytes-per-key figure in docs/mvcc.md.
    pub fn heap_bytes(&self) -> usize {
        let arc_header = 2 * std::mem::size_of::<usize>();
        self.blocks.capacity() * std::mem::size_of::<Arc<Block>>()
            + self
                .blocks
                .iter()
                .map(|b| arc_header + std::mem::size_of::<Block>() + b.heap_bytes())
                .sum::<usize>()
    }

    /// Checks every structural invariant; used by tests.
    #[cfg(test)]
    pub fn check_invariants(&self) {
        let (mut keys, mut live) = (0, 0);
        let mut prev: Option<Vec<u8>> = None;
        for b in &self.blocks {
            assert!(!b.is_empty(), "empty block");
            let (mut bl, mut bh) = (0u32, 0u32);
            for i in 0..b.len() {
                let k = b.key(i).to_vec();
                if let Some(p) = &prev {
                    assert!(p < &k, "keys out of order");
                }
                prev = Some(k);
                let h = b.history(i);
                bl += u32::from(h.is_live());
                bh += u32::from(h.has_history());
                assert!(
                    b.max_main >= h.latest().main,
                    "max_main below a latest revision"
                );
            }
            assert_eq!((b.live, b.with_history), (bl, bh), "stale block stats");
            keys += b.len();
            live += bl as usize;
        }
        assert_eq!((self.keys, self.live), (keys, live), "stale index totals");
    }
}

/// Ascending iterator over `(key, history)` in a key range; also walks backwards.
pub struct Iter<'a> {
    index: &'a Index,
    from: Pos,
    to: Pos,
}

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a [u8], &'a KeyHistory);

    fn next(&mut self) -> Option<Self::Item> {
        if self.from >= self.to {
            return None;
        }
        let item = self.index.at(self.from)?;
        self.from = self.index.next(self.from);
        Some(item)
    }
}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        if self.from >= self.to {
            return None;
        }
        self.to = if self.to.idx > 0 {
            Pos {
                block: self.to.block,
                idx: self.to.idx - 1,
            }
        } else {
            let b = self.to.block - 1;
            Pos {
                block: b,
                idx: self.index.blocks[b].len() - 1,
            }
        };
        self.index.at(self.to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::revision::Revision;

    fn put(main: i64) -> RevInfo {
        RevInfo::put(Revision::new(main, 0), main, 1, 0)
    }
    fn tomb(main: i64) -> RevInfo {
        RevInfo::tombstone(Revision::new(main, 0))
    }
    fn key(i: usize) -> Vec<u8> {
        format!("key{i:06}").into_bytes()
    }
    fn keys_of(index: &Index, range: &KeyRange<'_>) -> Vec<Vec<u8>> {
        index.iter(range).map(|(k, _)| k.to_vec()).collect()
    }

    /// 5000 keys inserted in a scrambled order: forces many splits.
    fn big() -> Index {
        let mut index = Index::new();
        for n in 0..5000usize {
            let i = (n * 7919) % 5000;
            index.push(&key(i), put(2 + n as i64));
        }
        index
    }

    #[test]
    fn inserts_split_blocks_and_keep_order() {
        let index = big();
        index.check_invariants();
        assert_eq!((index.keys(), index.live()), (5000, 5000));
        assert!(index.blocks() > 5000 / MAX_ENTRIES);
        let all: Vec<Vec<u8>> = index.iter_all().map(|(k, _)| k.to_vec()).collect();
        assert_eq!(all, (0..5000).map(key).collect::<Vec<_>>());
        let n = (0..5000).find(|n| (n * 7919) % 5000 == 4321).unwrap();
        assert_eq!(index.get(&key(4321)).unwrap().latest().main, 2 + n as i64);
        assert!(index.get(b"nope").is_none());
    }

    #[test]
    fn ranges_single_span_open_and_inverted() {
        let index = big();
        assert_eq!(keys_of(&index, &KeyRange::Single(&key(17))), vec![key(17)]);
        assert!(keys_of(&index, &KeyRange::Single(b"key0000170")).is_empty());
        let span = KeyRange::Span {
            start: &key(10),
            end: Some(&key(13)),
        };
        assert_eq!(keys_of(&index, &span), vec![key(10), key(11), key(12)]);
        let open = KeyRange::Span {
            start: &key(4998),
            end: None,
        };
        assert_eq!(keys_of(&index, &open), vec![key(4998), key(4999)]);
        let inverted = KeyRange::Span {
            start: &key(13),
            end: Some(&key(10)),
        };
        assert!(keys_of(&index, &inverted).is_empty());
        assert_eq!(index.count(&inverted, i64::MAX), 0);
        let everything = KeyRange::from_request(b"", b"\0");
        assert_eq!(index.count(&everything, i64::MAX), 5000);
    }

    #[test]
    fn reverse_iteration_mirrors_forward() {
        let index = big();
        let span = KeyRange::Span {
            start: &key(1000),
            end: Some(&key(3100)),
        };
        let fwd: Vec<Vec<u8>> = keys_of(&index, &span);
        let mut back: Vec<Vec<u8>> = index.iter(&span).rev().map(|(k, _)| k.to_vec()).collect();
        back.reverse();
        assert_eq!(fwd.len(), 2100);
        assert_eq!(fwd, back);
        // Meeting in the middle yields every key once.
        let mut it = index.iter(&span);
        let mut n = 0;
        while it.next().is_some() {
            n += 1;
            if it.next_back().is_some() {
                n += 1;
            }
        }
        assert_eq!(n, 2100);
    }

    #[test]
    fn counts_at_current_and_historical_revisions() {
        let mut index = big();
        // Delete every third key at revisions after all puts.
        let mut rev = 10_000;
        for i in (0..5000).step_by(3) {
            index.push(&key(i), tomb(rev));
            rev += 1;
        }
        index.check_invariants();
        let live = 5000 - (0..5000).step_by(3).count();
        assert_eq!(index.live(), live);
        for (lo, hi) in [(0, 5000), (1, 2), (100, 4900), (2047, 2049), (4000, 4001)] {
            let (klo, khi) = (key(lo), key(hi));
            let r = KeyRange::Span {
                start: &klo,
                end: Some(&khi),
            };
            let walked_now = index.iter(&r).filter(|(_, h)| h.is_live()).count();
            assert_eq!(index.count(&r, i64::MAX), walked_now);
            for at in [1, 2, 2500, 5001, 10_000, 10_500, rev] {
                let walked = index
                    .iter(&r)
                    .filter(|(_, h)| h.visible_at(at).is_some())
                    .count();
                assert_eq!(index.count(&r, at), walked, "range {lo}..{hi} at {at}");
            }
        }
    }

    #[test]
    fn clones_share_blocks_until_written() {
        let base = big();
        let mut work = base.clone();
        work.push(&key(0), put(99_999));
        let shared = base
            .blocks
            .iter()
            .zip(&work.blocks)
            .filter(|(a, b)| Arc::ptr_eq(a, b))
            .count();
        assert_eq!(
            shared,
            base.blocks() - 1,
            "only the written block is copied"
        );
        assert_eq!(base.get(&key(0)).unwrap().len(), 1);
        assert_eq!(work.get(&key(0)).unwrap().len(), 2);
    }

    #[test]
    fn compaction_removes_history_drops_keys_and_merges_blocks() {
        let mut index = big();
        let mut rev = 10_000;
        for i in 0..5000 {
            if i % 10 != 0 {
                index.push(&key(i), tomb(rev));
                rev += 1;
            }
        }
        let blocks_before = index.blocks();
        let untouched = index.clone();
        let mut removed = Vec::new();
        index.compact(rev, &mut removed);
        index.check_invariants();
        // Deleted keys lose both revisions; live keys keep their single put.
        assert_eq!(removed.len(), 2 * 4500);
        assert_eq!((index.keys(), index.live()), (500, 500));
        assert!(index.blocks() < blocks_before);
        assert!(index.blocks() <= 500usize.div_ceil(MIN_ENTRIES));
        // The clone taken before still sees everything.
        assert_eq!(untouched.keys(), 5000);
        // A second compaction finds nothing to do and copies nothing.
        let again = index.clone();
        let mut removed = Vec::new();
        index.compact(rev, &mut removed);
        assert!(removed.is_empty());
        assert!(
            index
                .blocks
                .iter()
                .zip(&again.blocks)
                .all(|(a, b)| Arc::ptr_eq(a, b))
        );
    }

    #[test]
    fn from_sorted_builds_target_sized_blocks() {
        let index = Index::from_sorted((0..3000).map(|i| (key(i), KeyHistory::new(put(2)))));
        index.check_invariants();
        assert_eq!(index.blocks(), 3);
        assert_eq!(index.count(&KeyRange::from_request(b"k", b"\0"), 2), 3000);
        assert!(index.heap_bytes() > 3000 * (9 + 4 + std::mem::size_of::<KeyHistory>()));
    }

    #[test]
    #[should_panic(expected = "out of order")]
    fn from_sorted_rejects_unsorted_input() {
        let _ = Index::from_sorted([
            (key(2), KeyHistory::new(put(2))),
            (key(1), KeyHistory::new(put(2))),
        ]);
    }

    #[test]
    fn large_keys_split_by_bytes() {
        let mut index = Index::new();
        let big_key = |i: usize| {
            let mut k = vec![b'x'; 40_000];
            k.extend_from_slice(&key(i));
            k
        };
        for i in 0..10 {
            index.push(&big_key(i), put(2 + i as i64));
        }
        index.check_invariants();
        assert!(index.blocks() >= 3, "{} blocks", index.blocks());
        assert_eq!(
            index.count(&KeyRange::from_request(b"x", b"\0"), i64::MAX),
            10
        );
    }

    /// Many keys, random puts/deletes/compactions against a `BTreeMap` model: exercises
    /// splits, merges and multi-block counts at historical revisions.
    mod model {
        use super::*;
        use proptest::prelude::*;
        use std::collections::BTreeMap;

        #[derive(Debug, Clone)]
        enum Step {
            /// Put `n` keys starting at key `start` (stride `stride`).
            Puts {
                start: usize,
                n: usize,
                stride: usize,
            },
            /// Delete the keys in `[lo, lo + len)` that exist.
            Deletes {
                lo: usize,
                len: usize,
            },
            Compact,
        }

        fn step() -> impl Strategy<Value = Step> {
            prop_oneof![
                4 => (0usize..12_000, 1usize..2500, 1usize..9).prop_map(|(start, n, stride)| Step::Puts { start, n, stride }),
                2 => (0usize..12_000, 1usize..3000).prop_map(|(lo, len)| Step::Deletes { lo, len }),
                1 => Just(Step::Compact),
            ]
        }

        fn visible(h: &[RevInfo], rev: i64) -> bool {
            h.iter()
                .rev()
                .find(|r| r.main <= rev)
                .is_some_and(|r| !r.tombstone)
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 10, max_shrink_iters: 30, ..ProptestConfig::default() })]

            #[test]
            fn index_matches_btreemap(steps in proptest::collection::vec(step(), 1..14), probes in proptest::collection::vec((0usize..12_100, 0usize..12_100, any::<u16>()), 12)) {
                let mut index = Index::new();
                let mut model: BTreeMap<Vec<u8>, Vec<RevInfo>> = BTreeMap::new();
                let (mut rev, mut compacted) = (1i64, 0i64);
                for s in steps {
                    rev += 1;
                    let mut sub = 0;
                    match s {
                        Step::Puts { start, n, stride } => {
                            for i in (0..n).map(|j| (start + j * stride) % 12_000) {
                                let r = RevInfo::put(Revision::new(rev, sub), rev, 1, 0);
                                if model.get(&key(i)).is_some_and(|h| h.last().unwrap().main == rev) {
                                    continue;
                                }
                                sub += 1;
                                index.push(&key(i), r);
                                model.entry(key(i)).or_default().push(r);
                            }
                        }
                        Step::Deletes { lo, len } => {
                            for i in lo..(lo + len).min(12_000) {
                                if model.get(&key(i)).is_some_and(|h| !h.last().unwrap().tombstone) {
                                    let r = RevInfo::tombstone(Revision::new(rev, sub));
                                    sub += 1;
                                    index.push(&key(i), r);
                                    model.get_mut(&key(i)).unwrap().push(r);
                                }
                            }
                        }
                        Step::Compact => {
                            let mut removed = Vec::new();
                            index.compact(rev - 1, &mut removed);
                            let mut model_removed = 0;
                            model = model
                                .into_iter()
                                .filter_map(|(k, h)| {
                                    let n = h.len();
                                    let kept = KeyHistory::from_revisions(h)?.compact(rev - 1, &mut Vec::new());
                                    let kept: Vec<RevInfo> = kept.map(|k| k.revisions().copied().collect()).unwrap_or_default();
                                    model_removed += n - kept.len();
                                    (!kept.is_empty()).then_some((k, kept))
                                })
                                .collect();
                            prop_assert_eq!(removed.len(), model_removed);
                            compacted = rev - 1;
                        }
                    }
                    index.check_invariants();
                    prop_assert_eq!(index.keys(), model.len());
                    for &(a, b, r) in &probes {
                        let (ka, kb) = (key(a.min(b)), key(a.max(b)));
                        let range = KeyRange::Span { start: &ka, end: Some(&kb) };
                        let at = compacted.max(1) + i64::from(r) % (rev - compacted.max(1) + 1);
                        let want = model.range(ka.clone()..kb.clone()).filter(|(_, h)| visible(h, at)).count();
                        prop_assert_eq!(index.count(&range, at), want, "count {}..{} at {}", a, b, at);
                        let got: Vec<Vec<u8>> = index.iter(&range).filter(|(_, h)| h.visible_at(at).is_some()).map(|(k, _)| k.to_vec()).collect();
                        let want: Vec<Vec<u8>> = model.range(ka.clone()..kb.clone()).filter(|(_, h)| visible(h, at)).map(|(k, _)| k.clone()).collect();
                        prop_assert_eq!(got, want);
                    }
                }
            }
        }
    }

    #[test]
    fn key_range_follows_etcd() {
        assert_eq!(KeyRange::from_request(b"a", b""), KeyRange::Single(b"a"));
        assert_eq!(
            KeyRange::from_request(b"a", b"\0"),
            KeyRange::Span {
                start: b"a",
                end: None
            }
        );
        let r = KeyRange::from_request(b"a", b"c");
        assert!(r.contains(b"a") && r.contains(b"bzz") && !r.contains(b"c"));
        assert!(!KeyRange::from_request(b"c", b"a").contains(b"b"));
    }
}
