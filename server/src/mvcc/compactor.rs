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

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use super::revision::{Revision, record_key};
use crate::backend::LiveTree;

/// Records removed in the compaction's own apply batch (when nothing is pending).
pub const INLINE_REMOVALS: usize = 1000;
/// Records removed per background sled batch.
pub const BATCH_REMOVALS: usize = 1000;
/// Pause between background batches, leaving sled to the apply loop.
pub const BATCH_PAUSE: Duration = Duration::from_millis(10);

/// Removal batches hold this shared; an index rebuild holds it exclusively while scanning.
pub(super) static REBUILD_GATE: RwLock<()> = RwLock::new(());

/// Records to remove for one compaction, in ascending revision order.
#[derive(Debug)]
pub(super) struct Job {
    /// The compact revision these removals complete.
    pub revision: i64,
    /// `(revision, tombstone)` of each record, ascending.
    pub records: Vec<(Revision, bool)>,
}

#[derive(Debug, Default)]
struct State {
    queue: VecDeque<Job>,
    /// A job is being removed right now.
    busy: bool,
    /// Every record of compactions up to this revision is gone (-1 = unknown / none).
    physical: i64,
    stop: bool,
}

#[derive(Debug)]
struct Shared {
    tree: LiveTree,
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
    /// are known to be gone.
    pub fn start(tree: LiveTree, physical: i64) -> std::io::Result<Compactor> {
        let shared = Arc::new(Shared {
            tree,
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
        } else {
            s.queue.push_back(job);
        }
        self.shared.changed.notify_all();
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
        tracing::info!(
            revision = job.revision,
            records = job.records.len(),
            took_ms = started.elapsed().as_millis() as u64,
            "mvcc: physical compaction done"
        );
        let mut s = shared.lock();
        s.busy = false;
        s.physical = s.physical.max(job.revision);
        shared.changed.notify_all();
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
        let c = Compactor::start(LiveTree::fixed(tree.clone()), -1).unwrap();
        assert!(c.idle());
        c.submit(Job {
            revision: 7,
            records: (0..n as i64)
                .map(|i| (Revision::new(i + 2, 0), false))
                .collect(),
        });
        assert!(c.wait(7, Duration::from_secs(10)));
        assert_eq!(c.physical_revision(), 7);
        assert!(c.idle());
        assert_eq!(tree.len(), 0);
        // Nothing to remove: done at once.
        c.submit(Job {
            revision: 9,
            records: vec![],
        });
        assert_eq!(c.physical_revision(), 9);
        assert!(!c.wait(10, Duration::from_millis(20)));
    }
}
