//! The consistent index: how far the raft log has been applied to the state machine.
//!
//! It is written into the *same* backend batch as the state changes it accounts for
//! (MVCC, lease, auth, membership), so after a crash the stored consistent index names
//! exactly the work whose effects are in the store. Replay skips what it covers, which makes
//! apply idempotent (etcd `server/etcdserver/cindex`, and the "consistent index" of etcd's
//! storage design).
//!
//! Keel proposes concurrent client requests as one *batch* entry (one append, one fsync).
//! The consistent index can also record a batch entry applied part-way: replay then resumes
//! at the first request not yet applied, never applying one twice. (Keel applies a whole
//! entry in one apply group today, so a stored partial index comes from versions that
//! committed each request on its own; the format keeps it.)
//!
//! Invariants (asserted by [`stage`], checked by [`load`]: a break would make replay apply
//! an entry twice or skip one):
//! - `partial`, when set, names the entry right after `applied` (`applied.index + 1`, any
//!   index when nothing is applied yet) with at least one request done;
//! - a staged index never moves backwards ([`ConsistentIndex::precedes`]).
//!
//! On-disk: sled key [`schema::CONSISTENT_INDEX`] → bincode [`ConsistentIndex`]
//! (`docs/backend.md`).

use serde::{Deserialize, Serialize};

use crate::backend::{Batch, schema};

/// A raft log id (openraft's, with etcd's u64 member IDs), as stored in the index.
pub type LogId = openraft::LogId<u64>;

/// A stored consistent index that cannot be used. (Messages carry their cause; none is
/// chained as a `source`, so `{:#}` does not print it twice.)
#[derive(Debug, thiserror::Error)]
pub enum CindexError {
    /// sled failed.
    #[error(transparent)]
    Storage(#[from] sled::Error),
    /// The stored value does not decode (a corrupt or foreign store).
    #[error("consistent index does not decode: {0}")]
    Decode(bincode::Error),
    /// The stored value breaks an invariant of the module docs.
    #[error("consistent index {0:?} is corrupt: {1}")]
    Corrupt(ConsistentIndex, &'static str),
}

/// How far the log is applied.
///
/// Invariant: `partial`, when set, names the entry right after `applied` (the one being
/// applied), with `0 < done < requests in that batch`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsistentIndex {
    /// The last log entry all of whose requests are applied (openraft's "last applied").
    pub applied: Option<LogId>,
    /// A batch entry applied part-way: its log id and how many of its requests are applied.
    pub partial: Option<(LogId, u32)>,
}

impl ConsistentIndex {
    /// Whether the entry at `index` is entirely applied.
    pub fn covers(&self, index: u64) -> bool {
        self.applied.is_some_and(|a| index <= a.index)
    }

    /// How many requests of the batch entry `log_id` are already applied.
    pub fn done_in(&self, log_id: &LogId) -> u32 {
        match self.partial {
            Some((id, done)) if id == *log_id => done,
            _ => 0,
        }
    }

    /// The index of the entry apply must see next: `applied + 1`, or `None` when nothing is
    /// applied (openraft may start the log at any index).
    pub fn next_index(&self) -> Option<u64> {
        self.applied.map(|a| a.index + 1)
    }

    /// Why this index breaks an invariant of the module docs, if it does.
    pub fn violation(&self) -> Option<&'static str> {
        let (id, done) = self.partial?;
        if self.next_index().is_some_and(|next| id.index != next) {
            return Some("the partial entry is not the one after the applied entry");
        }
        if done == 0 {
            return Some("a partial entry with no request done");
        }
        None
    }

    /// Whether `self` → `next` moves forward: a later applied entry, or more requests of the
    /// same partial entry.
    pub fn precedes(&self, next: &ConsistentIndex) -> bool {
        let position = |ci: &ConsistentIndex| {
            let applied = ci.applied.map(|a| a.index);
            let partial = ci.partial.map(|(id, done)| (id.index, done));
            (applied, partial)
        };
        let (before, after) = (position(self), position(next));
        match (before.0 == after.0, before.1, after.1) {
            // Same applied entry: the partial progress must grow.
            (true, None, Some(_)) => true,
            (true, Some(b), Some(a)) => a > b,
            (true, _, None) => false,
            // A later applied entry (None = nothing applied sorts first).
            (false, _, _) => after.0 > before.0,
        }
    }
}

/// Reads the stored consistent index; the default (nothing applied) on a fresh store.
///
/// Errors: sled I/O, a value that does not decode, or one that breaks the invariants
/// (a corrupt or foreign store).
pub fn load(tree: &sled::Tree) -> Result<ConsistentIndex, CindexError> {
    let ci: ConsistentIndex = match tree.get(schema::CONSISTENT_INDEX)? {
        None => return Ok(ConsistentIndex::default()),
        Some(v) => bincode::deserialize(&v).map_err(CindexError::Decode)?,
    };
    match ci.violation() {
        Some(why) => Err(CindexError::Corrupt(ci, why)),
        None => Ok(ci),
    }
}

/// Adds "consistent index = `ci`" to `batch`, which must also carry the state changes it
/// accounts for, so both land atomically.
///
/// Panics if `ci` breaks an invariant of the module docs: writing it would corrupt replay.
pub fn stage(batch: &mut Batch, ci: &ConsistentIndex) {
    if let Some(why) = ci.violation() {
        panic!("cindex: staging {ci:?}: {why}");
    }
    let bytes = bincode::serialize(ci).expect("ConsistentIndex always serializes");
    batch.insert(schema::CONSISTENT_INDEX, bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(index: u64) -> LogId {
        openraft::LogId::new(openraft::CommittedLeaderId::new(2, 9), index)
    }

    #[test]
    fn staged_index_lands_with_its_batch() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let tree = db.open_tree("t").unwrap();
        assert_eq!(load(&tree).unwrap(), ConsistentIndex::default());
        let ci = ConsistentIndex {
            applied: Some(id(16)),
            partial: Some((id(17), 3)),
        };
        let mut batch = Batch::default();
        batch.insert(b"k/x".as_slice(), b"v".as_slice());
        stage(&mut batch, &ci);
        // Nothing is visible before the batch is committed.
        assert_eq!(load(&tree).unwrap(), ConsistentIndex::default());
        batch.commit(&tree).unwrap();
        assert_eq!(load(&tree).unwrap(), ci);
        assert!(tree.get(b"k/x").unwrap().is_some());
    }

    #[test]
    fn coverage_and_partial_progress() {
        let ci = ConsistentIndex {
            applied: Some(id(16)),
            partial: Some((id(17), 3)),
        };
        assert!(ci.covers(16) && ci.covers(1) && !ci.covers(17));
        assert_eq!(ci.done_in(&id(17)), 3);
        assert_eq!(ci.done_in(&id(18)), 0);
        assert!(!ConsistentIndex::default().covers(0));
        assert_eq!(ci.next_index(), Some(17));
        assert_eq!(ConsistentIndex::default().next_index(), None);
    }

    #[test]
    fn the_index_only_moves_forward() {
        let at = |applied: Option<u64>, partial: Option<(u64, u32)>| ConsistentIndex {
            applied: applied.map(id),
            partial: partial.map(|(i, d)| (id(i), d)),
        };
        let fresh = ConsistentIndex::default();
        assert!(fresh.precedes(&at(Some(1), None)));
        assert!(fresh.precedes(&at(None, Some((1, 1)))));
        assert!(at(Some(4), None).precedes(&at(Some(4), Some((5, 1)))));
        assert!(at(Some(4), Some((5, 1))).precedes(&at(Some(4), Some((5, 2)))));
        assert!(at(Some(4), Some((5, 2))).precedes(&at(Some(5), None)));
        assert!(!at(Some(4), None).precedes(&at(Some(4), None)));
        assert!(!at(Some(5), None).precedes(&at(Some(4), None)));
        assert!(!at(Some(4), Some((5, 2))).precedes(&at(Some(4), Some((5, 2)))));
        assert!(!at(Some(4), Some((5, 2))).precedes(&at(Some(4), None)));
        assert!(!at(Some(4), None).precedes(&fresh));
    }

    #[test]
    fn an_index_that_breaks_its_invariant_is_refused() {
        let gap = ConsistentIndex {
            applied: Some(id(16)),
            partial: Some((id(18), 1)),
        };
        assert!(gap.violation().is_some());
        let nothing_done = ConsistentIndex {
            applied: Some(id(16)),
            partial: Some((id(17), 0)),
        };
        assert!(nothing_done.violation().is_some());
        let first = ConsistentIndex {
            applied: None,
            partial: Some((id(1), 2)),
        };
        assert_eq!(first.violation(), None);
        // A stored one is an error, not a panic: the member refuses to start.
        let db = sled::Config::new().temporary(true).open().unwrap();
        let tree = db.open_tree("t").unwrap();
        tree.insert(schema::CONSISTENT_INDEX, bincode::serialize(&gap).unwrap())
            .unwrap();
        let err = load(&tree).unwrap_err();
        assert!(
            err.to_string()
                .contains("not the one after the applied entry"),
            "{err}"
        );
        let staged = std::panic::catch_unwind(|| stage(&mut Batch::default(), &gap));
        assert!(staged.is_err(), "staging a corrupt index panics");
    }
}
