//! The consistent index: how far the raft log has been applied to the state machine.
//!
//! It is written into the *same* atomic sled batch as the state changes it accounts for
//! (MVCC, lease, auth, membership), so after a crash the stored consistent index names
//! exactly the work whose effects are in the store. Replay skips what it covers, which makes
//! apply idempotent (etcd `server/etcdserver/cindex`, and the "consistent index" of etcd's
//! storage design).
//!
//! Keel proposes concurrent client requests as one *batch* entry (one append, one fsync).
//! Each request of a batch is applied with its own sled batch, so the consistent index also
//! records a batch entry applied part-way: replay then resumes at the first request not yet
//! applied, never applying one twice.
//!
//! On-disk: sled key [`KEY`] → bincode [`ConsistentIndex`].

use serde::{Deserialize, Serialize};

use super::raft::types::LogId;

/// sled key of the consistent index (first byte `c`: owned by this module).
pub const KEY: &[u8] = b"c/consistent_index";

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
}

/// Reads the stored consistent index; the default (nothing applied) on a fresh store.
///
/// Errors: sled I/O, or a value that does not decode (a corrupt or foreign store).
pub fn load(tree: &sled::Tree) -> Result<ConsistentIndex, String> {
    match tree.get(KEY).map_err(|e| e.to_string())? {
        None => Ok(ConsistentIndex::default()),
        Some(v) => {
            bincode::deserialize(&v).map_err(|e| format!("consistent index does not decode: {e}"))
        }
    }
}

/// Adds "consistent index = `ci`" to `batch`, which must also carry the state changes it
/// accounts for, so both land atomically.
pub fn stage(batch: &mut crate::mvcc::Writes, ci: &ConsistentIndex) {
    let bytes = bincode::serialize(ci).expect("ConsistentIndex always serializes");
    batch.insert(KEY, bytes);
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
        let mut writes = crate::mvcc::Writes::default();
        writes.insert(b"k/x".as_slice(), b"v".as_slice());
        stage(&mut writes, &ci);
        let mut batch = sled::Batch::default();
        writes.fold_into(&mut batch);
        // Nothing is visible before the batch is applied.
        assert_eq!(load(&tree).unwrap(), ConsistentIndex::default());
        tree.apply_batch(batch).unwrap();
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
    }
}
