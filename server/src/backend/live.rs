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
use std::sync::{Arc, RwLock};

use super::BackendError;

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
}

impl LiveTree {
    /// A live tree that starts at `generation`.
    pub fn new(generation: Generation) -> LiveTree {
        LiveTree {
            current: Arc::new(RwLock::new(Arc::new(generation))),
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

    /// Bytes of the keys and values in the member tree: the live data (walks the whole
    /// tree: call off the async runtime, and not often).
    ///
    /// Errors: sled I/O.
    pub fn bytes_in_use(&self) -> Result<u64, BackendError> {
        let g = self.get();
        let mut total = 0u64;
        for kv in g.tree.iter() {
            let (k, v) = kv?;
            total += (k.len() + v.len()) as u64;
        }
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
