//! Rebuilding a member tree that a failed commit left damaged ([`crate::backend::damage`]):
//! at start, before anything reads the tree, its replicated state is set back to a point
//! the raft log can replay from, and openraft then re-applies every committed entry above
//! the consistent index found there (Raft §5.3: the state machine is the log applied in
//! order, so any applied prefix plus the rest of the log gives the same state).
//!
//! The base, in order of preference:
//! 1. the member's latest snapshot file (`member/snap/*.snap`): the log is purged only up
//!    to a snapshot's last log id, so every entry above it is still in the WAL;
//! 2. an empty tree (keeping only the cluster ID written at bootstrap), when the tree was
//!    empty when the damage mark was created and the WAL was never purged: then the whole
//!    state is the log applied from its first entry;
//! 3. otherwise (a tree restored by `keelutl snapshot restore`, or written by a release
//!    before the mark existed, with no snapshot yet) there is nothing to rebuild from, and
//!    the member refuses to start with a message saying how to replace it.
//!
//! Invariant: the mark is cleared only after the rebuilt tree is flushed, so a crash during
//! a rebuild makes the next start rebuild again.

use std::io;
use std::path::Path;

use super::snapshot;
use crate::backend::damage::{DamageMark, MarkState};
use crate::backend::schema::CLUSTER_ID;

/// What [`repair`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Repair {
    /// The tree was not damaged.
    Whole,
    /// The tree was replaced by the snapshot file; the raft log re-applies from its last
    /// log index.
    FromSnapshot {
        /// The snapshot file's last log index.
        last_log_index: u64,
    },
    /// The tree was emptied (cluster ID kept); the raft log re-applies from its start.
    FromEmpty,
}

/// Where the WAL stands, as [`repair`] needs it.
#[derive(Debug, Clone, Copy)]
pub struct LogStart {
    /// The WAL's first entry index.
    pub first_index: Option<u64>,
    /// The last index the WAL purged.
    pub purged_index: Option<u64>,
}

/// Rebuilds `tree` if `state` says a commit failed (module docs), then clears `mark`.
/// Blocking.
///
/// Errors: I/O or sled (the mark stays set, so the next start tries again), or nothing to
/// rebuild from (an error telling the operator what to do).
pub fn repair(
    tree: &sled::Tree,
    snap_dir: &Path,
    log: LogStart,
    mark: &DamageMark,
    state: &MarkState,
) -> io::Result<Repair> {
    let Some(why) = &state.damaged else {
        return Ok(Repair::Whole);
    };
    tracing::warn!(reason = %why, "the member tree is damaged by a failed commit: rebuilding it");
    let done = if let Some(path) = snapshot::latest(snap_dir)? {
        // A whole read before the clear: a corrupt file must leave the tree as it was.
        snapshot::verify(&mut std::fs::File::open(&path)?)?;
        let meta = snapshot::load_into(tree, &path)?;
        Repair::FromSnapshot {
            last_log_index: meta.last_log_id.map_or(0, |l| l.index),
        }
    } else if state.from_empty && log.purged_index.is_none() && log.first_index.unwrap_or(0) == 0 {
        let cluster_id = tree.get(CLUSTER_ID).map_err(io::Error::other)?;
        tree.clear().map_err(io::Error::other)?;
        if let Some(id) = cluster_id {
            tree.insert(CLUSTER_ID, id).map_err(io::Error::other)?;
        }
        tree.flush().map_err(io::Error::other)?;
        Repair::FromEmpty
    } else {
        return Err(io::Error::other(format!(
            "the member tree is damaged by a failed commit ({why}) and there is neither a \
             snapshot file in {} nor the raft log from its first entry to rebuild it from; \
             replace this member (etcdctl member remove, then member add with an empty \
             data dir) or restore its data dir from a snapshot",
            snap_dir.display()
        )));
    };
    mark.clear()?;
    tracing::warn!(rebuilt = ?done, "the member tree is rebuilt; the raft log re-applies above it");
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::snapshot::Meta;

    const NEVER_PURGED: LogStart = LogStart {
        first_index: Some(0),
        purged_index: None,
    };

    fn damaged(dir: &Path, from_empty: bool) -> (DamageMark, MarkState) {
        let (mark, _) = DamageMark::open(dir, from_empty).unwrap();
        mark.mark("IO error: No space left on device").unwrap();
        DamageMark::open(dir, from_empty).unwrap()
    }

    fn temp_tree() -> sled::Tree {
        let db = sled::Config::new().temporary(true).open().unwrap();
        db.open_tree("keel").unwrap()
    }

    fn still_damaged(dir: &Path) -> bool {
        DamageMark::open(dir, false).unwrap().1.damaged.is_some()
    }

    fn keys(tree: &sled::Tree) -> Vec<Vec<u8>> {
        tree.iter().keys().map(|k| k.unwrap().to_vec()).collect()
    }

    #[test]
    fn a_whole_tree_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let tree = temp_tree();
        tree.insert(b"k1", b"v").unwrap();
        let (mark, state) = DamageMark::open(dir.path(), false).unwrap();
        let r = repair(&tree, dir.path(), NEVER_PURGED, &mark, &state).unwrap();
        assert_eq!(r, Repair::Whole);
        assert_eq!(keys(&tree), vec![b"k1".to_vec()]);
    }

    #[test]
    fn a_damaged_tree_is_replaced_by_the_latest_snapshot_and_the_mark_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let tree = temp_tree();
        let meta_at = |term, index| Meta {
            last_log_id: Some(openraft::LogId::new(
                openraft::CommittedLeaderId::new(term, 1),
                index,
            )),
            ..Meta::default()
        };
        let (meta, older) = (meta_at(2, 40), meta_at(1, 9));
        let src = temp_tree();
        src.insert(b"old", b"1").unwrap();
        snapshot::write(&snapshot::file_name(dir.path(), &older), &older, &src).unwrap();
        src.insert(b"k0000000000000001", b"a").unwrap();
        src.insert(CLUSTER_ID, b"id").unwrap();
        snapshot::write(&snapshot::file_name(dir.path(), &meta), &meta, &src).unwrap();
        tree.insert(b"partial", b"x").unwrap();
        let (mark, state) = damaged(dir.path(), true);
        let r = repair(&tree, dir.path(), NEVER_PURGED, &mark, &state).unwrap();
        assert_eq!(r, Repair::FromSnapshot { last_log_index: 40 });
        let mut want = vec![
            b"k0000000000000001".to_vec(),
            b"old".to_vec(),
            CLUSTER_ID.to_vec(),
        ];
        want.sort();
        assert_eq!(keys(&tree), want);
        assert!(!still_damaged(dir.path()));
    }

    #[test]
    fn with_no_snapshot_a_tree_born_empty_is_emptied_but_keeps_its_cluster_id() {
        let dir = tempfile::tempdir().unwrap();
        let tree = temp_tree();
        tree.insert(CLUSTER_ID, b"id").unwrap();
        tree.insert(b"c/consistent_index", b"ci").unwrap();
        tree.insert(b"k1", b"record").unwrap();
        let (mark, state) = damaged(dir.path(), true);
        let r = repair(&tree, dir.path(), NEVER_PURGED, &mark, &state).unwrap();
        assert_eq!(r, Repair::FromEmpty);
        assert_eq!(keys(&tree), vec![CLUSTER_ID.to_vec()]);
        assert_eq!(tree.get(CLUSTER_ID).unwrap().unwrap(), b"id"[..]);
        assert!(!still_damaged(dir.path()));
    }

    #[test]
    fn with_nothing_to_rebuild_from_the_start_is_refused_and_the_mark_stays() {
        let dir = tempfile::tempdir().unwrap();
        let tree = temp_tree();
        tree.insert(b"k1", b"restored").unwrap();
        // Not born empty (a restored tree).
        let (mark, state) = damaged(dir.path(), false);
        let err = repair(&tree, dir.path(), NEVER_PURGED, &mark, &state).unwrap_err();
        assert!(err.to_string().contains("neither a snapshot file"), "{err}");
        // Born empty, but the log was purged.
        let dir2 = tempfile::tempdir().unwrap();
        let (mark2, state2) = damaged(dir2.path(), true);
        let purged = LogStart {
            first_index: Some(101),
            purged_index: Some(100),
        };
        assert!(repair(&tree, dir2.path(), purged, &mark2, &state2).is_err());
        assert_eq!(keys(&tree), vec![b"k1".to_vec()]);
        assert!(still_damaged(dir.path()) && still_damaged(dir2.path()));
    }
}
