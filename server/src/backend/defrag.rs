//! Online defragment: rewrite the live database into a fresh generation while the member
//! keeps serving, then switch to it in a short pause (issue 15 part 4; etcd 3.8's
//! `NonBlockingDefrag`, PR #22425: "copies almost all the data in the background while etcd
//! keeps serving normal reads and writes, then does one short pause at the end to catch up
//! and swap in the new file").
//!
//! sled reuses freed space but never returns it to the file system, so the only way to
//! shrink is a new database. A [`Rewrite`]:
//!
//! 1. [`Rewrite::open`] opens the new database in its generation directory;
//!    [`Rewrite::follow`] (no writer running) subscribes to every change of the live member
//!    tree and starts the *follower*, a thread that applies each change to the new tree as
//!    it happens;
//! 2. [`Rewrite::copy`] (writers running): copies every tree; for the member tree, a key the
//!    follower already wrote is skipped (the follower has a newer value, or its removal),
//!    and flushes the new database;
//! 3. [`Rewrite::finish`] (no writer running): lets the follower apply the last changes,
//!    flushes, and hands back the new [`Generation`].
//!
//! Why the result equals the live tree at the switch: a key written after the subscription
//! has a change event, and the follower applies a key's events in write order (sled reserves
//! a subscriber slot before each write, and the member writes each key from one thread at
//! a time), so the last event of a key leaves its last value. A key written before the
//! subscription and not since is copied as it is. The copy never overwrites a key the
//! follower has touched (both go through one lock), and when the copy reads a key before
//! the follower touches it, every later write of that key is an event the follower applies
//! after the copy's write. Compaction may therefore run during the copy: its removals are
//! changes like any other, so no compacted record survives into the new file, and
//! `HashKV` is the same before and after (tested).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use sled::{Event, IVec, Subscriber};

use super::{BackendError, CACHE_BYTES, Generation, LiveTree, schema};

/// Keys the copy reads ahead and writes under one hold of the follower lock.
const COPY_BATCH: usize = 1000;
/// Most events the follower applies under one hold of its lock.
const FOLLOW_BATCH: usize = 1000;
/// How long the follower sleeps when no change is ready: bounds the switch pause's wait
/// for the follower to apply the last changes.
const FOLLOW_POLL: Duration = Duration::from_millis(1);

/// Keys of the new member tree the follower has written (the copy must not overwrite them).
type Touched = Arc<Mutex<HashSet<IVec>>>;

/// A rewrite of the live database into a new generation (see the module docs).
pub struct Rewrite {
    dir: PathBuf,
    source: Arc<Generation>,
    db: sled::Db,
    tree: sled::Tree,
    touched: Touched,
    stop: Arc<AtomicBool>,
    follower: Option<JoinHandle<Result<u64, BackendError>>>,
}

impl Rewrite {
    /// Opens a new, empty database in `dir` for a rewrite of `live`'s current generation
    /// (writers may run; opening sled takes tens of milliseconds).
    ///
    /// Errors: sled I/O; `dir` must not hold a database.
    pub fn open(live: &LiveTree, dir: &Path) -> Result<Rewrite, BackendError> {
        let source = live.get();
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(CACHE_BYTES)
            .open()?;
        let tree = db.open_tree(schema::MEMBER_TREE)?;
        Ok(Rewrite {
            dir: dir.to_path_buf(),
            source,
            db,
            tree,
            touched: Touched::default(),
            stop: Arc::new(AtomicBool::new(false)),
            follower: None,
        })
    }

    /// Subscribes to every change of the live member tree and starts the follower. Call
    /// while nothing writes the member tree (apply and the compactor paused): a write
    /// racing with the subscription could be missed. Microseconds.
    ///
    /// Errors: no thread for the follower.
    pub fn follow(&mut self) -> Result<(), BackendError> {
        assert!(self.follower.is_none(), "defragment: followed twice");
        let subscriber = self.source.tree().watch_prefix(Vec::<u8>::new());
        let (tree, touched, stop) = (self.tree.clone(), self.touched.clone(), self.stop.clone());
        let follower = std::thread::Builder::new()
            .name("keel-defrag-follow".into())
            .spawn(move || follow(subscriber, &tree, &touched, &stop))
            .map_err(|e| BackendError::Storage(sled::Error::Io(e)))?;
        self.follower = Some(follower);
        Ok(())
    }

    /// Copies every tree of the live database into the new one (writers may run), then
    /// flushes the new database; `progress` gets the keys of each batch. Returns the keys
    /// copied.
    ///
    /// Errors: sled I/O.
    pub fn copy(&self, progress: &dyn Fn(u64)) -> Result<u64, BackendError> {
        assert!(
            self.follower.is_some(),
            "defragment: a copy without its follower would miss writes"
        );
        let Some(src) = self.source.db() else {
            return Err(BackendError::Storage(sled::Error::Unsupported(
                "defragment: a bare tree has no database to rewrite".into(),
            )));
        };
        let mut copied = 0u64;
        for name in src.tree_names() {
            let followed = name.as_ref() == schema::MEMBER_TREE.as_bytes();
            let (from, to) = (src.open_tree(&name)?, self.db.open_tree(&name)?);
            let mut chunk = Vec::with_capacity(COPY_BATCH);
            let mut iter = from.iter();
            loop {
                chunk.clear();
                for kv in iter.by_ref().take(COPY_BATCH) {
                    chunk.push(kv?);
                }
                if chunk.is_empty() {
                    break;
                }
                let n = chunk.len() as u64;
                // One insert per key, never a sled batch: sled's `apply_batch` takes a
                // process-wide exclusive lock that every read of every tree waits for
                // (sled 0.34 `concurrency_control`), so a 10,000-key batch stalled reads
                // for ~400 ms; an insert takes it shared.
                if followed {
                    let touched = self.touched.lock().unwrap_or_else(|e| e.into_inner());
                    for (k, v) in chunk.drain(..) {
                        // Under the lock: the follower must not write these keys in between.
                        if !touched.contains(&k) {
                            to.insert(k, v)?;
                        }
                    }
                } else {
                    for (k, v) in chunk.drain(..) {
                        to.insert(k, v)?;
                    }
                }
                copied += n;
                progress(n);
            }
        }
        // Crash with the copy written but not switched to: the next start removes it.
        crate::failpoint::crash_point!("defrag_mid");
        tracing::info!(copied, "defragment: copied, flushing the new database");
        self.db.flush()?;
        Ok(copied)
    }

    /// The directory of the new generation.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Applies the last changes and flushes the new database; returns it as a generation
    /// and how many changes the follower applied. Call while nothing writes the member tree.
    ///
    /// Errors: sled I/O in the follower or the flush.
    pub fn finish(mut self) -> Result<(Generation, u64), BackendError> {
        let followed = self.stop_follower()?;
        self.db.flush()?;
        let db = self.db.clone();
        let tree = self.tree.clone();
        Ok((Generation::new(db, tree), followed))
    }

    fn stop_follower(&mut self) -> Result<u64, BackendError> {
        self.stop.store(true, Ordering::Release);
        match self.follower.take().map(|f| f.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(BackendError::Storage(sled::Error::ReportableBug(
                "defragment: the follower thread panicked".into(),
            ))),
            None => Ok(0),
        }
    }
}

impl Drop for Rewrite {
    /// An abandoned rewrite stops its follower; its directory is removed by the next
    /// defragment or start ([`super::generation::prepare`]).
    fn drop(&mut self) {
        let _ = self.stop_follower();
    }
}

/// The follower: applies every change of the live tree to `dst` until `stop` is set and no
/// change is pending. Returns the changes applied.
fn follow(
    mut subscriber: Subscriber,
    dst: &sled::Tree,
    touched: &Mutex<HashSet<IVec>>,
    stop: &AtomicBool,
) -> Result<u64, BackendError> {
    let mut applied = 0u64;
    let mut events = Vec::with_capacity(FOLLOW_BATCH);
    loop {
        // Read before polling: once `stop` is set every change is already in the feed
        // (sled fills a change's slot before the write returns), so an empty poll after
        // seeing it means the follower is done.
        let stopping = stop.load(Ordering::Acquire);
        while events.len() < FOLLOW_BATCH {
            match next_change(&mut subscriber)? {
                Some(e) => events.push(e),
                None => break,
            }
        }
        if events.is_empty() {
            if stopping {
                return Ok(applied);
            }
            std::thread::sleep(FOLLOW_POLL);
            continue;
        }
        // One write per change, not a sled batch (see `Rewrite::copy`).
        let mut touched = touched.lock().unwrap_or_else(|e| e.into_inner());
        for e in events.drain(..) {
            applied += 1;
            match e {
                Event::Insert { key, value } => {
                    dst.insert(&key, value)?;
                    touched.insert(key);
                }
                Event::Remove { key } => {
                    dst.remove(&key)?;
                    touched.insert(key);
                }
            }
        }
    }
}

/// The next change if one is ready, without waiting. Polls the subscriber as a future:
/// sled 0.34's `next_timeout` never gets past the slot of a write that turned out to be a
/// no-op (its `OneShot::wait_timeout` reports the dropped slot as an error forever), while
/// the future skips such slots. A write still in flight is `None` (polled again later).
///
/// Errors: the live tree's change feed closed (its tree was dropped).
fn next_change(subscriber: &mut Subscriber) -> Result<Option<Event>, BackendError> {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    let mut cx = Context::from_waker(Waker::noop());
    match std::pin::Pin::new(subscriber).poll(&mut cx) {
        Poll::Ready(Some(e)) => Ok(Some(e)),
        Poll::Ready(None) => Err(BackendError::Storage(sled::Error::ReportableBug(
            "defragment: the live tree's change feed closed".into(),
        ))),
        Poll::Pending => Ok(None),
    }
}

#[cfg(test)]
mod tests;
