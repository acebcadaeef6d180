//! The storage backend of a member (etcd `server/storage/{backend,schema}`): one sled
//! database in `<data-dir>/member/db/`, its trees and keys ([`schema`], the on-disk format
//! documented once), and the apply batch ([`Batch`]) every component stages into.
//!
//! - [`Backend`] opens the database and hands out its two trees: the replicated member
//!   tree and the member-local tree.
//! - [`Batch`] gathers the writes of one apply group (mvcc, cindex, lease, membership, and
//!   next auth and alarms) and commits them as one atomic sled batch, with the consistent
//!   index that accounts for them.
//!
//! Invariant: every key written to a tree is declared in [`schema`]; the components that
//! own a key space encode its values (mvcc records, lease records...), nobody else writes
//! there. Docs: `docs/backend.md`.

mod batch;
#[cfg(test)]
mod batch_crash_test;
pub mod damage;
pub mod defrag;
pub mod generation;
mod live;
pub mod schema;
#[cfg(test)]
mod split_test;

use std::path::Path;

pub use batch::Batch;
pub use damage::DamageMark;
pub use live::{Generation, LiveTree};

/// sled's page cache size per member.
const CACHE_BYTES: u64 = 256 * 1024 * 1024;

/// A failure of the storage backend (sled). Fatal for the member.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// sled failed (I/O, or its own corruption detection); shown as sled's message.
    #[error(transparent)]
    Storage(#[from] sled::Error),
}

/// A member's sled database and its trees. Cheap to clone (sled handles are shared).
#[derive(Clone)]
pub struct Backend {
    db: sled::Db,
    tree: sled::Tree,
}

impl Backend {
    /// Opens (or creates) the database in `dir` and its member tree.
    ///
    /// Errors: sled I/O or a store sled cannot read.
    pub fn open(dir: &Path) -> Result<Backend, BackendError> {
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(CACHE_BYTES)
            .open()?;
        Backend::from_db(db)
    }

    /// A database that is deleted when dropped (tests and tools).
    ///
    /// Errors: sled I/O.
    pub fn temporary() -> Result<Backend, BackendError> {
        Backend::from_db(sled::Config::new().temporary(true).open()?)
    }

    fn from_db(db: sled::Db) -> Result<Backend, BackendError> {
        let tree = db.open_tree(schema::MEMBER_TREE)?;
        Ok(Backend { db, tree })
    }

    /// This database as the first generation of a member's [`LiveTree`].
    pub fn into_live(self) -> LiveTree {
        LiveTree::new(Generation::new(self.db, self.tree))
    }

    /// The replicated member tree ([`schema::MEMBER_TREE`]).
    pub fn tree(&self) -> &sled::Tree {
        &self.tree
    }

    /// The member-local tree ([`schema::LOCAL_TREE`]).
    ///
    /// Errors: sled I/O.
    pub fn local(&self) -> Result<sled::Tree, BackendError> {
        Ok(self.db.open_tree(schema::LOCAL_TREE)?)
    }

    /// Writes every dirty page to disk (blocking); returns the bytes flushed.
    ///
    /// Errors: sled I/O.
    pub fn flush(&self) -> Result<usize, BackendError> {
        Ok(self.db.flush()?)
    }

    /// [`Backend::flush`] without blocking the async runtime.
    ///
    /// Errors: sled I/O.
    pub async fn flush_async(&self) -> Result<usize, BackendError> {
        Ok(self.db.flush_async().await?)
    }
}
