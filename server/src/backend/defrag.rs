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
//!
//! Why two threads, a *feed* and a *follower*: sled 0.34 takes one process-wide lock for
//! every tree (`concurrency_control`): `apply_batch` holds it exclusively for the whole
//! batch and, inside, blocks on each write's subscriber slot when the subscriber's channel
//! (1,024 slots) is full; any write to the new tree needs the same lock shared. A single
//! thread that both drained the feed and wrote the new tree therefore deadlocked with the
//! first `apply_batch` of more changes than the channel had room for (seen in CI: the
//! member's apply and the rewrite stopped for good). The feed thread only moves events from
//! sled's channel to an unbounded queue and never takes a sled lock, so a source write
//! never waits for the new tree; the queue holds the changes made while the follower is
//! behind (bounded by the writes of one defragment).
//!
//! How the follower knows it has every change at the switch: [`Rewrite::finish`] makes a
//! *fence*, a `compare_and_swap` of the never-written key [`FENCE`] from absent to absent.
//! It changes nothing a reader can see, but sled gives it a change event (a removal) after
//! every earlier write's, so when the feed reaches it, every change made before the switch
//! is queued.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use sled::{Event, IVec, Subscriber};

use super::{BackendError, CACHE_BYTES, Generation, LiveTree, schema};

/// Keys the copy reads ahead and writes under one hold of the follower lock.
const COPY_BATCH: usize = 1000;
/// Most events the follower applies under one hold of its lock.
const FOLLOW_BATCH: usize = 1000;
/// The fence key (see the module docs). No component writes a key starting with `0xff`
/// (`schema`), and the fence itself never stores it.
pub const FENCE: &[u8] = b"\xffkeel/defrag-fence";

/// Keys of the new member tree the follower has written (the copy must not overwrite them).
type Touched = Arc<Mutex<HashSet<IVec>>>;

/// A rewrite of the live database into a new generation (see the module docs).
pub struct Rewrite {
    dir: PathBuf,
    source: Arc<Generation>,
    db: sled::Db,
    tree: sled::Tree,
    touched: Touched,
    /// The feed thread: sled's change channel to the follower's queue, up to the fence.
    feed: Option<JoinHandle<()>>,
    /// The follower thread: the queue to the new tree; returns the changes applied.
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
            feed: None,
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
        let (queue, changes) = mpsc::channel();
        let spawn_error = |e| BackendError::Storage(sled::Error::Io(e));
        let feed = std::thread::Builder::new()
            .name("keel-defrag-feed".into())
            .spawn(move || feed(subscriber, &queue))
            .map_err(spawn_error)?;
        let (tree, touched) = (self.tree.clone(), self.touched.clone());
        let follower = std::thread::Builder::new()
            .name("keel-defrag-follow".into())
            .spawn(move || follow(&changes, &tree, &touched));
        match follower {
            Ok(f) => {
                self.feed = Some(feed);
                self.follower = Some(f);
                Ok(())
            }
            Err(e) => {
                // The feed ends at the fence, and its queue with it.
                fence(self.source.tree())?;
                let _ = feed.join();
                Err(spawn_error(e))
            }
        }
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

    /// Fences the live tree, waits for the feed to reach the fence and for the follower to
    /// apply everything before it; returns the changes applied.
    fn stop_follower(&mut self) -> Result<u64, BackendError> {
        let Some(follower) = self.follower.take() else {
            return Ok(0);
        };
        let fenced = fence(self.source.tree());
        // Without a fence the feed only ends with the live tree; leave it (and the
        // follower) running rather than wait for that.
        fenced?;
        let panicked = |what: &str| {
            BackendError::Storage(sled::Error::ReportableBug(format!(
                "defragment: the {what} thread panicked"
            )))
        };
        if let Some(feed) = self.feed.take() {
            feed.join().map_err(|_| panicked("feed"))?;
        }
        follower.join().map_err(|_| panicked("follower"))?
    }
}

impl Drop for Rewrite {
    /// An abandoned rewrite stops its follower; its directory is removed by the next
    /// defragment or start ([`super::generation::prepare`]).
    fn drop(&mut self) {
        let _ = self.stop_follower();
    }
}

/// Makes the fence on `live`: a change event after every earlier write's, with nothing
/// written (`compare_and_swap` of [`FENCE`] from absent to absent).
///
/// Errors: sled I/O.
fn fence(live: &sled::Tree) -> Result<(), BackendError> {
    live.compare_and_swap(FENCE, None::<&[u8]>, None::<&[u8]>)?
        .map_err(|e| {
            BackendError::Storage(sled::Error::ReportableBug(format!(
                "defragment: the fence key {FENCE:?} holds {:?}",
                e.current
            )))
        })
}

/// The feed: moves every change of the live tree from sled's channel to `queue`, in order,
/// up to the fence. It takes no sled lock (the subscriber's blocking iterator waits on the
/// channel and on each write's slot only), so a write to the live tree never waits for it
/// for long (see the module docs). Ends early when the follower has gone or the live tree's
/// change feed closed.
fn feed(subscriber: Subscriber, queue: &mpsc::Sender<Event>) {
    for event in subscriber {
        if matches!(&event, Event::Remove { key } if key.as_ref() == FENCE) {
            return;
        }
        if queue.send(event).is_err() {
            return;
        }
    }
}

/// The follower: applies every change from the feed to `dst` until the feed ends. Returns
/// the changes applied.
///
/// Errors: sled I/O on `dst` (the rewrite is then abandoned).
fn follow(
    changes: &mpsc::Receiver<Event>,
    dst: &sled::Tree,
    touched: &Mutex<HashSet<IVec>>,
) -> Result<u64, BackendError> {
    let mut applied = 0u64;
    let mut events = Vec::with_capacity(FOLLOW_BATCH);
    // Blocks for the first change, then takes what is queued, up to a batch.
    while let Ok(first) = changes.recv() {
        events.push(first);
        events.extend(changes.try_iter().take(FOLLOW_BATCH - 1));
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
    Ok(applied)
}

#[cfg(test)]
mod tests;
