//! The in-memory view of the log: where each entry lives on disk, the purge point, and the
//! metadata values. Recovery rebuilds it by replaying records; the writer updates it after each
//! successful write, through the same methods, so replay and live writes cannot disagree.
//!
//! Invariants:
//! - entries are contiguous: `locs[i]` holds log index `first + i`;
//! - every entry index is above the purged index;
//! - a `Loc` points at a frame that was written (and CRC-checked on every read).

use std::collections::{BTreeMap, VecDeque};

use super::error::WalError;

/// Where one entry's frame lives: segment sequence number, frame offset, entry data length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Loc {
    pub seq: u64,
    pub offset: u64,
    pub data_len: u32,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct LogIndex {
    first: u64,
    locs: VecDeque<Loc>,
    purged: Option<u64>,
    meta: BTreeMap<u8, Vec<u8>>,
}

impl LogIndex {
    pub(crate) fn first_index(&self) -> Option<u64> {
        (!self.locs.is_empty()).then_some(self.first)
    }

    pub(crate) fn last_index(&self) -> Option<u64> {
        (!self.locs.is_empty()).then(|| self.first + self.locs.len() as u64 - 1)
    }

    pub(crate) fn purged(&self) -> Option<u64> {
        self.purged
    }

    pub(crate) fn meta(&self, key: u8) -> Option<&[u8]> {
        self.meta.get(&key).map(Vec::as_slice)
    }

    /// All metadata values, by key.
    pub(crate) fn metas(&self) -> impl Iterator<Item = (u8, &[u8])> {
        self.meta.iter().map(|(k, v)| (*k, v.as_slice()))
    }

    pub(crate) fn get(&self, index: u64) -> Option<Loc> {
        let offset = index.checked_sub(self.first)?;
        self.locs.get(usize::try_from(offset).ok()?).copied()
    }

    /// Entries in `[start, end)` that exist, in order.
    pub(crate) fn range(&self, start: u64, end: u64) -> impl Iterator<Item = (u64, Loc)> + '_ {
        let lo = start.max(self.first);
        let hi = end.min(self.first + self.locs.len() as u64);
        (lo..hi.max(lo)).map(move |i| (i, self.locs[(i - self.first) as usize]))
    }

    /// The index the next appended entry would get if the log continued; used to name segments.
    pub(crate) fn next_index(&self) -> u64 {
        match (self.last_index(), self.purged) {
            (Some(last), _) => last + 1,
            (None, Some(purged)) => purged + 1,
            (None, None) => 0,
        }
    }

    /// Checks that an append may start at `index`.
    pub(crate) fn check_append(&self, index: u64) -> Result<(), WalError> {
        match (self.last_index(), self.purged) {
            (Some(last), _) if index != last + 1 => Err(WalError::NotContiguous {
                expected: last + 1,
                got: index,
            }),
            (None, Some(purged)) if index <= purged => Err(WalError::BelowPurged { index, purged }),
            _ => Ok(()),
        }
    }

    /// Adds one entry; `check_append(index)` must have passed (live writes), or the entry was
    /// written after the records replayed so far (recovery).
    ///
    /// Panics if the entry would break the module's invariants: an index map with a hole or
    /// an entry at or below the purge point would serve the wrong bytes for a log index.
    pub(crate) fn push(&mut self, index: u64, loc: Loc) {
        if let Some(purged) = self.purged {
            assert!(
                index > purged,
                "log entry {index} at or below the purge point {purged}"
            );
        }
        if self.locs.is_empty() {
            self.first = index;
        }
        assert_eq!(
            index,
            self.first + self.locs.len() as u64,
            "log index must stay contiguous"
        );
        self.locs.push_back(loc);
    }

    /// Drops entries with index >= `index`.
    pub(crate) fn truncate_from(&mut self, index: u64) {
        let keep = index.saturating_sub(self.first).min(self.locs.len() as u64);
        self.locs.truncate(keep as usize);
    }

    /// Drops entries with index <= `index` and remembers `index` as purged (never lowers it).
    pub(crate) fn purge_to(&mut self, index: u64) {
        if self.purged.is_some_and(|p| p >= index) {
            return;
        }
        self.purged = Some(index);
        let drop = index
            .saturating_add(1)
            .saturating_sub(self.first)
            .min(self.locs.len() as u64);
        self.locs.drain(..drop as usize);
        self.first += drop;
    }

    pub(crate) fn set_meta(&mut self, key: u8, value: &[u8]) {
        self.meta.insert(key, value.to_vec());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(offset: u64) -> Loc {
        Loc {
            seq: 1,
            offset,
            data_len: 1,
        }
    }

    #[test]
    fn entries_continue_above_the_purge_point() {
        let mut index = LogIndex::default();
        index.purge_to(4);
        index.push(5, loc(0));
        index.push(6, loc(10));
        assert_eq!(
            (index.first_index(), index.last_index()),
            (Some(5), Some(6))
        );
    }

    #[test]
    #[should_panic(expected = "at or below the purge point")]
    fn an_entry_at_the_purge_point_panics() {
        let mut index = LogIndex::default();
        index.purge_to(4);
        index.push(4, loc(0));
    }

    #[test]
    #[should_panic(expected = "contiguous")]
    fn a_hole_in_the_log_panics() {
        let mut index = LogIndex::default();
        index.push(1, loc(0));
        index.push(3, loc(10));
    }
}
