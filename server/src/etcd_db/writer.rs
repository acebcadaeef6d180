//! Writes a fresh etcd database file through bbolt-rs (with its `compat` feature: Go
//! bbolt's magic number, so Go's bbolt, `etcdctl` and `etcd` open the file).
//!
//! Usage: [`DbWriter::create`], then any of the `put_*` sections in any order, then
//! [`DbWriter::finish`] with the `meta` bucket. Each section is written in transactions of
//! at most [`BATCH_ENTRIES`] entries or [`BATCH_BYTES`] bytes, so memory stays bounded
//! whatever the size of the store. The file is built at `<dest>.part`; `finish` writes the
//! meta, syncs, truncates the file to the database size (bbolt grows files in 16 MiB steps;
//! etcd's own snapshot is `tx.WriteTo`, exactly `tx.Size()` bytes) and renames it to `dest`.
//! Dropping a writer before `finish` removes the partial file.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use bbolt_rs::{Bolt, BoltOptions, BucketRwApi, DbApi, DbRwAPI, TxApi, TxRwApi, TxRwRefApi};
use keel_proto::authpb::{Role, User};
use keel_proto::etcdserverpb::AlarmMember;
use keel_proto::leasepb::Lease;
use prost::Message;

use super::model::{AuthMeta, Cluster, Member, Meta, MvccRecord};
use super::schema;
use super::{EtcdDbError, Result};

/// Most entries in one write transaction (etcd's defrag copies in 10,000-key transactions,
/// `defragLimit`).
pub const BATCH_ENTRIES: usize = 10_000;
/// Most key + value bytes in one write transaction.
pub const BATCH_BYTES: usize = 16 << 20;
/// Page size of written files: etcd's (`os.Getpagesize()` on x86-64 Linux).
pub const PAGE_SIZE: usize = 4096;
/// Buckets are filled completely: each is written in key order, and etcd only ever
/// appends to the `key` bucket, so full pages are never split again by inserts.
const FILL_PERCENT: f64 = 1.0;

/// The file a writer builds before renaming it to `dest`.
pub(super) fn part_path(dest: &Path) -> PathBuf {
    let mut s = dest.as_os_str().to_owned();
    s.push(".part");
    PathBuf::from(s)
}

/// fsyncs the directory holding `path`, so a rename into it is durable.
pub(super) fn sync_parent(path: &Path) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

/// Streams an etcd database into a new file (see the module docs).
pub struct DbWriter {
    /// `None` once closed by `finish`.
    db: Option<Bolt>,
    part: PathBuf,
    dest: PathBuf,
    /// The `key` bucket key of the last record written (records must increase).
    last_record: Option<Vec<u8>>,
}

/// What [`DbWriter::finish`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// The database file.
    pub path: PathBuf,
    /// Its size in bytes (a multiple of [`PAGE_SIZE`]).
    pub size: u64,
}

impl DbWriter {
    /// Starts a database that will be renamed to `dest`, with every bucket of etcd's schema
    /// ([`schema::ALL_BUCKETS`]) created, empty.
    pub fn create(dest: impl AsRef<Path>) -> Result<DbWriter> {
        let dest = dest.as_ref().to_path_buf();
        let part = part_path(&dest);
        match fs::remove_file(&part) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
        // No fsync per transaction: the file is synced once in `finish`, and a crash
        // before that leaves only a `.part` file, never `dest`.
        let mut db = BoltOptions::builder()
            .page_size(PAGE_SIZE)
            .no_sync()
            .build()
            .open(&part)?;
        db.update(|mut tx| {
            for b in schema::ALL_BUCKETS {
                tx.create_bucket_if_not_exists(b)?;
            }
            Ok(())
        })?;
        Ok(DbWriter {
            db: Some(db),
            part,
            dest,
            last_record: None,
        })
    }

    /// Appends MVCC records to the `key` bucket. Records must come in strictly increasing
    /// revision order, across calls too ([`EtcdDbError::OutOfOrder`] otherwise); values are
    /// written as given. Returns the number written.
    pub fn put_records<I, E>(&mut self, records: I) -> Result<u64>
    where
        I: IntoIterator<Item = std::result::Result<MvccRecord, E>>,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let mut last = self.last_record.take();
        let entries = records.into_iter().map(|r| {
            let r = r.map_err(|e| EtcdDbError::Source(e.into()))?;
            let key = r.etcd_key();
            if let Some(prev) = &last
                && key <= *prev
            {
                return Err(EtcdDbError::OutOfOrder {
                    prev: describe_rev_key(prev),
                    next: describe_rev_key(&key),
                });
            }
            last = Some(key.clone());
            Ok((key, r.value))
        });
        let n = self.put_batched(schema::KEY, entries);
        self.last_record = last;
        n
    }

    /// Writes leases to the `lease` bucket (`leasepb.Lease` keyed by the ID).
    pub fn put_leases<I>(&mut self, leases: I) -> Result<u64>
    where
        I: IntoIterator<Item = Lease>,
    {
        let entries = leases
            .into_iter()
            .map(|l| Ok((schema::lease_key(l.id).to_vec(), l.encode_to_vec())));
        self.put_batched(schema::LEASE, entries)
    }

    /// Writes the `members` and `members_removed` buckets.
    pub fn put_members(&mut self, members: &[Member], removed: &[u64]) -> Result<()> {
        let current = members.iter().map(|m| {
            let json = serde_json::to_vec(m).expect("a Member always serializes");
            Ok((schema::member_key(m.id), json))
        });
        self.put_batched(schema::MEMBERS, current)?;
        let gone = removed
            .iter()
            .map(|id| Ok((schema::member_key(*id), schema::REMOVED.to_vec())));
        self.put_batched(schema::MEMBERS_REMOVED, gone)?;
        Ok(())
    }

    /// Writes the `cluster` bucket (absent values are not written).
    pub fn put_cluster(&mut self, cluster: &Cluster) -> Result<()> {
        let mut entries = Vec::new();
        if let Some(v) = &cluster.cluster_version {
            entries.push(Ok((
                schema::CLUSTER_VERSION.to_vec(),
                v.as_bytes().to_vec(),
            )));
        }
        if let Some(d) = &cluster.downgrade {
            let json = serde_json::to_vec(d).expect("DowngradeInfo always serializes");
            entries.push(Ok((schema::DOWNGRADE.to_vec(), json)));
        }
        self.put_batched(schema::CLUSTER, entries).map(drop)
    }

    /// Writes active alarms to the `alarm` bucket (the key is the `AlarmMember`, the value
    /// empty).
    pub fn put_alarms(&mut self, alarms: &[AlarmMember]) -> Result<()> {
        let entries = alarms.iter().map(|a| Ok((a.encode_to_vec(), Vec::new())));
        self.put_batched(schema::ALARM, entries).map(drop)
    }

    /// Writes the `auth`, `authUsers` and `authRoles` buckets.
    pub fn put_auth<U, R>(&mut self, auth: &AuthMeta, users: U, roles: R) -> Result<()>
    where
        U: IntoIterator<Item = User>,
        R: IntoIterator<Item = Role>,
    {
        let flags = [
            Ok((
                schema::AUTH_ENABLED.to_vec(),
                schema::auth_enabled_value(auth.enabled).to_vec(),
            )),
            Ok((
                schema::AUTH_REVISION.to_vec(),
                auth.revision.to_be_bytes().to_vec(),
            )),
        ];
        self.put_batched(schema::AUTH, flags)?;
        let users = users
            .into_iter()
            .map(|u| Ok((u.name.clone(), u.encode_to_vec())));
        self.put_batched(schema::AUTH_USERS, users)?;
        let roles = roles
            .into_iter()
            .map(|r| Ok((r.name.clone(), r.encode_to_vec())));
        self.put_batched(schema::AUTH_ROLES, roles)?;
        Ok(())
    }

    /// Writes the `meta` bucket, then makes the file durable at `dest` (see the module docs).
    pub fn finish(mut self, meta: &Meta) -> Result<Written> {
        self.put_batched(schema::META, meta_entries(meta))?;
        let mut db = self.db.take().expect("finish runs once");
        let size = db.begin()?.size();
        db.sync()?;
        db.close();
        let f = fs::OpenOptions::new().write(true).open(&self.part)?;
        assert!(
            f.metadata()?.len() >= size,
            "bbolt file is smaller than its database"
        );
        f.set_len(size)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&self.part, &self.dest)?;
        sync_parent(&self.dest)?;
        Ok(Written {
            path: self.dest.clone(),
            size,
        })
    }

    /// Puts `entries` into `bucket`, committing every [`BATCH_ENTRIES`] entries or
    /// [`BATCH_BYTES`] bytes.
    fn put_batched<I>(&mut self, bucket: &str, entries: I) -> Result<u64>
    where
        I: IntoIterator<Item = Result<(Vec<u8>, Vec<u8>)>>,
    {
        let db = self.db.as_mut().expect("writer is open");
        let mut entries = entries.into_iter().peekable();
        let mut written = 0u64;
        while entries.peek().is_some() {
            let mut tx = db.begin_rw()?;
            {
                let mut b = tx
                    .bucket_mut(bucket)
                    .expect("create() made every bucket of the schema");
                b.set_fill_percent(FILL_PERCENT);
                let (mut n, mut bytes) = (0usize, 0usize);
                while n < BATCH_ENTRIES && bytes < BATCH_BYTES {
                    let Some(e) = entries.next() else { break };
                    let (k, v) = e?;
                    bytes += k.len() + v.len();
                    b.put(k, v)?;
                    n += 1;
                }
                written += n as u64;
            }
            tx.commit()?;
        }
        Ok(written)
    }
}

impl Drop for DbWriter {
    fn drop(&mut self) {
        if let Some(db) = self.db.take() {
            db.close();
            let _ = fs::remove_file(&self.part);
        }
    }
}

/// The `meta` entries of `meta`, encoded as etcd writes them (absent values skipped).
fn meta_entries(meta: &Meta) -> Vec<Result<(Vec<u8>, Vec<u8>)>> {
    let mut e = Vec::new();
    let mut put = |k: &[u8], v: Vec<u8>| e.push(Ok((k.to_vec(), v)));
    if meta.consistent_index > 0 {
        put(
            schema::CONSISTENT_INDEX,
            meta.consistent_index.to_be_bytes().to_vec(),
        );
    }
    if meta.term > 0 {
        put(schema::TERM, meta.term.to_be_bytes().to_vec());
    }
    if let Some(cs) = &meta.conf_state {
        put(
            schema::CONF_STATE,
            serde_json::to_vec(cs).expect("ConfState always serializes"),
        );
    }
    if let Some(rev) = meta.scheduled_compact_rev {
        put(schema::SCHEDULED_COMPACT, schema::compact_rev_value(rev));
    }
    if let Some(rev) = meta.finished_compact_rev {
        put(schema::FINISHED_COMPACT, schema::compact_rev_value(rev));
    }
    if let Some(v) = &meta.storage_version {
        put(schema::STORAGE_VERSION, v.as_bytes().to_vec());
    }
    e
}

/// `main_sub` (with `t` for a tombstone) of a `key` bucket key, for error messages.
fn describe_rev_key(k: &[u8]) -> String {
    match schema::parse_rev_key(k) {
        Some((rev, tomb)) => format!("{rev}{}", if tomb { "t" } else { "" }),
        None => k.escape_ascii().to_string(),
    }
}
