//! The consistent index: the log id of the last raft entry applied to the state machine.
//!
//! It is written into the *same* atomic sled batch as the state changes of that entry
//! (MVCC, lease, auth, membership), so after a crash the stored consistent index names
//! exactly the entries whose effects are in the store. Replay skips entries at or below it,
//! which makes apply idempotent (etcd `server/etcdserver/cindex`, and the "consistent index"
//! of etcd's storage design).
//!
//! On-disk: sled key [`KEY`] → bincode `openraft::LogId<u64>` (term, leader id, index).

use super::raft::types::LogId;

/// sled key of the consistent index (first byte `c`: owned by this module).
pub const KEY: &[u8] = b"c/consistent_index";

/// Reads the stored consistent index; `None` on a fresh store.
///
/// Errors: sled I/O, or a value that does not decode (a corrupt or foreign store).
pub fn load(tree: &sled::Tree) -> Result<Option<LogId>, String> {
    match tree.get(KEY).map_err(|e| e.to_string())? {
        None => Ok(None),
        Some(v) => bincode::deserialize(&v)
            .map(Some)
            .map_err(|e| format!("consistent index does not decode: {e}")),
    }
}

/// Adds "consistent index = `log_id`" to `batch`, which must also carry that entry's state
/// changes so both land atomically.
pub fn stage(batch: &mut sled::Batch, log_id: &LogId) {
    let bytes = bincode::serialize(log_id).expect("LogId always serializes");
    batch.insert(KEY, bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staged_index_lands_with_its_batch() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let tree = db.open_tree("t").unwrap();
        assert_eq!(load(&tree).unwrap(), None);
        let id = openraft::LogId::new(openraft::CommittedLeaderId::new(2, 9), 17);
        let mut batch = sled::Batch::default();
        batch.insert(b"k/x".as_slice(), b"v".as_slice());
        stage(&mut batch, &id);
        // Nothing is visible before the batch is applied.
        assert_eq!(load(&tree).unwrap(), None);
        tree.apply_batch(batch).unwrap();
        assert_eq!(load(&tree).unwrap(), Some(id));
        assert!(tree.get(b"k/x").unwrap().is_some());
    }
}
