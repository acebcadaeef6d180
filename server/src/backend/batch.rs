//! [`Batch`]: the writes one apply group makes to the member tree, staged by every component
//! (mvcc records and meta, the consistent index, leases, member attributes, the raft
//! membership; next auth and alarms) and committed as ONE atomic sled batch.
//!
//! Why one batch per group, not per request: sled's `apply_batch` rolls its I/O buffer before
//! and after the batch, and each roll writes the buffer with `sync_file_range(WAIT_AFTER)`
//! (sled 0.34 `pin_log`, `write_to_log`). One sled batch per request therefore cost two
//! synchronous disk writes per put and capped a member at about 1,200 puts/s
//! (docs/benchmarks.md, "Finding 1: sled syncs its log twice per `apply_batch`"). Durability
//! does not need any of it: the raft WAL holds every entry and the consistent index,
//! committed in the same batch, tells a restarted member where to resume, so a group is
//! exactly as safe as one request.

use sled::IVec;

use super::BackendError;

/// Staged writes to the member tree, in order, with `sled::Batch`'s `insert`/`remove` shape.
///
/// Unlike a `sled::Batch` it can be appended to another one (a request's writes join its
/// apply group's), it can tell whether it is empty, and dropping it discards everything.
/// A later write of a key wins over an earlier one, as in sled.
#[derive(Debug, Default)]
pub struct Batch {
    ops: Vec<(IVec, Option<IVec>)>,
}

impl Batch {
    /// Stages `key = value`.
    pub fn insert<K: Into<IVec>, V: Into<IVec>>(&mut self, key: K, value: V) {
        self.ops.push((key.into(), Some(value.into())));
    }

    /// Stages the removal of `key`.
    pub fn remove<K: Into<IVec>>(&mut self, key: K) {
        self.ops.push((key.into(), None));
    }

    /// An empty batch with room for `writes` staged writes without growing.
    pub fn with_capacity(writes: usize) -> Batch {
        Batch {
            ops: Vec::with_capacity(writes),
        }
    }

    /// Appends every write of `later` after this batch's own.
    pub fn append(&mut self, mut later: Batch) {
        // Taking `later`'s vector saves a copy, unless this one already has room for it
        // (a pending batch made `with_capacity`).
        if self.ops.is_empty() && self.ops.capacity() < later.ops.len() {
            self.ops = later.ops;
        } else {
            self.ops.append(&mut later.ops);
        }
    }

    /// True when nothing is staged.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Number of staged writes (a key written twice counts twice).
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// The inserts staged, `(key, value)` in order (removals left out).
    pub fn inserts(&self) -> impl Iterator<Item = (&IVec, &IVec)> {
        self.ops
            .iter()
            .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
    }

    /// Bytes of the keys and values this batch inserts (removals count 0): an upper bound
    /// on how much it grows the tree, for [`super::LiveTree::in_use`].
    pub fn inserted_bytes(&self) -> u64 {
        self.ops
            .iter()
            .filter_map(|(k, v)| v.as_ref().map(|v| (k.len() + v.len()) as u64))
            .sum()
    }

    /// Writes everything staged to `tree` as one sled batch (no fsync: durability comes from
    /// the raft WAL and the consistent index), atomic across a crash. A no-op when nothing
    /// is staged.
    ///
    /// Errors: sled I/O; then the tree may hold any part of the batch, in memory and after
    /// a restart (sled cancels the batch's manifest, `damage.rs`), and the caller must not
    /// trust it: apply marks it damaged and stops.
    pub fn commit(self, tree: &sled::Tree) -> Result<(), BackendError> {
        if self.ops.is_empty() {
            return Ok(());
        }
        // sled failing part way (a full disk while it writes a blob): sled applies a batch
        // in key order, so the first half of its keys (the newest consistent index among
        // them, `c/` sorts before the `k` records) reaches the tree and the disk, then the
        // error.
        if let Some(e) = crate::failpoint::io_error("backend_commit_partial", libc::ENOSPC) {
            let sorted: std::collections::BTreeMap<_, _> = self.ops.into_iter().collect();
            let half = sorted.len().div_ceil(2);
            tree.apply_batch(sled_batch(sorted.into_iter().take(half)))?;
            // As sled's I/O buffers would, sooner or later (the member may stop first).
            tree.flush()?;
            return Err(BackendError::Storage(sled::Error::Io(e)));
        }
        tree.apply_batch(sled_batch(self.ops))?;
        Ok(())
    }
}

/// `ops` as a sled batch (a later write of a key wins, as in sled).
fn sled_batch(ops: impl IntoIterator<Item = (IVec, Option<IVec>)>) -> sled::Batch {
    let mut batch = sled::Batch::default();
    for (key, value) in ops {
        match value {
            Some(v) => batch.insert(key, v),
            None => batch.remove(key),
        }
    }
    batch
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_lands_whole_in_order_and_later_writes_win() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let tree = db.open_tree("t").unwrap();
        tree.insert(b"gone", b"x").unwrap();
        let mut first = Batch::default();
        first.insert(b"a".as_slice(), b"1".as_slice());
        first.remove(b"gone".as_slice());
        let mut second = Batch::default();
        second.insert(b"a".as_slice(), b"2".as_slice());
        second.insert(b"b".as_slice(), b"3".as_slice());
        first.append(second);
        assert_eq!(first.len(), 4);
        // a=1, b"a"=2, b=3: three inserts of 2 bytes each; the removal adds nothing.
        assert_eq!(first.inserted_bytes(), 6);
        assert!(
            tree.get(b"a").unwrap().is_none(),
            "nothing lands before commit"
        );
        first.commit(&tree).unwrap();
        assert_eq!(tree.get(b"a").unwrap().unwrap(), b"2");
        assert_eq!(tree.get(b"b").unwrap().unwrap(), b"3");
        assert!(tree.get(b"gone").unwrap().is_none());
    }

    #[test]
    fn an_empty_batch_commits_nothing() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let tree = db.open_tree("t").unwrap();
        let mut b = Batch::default();
        assert!(b.is_empty());
        b.append(Batch::default());
        assert!(b.is_empty());
        b.commit(&tree).unwrap();
        assert!(tree.is_empty());
    }

    #[test]
    fn a_batch_made_with_capacity_keeps_its_room_when_groups_join() {
        let mut pending = Batch::with_capacity(64);
        let room = pending.ops.capacity();
        assert!(room >= 64);
        for g in 0..8u8 {
            let mut group = Batch::default();
            group.insert([g, 1].as_slice(), b"v".as_slice());
            group.insert([g, 2].as_slice(), b"v".as_slice());
            pending.append(group);
        }
        assert_eq!(pending.len(), 16);
        assert_eq!(pending.ops.capacity(), room, "no reallocation");
        // A group larger than the room is taken whole instead.
        let mut big = Batch::default();
        for i in 0..100u8 {
            big.insert([i].as_slice(), b"v".as_slice());
        }
        let mut empty = Batch::with_capacity(4);
        empty.append(big);
        assert_eq!(empty.len(), 100);
    }
}
