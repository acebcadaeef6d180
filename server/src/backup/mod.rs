//! Backups in etcd's format (issue 15 part 2): a consistent export of a member's applied
//! state as an etcd bbolt database (`Maintenance.Snapshot`, docs/etcd-format.md §7).
//!
//! - [`export::Capture`] pins one applied state: under the apply gate (no group half
//!   applied, `raft::export::ExportLocks`) it reads the store revision `R` and the compact
//!   revision and copies every key outside the MVCC record space (leases, members, alarms,
//!   auth, meta: small tables) into a temporary tree; then it keeps only the export lock
//!   (shared), so apply goes on while compaction and snapshot install wait.
//! - [`export::Capture::write_etcd_db`] (blocking) streams the records with main revision
//!   `<= R` from the live tree into an `etcd_db::DbWriter`, then the captured tables in
//!   etcd's schema, then `meta`.
//!
//! - [`restore::restore`] is the way back in (`keelutl snapshot restore`): an etcd
//!   database into the member tree of a new data dir; [`restore::defrag`] rewrites a
//!   stopped member's store into a fresh sled database (`keelutl defrag`);
//!   [`defragment::defragment`] does it on a running member (`Maintenance.Defragment`).
//!
//! Invariants: an export holds exactly the records `<= R` of the live tree and the tables of
//! the same applied state (records never change once written; only compaction and install
//! remove them, and both wait for the export lock); the file is complete and synced before
//! anything streams it (bbolt rewrites pages at commit).

pub mod defragment;
pub mod export;
pub mod restore;

use crate::alarm::AlarmError;
use crate::backend::BackendError;
use crate::cindex::CindexError;
use crate::etcd_db::EtcdDbError;
use crate::lease::record::RecordError;
use crate::membership::MembershipError;

/// Why an export (or a restore) failed. Messages carry their cause.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// The etcd database could not be written or read.
    #[error(transparent)]
    EtcdDb(#[from] EtcdDbError),
    /// sled failed.
    #[error(transparent)]
    Storage(#[from] sled::Error),
    /// The temporary or target store failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// Lease records do not decode.
    #[error(transparent)]
    Lease(#[from] RecordError),
    /// Member attributes do not decode.
    #[error(transparent)]
    Attributes(#[from] MembershipError),
    /// Alarm keys do not decode.
    #[error(transparent)]
    Alarm(#[from] AlarmError),
    /// The consistent index does not decode.
    #[error(transparent)]
    Cindex(#[from] CindexError),
    /// The stored raft membership does not decode.
    #[error("raft membership: {0}")]
    Membership(bincode::Error),
    /// The auth records do not decode.
    #[error(transparent)]
    Auth(#[from] crate::auth::storage::StorageError),
    /// The file system failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
