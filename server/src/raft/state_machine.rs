//! openraft state machine: applies committed entries through [`crate::apply::Applier`] and
//! builds/installs snapshots ([`super::snapshot`]).
//!
//! Snapshot policy and durability: building a snapshot first flushes sled, so every entry
//! at or below the snapshot's last log id is durable in the store before openraft may purge
//! the raft log up to it (DESIGN.md invariant "the raft log is purged only up to an index
//! whose applied state is durable").

use std::io::{self, Seek};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{RaftSnapshotBuilder, SnapshotMeta, StorageIOError, StoredMembership};

use super::snapshot;
use super::types::{Entry, LogId, MemberNode, NodeId, Response, StorageError, TypeConfig};
use crate::apply::Applier;
use crate::membership::Attributes;
use crate::mvcc::MvccStore;

/// The current MVCC store, swappable when a snapshot is installed. Readers take a clone of
/// the `Arc` per request and never hold the lock while reading.
pub struct SharedStore {
    store: RwLock<Arc<MvccStore>>,
}

impl SharedStore {
    /// Wraps the store opened at start-up.
    pub fn new(store: Arc<MvccStore>) -> SharedStore {
        SharedStore {
            store: RwLock::new(store),
        }
    }

    /// The store to read from now.
    pub fn get(&self) -> Arc<MvccStore> {
        self.store.read().expect("store lock").clone()
    }

    fn set(&self, store: Arc<MvccStore>) {
        *self.store.write().expect("store lock") = store;
    }
}

/// The raft state machine of one member.
pub struct StateMachine {
    applier: Applier,
    shared: Arc<SharedStore>,
    attributes: Arc<Attributes>,
    snap_dir: PathBuf,
    receiving: Option<PathBuf>,
    snapshot_seq: u64,
}

impl StateMachine {
    /// Creates the state machine over an opened applier; snapshots live in `snap_dir`.
    pub fn new(
        applier: Applier,
        shared: Arc<SharedStore>,
        attributes: Arc<Attributes>,
        snap_dir: PathBuf,
    ) -> StateMachine {
        StateMachine {
            applier,
            shared,
            attributes,
            snap_dir,
            receiving: None,
            snapshot_seq: 0,
        }
    }

    fn build_now(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let last = self.applier.last_applied();
        let err = |e: &dyn std::error::Error| -> StorageError { StorageIOError::write_snapshot(None, AnyErr::from(e)).into() };
        // Durable store first: the log may be purged up to `last` once this returns.
        self.applier.tree().flush().map_err(|e| err(&e))?;
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
        let path = snapshot::file_name(&self.snap_dir, &meta);
        tokio::task::block_in_place(|| snapshot::write(&path, &meta, self.applier.tree()))
            .map_err(|e| err(&e))?;
        snapshot::remove_others(&self.snap_dir, &path).map_err(|e| err(&e))?;
        let file = std::fs::File::open(&path).map_err(|e| err(&e))?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(tokio::fs::File::from_std(file)),
        })
    }

    /// Replaces the store with the snapshot in `file` (already complete and synced).
    fn install(&mut self, meta: &snapshot::Meta, mut file: std::fs::File) -> Result<(), StorageError> {
        let err = |e: &dyn std::error::Error| -> StorageError {
            StorageIOError::read_snapshot(Some(meta.signature()), AnyErr::from(e)).into()
        };
        let watch = self.applier.watch_hub().cloned();
        let tree = self.applier.tree().clone();
        tokio::task::block_in_place(|| -> io::Result<()> {
            // Verify the whole file before touching the store.
            snapshot::verify(&mut file)?;
            if let Some(hub) = &watch {
                // History reads from here on would see a half-replaced store.
                hub.begin_install();
            }
            tree.clear().map_err(io::Error::other)?;
            let mut batch = sled::Batch::default();
            let mut n = 0usize;
            snapshot::read_records(&mut file, |k, v| {
                batch.insert(k, v);
                n += 1;
                if n % 10_000 == 0 {
                    tree.apply_batch(std::mem::take(&mut batch)).map_err(io::Error::other)?;
                }
                Ok(())
            })?;
            tree.apply_batch(batch).map_err(io::Error::other)?;
            tree.flush().map_err(io::Error::other)?;
            Ok(())
        })
        .map_err(|e| err(&e))?;
        // Keep the installed snapshot as this member's current snapshot.
        let path = snapshot::file_name(&self.snap_dir, meta);
        let tmp = path.with_extension("tmp");
        file.seek(io::SeekFrom::Start(0)).map_err(|e| err(&e))?;
        let mut out = std::fs::File::create(&tmp).map_err(|e| err(&e))?;
        io::copy(&mut file, &mut out).map_err(|e| err(&e))?;
        out.sync_all().map_err(|e| err(&e))?;
        std::fs::rename(&tmp, &path).map_err(|e| err(&e))?;
        snapshot::remove_others(&self.snap_dir, &path).map_err(|e| err(&e))?;
        if let Some(r) = self.receiving.take() {
            let _ = std::fs::remove_file(r);
        }

        let store = Arc::new(MvccStore::open(tree.clone()).map_err(|e| err(&io::Error::other(e.to_string())))?);
        let attributes = Attributes::load(&tree).map_err(|e| err(&io::Error::other(e)))?;
        for id in meta.last_membership.membership().nodes().map(|(id, _)| *id) {
            if let Some(a) = attributes.get(id) {
                self.attributes.publish(a);
            }
        }
        let lessor = self.applier.lessor().clone();
        self.applier = Applier::open_with_lessor(tree, store.clone(), self.attributes.clone(), lessor)
            .map_err(|e| err(&io::Error::other(e)))?;
        self.shared.set(store);
        if let Some(hub) = watch {
            // Every watcher catches up from the new store (or is canceled as compacted).
            hub.finish_install();
            self.applier.set_watch_hub(hub);
        }
        Ok(())
    }
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

/// A snapshot built on the apply task (so it is consistent), handed to openraft.
pub struct SnapshotBuilder {
    built: Option<Result<Snapshot<TypeConfig>, StorageError>>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        self.built
            .take()
            .unwrap_or_else(|| Err(StorageIOError::write_snapshot(None, openraft::AnyError::error("snapshot already taken")).into()))
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId>, StoredMembership<NodeId, MemberNode>), StorageError> {
        Ok((self.applier.last_applied(), self.applier.membership().clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, StorageError>
    where
        I: IntoIterator<Item = Entry> + openraft::OptionalSend,
        I::IntoIter: openraft::OptionalSend,
    {
        entries.into_iter().map(|e| self.applier.apply(&e)).collect()
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        // openraft runs build_snapshot concurrently with apply; exporting here, on the apply
        // task, keeps the export consistent with its last log id.
        SnapshotBuilder {
            built: Some(self.build_now()),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<tokio::fs::File>, StorageError> {
        let path = self.snap_dir.join("receiving.tmp");
        let file = tokio::fs::File::create(&path)
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
        self.install(meta, file)
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let Some(path) = snapshot::latest(&self.snap_dir).map_err(|e| StorageIOError::read_snapshot(None, &e))? else {
            return Ok(None);
        };
        let mut file = std::fs::File::open(&path).map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        let meta = snapshot::read_meta(&mut file).map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        file.seek(io::SeekFrom::Start(0))
            .map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        Ok(Some(Snapshot {
            meta,
            snapshot: Box::new(tokio::fs::File::from_std(file)),
        }))
    }
}
