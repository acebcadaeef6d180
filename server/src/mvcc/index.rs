//! The in-memory key index: every key with its history, in key order.
//!
//! # Layout
//! A three-level, copy-on-write tree of fixed height:
//!
//! ```text
//! Index { chunks: Vec<Arc<Chunk>>, firsts }          top level, in key order
//! Chunk { blocks: Vec<Arc<Block>>, firsts, stats }   up to CHUNK_MAX_BLOCKS blocks
//! Block { key arena, key ends, histories, stats }    up to BLOCK_MAX_KEYS keys
//! ```
//!
//! `firsts` holds the first key of each child in one arena ([`super::separators`]), so a
//! lookup's binary search reads two vectors per level instead of chasing into every child
//! it probes.
//!
//! Every block and chunk caches its *live* key count at the newest revision, so counting any
//! key range at the current revision costs two partial block scans, two partial chunk sums
//! and a sum over whole chunks, never a walk over all keys. Each also caches the highest
//! main revision of its newest revisions (`max_main`): a part with `max_main <= rev` looks
//! at `rev` exactly as it does now, so historical counts reuse the cached counts of every
//! part untouched since `rev` and walk only the rest.
//!
//! # Sharing
//! `Index: Clone` copies only the top vector (one reference count per chunk). The single
//! writer clones the published index, changes it (`Arc::make_mut` copies a chunk's pointer
//! vector and a ~32-key block the first time they are touched) and publishes the result;
//! readers keep the index they started with, unchanged. So readers never block the writer
//! and never see half an entry, and one write costs a few small copies, not a walk.
//!
//! # Invariants
//! - keys strictly ascend within a block, across blocks and across chunks;
//! - no block and no chunk is empty;
//! - cached `keys` / `live` / `with_history` equal what the entries below imply;
//! - cached `max_main` ≥ the main revision of every newest revision below;
//! - `firsts` of the index and of each chunk name exactly the first key of each child.

use std::cmp::Ordering;
use std::sync::Arc;

use super::key_index::{KeyHistory, RevInfo};
use super::separators::Separators;

/// Keys per block when blocks are built or merged (small: a put copies its key's block, one
/// reference count per key with history; docs/mvcc.md, "Why 32-key blocks").
pub const BLOCK_TARGET_KEYS: usize = 32;
/// A block holding more keys than this is split in two.
pub const BLOCK_MAX_KEYS: usize = 64;
/// A block whose key bytes exceed this is split in two (when it holds ≥ 2 keys).
pub const BLOCK_MAX_KEY_BYTES: usize = 32 * 1024;
/// Key bytes per block when blocks are built or merged.
pub const BLOCK_TARGET_KEY_BYTES: usize = 16 * 1024;
/// After compaction a block with fewer keys than this merges into its right neighbour when
/// the result stays within the targets.
pub const BLOCK_MIN_KEYS: usize = BLOCK_TARGET_KEYS / 4;
/// Blocks per chunk when chunks are built or merged.
pub const CHUNK_TARGET_BLOCKS: usize = 64;
/// A chunk holding more blocks than this is split in two.
pub const CHUNK_MAX_BLOCKS: usize = 128;
/// After compaction a chunk with fewer blocks than this merges into its right neighbour.
pub const CHUNK_MIN_BLOCKS: usize = CHUNK_TARGET_BLOCKS / 4;

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

/// Cached statistics of a block or chunk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Stats {
    keys: usize,
    live: usize,
    with_history: usize,
    max_main: i64,
}

impl Stats {
    fn of(h: &KeyHistory) -> Stats {
        Stats {
            keys: 1,
            live: usize::from(h.is_live()),
            with_history: usize::from(h.has_history()),
            max_main: h.latest().main,
        }
    }

    fn add(&mut self, o: Stats) {
        self.keys += o.keys;
        self.live += o.live;
        self.with_history += o.with_history;
        self.max_main = self.max_main.max(o.max_main);
    }

    /// Replaces the contribution `old` by `new` (`max_main` only grows: an upper bound).
    fn replace(&mut self, old: Stats, new: Stats) {
        self.keys = self.keys - old.keys + new.keys;
        self.live = self.live - old.live + new.live;
        self.with_history = self.with_history - old.with_history + new.with_history;
        self.max_main = self.max_main.max(new.max_main);
    }

    /// Asserts that these cached stats of a `level` ("block" or "chunk") agree with
    /// `recount`, the sum over its parts: the counts exactly, `max_main` as an upper bound.
    #[cfg(test)]
    fn assert_matches(&self, recount: &Stats, level: &str) {
        assert_eq!(
            (self.keys, self.live, self.with_history),
            (recount.keys, recount.live, recount.with_history),
            "stale {level} stats"
        );
        assert!(
            self.max_main >= recount.max_main,
            "{level} max_main below one of its parts"
        );
    }
}

/// A run of consecutive keys with their histories (the leaf level).
#[derive(Debug, Clone, Default)]
pub struct Block {
    keys: Vec<u8>,
    ends: Vec<u32>,
    hist: Vec<KeyHistory>,
    stats: Stats,
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

    /// Appends a key greater than every key in the block.
    fn push(&mut self, key: &[u8], h: KeyHistory) {
        debug_assert!(self.is_empty() || self.key(self.len() - 1) < key);
        self.keys.extend_from_slice(key);
        self.ends.push(arena_offset(self.keys.len()));
        self.stats.add(Stats::of(&h));
        self.hist.push(h);
    }

    fn insert(&mut self, i: usize, key: &[u8], h: KeyHistory) {
        // Grow by ~1/8 instead of doubling: blocks are small and often re-copied, and
        // doubling would leave up to half of every block unused.
        let grow = (self.len() / 8).max(1);
        if self.hist.len() == self.hist.capacity() {
            self.hist.reserve_exact(grow);
            self.ends.reserve_exact(grow);
        }
        if self.keys.capacity() - self.keys.len() < key.len() {
            self.keys.reserve_exact(key.len().max(self.keys.len() / 8));
        }
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        self.keys.splice(start..start, key.iter().copied());
        let shift = arena_offset(key.len());
        for e in &mut self.ends[i..] {
            *e += shift;
        }
        self.ends.insert(i, arena_offset(start + key.len()));
        self.stats.add(Stats::of(&h));
        self.hist.insert(i, h);
    }

    /// Appends `rev` to the history of key `i`, keeping the statistics exact.
    fn push_rev(&mut self, i: usize, rev: RevInfo) {
        let old = Stats::of(&self.hist[i]);
        self.hist[i].push(rev);
        self.stats.replace(old, Stats::of(&self.hist[i]));
    }

    fn too_big(&self) -> bool {
        self.len() > BLOCK_MAX_KEYS || (self.len() >= 2 && self.keys.len() > BLOCK_MAX_KEY_BYTES)
    }

    /// Moves keys `[at..]` into a new block; both halves are sized exactly.
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
        self.keys.shrink_to_fit();
        self.ends.shrink_to_fit();
        self.hist.shrink_to_fit();
        self.stats = self.hist.iter().fold(Stats::default(), |mut s, h| {
            s.add(Stats::of(h));
            s
        });
        right
    }

    /// Live keys among `[lo, hi)` at `rev`.
    fn count(&self, lo: usize, hi: usize, rev: i64) -> usize {
        if lo == 0 && hi == self.len() && self.stats.max_main <= rev {
            return self.stats.live;
        }
        let hist = &self.hist[lo..hi];
        if self.stats.max_main <= rev {
            hist.iter().filter(|h| h.is_live()).count()
        } else {
            hist.iter().filter(|h| h.visible_at(rev).is_some()).count()
        }
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

/// A run of consecutive blocks (the middle level).
#[derive(Debug, Clone, Default)]
pub struct Chunk {
    blocks: Vec<Arc<Block>>,
    /// The first key of each block (lookups search here, not through the blocks).
    firsts: Separators,
    stats: Stats,
}

impl Chunk {
    fn first_key(&self) -> &[u8] {
        self.firsts.get(0)
    }

    /// The block that holds `key` or would receive it.
    fn block_for(&self, key: &[u8]) -> usize {
        self.firsts.child_for(key)
    }

    fn push(&mut self, block: Block) {
        self.stats.add(block.stats);
        self.firsts.push(block.first_key());
        self.blocks.push(Arc::new(block));
    }

    /// Recomputes the statistics and the first keys from the blocks (after a split, a
    /// merge or a compaction changed them).
    fn recompute(&mut self) {
        self.stats = Stats::default();
        for b in &self.blocks {
            self.stats.add(b.stats);
        }
        self.firsts = Separators::of(self.blocks.iter().map(|b| b.first_key()));
    }

    /// Live keys of blocks `[lo, hi)` at `rev`.
    fn count_blocks(&self, lo: usize, hi: usize, rev: i64) -> usize {
        if lo == 0 && hi == self.blocks.len() && self.stats.max_main <= rev {
            return self.stats.live;
        }
        self.blocks[lo..hi]
            .iter()
            .map(|b| b.count(0, b.len(), rev))
            .sum()
    }
}

/// A position in the index: key `idx` of block `block` of chunk `chunk`. The end position is
/// `(chunks.len(), 0, 0)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Pos {
    chunk: usize,
    block: usize,
    idx: usize,
}

/// The ordered key index. See the module docs.
#[derive(Clone, Default)]
pub struct Index {
    chunks: Vec<Arc<Chunk>>,
    /// The first key of each chunk (lookups search here, not through the chunks).
    firsts: Separators,
    keys: usize,
    live: usize,
}

impl std::fmt::Debug for Index {
    /// A summary: an index may hold millions of keys.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Index")
            .field("keys", &self.keys)
            .field("live", &self.live)
            .field("chunks", &self.chunks.len())
            .field("blocks", &self.blocks())
            .finish()
    }
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

    /// Number of leaf blocks.
    pub fn blocks(&self) -> usize {
        self.chunks.iter().map(|c| c.blocks.len()).sum()
    }

    /// Number of chunks.
    pub fn chunks(&self) -> usize {
        self.chunks.len()
    }

    /// Builds an index from `(key, history)` pairs in strictly ascending key order.
    ///
    /// Panics if the keys are not strictly ascending (the rebuild sorts them; anything else
    /// would silently break every lookup).
    pub fn from_sorted<K: AsRef<[u8]>>(
        entries: impl IntoIterator<Item = (K, KeyHistory)>,
    ) -> Index {
        let mut index = Index::new();
        let mut chunk = Chunk::default();
        let mut block = Block::default();
        for (key, h) in entries {
            let key = key.as_ref();
            let prev = if !block.is_empty() {
                Some(block.key(block.len() - 1))
            } else {
                chunk
                    .blocks
                    .last()
                    .or_else(|| index.chunks.last().and_then(|c| c.blocks.last()))
                    .map(|b| b.key(b.len() - 1))
            };
            assert!(
                prev.is_none_or(|p| p < key),
                "mvcc index: keys out of order in build"
            );
            index.keys += 1;
            index.live += usize::from(h.is_live());
            block.push(key, h);
            if block.len() >= BLOCK_TARGET_KEYS || block.keys.len() >= BLOCK_TARGET_KEY_BYTES {
                chunk.push(std::mem::take(&mut block));
                if chunk.blocks.len() >= CHUNK_TARGET_BLOCKS {
                    index.push_chunk(std::mem::take(&mut chunk));
                }
            }
        }
        if !block.is_empty() {
            chunk.push(block);
        }
        if !chunk.blocks.is_empty() {
            index.push_chunk(chunk);
        }
        index
    }

    fn push_chunk(&mut self, chunk: Chunk) {
        self.firsts.push(chunk.first_key());
        self.chunks.push(Arc::new(chunk));
    }

    /// Appends `other`, whose keys all sort after this index's keys.
    ///
    /// Panics if they do not (a misordered index breaks every lookup).
    pub fn append(&mut self, other: Index) {
        if let (Some(a), Some(b)) = (self.chunks.last(), other.chunks.first()) {
            let last = a.blocks.last().expect("non-empty chunk");
            assert!(
                last.key(last.len() - 1) < b.first_key(),
                "mvcc index: append out of order"
            );
        }
        self.keys += other.keys;
        self.live += other.live;
        for c in &other.chunks {
            self.firsts.push(c.first_key());
        }
        self.chunks.extend(other.chunks);
    }

    /// The history of `key`, if the index holds it.
    pub fn get(&self, key: &[u8]) -> Option<&KeyHistory> {
        let c = self.chunk_for(key)?;
        let chunk = &self.chunks[c];
        let block = &chunk.blocks[chunk.block_for(key)];
        block.search(key).ok().map(|i| block.history(i))
    }

    /// The chunk that holds `key` or would receive it.
    fn chunk_for(&self, key: &[u8]) -> Option<usize> {
        if self.chunks.is_empty() {
            return None;
        }
        Some(self.firsts.child_for(key))
    }

    fn end_pos(&self) -> Pos {
        Pos {
            chunk: self.chunks.len(),
            block: 0,
            idx: 0,
        }
    }

    /// The first position of block `block` of chunk `chunk`, normalized past the end of the
    /// chunk.
    fn block_start(&self, chunk: usize, block: usize) -> Pos {
        if chunk < self.chunks.len() && block >= self.chunks[chunk].blocks.len() {
            Pos {
                chunk: chunk + 1,
                block: 0,
                idx: 0,
            }
        } else {
            Pos {
                chunk,
                block,
                idx: 0,
            }
        }
    }

    /// Position of the first key `>= key`.
    fn lower_bound(&self, key: &[u8]) -> Pos {
        let Some(c) = self.chunk_for(key) else {
            return self.end_pos();
        };
        let chunk = &self.chunks[c];
        let b = chunk.block_for(key);
        let i = chunk.blocks[b].lower_bound(key);
        if i == chunk.blocks[b].len() {
            self.block_start(c, b + 1)
        } else {
            Pos {
                chunk: c,
                block: b,
                idx: i,
            }
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

    fn block(&self, p: Pos) -> &Block {
        &self.chunks[p.chunk].blocks[p.block]
    }

    fn at(&self, p: Pos) -> Option<(&[u8], &KeyHistory)> {
        let block = self.chunks.get(p.chunk)?.blocks.get(p.block)?;
        Some((block.key(p.idx), block.history(p.idx)))
    }

    fn next(&self, p: Pos) -> Pos {
        if p.idx + 1 < self.block(p).len() {
            Pos {
                idx: p.idx + 1,
                ..p
            }
        } else {
            self.block_start(p.chunk, p.block + 1)
        }
    }

    fn prev(&self, p: Pos) -> Pos {
        if p.idx > 0 {
            return Pos {
                idx: p.idx - 1,
                ..p
            };
        }
        let (chunk, block) = if p.block > 0 {
            (p.chunk, p.block - 1)
        } else {
            (p.chunk - 1, self.chunks[p.chunk - 1].blocks.len() - 1)
        };
        let idx = self.chunks[chunk].blocks[block].len() - 1;
        Pos { chunk, block, idx }
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
            from: Pos {
                chunk: 0,
                block: 0,
                idx: 0,
            },
            to: self.end_pos(),
        }
    }

    /// Number of keys in `range` that exist at revision `rev`. At (or above) the newest
    /// revision this sums cached counts; at older revisions cached counts still serve every
    /// block and chunk untouched since `rev`, and only the others are walked.
    pub fn count(&self, range: &KeyRange<'_>, rev: i64) -> usize {
        let (from, to) = self.bounds(range);
        if from >= to {
            return 0;
        }
        if (from.chunk, from.block) == (to.chunk, to.block) {
            return self.block(from).count(from.idx, to.idx, rev);
        }
        // First (partial) block, then the rest of its chunk.
        let first = self.block(from);
        let mut n = first.count(from.idx, first.len(), rev);
        let c0 = &self.chunks[from.chunk];
        if from.chunk == to.chunk {
            n += c0.count_blocks(from.block + 1, to.block, rev);
            return n + self.block(to).count(0, to.idx, rev);
        }
        n += c0.count_blocks(from.block + 1, c0.blocks.len(), rev);
        // Whole chunks.
        for c in &self.chunks[from.chunk + 1..to.chunk] {
            n += c.count_blocks(0, c.blocks.len(), rev);
        }
        // Blocks of the last chunk before `to`, then the partial last block.
        if to.chunk < self.chunks.len() {
            let cl = &self.chunks[to.chunk];
            n += cl.count_blocks(0, to.block, rev);
            n += self.block(to).count(0, to.idx, rev);
        }
        n
    }

    /// Appends revision `rev` to `key`, adding the key if the index does not hold it.
    pub fn push(&mut self, key: &[u8], rev: RevInfo) {
        self.push_with(key, |_| rev);
    }

    /// Appends the revision `make` builds from `key`'s newest revision (`None`: the index
    /// does not hold the key) and returns it: a put's create revision and version come from
    /// the key's previous revision, and this finds the key once for both (a lookup followed
    /// by [`Index::push`] descended the index twice per put).
    pub fn push_with(
        &mut self,
        key: &[u8],
        make: impl FnOnce(Option<&RevInfo>) -> RevInfo,
    ) -> RevInfo {
        let Some(c) = self.chunk_for(key) else {
            let rev = make(None);
            let mut block = Block::default();
            block.push(key, KeyHistory::new(rev));
            let mut chunk = Chunk::default();
            chunk.push(block);
            self.keys += 1;
            self.live += usize::from(!rev.tombstone);
            self.push_chunk(chunk);
            return rev;
        };
        let chunk = Arc::make_mut(&mut self.chunks[c]);
        let b = chunk.block_for(key);
        let block = Arc::make_mut(&mut chunk.blocks[b]);
        let before = block.stats;
        let rev = match block.search(key) {
            Ok(i) => {
                let rev = make(Some(block.history(i).latest()));
                block.push_rev(i, rev);
                rev
            }
            Err(i) => {
                let rev = make(None);
                block.insert(i, key, KeyHistory::new(rev));
                if i == 0 {
                    // A new first key (only of the first block of the first chunk: any other
                    // block's first key is <= every key routed to it).
                    chunk.firsts.replace(b, key);
                    if b == 0 {
                        self.firsts.replace(c, key);
                    }
                }
                rev
            }
        };
        let after = block.stats;
        chunk.stats.replace(before, after);
        self.keys = self.keys + after.keys - before.keys;
        self.live = self.live + after.live - before.live;
        if block.too_big() {
            let right = block.split_off(block.len() / 2);
            chunk.firsts.insert(b + 1, right.first_key());
            chunk.blocks.insert(b + 1, Arc::new(right));
            if chunk.blocks.len() > CHUNK_MAX_BLOCKS {
                let mut right = Chunk {
                    blocks: chunk.blocks.split_off(chunk.blocks.len() / 2),
                    ..Chunk::default()
                };
                chunk.recompute();
                right.recompute();
                self.firsts.insert(c + 1, right.first_key());
                self.chunks.insert(c + 1, Arc::new(right));
            }
        }
        rev
    }

    /// Compacts every key at `at_rev` (see [`KeyHistory::compact`]), appending the removed
    /// revisions to `removed`. Chunks and blocks without removable history stay shared (not
    /// copied); emptied blocks and chunks are dropped and small ones merged.
    pub fn compact(&mut self, at_rev: i64, removed: &mut Vec<RevInfo>) {
        let mut changed = false;
        for slot in &mut self.chunks {
            if slot.stats.with_history == 0 {
                continue;
            }
            let dirty: Vec<usize> = (0..slot.blocks.len())
                .filter(|&b| {
                    let block = &slot.blocks[b];
                    block.stats.with_history > 0 && block.hist.iter().any(|h| h.compacts_at(at_rev))
                })
                .collect();
            if dirty.is_empty() {
                continue;
            }
            changed = true;
            let chunk = Arc::make_mut(slot);
            for b in dirty {
                let old = &chunk.blocks[b];
                let mut fresh = Block::default();
                for i in 0..old.len() {
                    if let Some(kept) = old.history(i).compact(at_rev, removed) {
                        fresh.push(old.key(i), kept);
                    }
                }
                self.keys = self.keys - old.stats.keys + fresh.stats.keys;
                self.live = self.live - old.stats.live + fresh.stats.live;
                chunk.blocks[b] = Arc::new(fresh);
            }
            chunk.blocks.retain(|b| !b.is_empty());
            merge_small_blocks(&mut chunk.blocks);
            chunk.recompute();
        }
        if changed {
            self.chunks.retain(|c| !c.blocks.is_empty());
            self.merge_small_chunks();
            self.firsts = Separators::of(self.chunks.iter().map(|c| c.first_key()));
        }
    }

    fn merge_small_chunks(&mut self) {
        let mut i = 0;
        while i + 1 < self.chunks.len() {
            let (a, b) = (self.chunks[i].blocks.len(), self.chunks[i + 1].blocks.len());
            if (a < CHUNK_MIN_BLOCKS || b < CHUNK_MIN_BLOCKS) && a + b <= CHUNK_TARGET_BLOCKS {
                let right = self.chunks.remove(i + 1);
                let left = Arc::make_mut(&mut self.chunks[i]);
                left.blocks.extend(right.blocks.iter().cloned());
                merge_small_blocks(&mut left.blocks);
                left.recompute();
            } else {
                i += 1;
            }
        }
    }

    /// Approximate heap bytes of the index (chunks, blocks, key arenas, histories), for the
    /// bytes-per-key figure in docs/mvcc.md.
    pub fn heap_bytes(&self) -> usize {
        let arc_header = 2 * std::mem::size_of::<usize>();
        self.chunks.capacity() * std::mem::size_of::<Arc<Chunk>>()
            + self
                .chunks
                .iter()
                .map(|c| {
                    arc_header
                        + std::mem::size_of::<Chunk>()
                        + c.blocks.capacity() * std::mem::size_of::<Arc<Block>>()
                        + c.blocks
                            .iter()
                            .map(|b| arc_header + std::mem::size_of::<Block>() + b.heap_bytes())
                            .sum::<usize>()
                })
                .sum::<usize>()
    }

    /// Checks every structural invariant; used by tests.
    #[cfg(test)]
    pub fn check_invariants(&self) {
        let mut total = Stats::default();
        let mut prev: Option<Vec<u8>> = None;
        assert_eq!(self.firsts.len(), self.chunks.len(), "chunk separators");
        for (i, c) in self.chunks.iter().enumerate() {
            assert!(!c.blocks.is_empty(), "empty chunk");
            assert_eq!(
                self.firsts.get(i),
                c.blocks[0].first_key(),
                "chunk separator"
            );
            assert_eq!(c.firsts.len(), c.blocks.len(), "block separators");
            for (j, b) in c.blocks.iter().enumerate() {
                assert_eq!(c.firsts.get(j), b.first_key(), "block separator");
            }
            let mut cs = Stats::default();
            for b in &c.blocks {
                assert!(!b.is_empty(), "empty block");
                let mut bs = Stats::default();
                for i in 0..b.len() {
                    let k = b.key(i).to_vec();
                    if let Some(p) = &prev {
                        assert!(p < &k, "keys out of order");
                    }
                    prev = Some(k);
                    bs.add(Stats::of(b.history(i)));
                }
                b.stats.assert_matches(&bs, "block");
                cs.add(b.stats);
            }
            c.stats.assert_matches(&cs, "chunk");
            total.add(c.stats);
        }
        assert_eq!(
            (self.keys, self.live),
            (total.keys, total.live),
            "stale index totals"
        );
    }
}

/// Merges each block under [`BLOCK_MIN_KEYS`] into its right neighbour when the result stays
/// within the block targets.
fn merge_small_blocks(blocks: &mut Vec<Arc<Block>>) {
    let mut i = 0;
    while i + 1 < blocks.len() {
        let (a, b) = (&blocks[i], &blocks[i + 1]);
        let small = a.len() < BLOCK_MIN_KEYS || b.len() < BLOCK_MIN_KEYS;
        let fits = a.len() + b.len() <= BLOCK_TARGET_KEYS
            && a.keys.len() + b.keys.len() <= BLOCK_TARGET_KEY_BYTES;
        if small && fits {
            let right = blocks.remove(i + 1);
            let left = Arc::make_mut(&mut blocks[i]);
            for j in 0..right.len() {
                left.push(right.key(j), right.history(j).clone());
            }
        } else {
            i += 1;
        }
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
        self.to = self.index.prev(self.to);
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
        assert!(index.blocks() > 5000 / BLOCK_MAX_KEYS);
        let all: Vec<Vec<u8>> = index.iter_all().map(|(k, _)| k.to_vec()).collect();
        assert_eq!(all, (0..5000).map(key).collect::<Vec<_>>());
        let n = (0..5000).find(|n| (n * 7919) % 5000 == 4321).unwrap();
        assert_eq!(index.get(&key(4321)).unwrap().latest().main, 2 + n as i64);
        assert!(index.get(b"nope").is_none());
    }

    #[test]
    fn push_with_sees_the_keys_newest_revision_and_stores_what_it_builds() {
        let mut index = big();
        let mut seen = Vec::new();
        // A key the index holds, a key it does not (in the middle, so it lands in a block
        // that exists), and a key before every other one (a new first key).
        for (k, main) in [
            (key(4321), 9000),
            (b"key004321x".to_vec(), 9001),
            (b"a".to_vec(), 9002),
        ] {
            let built = index.push_with(&k, |latest| {
                seen.push(latest.map(|l| (l.main, l.version)));
                let version = latest.map_or(1, |l| l.version + 1);
                RevInfo::put(Revision::new(main, 0), main, version, 0)
            });
            assert_eq!(index.get(&k).unwrap().latest(), &built);
        }
        let n = (0..5000).find(|n| (n * 7919) % 5000 == 4321).unwrap();
        assert_eq!(seen, vec![Some((2 + n as i64, 1)), None, None]);
        assert_eq!(index.get(&key(4321)).unwrap().latest().version, 2);
        assert_eq!((index.keys(), index.live()), (5002, 5002));
        index.check_invariants();
        // An empty index: the first key is built from nothing.
        let mut empty = Index::new();
        let built = empty.push_with(b"k", |latest| {
            assert!(latest.is_none());
            put(5)
        });
        assert_eq!(built, put(5));
        assert_eq!(empty.get(b"k").unwrap().latest(), &put(5));
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

    /// How many positions of `a` and `b` hold the same allocation (not a copy).
    fn shared_arcs<T>(a: &[Arc<T>], b: &[Arc<T>]) -> usize {
        a.iter().zip(b).filter(|(x, y)| Arc::ptr_eq(x, y)).count()
    }

    #[test]
    fn clones_share_blocks_until_written() {
        let base = big();
        let mut work = base.clone();
        work.push(&key(0), put(99_999));
        assert_eq!(
            shared_arcs(&base.chunks, &work.chunks),
            base.chunks() - 1,
            "only the written chunk is copied"
        );
        let (bc, wc) = (&base.chunks[0], &work.chunks[0]);
        assert_eq!(
            shared_arcs(&bc.blocks, &wc.blocks),
            bc.blocks.len() - 1,
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
        assert!(index.blocks() <= 500usize.div_ceil(BLOCK_MIN_KEYS));
        // The clone taken before still sees everything.
        assert_eq!(untouched.keys(), 5000);
        // A second compaction finds nothing to do and copies nothing.
        let again = index.clone();
        let mut removed = Vec::new();
        index.compact(rev, &mut removed);
        assert!(removed.is_empty());
        assert!(
            index
                .chunks
                .iter()
                .zip(&again.chunks)
                .all(|(a, b)| Arc::ptr_eq(a, b))
        );
    }

    #[test]
    fn from_sorted_builds_target_sized_blocks_and_chunks() {
        let index = Index::from_sorted((0..20_000).map(|i| (key(i), KeyHistory::new(put(2)))));
        index.check_invariants();
        assert_eq!(index.blocks(), 20_000usize.div_ceil(BLOCK_TARGET_KEYS));
        assert_eq!(index.chunks(), index.blocks().div_ceil(CHUNK_TARGET_BLOCKS));
        assert_eq!(index.count(&KeyRange::from_request(b"k", b"\0"), 2), 20_000);
        let per_key = index.heap_bytes() as f64 / 20_000.0;
        assert!(
            per_key > (9 + 4 + std::mem::size_of::<KeyHistory>()) as f64,
            "{per_key}"
        );
        assert!(per_key < 75.0, "{per_key} bytes/key");
    }

    #[test]
    fn random_inserts_split_chunks_and_counts_stay_exact() {
        let mut index = Index::new();
        let n = 100_000usize;
        for j in 0..n {
            let i = (j * 7919) % n;
            let r = if j % 5 == 0 {
                tomb(2 + j as i64)
            } else {
                put(2 + j as i64)
            };
            index.push(&key(i), r);
        }
        index.check_invariants();
        assert!(index.chunks() >= 3, "{} chunks", index.chunks());
        for (lo, hi, at) in [
            (0, n, i64::MAX),
            (1, 99_999, 50_000),
            (5_000, 83_333, 30_001),
            (17, 18, 9),
        ] {
            let (a, b) = (key(lo), key(hi));
            let r = KeyRange::Span {
                start: &a,
                end: Some(&b),
            };
            let walked = index
                .iter(&r)
                .filter(|(_, h)| h.visible_at(at).is_some())
                .count();
            assert_eq!(index.count(&r, at), walked, "{lo}..{hi} at {at}");
            let back = index.iter(&r).rev().count();
            assert_eq!(back, hi - lo);
        }
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
                4 => (0usize..30_000, 1usize..6000, 1usize..9).prop_map(|(start, n, stride)| Step::Puts { start, n, stride }),
                2 => (0usize..30_000, 1usize..8000).prop_map(|(lo, len)| Step::Deletes { lo, len }),
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
            fn index_matches_btreemap(steps in proptest::collection::vec(step(), 1..14), probes in proptest::collection::vec((0usize..30_100, 0usize..30_100, any::<u16>()), 12)) {
                let mut index = Index::new();
                let mut model: BTreeMap<Vec<u8>, Vec<RevInfo>> = BTreeMap::new();
                let (mut rev, mut compacted) = (1i64, 0i64);
                for s in steps {
                    rev += 1;
                    let mut sub = 0;
                    match s {
                        Step::Puts { start, n, stride } => {
                            for i in (0..n).map(|j| (start + j * stride) % 30_000) {
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
                            for i in lo..(lo + len).min(30_000) {
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
