//! `keelutl snapshot restore`: an etcd database (an etcd or a Keel snapshot, or a raw
//! `member/snap/db`) into the member tree of a new Keel data dir, the way in from etcd.
//!
//! What is kept (etcd `etcdutl snapshot restore` keeps the same): every MVCC record with its
//! bytes (so create/mod revision, version and lease of every key), the compact revision, the
//! leases, the raised alarms, the auth flags, revision, users and roles. What is not: the
//! file's members, consistent index and raft state. The new member has no raft log and no
//! consistent index; its first start with `--initial-cluster-state new` and the same
//! `--initial-cluster` bootstraps the cluster, and apply continues from the restored
//! revision (the MVCC store rebuilds its index from the records on open).
//!
//! `--bump-revision N --mark-compacted` (etcdutl 3.6, for Kubernetes restores): the store's
//! revision becomes `latest + N` and a compaction at that revision is recorded, so every
//! watcher resuming below it is told its revision is compacted. A file bumped by etcdutl
//! holds an empty-valued placeholder record at `(latest + N, 0)`: it is read the same way.

use std::path::Path;

use keel_proto::etcdserverpb::AlarmMember;
use prost::Message;

use super::BackupError;
use crate::backend::{Backend, Batch, schema};
use crate::etcd_db::{EtcdDb, HashCheck};
use crate::lease::record::{self as lease_record, LeaseRecord};

/// Records per sled batch while restoring.
const BATCH: usize = 10_000;

/// What [`restore`] does beyond copying.
#[derive(Debug, Clone, Copy, Default)]
pub struct RestoreOptions {
    /// Accept a file without its trailing sha256 (`--skip-hash-check`).
    pub skip_hash_check: bool,
    /// `--bump-revision N`: raise the revision by N (needs `mark_compacted`).
    pub bump_revision: u64,
    /// `--mark-compacted`: record a compaction at the (bumped) revision.
    pub mark_compacted: bool,
}

/// What [`restore`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restored {
    /// MVCC records copied.
    pub records: u64,
    /// The store revision the member starts at.
    pub revision: i64,
    /// The compact revision (0: none).
    pub compact_revision: i64,
    /// Leases copied.
    pub leases: u64,
    /// Users copied.
    pub users: usize,
    /// Roles copied.
    pub roles: usize,
}

/// Why the options cannot be used (before anything is written).
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// `--bump-revision` without `--mark-compacted`.
    #[error("--bump-revision requires --mark-compacted: Keel has no placeholder revisions")]
    BumpNeedsMarkCompacted,
    /// The target already holds a store.
    #[error("data-dir {0:?} exists")]
    Exists(String),
    /// Reading or writing failed.
    #[error(transparent)]
    Backup(#[from] BackupError),
}

/// Restores the etcd database `file` into a new store in `db_dir` (the member's
/// `member/db`), calling `progress(entries)` as entries are written. The store is flushed
/// before this returns.
///
/// Errors: bad options, an existing `db_dir`, an unreadable or damaged file (etcd's texts for
/// a missing or wrong hash), or I/O.
pub fn restore(
    file: &Path,
    db_dir: &Path,
    opts: RestoreOptions,
    progress: &dyn Fn(u64),
) -> Result<Restored, RestoreError> {
    if opts.bump_revision > 0 && !opts.mark_compacted {
        return Err(RestoreError::BumpNeedsMarkCompacted);
    }
    if db_dir.exists() {
        return Err(RestoreError::Exists(db_dir.display().to_string()));
    }
    let check = if opts.skip_hash_check {
        HashCheck::Skip
    } else {
        HashCheck::Verify
    };
    let db = EtcdDb::open(file, check).map_err(BackupError::from)?;
    let backend = Backend::open(db_dir).map_err(BackupError::from)?;
    let tree = backend.tree();
    let mut out = Restored {
        records: 0,
        revision: 1,
        compact_revision: 0,
        leases: 0,
        users: 0,
        roles: 0,
    };
    let mut batch = Batch::default();
    let flush = |batch: &mut Batch, force: bool| -> Result<(), BackupError> {
        if force || batch.len() >= BATCH {
            let n = batch.len() as u64;
            std::mem::take(batch).commit(tree)?;
            progress(n);
        }
        Ok(())
    };
    let mut placeholder = 0i64;
    for r in db.records().map_err(BackupError::from)? {
        let r = r.map_err(BackupError::from)?;
        out.revision = out.revision.max(r.rev.main);
        if !r.tombstone && r.value.is_empty() {
            // etcdutl's bump placeholder: it marks a revision, it is not a key.
            placeholder = placeholder.max(r.rev.main);
            continue;
        }
        batch.insert(r.keel_key(), r.value);
        out.records += 1;
        flush(&mut batch, false)?;
    }
    let mut compact = db.meta().map_err(BackupError::from)?.compact_revision();
    out.revision = out.revision.max(compact);
    if placeholder > 0 {
        compact = compact.max(placeholder);
    }
    if opts.bump_revision > 0 {
        out.revision += opts.bump_revision as i64;
        compact = out.revision;
    }
    if compact > 0 {
        // mvcc's meta: the compact revision as i64 BE (backend::schema).
        batch.insert(schema::MVCC_COMPACT, compact.to_be_bytes().to_vec());
        out.compact_revision = compact;
    }
    for l in db.leases().map_err(BackupError::from)? {
        let l = l.map_err(BackupError::from)?;
        let rec = LeaseRecord {
            id: l.id,
            ttl: l.ttl,
            remaining_ttl: l.remaining_ttl,
        };
        lease_record::stage_put(&mut batch, &rec);
        out.leases += 1;
        flush(&mut batch, false)?;
    }
    for AlarmMember { member_id, alarm } in db.alarms().map_err(BackupError::from)? {
        let mut key = schema::id_key(schema::ALARM_PREFIX, member_id.to_be_bytes());
        key.extend_from_slice(&alarm.to_be_bytes());
        batch.insert(key, Vec::<u8>::new());
    }
    // Auth (issue 12's keys, bytes as etcd stores them).
    let users = db.users().map_err(BackupError::from)?;
    let roles = db.roles().map_err(BackupError::from)?;
    let auth = db.auth_meta().map_err(BackupError::from)?;
    if !users.is_empty() || !roles.is_empty() || auth.enabled {
        batch.insert(schema::AUTH_FORMAT, 1u64.to_be_bytes().to_vec());
        batch.insert(schema::AUTH_ENABLED, vec![u8::from(auth.enabled)]);
        batch.insert(
            schema::AUTH_REVISION,
            auth.revision.max(1).to_be_bytes().to_vec(),
        );
        for u in &users {
            let mut key = schema::AUTH_USER_PREFIX.to_vec();
            key.extend_from_slice(&u.name);
            batch.insert(key, u.encode_to_vec());
        }
        for r in &roles {
            let mut key = schema::AUTH_ROLE_PREFIX.to_vec();
            key.extend_from_slice(&r.name);
            batch.insert(key, r.encode_to_vec());
        }
    }
    out.users = users.len();
    out.roles = roles.len();
    flush(&mut batch, true)?;
    backend.flush().map_err(BackupError::from)?;
    Ok(out)
}

/// Rewrites the store in `db_dir` into a fresh sled database (`keelutl defrag`, offline): a
/// copy of every tree, then a swap of the directories, so the file shrinks to the live data.
/// Crash safety: the copy is built in `<db_dir>.defrag`; the swap renames `db_dir` to
/// `<db_dir>.old`, the copy to `db_dir`, then removes the old one. A run that finds
/// `<db_dir>.old` without `db_dir` (a crash inside the swap) first puts it back.
///
/// Returns the sizes on disk before and after. Errors: sled or file system I/O.
pub fn defrag(db_dir: &Path, progress: &dyn Fn(u64)) -> Result<(u64, u64), BackupError> {
    let with = |ext: &str| db_dir.with_extension(ext);
    let (copy_dir, old_dir) = (with("defrag"), with("old"));
    if !db_dir.exists() && old_dir.exists() {
        std::fs::rename(&old_dir, db_dir)?;
    }
    if copy_dir.exists() {
        std::fs::remove_dir_all(&copy_dir)?;
    }
    let before;
    {
        let src = sled::open(db_dir)?;
        before = src.size_on_disk()?;
        let dst = sled::open(&copy_dir)?;
        for name in src.tree_names() {
            let (from, to) = (src.open_tree(&name)?, dst.open_tree(&name)?);
            let mut batch = sled::Batch::default();
            let mut n = 0;
            for kv in from.iter() {
                let (k, v) = kv?;
                batch.insert(k, v);
                n += 1;
                if n == BATCH {
                    to.apply_batch(std::mem::take(&mut batch))?;
                    progress(n as u64);
                    n = 0;
                }
            }
            to.apply_batch(batch)?;
            progress(n as u64);
        }
        dst.flush()?;
    }
    if old_dir.exists() {
        std::fs::remove_dir_all(&old_dir)?;
    }
    // A member's `db` is a link to its generation (backend/generation.rs): the copy
    // replaces the link, the generation it named goes too (the next start links the copy).
    let generation = std::fs::read_link(db_dir)
        .ok()
        .map(|t| db_dir.parent().unwrap_or(Path::new(".")).join(t));
    std::fs::rename(db_dir, &old_dir)?;
    std::fs::rename(&copy_dir, db_dir)?;
    std::fs::remove_dir_all(&old_dir)?;
    if let Some(g) = generation {
        std::fs::remove_dir_all(g)?;
    }
    let after = sled::open(db_dir)?.size_on_disk()?;
    Ok((before, after))
}
