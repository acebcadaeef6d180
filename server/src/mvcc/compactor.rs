//! Physical compaction: removing the records of compacted revisions from sled.
//!
//! sled removes about one record per 14 µs whether batched or not (docs/mvcc.md), so
//! removing 1M superseded revisions inside the compaction's own apply batch would stall
//! apply for ~15 s. Instead (as etcd does with `scheduleCompaction`):
//! - the index is compacted in the apply batch (readers, HashKV and watch catch-up only ever
//!   follow the index, so records it dropped are invisible at once);
//! - the first [`INLINE_REMOVALS`] records go into the same sled batch when no background
//!   work is pending, so ordinary compactions are fully physical when their entry commits;
//! - the rest is removed here, on one thread, [`BATCH_REMOVALS`] per sled batch with a
//!   [`BATCH_PAUSE`] between batches (etcd's defaults: 1000 and 10 ms).
//!
//! Crash safety: records are removed in ascending revision order, job after job, so at any
//! moment the records left of each key are a suffix of its history. A rebuild's scan must
//! not overlap a removal batch (a sled scan is not a snapshot), so batches and rebuild scans
//! exclude each other through [`REBUILD_GATE`], process-wide: a store reopened on the same
//! tree may still have its predecessor's worker finishing a batch. Compacting such a
//! suffix at the same revision gives the same result as compacting the full history, which
//! is what `MvccStore::open` does (rebuild, then compact at the stored compact revision and
//! hand the leftovers back to this worker). A removal that outlives a snapshot install is
//! harmless for the same reason: every member has the same record at a revision, and a
//! revision compactable in an older state is compactable in every later one.
//!
//! Compaction hashes (etcd's `hashStorage`, for the compact-hash corruption check): when
//! [`super::MvccStore::set_compact_hashing`] is on, a job also carries the view published
//! with its compaction, and this thread computes HashKV at the compaction revision after
//! the job's removals, keeping the last [`COMPACT_HASHES_KEPT`]. The records that hash
//! needs (those visible at the compaction revision) are removed only by a later
//! compaction, whose removals queue behind this job (the thread counts as busy while it
//! hashes, so no later compaction removes records in its own batch meanwhile). The hashes
//! are kept in memory, not persisted: HashKV at a revision is a pure function of the log up
//! to it (hash.rs), so what a restart loses is recomputed (the current compaction's hash at
//! once, older ones by any member that still holds the revision), and hashing inside the
//! compaction's own apply batch would stall apply for a walk of the whole store.

use std::collections::VecDeque;
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use super::hash;
use super::revision::{Revision, record_key};
use super::store::View;
use crate::backend::LiveTree;

/// Records removed in the compaction's own apply batch (when nothing is pending).
pub const INLINE_REMOVALS: usize = 1000;
/// Records removed per background sled batch.
pub const BATCH_REMOVALS: usize = 1000;
/// Pause between background batches, leaving sled to the apply loop.
pub const BATCH_PAUSE: Duration = Duration::from_millis(10);
/// Compaction hashes kept (etcd's `hashStorageMaxSize`).
pub const COMPACT_HASHES_KEPT: usize = 10;

/// HashKV at a compaction revision (etcd's `KeyValueHash`), computed after the compaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompactHash {
    /// The compaction revision, also the revision hashed.
    pub revision: i64,
    /// HashKV at `revision` (hash.rs).
    pub hash: u32,
}

/// Removal batches hold this shared; an index rebuild holds it exclusively while scanning.
pub(super) static REBUILD_GATE: RwLock<()> = RwLock::new(());

/// Records to remove for one compaction, in ascending revision order.
#[derive(Debug)]
pub(super) struct Job {
    /// The compact revision these removals complete.
    pub revision: i64,
    /// `(revision, tombstone)` of each record, ascending.
    pub records: Vec<(Revision, bool)>,
    /// The view published with the compaction at `revision`, to hash at `revision` once the
    /// records are removed (module docs); `None` when compaction hashes are off.
    pub hash: Option<Arc<View>>,
}

#[derive(Debug, Default)]
struct State {
    queue: VecDeque<Job>,
    /// A job is being removed right now.
    busy: bool,
    /// Every record of compactions up to this revision is gone (-1 = unknown / none).
    physical: i64,
    /// The last compaction hashes, oldest first.
    hashes: VecDeque<CompactHash>,
    stop: bool,
}

#[derive(Debug)]
struct Shared {
    tree: LiveTree,
    /// The store's compact floor (store.rs): tells a hash's missing record from corruption.
    floor: Arc<AtomicI64>,
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The background remover of one store. Dropping it stops the thread after its current
/// batch (without waiting); what is left is found again by the next open.
#[derive(Debug)]
pub(super) struct Compactor {
    shared: Arc<Shared>,
}

impl Compactor {
    /// Starts the worker thread on `tree`; `physical` is the revision up to which records
    /// are known to be gone; `floor` is the store's compact floor.
    pub fn start(
        tree: LiveTree,
        physical: i64,
        floor: Arc<AtomicI64>,
    ) -> std::io::Result<Compactor> {
        let shared = Arc::new(Shared {
            tree,
            floor,
            state: Mutex::new(State {
                physical,
                ..State::default()
            }),
            changed: Condvar::new(),
        });
        let worker = shared.clone();
        std::thread::Builder::new()
            .name("keel-mvcc-compact".into())
            .spawn(move || run(&worker))?;
        Ok(Compactor { shared })
    }

    /// Whether no job is queued or running: only then may a compaction remove records in
    /// its own batch without breaking the ascending removal order.
    pub fn idle(&self) -> bool {
        let s = self.shared.lock();
        s.queue.is_empty() && !s.busy
    }

    /// Queues a job, or records `revision` as physically done when there is nothing to
    /// remove. Call only after the compaction's batch is applied.
    pub fn submit(&self, job: Job) {
        let mut s = self.shared.lock();
        if job.records.is_empty() && s.queue.is_empty() && !s.busy {
            s.physical = s.physical.max(job.revision);
            if job.hash.is_some() {
                s.queue.push_back(job);
            }
        } else {
            s.queue.push_back(job);
        }
        self.shared.changed.notify_all();
    }

    /// The compaction hashes kept, newest first.
    pub fn hashes(&self) -> Vec<CompactHash> {
        self.shared.lock().hashes.iter().rev().copied().collect()
    }

    /// The revision up to which compacted records are removed from sled.
    pub fn physical_revision(&self) -> i64 {
        self.shared.lock().physical
    }

    /// Waits until compactions up to `revision` are physically done. Returns false on
    /// timeout.
    pub fn wait(&self, revision: i64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut s = self.shared.lock();
        while s.physical < revision {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || s.stop {
                return false;
            }
            s = self
                .shared
                .changed
                .wait_timeout(s, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }
}

impl Drop for Compactor {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.changed.notify_all();
    }
}

fn run(shared: &Shared) {
    loop {
        let job = {
            let mut s = shared.lock();
            loop {
                if s.stop {
                    return;
                }
                if let Some(job) = s.queue.pop_front() {
                    s.busy = true;
                    break job;
                }
                s = shared.changed.wait(s).unwrap_or_else(|e| e.into_inner());
            }
        };
        let started = Instant::now();
        for chunk in job.records.chunks(BATCH_REMOVALS) {
            if shared.lock().stop {
                return;
            }
            let mut batch = sled::Batch::default();
            for &(rev, tombstone) in chunk {
                batch.remove(record_key(rev, tombstone));
            }
            let applied = {
                let _gate = REBUILD_GATE.read().unwrap_or_else(|e| e.into_inner());
                shared.tree.get().tree().apply_batch(batch)
            };
            if let Err(e) = applied {
                // The records stay; the next open finds and removes them.
                tracing::error!(error = %e, revision = job.revision, "mvcc: physical compaction failed");
                let mut s = shared.lock();
                s.busy = false;
                s.stop = true;
                shared.changed.notify_all();
                return;
            }
            // Crash after the first background batch: the next open finds the rest.
            crate::failpoint::crash_point!("compact_mid");
            std::thread::sleep(BATCH_PAUSE);
        }
        if !job.records.is_empty() {
            tracing::info!(
                revision = job.revision,
                records = job.records.len(),
                took_ms = started.elapsed().as_millis() as u64,
                "mvcc: physical compaction done"
            );
        }
        if let Some(view) = &job.hash {
            // Physically done now (a `physical` compaction need not wait for the hash), but
            // still busy: no later compaction may remove records in its own batch while the
            // hash reads them.
            {
                let mut s = shared.lock();
                s.physical = s.physical.max(job.revision);
                shared.changed.notify_all();
            }
            compute_hash(shared, view, job.revision);
        }
        // Done and idle in one step: a waiter that sees the revision physical also sees the
        // compactor idle (the next compaction may then remove records inline).
        let mut s = shared.lock();
        s.busy = false;
        s.physical = s.physical.max(job.revision);
        shared.changed.notify_all();
    }
}

/// Hashes `view` at compaction revision `revision` and keeps the result (module docs).
fn compute_hash(shared: &Shared, view: &View, revision: i64) {
    let started = Instant::now();
    let generation = shared.tree.get();
    match hash::hash_kv(view, generation.tree(), &shared.floor, revision) {
        Ok(h) => {
            let mut s = shared.lock();
            if s.hashes
                .back()
                .is_some_and(|last| last.revision >= revision)
            {
                return;
            }
            s.hashes.push_back(CompactHash {
                revision,
                hash: h.hash,
            });
            while s.hashes.len() > COMPACT_HASHES_KEPT {
                s.hashes.pop_front();
            }
            tracing::debug!(
                revision,
                hash = h.hash,
                took_ms = started.elapsed().as_millis() as u64,
                "mvcc: compaction hash stored"
            );
        }
        // A later compaction got there first: that revision goes unhashed here.
        Err(e) => tracing::warn!(revision, error = %e, "mvcc: no hash at the compaction revision"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_in_batches_and_reports_progress() {
        let tree = crate::mvcc::test_support::temp_tree();
        let n = BATCH_REMOVALS + 10;
        for i in 0..n as i64 {
            tree.insert(record_key(Revision::new(i + 2, 0), false), b"v".as_slice())
                .unwrap();
        }
        let floor = Arc::new(AtomicI64::new(-1));
        let c = Compactor::start(LiveTree::fixed(tree.clone()), -1, floor).unwrap();
        assert!(c.idle());
        c.submit(Job {
            revision: 7,
            records: (0..n as i64)
                .map(|i| (Revision::new(i + 2, 0), false))
                .collect(),
            hash: None,
        });
        assert!(c.wait(7, Duration::from_secs(10)));
        assert_eq!(c.physical_revision(), 7);
        assert!(c.idle());
        assert_eq!(tree.len(), 0);
        // Nothing to remove: done at once.
        c.submit(Job {
            revision: 9,
            records: vec![],
            hash: None,
        });
        assert_eq!(c.physical_revision(), 9);
        assert!(!c.wait(10, Duration::from_millis(20)));
    }
}
