//! Revision-bounded snapshot export: a consistent MVCC export that does not stop apply.
//!
//! MVCC records are keyed by revision (`k` + main + sub) and never change once written; only
//! compaction (and a snapshot install) deletes them. So a snapshot at log id `L` (store
//! revision `R`) is:
//!
//! - captured on the apply task, in microseconds to milliseconds: the metadata, `R`, and a copy
//!   of every key outside the `k` record space (MVCC meta, consistent index, membership,
//!   member attributes, and what lease/auth keep: small tables), read by two range scans on
//!   either side of the records, never walking them (apply waits for the capture);
//! - written on a blocking thread while apply goes on: the captured keys, then every record
//!   with main revision `<= R` read from the live tree. Records above `R`, written by entries
//!   applied meanwhile, are outside the bound.
//!
//! The only writers that could remove records `<= R` during the export are compaction and
//! snapshot install. Both take the **export lock** ([`ExportLock`]) exclusively, the export
//! holds it shared: a compaction entry waits for a running export, and so does an install.
//!
//! Lock order (DESIGN.md "Snapshot install and compaction take locks in one documented
//! order"): the export lock first, then sled/MVCC internals. The export never waits for the
//! apply task, so apply waiting for the export cannot deadlock.
//!
//! Before the file is complete, sled is flushed: openraft may purge the raft log up to `L`
//! once the snapshot is returned, so the store must hold everything up to `L` durably.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::SnapshotMeta;
use tokio::sync::{OwnedRwLockReadGuard, RwLock};

use super::snapshot::{self, Meta};
use crate::backend::schema::RECORD_PREFIX;
use crate::mvcc::revision::record_key_lower_bound;

/// Shared by export (read) and by compaction and install (write). See the module docs.
pub type ExportLock = Arc<RwLock<()>>;

/// Held exclusively by the apply task for each group it applies (stage + flush) and for a
/// snapshot install; held shared by a capture that must read several keys of one applied
/// state (`Maintenance.Snapshot`, `backup::export`), which therefore sees no group half
/// applied. Lock order: this gate first, then the [`ExportLock`]. A capture holds the gate
/// only while it copies the small tables (microseconds to milliseconds), never during I/O
/// on the records.
pub type ApplyGate = Arc<RwLock<()>>;

/// The locks an export outside the raft snapshot path takes (see [`ApplyGate`]).
#[derive(Clone, Default)]
pub struct ExportLocks {
    /// Excludes apply while a capture copies its tables.
    pub gate: ApplyGate,
    /// Keeps compaction and install out while records are written.
    pub export: ExportLock,
}

/// Called inside a running export (tests use it to hold an export open).
pub type ExportHook = Arc<dyn Fn() + Send + Sync>;

/// Everything an export needs, captured on the apply task.
pub struct ExportJob {
    meta: Meta,
    path: PathBuf,
    snap_dir: PathBuf,
    tree: sled::Tree,
    revision: i64,
    captured: Vec<(sled::IVec, sled::IVec)>,
    _guard: OwnedRwLockReadGuard<()>,
    hook: Option<ExportHook>,
}

impl ExportJob {
    /// Captures a snapshot of `tree` at `meta.last_log_id`, whose store revision is
    /// `revision`. Must run on the apply task (nothing is applied while it runs); holds the
    /// export lock shared from here until the job finishes.
    ///
    /// Errors: sled I/O while copying the non-record keys.
    pub async fn capture(
        lock: &ExportLock,
        tree: &sled::Tree,
        meta: SnapshotMeta<u64, super::types::MemberNode>,
        revision: i64,
        snap_dir: &Path,
        hook: Option<ExportHook>,
    ) -> io::Result<ExportJob> {
        let guard = lock.clone().read_owned().await;
        // The keys below and above the record space, without walking the records: they are
        // most of the tree, and apply waits while this runs.
        let captured = tree
            .range(..[RECORD_PREFIX].as_slice())
            .chain(tree.range([RECORD_PREFIX + 1].as_slice()..))
            .collect::<Result<Vec<_>, _>>()
            .map_err(io::Error::other)?;
        Ok(ExportJob {
            path: snapshot::file_name(snap_dir, &meta),
            meta,
            snap_dir: snap_dir.to_path_buf(),
            tree: tree.clone(),
            revision,
            captured,
            _guard: guard,
            hook,
        })
    }

    /// Writes the snapshot file (blocking I/O: call from a blocking thread) and returns its
    /// metadata and path. Other snapshot files are removed afterwards.
    ///
    /// Errors: sled or file I/O.
    pub fn write(self) -> io::Result<(Meta, PathBuf)> {
        // Durable store first: the raft log may be purged up to the snapshot once it exists.
        self.tree.flush().map_err(io::Error::other)?;
        let records = self
            .tree
            .range(
                record_key_lower_bound(0)..record_key_lower_bound(self.revision.saturating_add(1)),
            )
            .map(|kv| kv.map_err(io::Error::other));
        let hook = self.hook.clone();
        let mut hooked = false;
        let all = self
            .captured
            .iter()
            .cloned()
            .map(Ok)
            .chain(records)
            .inspect(|_| {
                if !hooked {
                    hooked = true;
                    if let Some(h) = &hook {
                        h();
                    }
                }
            });
        snapshot::write_records(&self.path, &self.meta, all)?;
        snapshot::remove_others(&self.snap_dir, &self.path)?;
        Ok((self.meta, self.path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::revision::{Revision, record_key};

    fn meta() -> Meta {
        SnapshotMeta {
            last_log_id: Some(openraft::LogId::new(
                openraft::CommittedLeaderId::new(2, 1),
                7,
            )),
            last_membership: Default::default(),
            snapshot_id: "2-7-1".into(),
        }
    }

    #[tokio::test]
    async fn an_export_holds_the_tables_on_both_sides_of_the_records_and_records_up_to_its_revision()
     {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().temporary(true).open().unwrap();
        let tree = db.open_tree("t").unwrap();
        // Tables sort below and above the record space ('k'), right up to its edges.
        let tables: Vec<Vec<u8>> = vec![
            b"a/user/root".to_vec(),
            b"j\xff\xff".to_vec(),
            b"l\x00\x00".to_vec(),
            b"m/rev".to_vec(),
            b"x/alarm/1".to_vec(),
            vec![0xff],
        ];
        for t in &tables {
            tree.insert(t.as_slice(), b"t".as_slice()).unwrap();
        }
        for main in 1..=5i64 {
            let rev = Revision { main, sub: 0 };
            tree.insert(record_key(rev, main == 4), vec![main as u8])
                .unwrap();
        }
        let lock = ExportLock::default();
        let job = ExportJob::capture(&lock, &tree, meta(), 3, dir.path(), None)
            .await
            .unwrap();
        // Records written after the capture, above its revision, stay out of the file.
        tree.insert(
            record_key(Revision { main: 6, sub: 0 }, false),
            b"6".as_slice(),
        )
        .unwrap();
        let (written_meta, path) = tokio::task::spawn_blocking(move || job.write())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(written_meta, meta());

        let mut keys = Vec::new();
        let mut file = std::fs::File::open(&path).unwrap();
        snapshot::verify(&mut file).unwrap();
        snapshot::read_records(&mut file, |k, _| {
            keys.push(k);
            Ok(())
        })
        .unwrap();
        let mut want = tables.clone();
        want.extend((1..=3).map(|main| record_key(Revision { main, sub: 0 }, false)));
        want.sort();
        keys.sort();
        assert_eq!(keys, want);
    }
}
