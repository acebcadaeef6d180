//! The history of one key: its revisions, tombstones and generations.
//!
//! This is etcd's `keyIndex` (`server/storage/mvcc/key_index.go`) in a flatter, smaller form.
//! A key's history is its revisions in ascending order. A tombstone (a delete) ends a
//! *generation*; the next put starts a new one with `version` 1 and `create_revision` = its
//! own main revision. Unlike etcd, each revision also carries its `create_revision`,
//! `version` and `lease`, so `keys_only`, `count`, sorting by version/create/mod, the
//! create/mod filters and non-value compares are answered without reading values from sled.
//!
//! Invariants (asserted where a violation would corrupt the index):
//! - revisions strictly increase (`(main, sub)` order);
//! - a put's `version` is 1 after a tombstone (or at the start) and +1 per put otherwise, and
//!   all puts of a generation share one `create_revision`;
//! - a tombstone has `create_revision` = `version` = `lease` = 0.

use std::sync::Arc;

use super::older::Older;
use super::revision::Revision;

/// One revision of one key as the index keeps it (40 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RevInfo {
    /// Main revision (the key's `mod_revision` at this revision).
    pub main: i64,
    /// `create_revision` of the generation (0 for a tombstone).
    pub create: i64,
    /// `version` of the key at this revision (0 for a tombstone).
    pub version: i64,
    /// Lease id attached at this revision (0 = none).
    pub lease: i64,
    /// Sub revision (change index within the main revision).
    pub sub: u32,
    /// Whether this revision deletes the key.
    pub tombstone: bool,
}

impl RevInfo {
    /// A put revision.
    pub fn put(rev: Revision, create: i64, version: i64, lease: i64) -> RevInfo {
        RevInfo {
            main: rev.main,
            create,
            version,
            lease,
            sub: sub_u32(rev.sub),
            tombstone: false,
        }
    }

    /// A tombstone revision.
    pub fn tombstone(rev: Revision) -> RevInfo {
        RevInfo {
            main: rev.main,
            create: 0,
            version: 0,
            lease: 0,
            sub: sub_u32(rev.sub),
            tombstone: true,
        }
    }

    /// The `(main, sub)` revision.
    pub fn revision(&self) -> Revision {
        Revision::new(self.main, i64::from(self.sub))
    }
}

/// Sub revisions count changes within one raft entry; an entry with more than 2^32 changes
/// cannot be built (its sled batch alone would exceed memory), so this never truncates.
fn sub_u32(sub: i64) -> u32 {
    u32::try_from(sub).expect("sub revision exceeds u32: more than 2^32 changes in one entry")
}

/// All revisions of one key still in the index, oldest first.
///
/// `latest` is stored inline because most keys have exactly one revision (after
/// compaction); older revisions live behind one thin pointer that is null in that case.
/// The pointer is an `Arc`, so copying an index block (copy-on-write, see `index.rs`) bumps
/// a reference count per key with history instead of copying that history, and an append
/// copies only the newest part of it ([`Older`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyHistory {
    latest: RevInfo,
    // A thin (8-byte, null when empty) pointer: `Vec` inline would cost 24 bytes per key.
    older: Option<Arc<Older>>,
}

impl KeyHistory {
    /// A history holding one revision.
    pub fn new(first: RevInfo) -> KeyHistory {
        KeyHistory {
            latest: first,
            older: None,
        }
    }

    /// Builds a history from revisions in ascending order. Returns `None` for an empty list.
    pub fn from_revisions(mut revs: Vec<RevInfo>) -> Option<KeyHistory> {
        let latest = revs.pop()?;
        let older = (!revs.is_empty()).then(|| Arc::new(Older::from_vec(revs)));
        Some(KeyHistory { latest, older })
    }

    /// The newest revision (a put or a tombstone).
    pub fn latest(&self) -> &RevInfo {
        &self.latest
    }

    /// Whether the key exists at the newest revision.
    pub fn is_live(&self) -> bool {
        !self.latest.tombstone
    }

    /// Whether compaction may have work here: older revisions, or a tombstone at the head.
    pub fn has_history(&self) -> bool {
        self.older.is_some() || self.latest.tombstone
    }

    /// Number of revisions held.
    pub fn len(&self) -> usize {
        1 + self.older.as_ref().map_or(0, |o| o.len())
    }

    /// Always false: a history holds at least one revision.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// All revisions, oldest first.
    pub fn revisions(&self) -> impl DoubleEndedIterator<Item = &RevInfo> {
        self.older
            .as_deref()
            .into_iter()
            .flat_map(|o| o.iter())
            .chain(std::iter::once(&self.latest))
    }

    /// The put visible at store revision `rev`: the newest revision with `main <= rev`,
    /// unless that revision is a tombstone or there is none (etcd `keyIndex.get`).
    pub fn visible_at(&self, rev: i64) -> Option<&RevInfo> {
        let r = if self.latest.main <= rev {
            &self.latest
        } else {
            let older = self.older.as_deref()?;
            let n = older.partition_point(|r| r.main <= rev);
            older.get(n.checked_sub(1)?)?
        };
        (!r.tombstone).then_some(r)
    }

    /// Appends a newer revision.
    ///
    /// Panics if `next` is not newer than the current head: out-of-order revisions would
    /// corrupt every later read of this key.
    pub fn push(&mut self, next: RevInfo) {
        assert!(
            next.revision() > self.latest.revision(),
            "mvcc index: revision {} is not after {}",
            next.revision(),
            self.latest.revision()
        );
        let prev = std::mem::replace(&mut self.latest, next);
        match &mut self.older {
            Some(older) => Older::push(older, prev),
            None => self.older = Some(Arc::new(Older::from_vec(vec![prev]))),
        }
    }

    /// Compacts this history at `at_rev`, appending the removed revisions to `removed`.
    /// Returns `None` when nothing remains (the key leaves the index).
    ///
    /// Semantics of etcd ≥ 3.5.16 / 3.4.34 `keyIndex.compact`: split the history into
    /// generations; pick the first generation whose tombstone is at or after `at_rev` (or
    /// the open generation); inside it keep from the newest revision `<= at_rev` onwards;
    /// keep all later generations. A tombstone at exactly `at_rev` is therefore kept, so a
    /// watcher starting at the compact revision still sees that delete.
    pub fn compact(&self, at_rev: i64, removed: &mut Vec<RevInfo>) -> Option<KeyHistory> {
        let keep_from = self.keep_from(at_rev);
        if keep_from == 0 {
            return Some(self.clone());
        }
        // Reads the (possibly shared) history; allocates only for what is kept.
        let len = self.len();
        removed.extend(self.revisions().take(keep_from.min(len - 1)));
        if keep_from == len {
            removed.push(self.latest);
            return None;
        }
        let kept_older = self.older.as_deref().and_then(|o| o.suffix(keep_from));
        Some(KeyHistory {
            latest: self.latest,
            older: kept_older.map(Arc::new),
        })
    }

    /// Whether [`KeyHistory::compact`] at `at_rev` would remove anything.
    pub fn compacts_at(&self, at_rev: i64) -> bool {
        self.has_history() && self.keep_from(at_rev) > 0
    }

    /// Approximate heap bytes owned by this history (excluding `self`).
    pub fn heap_bytes(&self) -> usize {
        // Shared histories are counted once per holder: an upper bound.
        self.older.as_ref().map_or(0, |o| {
            2 * std::mem::size_of::<usize>() + std::mem::size_of::<Older>() + o.heap_bytes()
        })
    }

    fn get(&self, i: usize) -> &RevInfo {
        self.older
            .as_deref()
            .and_then(|o| o.get(i))
            .unwrap_or(&self.latest)
    }

    /// Index (in [`KeyHistory::revisions`] order) of the first revision a compaction at
    /// `at_rev` keeps; `self.len()` means nothing is kept.
    fn keep_from(&self, at_rev: i64) -> usize {
        let len = self.len();
        // Position of the newest revision with main <= at_rev in [start, end), or `start`
        // when there is none (etcd keeps the whole generation then).
        let newest_at_or_before = |start: usize, end: usize| {
            (start..end)
                .rev()
                .find(|&i| self.get(i).main <= at_rev)
                .unwrap_or(start)
        };
        // Each closed generation ends with its tombstone; the open one may be empty.
        let mut gen_start = 0;
        for i in 0..len {
            let r = self.get(i);
            if r.tombstone {
                if r.main >= at_rev {
                    return newest_at_or_before(gen_start, i + 1);
                }
                gen_start = i + 1;
            }
        }
        if gen_start == len {
            return len;
        }
        newest_at_or_before(gen_start, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(main: i64, create: i64, version: i64) -> RevInfo {
        RevInfo::put(Revision::new(main, 0), create, version, 0)
    }
    fn tomb(main: i64) -> RevInfo {
        RevInfo::tombstone(Revision::new(main, 0))
    }
    fn history(revs: &[RevInfo]) -> KeyHistory {
        KeyHistory::from_revisions(revs.to_vec()).unwrap()
    }
    fn mains(h: &Option<KeyHistory>) -> Vec<i64> {
        h.as_ref()
            .map_or(vec![], |h| h.revisions().map(|r| r.main).collect())
    }

    #[test]
    fn rev_info_is_40_bytes_and_history_48() {
        assert_eq!(std::mem::size_of::<RevInfo>(), 40);
        assert_eq!(std::mem::size_of::<KeyHistory>(), 48);
    }

    #[test]
    fn visible_at_follows_generations() {
        // put@2 put@4 del@6 put@8
        let h = history(&[put(2, 2, 1), put(4, 2, 2), tomb(6), put(8, 8, 1)]);
        assert_eq!(h.visible_at(1), None);
        assert_eq!(h.visible_at(2).map(|r| r.version), Some(1));
        assert_eq!(h.visible_at(5).map(|r| r.main), Some(4));
        assert_eq!(h.visible_at(6), None);
        assert_eq!(h.visible_at(7), None);
        assert_eq!(h.visible_at(8).map(|r| (r.create, r.version)), Some((8, 1)));
        assert_eq!(h.visible_at(i64::MAX).map(|r| r.main), Some(8));
    }

    #[test]
    #[should_panic(expected = "is not after")]
    fn push_rejects_out_of_order_revisions() {
        let mut h = KeyHistory::new(put(5, 5, 1));
        h.push(put(5, 5, 2));
    }

    #[test]
    fn compact_keeps_newest_revision_at_or_before() {
        let h = history(&[put(2, 2, 1), put(3, 2, 2), put(4, 2, 3)]);
        let mut removed = vec![];
        let kept = h.clone().compact(3, &mut removed);
        assert_eq!(mains(&kept), vec![3, 4]);
        assert_eq!(removed.iter().map(|r| r.main).collect::<Vec<_>>(), vec![2]);
        // Compacting before the first revision removes nothing.
        let mut removed = vec![];
        assert_eq!(mains(&h.clone().compact(1, &mut removed)), vec![2, 3, 4]);
        assert!(removed.is_empty());
        assert!(!h.compacts_at(1) && h.compacts_at(3));
    }

    #[test]
    fn compact_drops_generations_closed_before_the_compact_revision() {
        // put@2 del@3 put@5 ; compact at 4 -> only put@5 survives
        let h = history(&[put(2, 2, 1), tomb(3), put(5, 5, 1)]);
        let mut removed = vec![];
        assert_eq!(mains(&h.compact(4, &mut removed)), vec![5]);
        assert_eq!(removed.len(), 2);
    }

    #[test]
    fn compact_keeps_a_tombstone_at_exactly_the_compact_revision() {
        let h = history(&[put(2, 2, 1), tomb(3)]);
        let mut removed = vec![];
        let kept = h.clone().compact(3, &mut removed);
        assert_eq!(mains(&kept), vec![3]);
        assert!(kept.unwrap().latest().tombstone);
        // ... and removes it (and the key) once compaction passes it.
        let mut removed = vec![];
        assert_eq!(h.compact(4, &mut removed), None);
        assert_eq!(removed.len(), 2);
    }

    #[test]
    fn compact_of_a_lone_tombstone_below_the_revision_removes_the_key() {
        let h = history(&[tomb(3)]);
        let mut removed = vec![];
        assert_eq!(h.compact(10, &mut removed), None);
        assert_eq!(removed, vec![tomb(3)]);
    }

    #[test]
    fn compact_keeps_open_generation_from_newest_at_or_before() {
        // put@2 del@3 put@4 put@6 ; compact at 5 -> keep put@4 (visible at 5) and put@6
        let h = history(&[put(2, 2, 1), tomb(3), put(4, 4, 1), put(6, 4, 2)]);
        let mut removed = vec![];
        let kept = h.compact(5, &mut removed);
        assert_eq!(mains(&kept), vec![4, 6]);
        assert_eq!(kept.unwrap().visible_at(5).map(|r| r.main), Some(4));
    }

    #[test]
    fn compaction_never_changes_what_is_visible_at_or_after_the_revision() {
        let revs = [
            put(2, 2, 1),
            put(3, 2, 2),
            tomb(5),
            put(7, 7, 1),
            tomb(9),
            put(9 + 1, 10, 1),
        ];
        let h = history(&revs);
        for at in 0..12 {
            let mut removed = vec![];
            let kept = h.clone().compact(at, &mut removed);
            assert_eq!(
                removed.len() + kept.as_ref().map_or(0, |k| k.len()),
                revs.len()
            );
            for read in at..13 {
                let before = h.visible_at(read).copied();
                let after = kept.as_ref().and_then(|k| k.visible_at(read).copied());
                assert_eq!(before, after, "compact at {at}, read at {read}");
            }
        }
    }
}
