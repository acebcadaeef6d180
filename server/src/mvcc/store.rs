//! [`MvccStore`]: the published view for readers, and the entry point of the single writer.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use keel_proto::etcdserverpb::range_request::SortTarget;
use keel_proto::etcdserverpb::{RangeRequest, RangeResponse, TxnRequest, TxnResponse};
use keel_proto::mvccpb::{Event, KeyValue};

use super::MvccError;
use super::codec::{self, FORMAT_VERSION};
use super::compactor::{CompactHash, Compactor, INLINE_REMOVALS, Job};
use super::hash::{self, HashKv};
use super::index::{Index, KeyRange};
use super::key_index::RevInfo;
use super::range::{ReadView, ValueSource};
use super::rebuild;
use super::revision::record_key;
use super::staged::Staged;
use super::unpersisted::{Commit, PersistPolicy, Persister};
use super::write_txn::WriteTxn;
use crate::backend::LiveTree;
use crate::backend::schema::{MVCC_COMPACT, MVCC_FORMAT};
use crate::error::EtcdError;

/// One immutable state of the store, shared by every reader that started while it was
/// current.
#[derive(Debug)]
pub(crate) struct View {
    /// The key index as of `rev`.
    pub index: Index,
    /// Store revision (1 on a fresh store).
    pub rev: i64,
    /// Compact revision; -1 until the first compaction (etcd's `compactMainRev`).
    pub compact_rev: i64,
}

/// Sizes of the key index, for metrics and docs/mvcc.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexStats {
    /// Keys in the index (live ones and deleted ones not yet compacted away).
    pub keys: usize,
    /// Keys that exist at the current revision.
    pub live_keys: usize,
    /// Index blocks.
    pub blocks: usize,
    /// Approximate heap bytes of the index.
    pub heap_bytes: usize,
}

/// etcd's MVCC key-value store over one sled tree (shared with other modules, which use
/// other key prefixes).
///
/// Concurrency: `Send + Sync`, shared through `Arc`. Readers ([`MvccStore::range`],
/// [`MvccStore::hash_kv`], ...) take the current view (an `Arc` clone under a read lock held
/// for nanoseconds) and then work without any lock, reading values from the overlay of
/// published groups not yet in sled, else from sled. The apply loop is the only writer
/// ([`MvccStore::write`]); it publishes a new view after each apply group, and its sled
/// writes go to sled by the [`PersistPolicy`] (unpersisted.rs). A reader whose revision is
/// compacted away while it reads gets [`EtcdError::Compacted`], never a partial answer.
/// Lock order: `staged`, then the persister's (unpersisted.rs); `view` alone; the only
/// lock held across sled I/O is the persister's `committing`.
///
/// Invariants:
/// - the published view's index describes exactly the records in the overlay or in sled
///   at or below its revision (a group's records join the overlay, or reach sled, before
///   the view that references them is published; they leave the overlay only once in sled);
/// - anything that reads sled directly (HashKV, watch catch-up, exports) first commits
///   the pending groups ([`MvccStore::persist`]), after taking its view;
/// - `compact_floor` ≥ the compact revision of any batch already applied to sled, so a
///   reader that misses a record can tell a compaction from corruption; a group with a
///   compaction goes to sled at once, with everything pending before it.
#[derive(Debug)]
pub struct MvccStore {
    /// The member tree of the current database generation (an online defragment switches it).
    pub(super) tree: LiveTree,
    view: RwLock<Arc<View>>,
    /// The apply group: committed txns not yet published (see staged.rs).
    staged: Mutex<Staged>,
    /// Published groups' sled writes not yet in sled, and their records for readers (see
    /// unpersisted.rs).
    persister: Arc<Persister>,
    /// Wakes the background committer (when the policy has one).
    wake: Mutex<Option<SyncSender<()>>>,
    writer_active: AtomicBool,
    /// Highest compact revision whose record removals may already be in sled. Raised
    /// before a compaction batch is applied.
    pub(super) compact_floor: Arc<AtomicI64>,
    /// Removes compacted records that did not fit in the compaction's own batch.
    pub(super) compactor: Compactor,
    /// Records a compaction removes in its own batch ([`INLINE_REMOVALS`]; tests lower it).
    pub(super) inline_removals: AtomicUsize,
    /// Whether the compactor hashes each compaction revision ([`MvccStore::set_compact_hashing`]).
    compact_hashing: AtomicBool,
}

impl MvccStore {
    /// Opens the store on `tree`: checks the format version (writing it on a fresh tree),
    /// loads the compact revision, rebuilds the key index once (in parallel on 2 threads),
    /// compacts it at the compact revision, and hands records a previous run had not yet
    /// removed to the background compactor.
    ///
    /// Errors: sled I/O, an unknown format version, a corrupt record, or no thread for the
    /// compactor.
    pub fn open(tree: sled::Tree) -> Result<MvccStore, MvccError> {
        MvccStore::open_live(LiveTree::fixed(tree))
    }

    /// [`MvccStore::open`] on the current generation of `live`, following it when an online
    /// defragment switches generations (the member's store).
    ///
    /// Errors: as [`MvccStore::open`].
    pub fn open_live(live: LiveTree) -> Result<MvccStore, MvccError> {
        let tree = live.tree();
        match tree.get(MVCC_FORMAT)? {
            Some(v) => {
                let found = codec::decode_i64(MVCC_FORMAT, &v)? as u64;
                if found != FORMAT_VERSION {
                    return Err(MvccError::Format {
                        found,
                        supported: FORMAT_VERSION,
                    });
                }
            }
            None => {
                tree.insert(MVCC_FORMAT, &codec::encode_i64(FORMAT_VERSION as i64))?;
            }
        }
        let compact_rev = match tree.get(MVCC_COMPACT)? {
            Some(v) => codec::decode_i64(MVCC_COMPACT, &v)?,
            None => -1,
        };
        let mut rebuilt = rebuild::rebuild(&tree)?;
        // etcd: a fresh store is at revision 1; after a compaction that removed the newest
        // records the compact revision still bounds the current revision from below.
        let rev = rebuilt.max_main.max(compact_rev).max(1);
        // Records of the last compaction that were not removed yet (see compactor.rs).
        let mut leftovers = Vec::new();
        if compact_rev >= 0 {
            rebuilt.index.compact(compact_rev, &mut leftovers);
        }
        let mut records: Vec<_> = leftovers
            .iter()
            .map(|r| (r.revision(), r.tombstone))
            .collect();
        records.sort_unstable();
        let physical = if records.is_empty() { compact_rev } else { -1 };
        let compact_floor = Arc::new(AtomicI64::new(compact_rev));
        let compactor = Compactor::start(live.clone(), physical, compact_floor.clone())
            .map_err(MvccError::Thread)?;
        tracing::info!(
            records = rebuilt.records,
            scan_ms = rebuilt.times[0].as_millis() as u64,
            sort_ms = rebuilt.times[1].as_millis() as u64,
            build_ms = rebuilt.times[2].as_millis() as u64,
            keys = rebuilt.index.keys(),
            revision = rev,
            compact_revision = compact_rev,
            leftover_records = records.len(),
            "mvcc: key index rebuilt"
        );
        if !records.is_empty() {
            compactor.submit(Job {
                revision: compact_rev,
                records,
                hash: None,
            });
        }
        Ok(MvccStore {
            persister: Arc::new(Persister::new(live.clone())),
            wake: Mutex::new(None),
            tree: live,
            view: RwLock::new(Arc::new(View {
                index: rebuilt.index,
                rev,
                compact_rev,
            })),
            staged: Mutex::new(Staged::default()),
            writer_active: AtomicBool::new(false),
            compact_floor,
            compactor,
            inline_removals: AtomicUsize::new(INLINE_REMOVALS),
            compact_hashing: AtomicBool::new(false),
        })
    }

    /// The member tree this store reads and writes, across database generations.
    pub fn live_tree(&self) -> &LiveTree {
        &self.tree
    }

    /// Holds the background compactor between two removal batches until the guard drops
    /// (with apply paused, nothing then writes the tree: an online defragment's switch).
    /// Blocking: call off the async runtime.
    pub fn pause_removals(&self) -> std::sync::RwLockWriteGuard<'static, ()> {
        super::compactor::REBUILD_GATE
            .write()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The current view (a cheap `Arc` clone).
    pub(crate) fn view(&self) -> Arc<View> {
        self.view.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Makes `view` the one new readers see.
    pub(super) fn publish(&self, new: Arc<View>) {
        let old = std::mem::replace(
            &mut *self.view.write().unwrap_or_else(|e| e.into_inner()),
            new,
        );
        // The old view (and any blocks only it holds) is freed here, outside the lock,
        // unless a reader still uses it.
        drop(old);
    }

    /// The store revision: 1 on a fresh store, +1 per applied entry that changed a key.
    pub fn current_revision(&self) -> i64 {
        self.view().rev
    }

    /// The revision of the last compaction, 0 if the store was never compacted.
    pub fn compact_revision(&self) -> i64 {
        self.view().compact_rev.max(0)
    }

    /// The compact revision as etcd keeps it (`compactMainRev`): -1 until the first
    /// compaction. Watch compares a start revision with this (a negative start below it is
    /// canceled as compacted, with this value as `compact_revision`).
    pub fn compact_main_revision(&self) -> i64 {
        self.view().compact_rev
    }

    /// The revision up to which compacted records are removed from sled (-1 if unknown).
    /// Reads never depend on it: the index forgets compacted revisions at once.
    pub fn physical_compact_revision(&self) -> i64 {
        self.compactor.physical_revision()
    }

    /// Blocks until the records of compactions up to `revision` are removed from sled, or
    /// `timeout` passes (returns false). etcd's `CompactionRequest.physical`: call it (off
    /// the async runtime) after the compaction entry is applied.
    pub fn wait_physical_compaction(&self, revision: i64, timeout: Duration) -> bool {
        self.compactor.wait(revision, timeout)
    }

    /// Turns compaction hashes on or off (etcd's `hashStorage`; the compact-hash corruption
    /// check, `cluster::compact_hash`). Turning them on also hashes the current compaction
    /// revision, in the background, so a restarted member has its newest hash again.
    pub fn set_compact_hashing(&self, on: bool) {
        let was = self.compact_hashing.swap(on, Ordering::AcqRel);
        let view = self.view();
        if on && !was && view.compact_rev >= 0 {
            self.compactor.submit(Job {
                revision: view.compact_rev,
                records: Vec::new(),
                hash: Some(view),
            });
        }
    }

    /// Whether compaction hashes are on.
    pub fn compact_hashing(&self) -> bool {
        self.compact_hashing.load(Ordering::Acquire)
    }

    /// The last compaction hashes ([`super::COMPACT_HASHES_KEPT`] at most), newest first.
    pub fn compact_hashes(&self) -> Vec<CompactHash> {
        self.compactor.hashes()
    }

    /// HashKV at compaction revision `revision`: the kept hash, else computed now (possible
    /// while the store still holds `revision`), as etcd's `HashByRev`. The [`HashKv`] carries
    /// the store's current compact and current revisions.
    ///
    /// Errors: as [`MvccStore::hash_kv`] when nothing is kept for `revision`.
    pub fn hash_at_compaction(&self, revision: i64) -> Result<HashKv, EtcdError> {
        let kept = self
            .compact_hashes()
            .into_iter()
            .find(|h| h.revision == revision);
        match kept {
            Some(h) => {
                let view = self.view();
                Ok(HashKv {
                    hash: h.hash,
                    compact_revision: view.compact_rev,
                    hash_revision: revision,
                    current_revision: view.rev,
                })
            }
            None => self.hash_kv(revision),
        }
    }

    /// Lowers the number of records a compaction removes in its own batch, so tests reach
    /// the background path with small stores.
    #[cfg(test)]
    pub(super) fn set_inline_removals(&self, n: usize) {
        self.inline_removals.store(n, Ordering::Relaxed);
    }

    /// Serves an etcd `RangeRequest` at the current view: every field except
    /// `serializable` (a concern of the API layer). The response header holds only
    /// `revision` (the current revision); the API fills the member fields.
    ///
    /// Errors: `FutureRev` (`revision` > current), `Compacted` (`revision` < compact
    /// revision, also when a compaction removes the needed records during the read),
    /// `Internal` on storage failure.
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse, EtcdError> {
        let view = self.view();
        self.read_view(&view).range(req)
    }

    /// How many keys [`MvccStore::range`] reads for `req`, from the index's cached counts at
    /// the current revision (no value is read): the keys in the range, capped by `limit`
    /// unless the results are sorted by value (then every value is read); 0 for `count_only`;
    /// 1 for a single key, looked up or not.
    /// A hint of how long the range takes (the API reads big ranges through
    /// [`crate::heavy::run`]).
    pub fn range_reads(&self, req: &RangeRequest) -> usize {
        if req.count_only {
            return 0;
        }
        let range = KeyRange::from_request(&req.key, &req.range_end);
        if let KeyRange::Single(_) = range {
            return 1; // an upper bound, without a lookup
        }
        let view = self.view();
        let keys = view.index.count(&range, view.rev);
        // Sorting by value reads every value first (with any `sort_order`: etcd sorts a
        // non-KEY target ascending even with NONE).
        let by_value = req.sort_target == SortTarget::Value as i32;
        match usize::try_from(req.limit) {
            Ok(limit) if limit > 0 && !by_value => keys.min(limit),
            _ => keys,
        }
    }

    /// How many keys the ranges of read-only txn `req` read ([`MvccStore::range_reads`]),
    /// over both branches and nested txns (one branch runs: an upper bound).
    pub fn txn_reads(&self, req: &TxnRequest) -> usize {
        use keel_proto::etcdserverpb::request_op::Request as Op;
        super::txn_ops(req)
            .map(|op| match op {
                Op::RequestRange(r) => self.range_reads(r),
                _ => 0,
            })
            .sum()
    }

    /// Evaluates read-only txn `req` ([`super::is_txn_read_only`]) at the current view: the
    /// compares and every range at one revision, which no apply can change meanwhile (the
    /// view is immutable). The response is the one apply would give for `req` at that
    /// revision; its header holds only `revision`, the API fills the member fields.
    ///
    /// Errors: `FutureRev` / `Compacted` (a range op at such a revision, or compacted during
    /// the read), `Internal` if `req` writes or on storage failure.
    pub fn txn_read_only(&self, req: &TxnRequest) -> Result<TxnResponse, EtcdError> {
        let view = self.view();
        super::txn::read_only(&self.read_view(&view), req)
    }

    /// One chunk of a `RangeStream` at the current view (`ReadView::chunk`):
    /// up to `limit` kvs of `req`'s range at `req.revision`, and whether keys remain.
    ///
    /// Errors: as [`MvccStore::range`].
    pub fn range_chunk(
        &self,
        req: &RangeRequest,
        limit: usize,
    ) -> Result<(Vec<KeyValue>, bool), EtcdError> {
        let view = self.view();
        self.read_view(&view).chunk(req, limit)
    }

    /// etcd `HashKV` at `revision` (0 = current). See [`HashKv`] for what is hashed.
    ///
    /// Errors: `FutureRev`, `Compacted` (revision below the compact revision, or compacted
    /// during the computation), `Internal` on storage failure.
    pub fn hash_kv(&self, revision: i64) -> Result<HashKv, EtcdError> {
        let view = self.view();
        self.persist_for_read()?;
        let generation = self.tree.get();
        hash::hash_kv(&view, generation.tree(), &self.compact_floor, revision)
    }

    /// Begins the write view for one committed raft entry. Only the apply loop calls this,
    /// one at a time.
    ///
    /// Panics if another [`WriteTxn`] is still open: two writers would each publish a view
    /// missing the other's changes.
    pub fn write(&self) -> WriteTxn<'_> {
        let busy = self.writer_active.swap(true, Ordering::AcqRel);
        assert!(
            !busy,
            "mvcc: a second WriteTxn began while one is open (one writer only)"
        );
        let published = self.view();
        // The txn owns the staged view while it runs (it is the only holder), so it can change
        // the index in place instead of copying every block an earlier txn of the group
        // already copied. It gives the view back when it is staged or dropped.
        match self.staged().view.take() {
            Some(staged) => WriteTxn::begin(self, staged, published.rev, true),
            None => WriteTxn::begin(self, published.clone(), published.rev, false),
        }
    }

    /// The apply group (only the single writer uses it).
    pub(super) fn staged(&self) -> MutexGuard<'_, Staged> {
        self.staged.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The revision after every staged txn (the published revision when none is staged).
    pub fn staged_revision(&self) -> i64 {
        match &self.staged().view {
            Some(v) => v.rev,
            None => self.current_revision(),
        }
    }

    /// Publishes every staged txn as ONE group: adds the group's sled writes to the
    /// unpersisted batch (committed now if the [`PersistPolicy`] says so, or if the group
    /// compacts), publishes the last staged view and hands staged compaction removals to the
    /// compactor. Returns the group's changes, `(revision, events)` in revision order, for
    /// watchers. A no-op (returning nothing) when nothing is staged. Only the apply loop
    /// calls it, with no [`WriteTxn`] open.
    ///
    /// Errors: sled I/O, or an abandoned group; then nothing is published (the member must
    /// stop: its applied state is behind what it acknowledged to the group).
    pub fn flush(&self) -> Result<Vec<(i64, Vec<Event>)>, MvccError> {
        let mut group = {
            let mut staged = self.staged();
            if staged.is_empty() {
                return Ok(Vec::new());
            }
            if let Some(why) = &staged.abandoned {
                return Err(MvccError::Abandoned(why.clone()));
            }
            std::mem::take(&mut *staged)
        };
        let commit = self.persister.push(std::mem::take(&mut group.batch))?;
        // A compaction's removals must not reach sled before the records they remove, nor
        // its jobs run before them: everything pending goes now, from here.
        let compacts = group.compact_floor.is_some() || !group.jobs.is_empty();
        if compacts {
            // Before the removals reach sled, so a reader that misses a record knows why.
            if let Some(floor) = group.compact_floor {
                self.compact_floor.fetch_max(floor, Ordering::AcqRel);
            }
            self.persister.commit()?;
        } else if commit != Commit::Later {
            match (
                &*self.wake.lock().unwrap_or_else(|e| e.into_inner()),
                commit,
            ) {
                // Full: a wake is queued already, and that commit will take this group too.
                (Some(wake), Commit::Due) => drop(wake.try_send(())),
                _ => self.persister.commit()?,
            }
        }
        let published = group.view.take();
        if let Some(view) = &published {
            self.publish(view.clone());
        }
        let hashing = self.compact_hashing();
        for mut job in std::mem::take(&mut group.jobs) {
            // Only the group's last compaction can be hashed from the published view.
            job.hash = published
                .clone()
                .filter(|v| hashing && v.compact_rev == job.revision);
            self.compactor.submit(job);
        }
        Ok(group.into_events())
    }

    /// Commits every published group's sled writes that are not in sled yet, as one sled
    /// batch (no fsync), after a commit in progress. Call it after taking the view whose
    /// records must be in sled, before reading sled directly; apply commits by the
    /// [`PersistPolicy`]. Blocking (sled I/O).
    ///
    /// Errors: sled I/O, fatal for the member.
    pub fn persist(&self) -> Result<(), MvccError> {
        self.persister.commit()
    }

    /// Sets when published groups go to sled (a member's store: [`PersistPolicy::BATCHED`];
    /// [`MvccStore::open`] starts with [`PersistPolicy::EVERY_GROUP`]). Commits what is
    /// pending first, and starts the background committer if the policy has one.
    ///
    /// Errors: sled I/O, fatal for the member, or no thread for the committer.
    pub fn set_persist_policy(&self, policy: PersistPolicy) -> Result<(), MvccError> {
        self.persist()?;
        let mut wake = self.wake.lock().unwrap_or_else(|e| e.into_inner());
        *wake = match policy.background {
            true => Some(self.persister.start().map_err(MvccError::Thread)?),
            false => None,
        };
        self.persister.set_policy(policy);
        Ok(())
    }

    /// When published groups go to sled.
    pub fn persist_policy(&self) -> PersistPolicy {
        self.persister.policy()
    }

    /// Called by [`WriteTxn`]'s drop.
    pub(super) fn end_write(&self) {
        self.writer_active.store(false, Ordering::Release);
    }

    /// Every key that exists at the current revision with a lease attached, as
    /// `(key, lease id)` in key order: what the lessor re-attaches after a restart (etcd
    /// `lessor.Recover` + `restore`).
    pub fn leased_keys(&self) -> Vec<(Vec<u8>, i64)> {
        let view = self.view();
        view.index
            .iter_all()
            .filter_map(|(k, h)| {
                h.visible_at(view.rev)
                    .filter(|r| r.lease != 0)
                    .map(|r| (k.to_vec(), r.lease))
            })
            .collect()
    }

    /// Sizes of the current key index.
    pub fn index_stats(&self) -> IndexStats {
        let view = self.view();
        IndexStats {
            keys: view.index.keys(),
            live_keys: view.index.live(),
            blocks: view.index.blocks(),
            heap_bytes: view.index.heap_bytes(),
        }
    }

    pub(super) fn read_view<'a>(&'a self, view: &'a View) -> ReadView<'a> {
        ReadView {
            index: &view.index,
            rev: view.rev,
            compact_rev: view.compact_rev,
            values: self,
        }
    }

    /// [`MvccStore::persist`] for a reader about to scan sled, its error as etcd's.
    pub(super) fn persist_for_read(&self) -> Result<(), EtcdError> {
        self.persist()
            .map_err(|e| EtcdError::Internal(format!("mvcc: persist: {e}")))
    }

    /// Reads the record of a revision that the index says exists: from the overlay of
    /// unpersisted groups, else from sled.
    pub(super) fn read_value(
        &self,
        key: &[u8],
        rev: &RevInfo,
        read_rev: i64,
    ) -> Result<KeyValue, EtcdError> {
        let rkey = record_key(rev.revision(), rev.tombstone);
        let stored = match self.persister.overlay().get(&rkey) {
            Some(v) => Some(v),
            None => self.tree.get().tree().get(&rkey).map_err(MvccError::from)?,
        };
        let record = stored.map(|v| codec::decode_kv(&rkey, &v)).transpose()?;
        match record {
            Some(kv) if kv.key == key => Ok(kv),
            Some(kv) => Err(EtcdError::Internal(format!(
                "mvcc: record {} holds key {:?}, the index says {:?}",
                rev.revision(),
                kv.key.escape_ascii().to_string(),
                key.escape_ascii().to_string()
            ))),
            None => Err(self.missing_record(rev, read_rev)),
        }
    }

    /// The error for a record the index pointed to but sled no longer holds.
    pub(super) fn missing_record(&self, rev: &RevInfo, read_rev: i64) -> EtcdError {
        if self.compact_floor.load(Ordering::Acquire) > read_rev {
            EtcdError::Compacted
        } else {
            EtcdError::Internal(format!("mvcc: record {} is missing", rev.revision()))
        }
    }
}

impl ValueSource for MvccStore {
    fn value(&self, key: &[u8], rev: &RevInfo, read_rev: i64) -> Result<KeyValue, EtcdError> {
        self.read_value(key, rev, read_rev)
    }
}
