//! The first key of each child of one key-index level, kept in the parent in one arena.
//!
//! Finding the child that holds a key is a binary search over the children's first keys. Read
//! through the children themselves, every probe chases two or three pointers (the child's
//! `Arc`, its first block, that block's key arena), a cache miss each once the index outgrows
//! the CPU caches: about 10 µs of misses per lookup at 1M keys (`benches/benches/index.rs`).
//! Here the probes read two contiguous vectors.
//!
//! # Invariants
//! - entry `i` equals the first key of the parent's child `i`, and there is one entry per
//!   child (the parent keeps them in step; `Index::check_invariants` checks it in tests);
//! - entries ascend strictly, as the children's keys do.

/// First keys of consecutive children: `bytes[ends[i-1]..ends[i]]` is entry `i`.
#[derive(Debug, Clone, Default)]
pub(super) struct Separators {
    bytes: Vec<u8>,
    ends: Vec<u32>,
}

impl Separators {
    /// The separators of children whose first keys are `firsts`, in order.
    pub(super) fn of<'a>(firsts: impl IntoIterator<Item = &'a [u8]>) -> Separators {
        let mut s = Separators::default();
        for key in firsts {
            s.push(key);
        }
        s
    }

    /// Number of entries.
    pub(super) fn len(&self) -> usize {
        self.ends.len()
    }

    /// Entry `i`.
    pub(super) fn get(&self, i: usize) -> &[u8] {
        &self.bytes[self.start(i)..self.ends[i] as usize]
    }

    /// The child that holds `key` or would receive it: the last whose first key is `<= key`,
    /// or child 0 when `key` sorts before every child. `0` when there are no entries.
    pub(super) fn child_for(&self, key: &[u8]) -> usize {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.get(mid) <= key {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo.saturating_sub(1)
    }

    /// Appends an entry for a new last child.
    pub(super) fn push(&mut self, key: &[u8]) {
        self.bytes.extend_from_slice(key);
        self.ends.push(offset(self.bytes.len()));
    }

    /// Inserts an entry for a child inserted at `i`.
    pub(super) fn insert(&mut self, i: usize, key: &[u8]) {
        let start = self.start(i);
        self.bytes.splice(start..start, key.iter().copied());
        let shift = offset(key.len());
        for e in &mut self.ends[i..] {
            *e += shift;
        }
        self.ends.insert(i, offset(start + key.len()));
    }

    /// Replaces entry `i` (child `i` got a new first key).
    pub(super) fn replace(&mut self, i: usize, key: &[u8]) {
        let (start, end) = (self.start(i), self.ends[i] as usize);
        self.bytes.splice(start..end, key.iter().copied());
        let (old, new) = (end - start, key.len());
        for e in &mut self.ends[i..] {
            *e = offset(*e as usize + new - old);
        }
    }

    fn start(&self, i: usize) -> usize {
        if i == 0 { 0 } else { self.ends[i - 1] as usize }
    }
}

/// Arena offsets are u32, as in the blocks: keys are bounded by the request size limit and a
/// level holds at most a few thousand entries.
fn offset(n: usize) -> u32 {
    u32::try_from(n).expect("mvcc index: separator arena exceeds 4 GiB")
}

#[cfg(test)]
mod tests {
    use super::Separators;

    #[test]
    fn child_for_is_the_last_child_starting_at_or_before_the_key() {
        let s = Separators::of([&b"b"[..], b"d", b"f"]);
        let found: Vec<usize> = [&b"a"[..], b"b", b"c", b"d", b"e", b"f", b"g"]
            .iter()
            .map(|k| s.child_for(k))
            .collect();
        assert_eq!(found, [0, 0, 0, 1, 1, 2, 2]);
        assert_eq!(Separators::default().child_for(b"x"), 0);
    }

    #[test]
    fn insert_and_replace_keep_every_other_entry() {
        let mut s = Separators::of([&b"bb"[..], b"dd"]);
        s.insert(1, b"c");
        s.insert(3, b"eeee");
        s.insert(0, b"a");
        s.replace(2, b"ccccc");
        s.replace(0, b"");
        let all: Vec<&[u8]> = (0..s.len()).map(|i| s.get(i)).collect();
        assert_eq!(all, [&b""[..], b"bb", b"ccccc", b"dd", b"eeee"]);
        assert_eq!(s.child_for(b"cz"), 2);
    }
}
