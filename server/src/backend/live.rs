//! [`LiveTree`]: the member tree of the current database generation, shared by every
//! component that reads or writes it, and switched to a new generation by an online
//! defragment (`defrag.rs`).
//!
//! Invariants:
//! - a switch happens only while no writer runs (the caller pauses apply and the
//!   compactor), so every write lands in exactly one generation and the new one holds
//!   every write of the old one;
//! - a reader holds the [`Generation`] it started on for the whole read (the `Arc`), so it
//!   never mixes generations inside one sled call, and a retired generation's files are
//!   removed only after its last reader is gone (`Drop`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use super::BackendError;
use super::damage::DamageMark;

/// One sled database and its member tree. When it was replaced by a defragment
/// (`retire`), dropping the last handle closes the database and removes its directory.
pub struct Generation {
    tree: sled::Tree,
    db: Option<sled::Db>,
    /// Removed after the database closes, once retired.
    retired_dir: std::sync::Mutex<Option<PathBuf>>,
}

impl std::fmt::Debug for Generation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generation").finish_non_exhaustive()
    }
}

impl Generation {
    /// The generation of database `db` with member tree `tree`.
    pub fn new(db: sled::Db, tree: sled::Tree) -> Generation {
        Generation {
            tree,
            db: Some(db),
            retired_dir: std::sync::Mutex::new(None),
        }
    }

    /// A bare tree without its database handle (tests and tools that never defragment).
    pub fn tree_only(tree: sled::Tree) -> Generation {
        Generation {
            tree,
            db: None,
            retired_dir: std::sync::Mutex::new(None),
        }
    }

    /// The member tree.
    pub fn tree(&self) -> &sled::Tree {
        &self.tree
    }

    /// The database, if this generation owns one.
    pub fn db(&self) -> Option<&sled::Db> {
        self.db.as_ref()
    }

    /// Marks the generation replaced: its directory `dir` is removed when the last handle
    /// drops.
    fn retire(&self, dir: PathBuf) {
        *self.retired_dir.lock().unwrap_or_else(|e| e.into_inner()) = Some(dir);
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        let dir = self
            .retired_dir
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let Some(dir) = dir else { return };
        let db = self.db.take();
        // Off the reader's thread: closing sled joins its flusher, removal walks files.
        let _ = std::thread::Builder::new()
            .name("keel-db-retire".into())
            .spawn(move || {
                drop(db);
                match std::fs::remove_dir_all(&dir) {
                    Ok(()) => {
                        tracing::info!(dir = %dir.display(), "backend: old database generation removed")
                    }
                    Err(e) => {
                        tracing::warn!(dir = %dir.display(), error = %e, "backend: cannot remove an old database generation (the next start removes it)")
                    }
                }
            });
    }
}

/// The current generation's member tree, swappable. Cheap to clone (shared).
#[derive(Clone, Debug)]
pub struct LiveTree {
    current: Arc<RwLock<Arc<Generation>>>,
    /// Bytes the apply path has inserted since this process opened the tree (keys and
    /// values, overwrites included): monotonic.
    inserted: Arc<AtomicU64>,
    /// The last [`LiveTree::measure_in_use`]: `(bytes in use, inserted when it started)`.
    measured: Arc<Mutex<(u64, u64)>>,
    /// Bytes apply published that are not committed to the tree yet (the MVCC store's
    /// pending batch, mvcc/unpersisted.rs).
    pending: Arc<AtomicU64>,
    /// Where a failed commit of apply groups is recorded (a member's tree; tools and tests
    /// have none).
    damage: Arc<OnceLock<Arc<DamageMark>>>,
}

impl LiveTree {
    /// A live tree that starts at `generation`.
    pub fn new(generation: Generation) -> LiveTree {
        LiveTree {
            current: Arc::new(RwLock::new(Arc::new(generation))),
            inserted: Arc::new(AtomicU64::new(0)),
            measured: Arc::new(Mutex::new((0, 0))),
            pending: Arc::new(AtomicU64::new(0)),
            damage: Arc::new(OnceLock::new()),
        }
    }

    /// Records failed commits in `mark` from now on (a member's tree, once, at start).
    pub fn set_damage_mark(&self, mark: Arc<DamageMark>) {
        let _ = self.damage.set(mark);
    }

    /// Records that a commit of apply groups failed part way, so the tree may hold part of
    /// it ([`DamageMark::mark`]); the member must stop next. Logs (and otherwise ignores) a
    /// mark that cannot be written: the member stops either way. Blocking (fdatasync).
    pub fn mark_damaged(&self, why: &str) {
        if let Some(mark) = self.damage.get() {
            match mark.mark(why) {
                Ok(()) => {
                    tracing::error!(mark = %mark.path().display(), "backend: a failed commit marked the member tree damaged; the next start rebuilds it")
                }
                Err(e) => {
                    tracing::error!(error = %e, mark = %mark.path().display(), "backend: cannot mark the member tree damaged after a failed commit")
                }
            }
        }
    }

    /// A live tree over a bare tree (tests and tools).
    pub fn fixed(tree: sled::Tree) -> LiveTree {
        LiveTree::new(Generation::tree_only(tree))
    }

    /// The current generation; hold it for the whole read.
    pub fn get(&self) -> Arc<Generation> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A handle on the current member tree (for calls that take a `sled::Tree`).
    pub fn tree(&self) -> sled::Tree {
        self.get().tree.clone()
    }

    /// Makes `next` current and retires the previous generation, whose directory `old_dir`
    /// is removed once its last reader is gone. Call only while no writer runs.
    pub fn switch(&self, next: Generation, old_dir: PathBuf) {
        let old = std::mem::replace(
            &mut *self.current.write().unwrap_or_else(|e| e.into_inner()),
            Arc::new(next),
        );
        old.retire(old_dir);
    }

    /// Writes every dirty page of the current generation to disk; returns the bytes flushed.
    ///
    /// Errors: sled I/O.
    pub fn flush(&self) -> Result<usize, BackendError> {
        let g = self.get();
        Ok(match g.db() {
            Some(db) => db.flush()?,
            None => g.tree.flush()?,
        })
    }

    /// Counts `bytes` of keys and values apply published but has not committed to the tree
    /// yet ([`super::Batch::inserted_bytes`] of a group joining the pending batch) toward
    /// [`LiveTree::in_use`].
    pub fn note_pending(&self, bytes: u64) {
        self.pending.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counts `bytes` of keys and values a committed apply batch inserted toward
    /// [`LiveTree::in_use`]; with `was_pending`, the same bytes stop counting as pending
    /// (after they count as inserted: the figure may read high for a moment, never low).
    pub fn note_inserted(&self, bytes: u64, was_pending: bool) {
        self.inserted.fetch_add(bytes, Ordering::Relaxed);
        if was_pending {
            self.pending.fetch_sub(bytes, Ordering::Relaxed);
        }
    }

    /// Bytes of the keys and values in the member tree and in apply's pending batch, never
    /// below the true figure except for writes made outside the apply path: the last
    /// [`LiveTree::measure_in_use`] plus every byte inserted since it started plus the
    /// pending bytes. Overwrites and removals since then are not subtracted until the next
    /// measurement, so between measurements this reads high, which is the safe side for the
    /// quota. O(1).
    pub fn in_use(&self) -> u64 {
        let (measured, inserted_then) = *self.measured.lock().unwrap_or_else(|e| e.into_inner());
        measured
            + self
                .inserted
                .load(Ordering::Relaxed)
                .saturating_sub(inserted_then)
            + self.pending.load(Ordering::Relaxed)
    }

    /// Walks the whole tree, sums its keys and values, and makes that the base of
    /// [`LiveTree::in_use`]; returns the sum. Call off the async runtime, and not often.
    ///
    /// Errors: sled I/O; then the previous measurement stays.
    pub fn measure_in_use(&self) -> Result<u64, BackendError> {
        // Read before the walk: a write racing the walk may count twice, never zero times.
        let inserted_then = self.inserted.load(Ordering::Relaxed);
        let g = self.get();
        let mut total = 0u64;
        for kv in g.tree.iter() {
            let (k, v) = kv?;
            total += (k.len() + v.len()) as u64;
        }
        *self.measured.lock().unwrap_or_else(|e| e.into_inner()) = (total, inserted_then);
        Ok(total)
    }

    /// Bytes the current generation occupies on disk (0 for a bare tree; walks its files:
    /// call off the async runtime).
    ///
    /// Errors: file system I/O.
    pub fn size_on_disk(&self) -> Result<u64, BackendError> {
        Ok(match self.get().db() {
            Some(db) => db.size_on_disk()?,
            None => 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::MvccStore;
    use keel_proto::etcdserverpb::PutRequest;

    fn sum(tree: &sled::Tree) -> u64 {
        tree.iter()
            .map(|kv| kv.map(|(k, v)| (k.len() + v.len()) as u64).unwrap())
            .sum()
    }

    #[test]
    fn in_use_is_the_last_measurement_plus_what_apply_inserted_since() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let live = LiveTree::fixed(db.open_tree("t").unwrap());
        live.tree().insert(b"x/1", b"valu").unwrap();
        assert_eq!(live.in_use(), 0, "nothing measured or noted yet");
        assert_eq!(live.measure_in_use().unwrap(), 7);
        assert_eq!(live.in_use(), 7);

        let store = MvccStore::open_live(live.clone()).unwrap();
        let before = live.measure_in_use().unwrap();
        let put = PutRequest {
            key: b"key".to_vec(),
            value: vec![7; 100],
            ..Default::default()
        };
        let mut w = store.write();
        w.put(&put).unwrap();
        w.commit().unwrap();
        let after = sum(&live.tree());
        assert!(after >= before + 103, "{before} -> {after}");
        // Not measured again: the estimate covers the put (and may read high).
        assert!(live.in_use() >= after, "{} < {after}", live.in_use());

        // A put still pending (not in the tree yet) counts too, before and after its commit.
        store
            .set_persist_policy(crate::mvcc::PersistPolicy {
                max_writes: 1_000,
                max_bytes: u64::MAX,
                max_age: std::time::Duration::from_secs(3600),
                background: false,
            })
            .unwrap();
        let in_use = live.in_use();
        let mut w = store.write();
        w.put(&PutRequest {
            key: b"key2".to_vec(),
            value: vec![7; 1_000],
            ..Default::default()
        })
        .unwrap();
        w.commit().unwrap();
        assert_eq!(sum(&live.tree()), after, "the put is pending");
        assert!(live.in_use() >= in_use + 1_004, "pending bytes count");
        store.persist().unwrap();
        let after = sum(&live.tree());
        assert!(live.in_use() >= after, "{} < {after}", live.in_use());

        // A removal is seen at the next measurement, which resets the base.
        live.tree().remove(b"x/1").unwrap();
        assert_eq!(live.measure_in_use().unwrap(), after - 7);
        assert_eq!(live.in_use(), after - 7);
    }
}
