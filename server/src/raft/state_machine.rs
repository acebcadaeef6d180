//! openraft state machine: drives the member's applied state ([`AppliedState`], implemented
//! by `apply::Applier`: raft knows only the trait, as toyDB's raft knows only its `State`)
//! and builds/installs snapshots ([`super::snapshot`]).
//!
//! Snapshots are revision-bounded exports ([`super::export`]): captured on the apply task,
//! written on a blocking thread while apply continues. Compaction entries and snapshot
//! installs take the export lock exclusively, so they wait for a running export.
//!
//! Installing a snapshot is crash-safe: the received file is verified (CRC) and renamed to
//! its snapshot name, an `INSTALLING` marker naming it is written, the tree is replaced, and
//! the marker is removed. A member that crashed in between finishes the install from the
//! marker's file when it starts (on openraft's first `applied_state` call).
//!
//! Snapshot policy and durability: building a snapshot first flushes sled, so every entry
//! at or below the snapshot's last log id is durable in the store before openraft may purge
//! the raft log up to it (DESIGN.md invariant "the raft log is purged only up to an index
//! whose applied state is durable").

// openraft's `StorageError` (the error type its storage traits require) is large by design;
// it only travels on the rare failure path.
#![allow(clippy::result_large_err)]

use std::io::{self, Seek};
use std::path::PathBuf;

use keel_proto::keelpb::raft_request::Request as Rq;
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{RaftSnapshotBuilder, SnapshotMeta, StorageIOError, StoredMembership};

use super::export::{ExportHook, ExportJob, ExportLock, ExportLocks};
use super::snapshot;
use super::types::{Entry, LogId, MemberNode, NodeId, Response, StorageError, TypeConfig};

/// The state committed entries are applied to, as the raft state machine drives it: entries
/// in log order into an apply group, one flush per group, and a tree that snapshots export
/// and installs replace.
pub trait AppliedState: Send + Sync + 'static {
    /// The last log entry whose every request is applied (openraft's last applied).
    fn last_applied(&self) -> Option<LogId>;

    /// The last applied membership config.
    fn membership(&self) -> &StoredMembership<NodeId, MemberNode>;

    /// Applies one committed entry into the current apply group and returns its result.
    ///
    /// Errors: storage failures only (fatal for the member).
    fn stage(&mut self, entry: &Entry) -> Result<Response, StorageError>;

    /// Publishes the apply group (its writes join the store's pending sled batch), then
    /// notifies watchers.
    ///
    /// Errors: storage failures (fatal for the member).
    fn flush(&mut self) -> Result<(), StorageError>;

    /// Commits every published group's writes to [`AppliedState::tree`] (before a snapshot
    /// reads or replaces it). Blocking.
    ///
    /// Errors: sled I/O (fatal for the member).
    fn persist(&mut self) -> io::Result<()>;

    /// The sled tree holding the replicated state (what a snapshot carries), of the current
    /// database generation.
    fn tree(&self) -> sled::Tree;

    /// The store revision of the applied state (bounds a snapshot export).
    fn revision(&self) -> i64;

    /// Called before an install clears and reloads [`AppliedState::tree`].
    fn begin_install(&mut self);

    /// Called once the tree holds the snapshot whose membership is `members`: reload every
    /// in-memory view from it.
    ///
    /// Errors: the new tree does not load.
    fn finish_install(&mut self, members: &StoredMembership<NodeId, MemberNode>) -> io::Result<()>;
}

/// The raft state machine of one member.
pub struct StateMachine {
    applier: Box<dyn AppliedState>,
    snap_dir: PathBuf,
    receiving: Option<PathBuf>,
    snapshot_seq: u64,
    export_lock: ExportLock,
    /// Held exclusively while a group is applied or a snapshot installed ([`ExportLocks`]).
    apply_gate: super::export::ApplyGate,
    export_hook: Option<ExportHook>,
    startup_checked: bool,
}

/// Marker file in the snapshot dir while an install replaces the store; holds the name of
/// the snapshot file being installed.
const INSTALL_MARKER: &str = "INSTALLING";

impl StateMachine {
    /// Creates the state machine over an opened applied state; snapshots live in `snap_dir`.
    pub fn new(applier: impl AppliedState, snap_dir: PathBuf) -> StateMachine {
        StateMachine {
            applier: Box::new(applier),
            snap_dir,
            receiving: None,
            snapshot_seq: 0,
            export_lock: ExportLock::default(),
            apply_gate: Default::default(),
            export_hook: None,
            startup_checked: false,
        }
    }

    /// The locks an export of the applied state from outside raft takes
    /// (`Maintenance.Snapshot`); see [`ExportLocks`].
    pub fn export_locks(&self) -> ExportLocks {
        ExportLocks {
            gate: self.apply_gate.clone(),
            export: self.export_lock.clone(),
        }
    }

    /// Test hook: `hook` runs inside every export once it holds the export lock and has
    /// started writing (tests hold an export open with it).
    #[cfg(test)]
    pub(crate) fn set_export_hook(&mut self, hook: ExportHook) {
        self.export_hook = Some(hook);
    }

    /// Captures a snapshot of the applied state (see [`super::export`]).
    async fn capture(&mut self) -> Result<ExportJob, StorageError> {
        let last = self.applier.last_applied();
        self.snapshot_seq += 1;
        let meta = SnapshotMeta {
            last_log_id: last,
            last_membership: self.applier.membership().clone(),
            snapshot_id: format!(
                "{}-{}-{}",
                last.map_or(0, |l| l.leader_id.term),
                last.map_or(0, |l| l.index),
                self.snapshot_seq
            ),
        };
        let revision = self.applier.revision();
        let started = std::time::Instant::now();
        // The capture and the export read sled: every applied group must be in it.
        tokio::task::block_in_place(|| self.applier.persist())
            .map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        let persisted = started.elapsed();
        let job = ExportJob::capture(
            &self.export_lock,
            &self.applier.tree(),
            meta,
            revision,
            &self.snap_dir,
            self.export_hook.clone(),
        )
        .await
        .map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        // Apply waited for all of this (etcd logs its snapshot's `took` alike).
        tracing::info!(
            last_log_index = last.map_or(0, |l| l.index),
            revision,
            persist_ms = %format_args!("{:.3}", persisted.as_secs_f64() * 1e3),
            capture_ms = %format_args!("{:.3}", (started.elapsed() - persisted).as_secs_f64() * 1e3),
            "captured a snapshot"
        );
        Ok(job)
    }

    /// Replaces the store with the snapshot in `file` (already complete and synced).
    fn install(
        &mut self,
        meta: &snapshot::Meta,
        mut file: std::fs::File,
    ) -> Result<(), StorageError> {
        let err = |e: &dyn std::error::Error| -> StorageError {
            StorageIOError::read_snapshot(Some(meta.signature()), AnyErr::from(e)).into()
        };
        // Verify before anything changes: a corrupt snapshot leaves the store as it was.
        tokio::task::block_in_place(|| snapshot::verify(&mut file)).map_err(|e| err(&e))?;
        // Keep it as this member's current snapshot; the install marker names that file.
        let path = snapshot::file_name(&self.snap_dir, meta);
        self.keep_as_current(&mut file, &path)
            .map_err(|e| err(&e))?;
        let marker = self.snap_dir.join(INSTALL_MARKER);
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        write_synced(&marker, name.as_bytes()).map_err(|e| err(&e))?;
        self.replace_store(&path).map_err(|e| err(&e))?;
        std::fs::remove_file(&marker).map_err(|e| err(&e))?;
        snapshot::sync_dir(&self.snap_dir).map_err(|e| err(&e))?;
        snapshot::remove_others(&self.snap_dir, &path).map_err(|e| err(&e))?;
        tracing::info!(
            snapshot_id = %meta.snapshot_id,
            last_log_index = meta.last_log_id.map_or(0, |l| l.index),
            "installed a snapshot"
        );
        Ok(())
    }

    /// Makes the verified snapshot in `file` this member's snapshot file `path`: renames the
    /// received file when `file` is it (the usual case), copies it otherwise.
    fn keep_as_current(
        &mut self,
        file: &mut std::fs::File,
        path: &std::path::Path,
    ) -> io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        let received = self.receiving.take();
        let same = |p: &std::path::Path| -> io::Result<bool> {
            let (a, b) = (file.metadata()?, std::fs::metadata(p)?);
            Ok(a.dev() == b.dev() && a.ino() == b.ino())
        };
        match received {
            Some(r) if same(&r).unwrap_or(false) => std::fs::rename(&r, path)?,
            other => {
                let tmp = path.with_extension("tmp");
                file.seek(io::SeekFrom::Start(0))?;
                let mut out = std::fs::File::create(&tmp)?;
                io::copy(file, &mut out)?;
                out.sync_all()?;
                std::fs::rename(&tmp, path)?;
                if let Some(r) = other {
                    let _ = std::fs::remove_file(r);
                }
            }
        }
        snapshot::sync_dir(&self.snap_dir)
    }

    /// Replaces the whole tree with the (verified) snapshot file at `path`, flushes it, and
    /// has the applied state reload from it.
    fn replace_store(&mut self, path: &std::path::Path) -> io::Result<()> {
        self.applier.begin_install();
        // Pending groups of the old store go to sled before the clear, so none can land on
        // top of the snapshot later.
        tokio::task::block_in_place(|| self.applier.persist())?;
        let tree = self.applier.tree().clone();
        let meta = tokio::task::block_in_place(|| snapshot::load_into(&tree, path))?;
        self.applier.finish_install(&meta.last_membership)
    }

    /// Finishes an install that a crash interrupted (the marker is still there).
    fn finish_interrupted_install(&mut self) -> io::Result<()> {
        let marker = self.snap_dir.join(INSTALL_MARKER);
        let name = match std::fs::read_to_string(&marker) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        let path = self.snap_dir.join(name.trim());
        tracing::warn!(snapshot = %path.display(), "finishing a snapshot install interrupted by a crash");
        self.replace_store(&path)?;
        std::fs::remove_file(&marker)?;
        snapshot::sync_dir(&self.snap_dir)
    }
}

/// Writes `bytes` to `path` and fsyncs the file and its directory.
fn write_synced(path: &std::path::Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    snapshot::sync_dir(path.parent().unwrap_or(std::path::Path::new(".")))
}

/// Adapts `&dyn Error` to openraft's `AnyError`.
struct AnyErr(openraft::AnyError);

impl From<&dyn std::error::Error> for AnyErr {
    fn from(e: &dyn std::error::Error) -> AnyErr {
        AnyErr(openraft::AnyError::error(e.to_string()))
    }
}

impl From<AnyErr> for openraft::AnyError {
    fn from(e: AnyErr) -> openraft::AnyError {
        e.0
    }
}

/// A snapshot captured on the apply task and written by `build_snapshot` on a blocking
/// thread while apply goes on (see [`super::export`]).
pub struct SnapshotBuilder {
    job: Option<Result<ExportJob, StorageError>>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let Some(job) = self.job.take() else {
            return Err(StorageIOError::write_snapshot(
                None,
                openraft::AnyError::error("snapshot already taken"),
            )
            .into());
        };
        let job = job?;
        let started = std::time::Instant::now();
        let written = tokio::task::spawn_blocking(move || job.write())
            .await
            .map_err(|e| io::Error::other(e.to_string()))
            .and_then(|r| r);
        let (meta, path) = written.map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        let file = std::fs::File::open(&path)
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
        tracing::info!(
            snapshot_id = %meta.snapshot_id,
            bytes = file.metadata().map_or(0, |m| m.len()),
            took_ms = %format_args!("{:.1}", started.elapsed().as_secs_f64() * 1e3),
            "saved a snapshot"
        );
        Ok(Snapshot {
            meta,
            snapshot: Box::new(tokio::fs::File::from_std(file)),
        })
    }
}

/// Whether `entry` holds a request, or carries one in a batch, for which `pred` holds.
fn any_request(entry: &Entry, pred: impl Fn(&Rq) -> bool + Copy) -> bool {
    fn has(req: Option<&Rq>, pred: impl Fn(&Rq) -> bool + Copy) -> bool {
        match req {
            Some(Rq::Batch(b)) => b.requests.iter().any(|r| has(r.request.as_ref(), pred)),
            Some(r) => pred(r),
            None => false,
        }
    }
    matches!(&entry.payload, openraft::EntryPayload::Normal(r) if has(r.request.as_ref(), pred))
}

/// Whether an entry is, or carries in a batch, a compaction (which must not run during a
/// snapshot export).
pub(super) fn is_compaction(entry: &Entry) -> bool {
    any_request(entry, |r| matches!(r, Rq::Compaction(_)))
}

/// Whether applying `entry` may take long ([`crate::heavy`]): it deletes a key range (alone or
/// in a txn, nested too), compacts, or revokes leases (with every key attached).
pub(super) fn may_run_long(entry: &Entry) -> bool {
    use keel_proto::etcdserverpb::request_op::Request as Op;
    let range_delete = |d: &keel_proto::etcdserverpb::DeleteRangeRequest| !d.range_end.is_empty();
    any_request(entry, |r| match r {
        Rq::DeleteRange(d) => range_delete(d),
        Rq::Txn(t) => crate::mvcc::txn_ops(t)
            .any(|op| matches!(op, Op::RequestDeleteRange(d) if range_delete(d))),
        Rq::Compaction(_) | Rq::LeaseRevoke(_) | Rq::LeaseExpire(_) => true,
        _ => false,
    })
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId>, StoredMembership<NodeId, MemberNode>), StorageError> {
        if !self.startup_checked {
            self.startup_checked = true;
            self.finish_interrupted_install()
                .map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        }
        Ok((
            self.applier.last_applied(),
            self.applier.membership().clone(),
        ))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, StorageError>
    where
        I: IntoIterator<Item = Entry> + openraft::OptionalSend,
        I::IntoIter: openraft::OptionalSend,
    {
        let mut responses = Vec::new();
        // Captures see whole groups only (lock order: gate, then export lock).
        let _gate = self.apply_gate.clone().write_owned().await;
        // Compaction deletes records a running export may still need: wait for it, and keep
        // exports out until the group (and so the compaction) is in sled (a group that
        // compacts goes to sled at once, with everything pending before it).
        let mut exclusive = None;
        let mut indexes: Option<(u64, u64)> = None;
        let mut long = false;
        for entry in entries {
            if exclusive.is_none() && is_compaction(&entry) {
                exclusive = Some(self.export_lock.clone().write_owned().await);
            }
            let i = entry.log_id.index;
            indexes = Some(indexes.map_or((i, i), |(first, _)| (first, i)));
            // A range delete or a compaction can hold this thread for seconds: the member's
            // other tasks (heartbeats, the election watchdog) move off it meanwhile.
            let long_entry = may_run_long(&entry);
            long |= long_entry;
            responses.push(crate::heavy::run_if(long_entry, || {
                self.applier.stage(&entry)
            })?);
        }
        // One apply group for everything openraft handed over (see mvcc/staged.rs); its
        // events reach the watchers and its writes the backend here, as many as it staged.
        crate::heavy::run_if(long, || self.applier.flush())?;
        if let Some((first, last)) = indexes {
            super::trace::mark(super::trace::Stage::Apply, first, last, 0);
        }
        crate::metrics::keel()
            .apply_group_entries
            .observe(responses.len() as f64);
        drop(exclusive);
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        // Captured here, on the apply task, so the export matches its last log id; written
        // by build_snapshot, which openraft runs concurrently with apply.
        SnapshotBuilder {
            job: Some(self.capture().await),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<tokio::fs::File>, StorageError> {
        let path = self.snap_dir.join(snapshot::RECEIVING);
        // Read and write: install_snapshot verifies and copies from this same handle.
        let file = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .await
            .map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        self.receiving = Some(path);
        Ok(Box::new(file))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, MemberNode>,
        mut snapshot: Box<tokio::fs::File>,
    ) -> Result<(), StorageError> {
        use tokio::io::AsyncWriteExt;
        snapshot
            .flush()
            .await
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
        snapshot
            .sync_all()
            .await
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
        let file = snapshot.into_std().await;
        // No capture may see a half-replaced tree, and a running export must finish before
        // the tree is replaced (lock order: gate, then export lock).
        let _gate = self.apply_gate.clone().write_owned().await;
        let _exclusive = self.export_lock.clone().write_owned().await;
        self.install(meta, file)
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let Some(path) = snapshot::latest(&self.snap_dir)
            .map_err(|e| StorageIOError::read_snapshot(None, &e))?
        else {
            return Ok(None);
        };
        let mut file =
            std::fs::File::open(&path).map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        let meta =
            snapshot::read_meta(&mut file).map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        file.seek(io::SeekFrom::Start(0))
            .map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        Ok(Some(Snapshot {
            meta,
            snapshot: Box::new(tokio::fs::File::from_std(file)),
        }))
    }
}
