//! The newest entries of the raft log, kept in memory (issue 20 part 4).
//!
//! A leader reads every entry back right after appending it: once per follower for
//! AppendEntries, and once more to apply it. From the WAL that costs a pread, a CRC check and
//! a bincode decode each time. The log store keeps the entries of its latest appends here and
//! serves such reads with a clone instead; anything older goes to the WAL as before.
//!
//! Invariants:
//! - the tail holds a contiguous run of entries, `first..first + len`, equal to the WAL's
//!   entries at those indexes: the log store mirrors every append, truncation and purge here
//!   (a truncation before the WAL's, so no reader sees a truncated entry here afterwards);
//! - it holds at most [`MAX_ENTRIES`] entries and [`MAX_BYTES`] encoded bytes, dropping the
//!   oldest first;
//! - a read is served only when the whole range is in the tail.

use std::collections::VecDeque;
use std::sync::Mutex;

use super::types::Entry;

/// Most entries kept.
pub const MAX_ENTRIES: usize = 8192;
/// Most encoded entry bytes kept (the WAL's bincode size), so a run of large requests cannot
/// hold much memory. Each entry holds its protobuf bytes and its decoded message, of about the
/// same size (`types::Request`, "encode once"), so the tail holds about twice this: 32 MiB.
pub const MAX_BYTES: usize = 16 << 20;

/// The in-memory tail of the raft log. See the module docs.
#[derive(Default)]
pub struct LogTail {
    inner: Mutex<Tail>,
}

#[derive(Default)]
struct Tail {
    /// Index of `entries[0]`.
    first: u64,
    /// Entries with their encoded size in bytes.
    entries: VecDeque<(Entry, usize)>,
    bytes: usize,
}

impl Tail {
    fn next(&self) -> u64 {
        self.first + self.entries.len() as u64
    }

    fn pop_front(&mut self) {
        if let Some((_, n)) = self.entries.pop_front() {
            self.bytes -= n;
            self.first += 1;
        }
    }
}

impl LogTail {
    /// Records entries just written to the WAL: consecutive indexes, each with its encoded
    /// size. Entries that do not continue the tail replace it.
    pub fn appended(&self, entries: Vec<(Entry, usize)>) {
        let Some((head, _)) = entries.first() else {
            return;
        };
        let start = head.log_id.index;
        let mut t = self.inner.lock().expect("log tail lock");
        if t.entries.is_empty() || start != t.next() {
            t.entries.clear();
            t.bytes = 0;
            t.first = start;
        }
        for (entry, n) in entries {
            assert_eq!(
                entry.log_id.index,
                t.next(),
                "log tail: entries must be consecutive"
            );
            t.bytes += n;
            t.entries.push_back((entry, n));
        }
        while t.entries.len() > MAX_ENTRIES || (t.bytes > MAX_BYTES && t.entries.len() > 1) {
            t.pop_front();
        }
    }

    /// Drops entries with index `>= from` (a raft log truncation).
    pub fn truncated(&self, from: u64) {
        let mut t = self.inner.lock().expect("log tail lock");
        while t.next() > from {
            let Some((_, n)) = t.entries.pop_back() else {
                break;
            };
            t.bytes -= n;
        }
    }

    /// Drops entries with index `<= upto` (a raft log purge).
    pub fn purged(&self, upto: u64) {
        let mut t = self.inner.lock().expect("log tail lock");
        while !t.entries.is_empty() && t.first <= upto {
            t.pop_front();
        }
        if t.entries.is_empty() {
            t.first = upto.saturating_add(1);
        }
    }

    /// Clones of entries `[start, end)` if the tail holds all of them, else `None`.
    #[cfg(test)]
    pub fn get(&self, start: u64, end: u64) -> Option<Vec<Entry>> {
        self.get_limited(start, end, usize::MAX)
    }

    /// Clones of entries `[start, end)` if the tail holds all of them, else `None`; stops
    /// before the entry that would take the entries' encoded size past `max_bytes` (the first
    /// entry is always returned, however large).
    pub fn get_limited(&self, start: u64, end: u64, max_bytes: usize) -> Option<Vec<Entry>> {
        let t = self.inner.lock().expect("log tail lock");
        if start < t.first || end > t.next() || start >= end {
            return None;
        }
        let from = (start - t.first) as usize;
        let to = (end - t.first) as usize;
        let mut bytes = 0usize;
        let mut out = Vec::new();
        for (e, n) in t.entries.range(from..to) {
            bytes = bytes.saturating_add(*n);
            if !out.is_empty() && bytes > max_bytes {
                break;
            }
            out.push(e.clone());
        }
        Some(out)
    }

    /// Number of entries held.
    pub fn len(&self) -> usize {
        self.inner.lock().expect("log tail lock").entries.len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, EntryPayload};

    use super::*;

    fn entry(index: u64) -> (Entry, usize) {
        let e = Entry {
            log_id: openraft::LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Blank,
        };
        (e, 100)
    }

    fn indexes(v: Option<Vec<Entry>>) -> Option<Vec<u64>> {
        v.map(|v| v.iter().map(|e| e.log_id.index).collect())
    }

    #[test]
    fn serves_only_ranges_it_holds_whole() {
        let t = LogTail::default();
        t.appended((5..10).map(entry).collect());
        assert_eq!(indexes(t.get(5, 10)), Some(vec![5, 6, 7, 8, 9]));
        assert_eq!(indexes(t.get(7, 9)), Some(vec![7, 8]));
        assert_eq!(t.get(4, 8), None, "starts before the tail");
        assert_eq!(t.get(8, 11), None, "ends after the tail");
        assert_eq!(t.get(8, 8), None, "empty range");
    }

    #[test]
    fn a_limited_read_stops_at_the_byte_budget_but_returns_at_least_one_entry() {
        let t = LogTail::default();
        t.appended((1..6).map(entry).collect()); // 100 bytes each
        assert_eq!(indexes(t.get_limited(1, 6, 250)), Some(vec![1, 2]));
        assert_eq!(indexes(t.get_limited(2, 6, 300)), Some(vec![2, 3, 4]));
        assert_eq!(
            indexes(t.get_limited(3, 6, 10)),
            Some(vec![3]),
            "one entry past the budget"
        );
        assert_eq!(
            indexes(t.get_limited(1, 6, usize::MAX)),
            Some(vec![1, 2, 3, 4, 5])
        );
        assert_eq!(t.get_limited(0, 3, 1000), None, "starts before the tail");
    }

    #[test]
    fn a_gap_or_an_overlap_restarts_the_tail() {
        let t = LogTail::default();
        t.appended((1..4).map(entry).collect());
        t.appended((10..12).map(entry).collect());
        assert_eq!(t.get(1, 4), None);
        assert_eq!(indexes(t.get(10, 12)), Some(vec![10, 11]));
        t.appended((11..13).map(entry).collect());
        assert_eq!(indexes(t.get(11, 13)), Some(vec![11, 12]));
        assert_eq!(t.get(10, 11), None);
    }

    #[test]
    fn truncation_and_purge_drop_entries() {
        let t = LogTail::default();
        t.appended((1..11).map(entry).collect());
        t.truncated(8);
        assert_eq!(t.get(7, 9), None);
        assert_eq!(indexes(t.get(6, 8)), Some(vec![6, 7]));
        t.appended((8..10).map(entry).collect());
        assert_eq!(indexes(t.get(7, 10)), Some(vec![7, 8, 9]));
        t.purged(5);
        assert_eq!(t.get(5, 7), None);
        assert_eq!(indexes(t.get(6, 7)), Some(vec![6]));
        t.truncated(0);
        assert!(t.is_empty());
        t.purged(100);
        assert!(t.is_empty());
        t.appended((101..103).map(entry).collect());
        assert_eq!(indexes(t.get(101, 103)), Some(vec![101, 102]));
    }

    #[test]
    fn bounded_by_entries_and_bytes() {
        let t = LogTail::default();
        t.appended((0..(MAX_ENTRIES as u64 + 10)).map(entry).collect());
        assert_eq!(t.len(), MAX_ENTRIES);
        assert_eq!(t.get(9, 11), None, "the oldest were dropped");
        assert!(t.get(10, 12).is_some());

        let big = LogTail::default();
        let huge = |i| (entry(i).0, MAX_BYTES / 2);
        big.appended((0..5).map(huge).collect());
        assert_eq!(big.len(), 2, "at most MAX_BYTES of entries");
        // A single entry larger than the bound is still held (it is the newest).
        let one = LogTail::default();
        one.appended(vec![(entry(1).0, MAX_BYTES * 2)]);
        assert_eq!(one.len(), 1);
    }
}
