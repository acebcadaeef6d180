//! Group commit: one sync thread makes writes durable for many appenders at once.
//!
//! Loop: wait until some write somebody needs durable is not yet durable (a lazy metadata write
//! alone does not count, `Wal::set_meta_lazy`); under the writer mutex, note the highest
//! written Lsn and the segments that may hold unsynced bytes; release the mutex; fdatasync those
//! segments (oldest first) and give not-yet-named segments their final name (rename + directory
//! fsync), in order; then mark everything up to the noted Lsn durable, fire the callbacks, wake
//! the waiters, and append a `SyncPoint` record telling recovery how far the segment is known to
//! be durable. Appenders keep writing while the fdatasync runs, so the next round covers all of
//! them with one fdatasync.
//!
//! The writer mutex is never held across an fdatasync. Lock order: writer, then durability.

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use super::error::WalError;
use super::segment::Segment;
use super::{Lsn, Shared, fsutil};

/// A durability callback (see [`crate::wal::Wal::on_durable`]).
pub(crate) type Callback = Box<dyn FnOnce(Result<(), WalError>) + Send>;

/// Tracks the durable Lsn, the callbacks waiting for it, and the sticky failure.
#[derive(Default)]
pub(crate) struct Durability {
    state: Mutex<DurableState>,
    changed: Condvar,
}

#[derive(Default)]
struct DurableState {
    durable: Lsn,
    callbacks: BTreeMap<Lsn, Vec<Callback>>,
    failed: Option<String>,
}

impl Durability {
    fn lock(&self) -> MutexGuard<'_, DurableState> {
        // A panic in another thread cannot leave this state half-updated (single assignments).
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `f` for `lsn`. Returns true if it can be fired right away (already durable, or the
    /// WAL failed); the caller then wakes the sync thread, which runs it.
    pub(crate) fn register(&self, lsn: Lsn, f: Callback) -> bool {
        let mut s = self.lock();
        s.callbacks.entry(lsn).or_default().push(f);
        lsn <= s.durable || s.failed.is_some()
    }

    /// Marks everything up to `lsn` durable: wakes waiters, then runs the due callbacks in Lsn
    /// order on the calling (sync) thread.
    pub(crate) fn complete(&self, lsn: Lsn) {
        let due = {
            let mut s = self.lock();
            s.durable = s.durable.max(lsn);
            let first_later = s.durable + 1;
            let later = s.callbacks.split_off(&first_later);
            std::mem::replace(&mut s.callbacks, later)
        };
        self.changed.notify_all();
        for f in due.into_values().flatten() {
            call(f, Ok(()));
        }
    }

    /// Records a failure: every pending and future callback above the durable Lsn gets an error.
    pub(crate) fn fail(&self, reason: &str) {
        let (due, failed) = {
            let mut s = self.lock();
            let reason = s.failed.get_or_insert_with(|| reason.to_string()).clone();
            let durable = s.durable;
            (std::mem::take(&mut s.callbacks), (durable, reason))
        };
        self.changed.notify_all();
        for (lsn, fs) in due {
            for f in fs {
                let result = if lsn <= failed.0 {
                    Ok(())
                } else {
                    Err(WalError::Failed(failed.1.clone()))
                };
                call(f, result);
            }
        }
    }

    /// Blocks until `lsn` is durable or the WAL failed.
    pub(crate) fn wait(&self, lsn: Lsn) -> Result<(), WalError> {
        let mut s = self.lock();
        loop {
            if lsn <= s.durable {
                return Ok(());
            }
            if let Some(reason) = &s.failed {
                return Err(WalError::Failed(reason.clone()));
            }
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    pub(crate) fn durable(&self) -> Lsn {
        self.lock().durable
    }
}

/// Runs one callback. A panicking callback is a bug in its owner; it must not take down the
/// sync thread, which every other writer depends on.
fn call(f: Callback, result: Result<(), WalError>) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(result))).is_err() {
        tracing::error!("a WAL durability callback panicked");
    }
}

/// What one round must make durable.
struct Round {
    target: Lsn,
    segments: Vec<Arc<Segment>>,
    current_seq: u64,
    current_offset: u64,
}

/// Body of the sync thread; returns after shutdown once every write is durable (or failed).
pub(crate) fn run(shared: Arc<Shared>) {
    loop {
        let Some(round) = next_round(&shared) else {
            return;
        };
        if round.segments.is_empty() {
            // Only callbacks registered for an Lsn that is already durable.
            shared.durability.complete(round.target);
            continue;
        }
        // Crash with the batch written but not durable: nobody was told about it.
        crate::failpoint::crash_point!("wal_before_fsync");
        let started = Instant::now();
        match sync_segments(&shared, &round.segments) {
            Ok(()) => {
                // Crash with the batch durable but before any waiter or callback learns it.
                crate::failpoint::crash_point!("wal_after_fsync");
                shared.stats.record_sync(started.elapsed());
                finish_round(&shared, round);
            }
            Err(e) => {
                let reason = e.to_string();
                tracing::error!(error = %reason, "WAL fdatasync failed; refusing further writes");
                // Never retried (fsyncgate): the kernel may have dropped the dirty pages.
                shared.lock_writer().record_failure(reason, e.source_io());
            }
        }
    }
}

/// Waits for work and snapshots it; `None` on shutdown with nothing left to do.
fn next_round(shared: &Shared) -> Option<Round> {
    let mut w = shared.lock_writer();
    loop {
        if let Some(reason) = w.failed.clone() {
            // Fail every waiter and callback, then keep draining late callbacks until shutdown.
            w.kick = false;
            drop(w);
            shared.durability.fail(&reason);
            w = shared.lock_writer();
            if w.shutdown {
                return None;
            }
            if !w.kick {
                w = shared.work.wait(w).unwrap_or_else(|e| e.into_inner());
            }
            continue;
        }
        // A lazy write alone starts no round; at shutdown everything written is synced.
        let due = w.wanted_lsn.max(if w.shutdown { w.written_lsn } else { 0 });
        if due > w.synced_lsn {
            w.kick = false;
            let from = w.sync_from_seq;
            return Some(Round {
                target: w.written_lsn,
                segments: w
                    .segments
                    .iter()
                    .filter(|s| s.seg.seq() >= from)
                    .map(|s| Arc::clone(&s.seg))
                    .collect(),
                current_seq: w.current().seg.seq(),
                current_offset: w.offset,
            });
        }
        if w.kick {
            w.kick = false;
            return Some(Round {
                target: w.synced_lsn,
                segments: Vec::new(),
                current_seq: 0,
                current_offset: 0,
            });
        }
        if w.shutdown {
            return None;
        }
        w = shared.work.wait(w).unwrap_or_else(|e| e.into_inner());
    }
}

/// The step of a sync round that failed; its text becomes the WAL's sticky failure reason
/// ([`WalError::Failed`]).
#[derive(Debug, thiserror::Error)]
enum SyncError {
    /// fdatasync of a segment file.
    #[error("fdatasync {}: {source}", path.display())]
    Fdatasync {
        /// The segment file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// Renaming a `.wal.tmp` segment to its final name.
    #[error("rename {} into place: {source}", path.display())]
    Rename {
        /// The segment file, by its name before the rename.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// fsync of the WAL directory after a rename.
    #[error("fsync WAL directory: {0}")]
    FsyncDir(#[source] io::Error),
}

impl SyncError {
    fn source_io(&self) -> &io::Error {
        match self {
            SyncError::Fdatasync { source, .. } | SyncError::Rename { source, .. } => source,
            SyncError::FsyncDir(source) => source,
        }
    }
}

/// fdatasyncs the segments oldest first and names each unnamed one after it and all earlier
/// ones are durable, so a named segment is never preceded by a torn one.
fn sync_segments(shared: &Shared, segments: &[Arc<Segment>]) -> Result<(), SyncError> {
    for seg in segments {
        // `sleep(ms)` here models a slow disk.
        crate::failpoint::crash_point!("wal_slow_fsync");
        // `wal_fsync_enospc` / `wal_fsync_eio`: the fdatasync fails (docs/failpoints.md).
        let injected = crate::failpoint::io_error("wal_fsync_enospc", libc::ENOSPC)
            .or_else(|| crate::failpoint::io_error("wal_fsync_eio", libc::EIO));
        injected
            .map_or_else(|| seg.sync_data(), Err)
            .map_err(|source| SyncError::Fdatasync {
                path: seg.path(),
                source,
            })?;
        shared.stats.fdatasyncs.fetch_add(1, Ordering::Relaxed);
        if !seg.is_named() {
            seg.rename_to_final().map_err(|source| SyncError::Rename {
                path: seg.path(),
                source,
            })?;
            fsutil::fsync_dir(&shared.dir_file).map_err(SyncError::FsyncDir)?;
            seg.mark_named();
        }
    }
    Ok(())
}

/// Publishes a successful round: removes segments obsoleted by durable purges, fires callbacks,
/// then writes the sync point.
fn finish_round(shared: &Shared, round: Round) {
    let victims = {
        let mut w = shared.lock_writer();
        w.synced_lsn = w.synced_lsn.max(round.target);
        w.sync_from_seq = round.current_seq;
        w.named_seq = w.named_seq.max(round.current_seq);
        w.take_purged_segments(round.target)
    };
    drop(round.segments);
    if !victims.is_empty() {
        super::remove_segments(shared, victims);
    }
    shared.durability.complete(round.target);
    shared
        .lock_writer()
        .write_sync_point(round.current_seq, round.current_offset);
}
