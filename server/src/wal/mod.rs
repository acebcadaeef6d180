//! Keel's write-ahead log: the durable raft log of one member.
//!
//! The WAL stores raft log entries (opaque bytes keyed by log index) and a few small metadata
//! values (opaque bytes keyed by a `u8`; the raft glue uses them for the vote, the committed log
//! id and the last purged log id). It lives in `<data-dir>/member/wal/` as a sequence of
//! preallocated segment files of CRC-framed records; `docs/wal.md` describes the format.
//!
//! Usage: [`Wal::open`] runs recovery; [`Wal::append`], [`Wal::set_meta`] and
//! [`Wal::truncate_from`] write at once (readable immediately) and return an [`Lsn`];
//! [`Wal::on_durable`] / [`Wal::wait_durable`] report when that Lsn is fdatasync'ed. One sync
//! thread serves every writer (group commit), so many concurrent appends share one fdatasync.
//! Raft requires that a node acknowledges an append or a vote only once it is on stable storage
//! (Raft paper §5.1, Figure 2 "updated on stable storage before responding to RPCs"): call
//! openraft's `LogFlushed` from `on_durable`.
//!
//! Invariants:
//! - Durability: `on_durable(lsn)` fires `Ok` only after every write up to `lsn` is
//!   fdatasync'ed, in a segment whose name (and every earlier segment) is durable.
//! - Prefix: after any crash, recovery yields the state after some prefix of the write sequence,
//!   and that prefix includes every acknowledged write. Never a hole, never garbage.
//! - A record validates only in the segment incarnation that wrote it: its CRC covers the
//!   segment identity (sequence number + random nonce) and its bytes.
//! - Corruption before the tail is an error ([`WalError::Corrupt`]), never skipped.
//! - The log is contiguous: entries `first_index()..=last_index()` all exist; every entry index
//!   is above the purged index.

mod error;
mod fsutil;
mod log_index;
mod record;
mod recovery;
mod segment;
mod sync;
mod writer;

#[cfg(test)]
mod tests;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

pub use error::WalError;

use log_index::Loc;
use record::{ENTRY_DATA_OFFSET, Record};
use segment::{HEADER_LEN, Segment, spare_file_name};
use sync::Durability;
use writer::{SegSlot, Writer};

/// Position in this process's write sequence: the n-th successful `append`, `set_meta`,
/// `truncate_from` or `purge_to` since [`Wal::open`] returns Lsn n. A write is durable once the
/// sync thread has fdatasync'ed past its Lsn. Lsns are not stored on disk and restart at 0 on
/// every open (everything recovered is durable).
pub type Lsn = u64;

/// Largest entry or metadata value accepted, in bytes (64 MiB). etcd's own request limit
/// (`--max-request-bytes`, default 1.5 MiB) keeps raft entries far below it.
pub const MAX_VALUE_BYTES: usize = 64 << 20;

/// Smallest accepted `WalOptions::segment_bytes`: the header plus a few small records.
pub const MIN_SEGMENT_BYTES: u64 = HEADER_LEN + 256;

/// Tuning knobs of the WAL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalOptions {
    /// Target segment size in bytes (default 64 MiB, etcd's `SegmentSizeBytes`). A new segment
    /// starts when the next write would not fit; one oversized write may exceed it. Values
    /// below [`MIN_SEGMENT_BYTES`] (304) are raised to it.
    pub segment_bytes: u64,
    /// Preallocate each segment to `segment_bytes` with fallocate(2) (default true), so
    /// appends do not grow the file and fdatasync has less metadata to write.
    pub preallocate: bool,
    /// How many purged segment files to keep and reuse instead of creating new ones (default
    /// 2). A recycled file gets a new nonce, so its old records can never validate again.
    pub recycle_segments: usize,
}

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions {
            segment_bytes: 64 << 20,
            preallocate: true,
            recycle_segments: 2,
        }
    }
}

/// Why a WAL stopped taking writes ([`Wal::failure`]). A stopped WAL is never resumed in
/// place: the member fences itself and a restart runs recovery (docs/wal.md, "Disk full and
/// I/O errors").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalFailure {
    /// The failed operation, its file and the OS error, e.g. `fdatasync .../0000…0001-….wal:
    /// No space left on device (os error 28)`.
    pub reason: String,
    /// Whether the OS error was ENOSPC (the disk is full).
    pub no_space: bool,
}

/// Counters since open, for metrics and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalStats {
    /// Successful write calls (each got an Lsn).
    pub writes: u64,
    /// Entries appended.
    pub entries: u64,
    /// Group-commit rounds that called fdatasync.
    pub sync_rounds: u64,
    /// fdatasync calls (a round syncs more than one file only around a rollover).
    pub fdatasyncs: u64,
    /// Wall time spent in sync rounds (fdatasync, plus renames around rollover).
    pub sync_time: Duration,
}

#[derive(Default)]
struct Stats {
    writes: AtomicU64,
    entries: AtomicU64,
    sync_rounds: AtomicU64,
    fdatasyncs: AtomicU64,
    sync_nanos: AtomicU64,
}

impl Stats {
    fn record_sync(&self, took: Duration) {
        crate::metrics::disk().observe_wal_fsync(took);
        self.sync_rounds.fetch_add(1, Ordering::Relaxed);
        self.sync_nanos.fetch_add(
            u64::try_from(took.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }
}

/// State shared by the handle and the sync thread.
struct Shared {
    writer: Mutex<Writer>,
    /// Wakes the sync thread; paired with `writer`.
    work: Condvar,
    durability: Durability,
    dir: PathBuf,
    /// The WAL directory, opened for fsync and holding the exclusive lock.
    dir_file: File,
    stats: Stats,
    /// The writer's rollover signal (see [`Wal::rolled_over`]), reachable without its lock.
    rolled: Arc<tokio::sync::Notify>,
    /// Lsn of the newest lazy metadata write (0: none): a waiter for a higher Lsn waits for a
    /// write that asked for its sync itself, and need not take the writer's lock to ask.
    last_lazy: AtomicU64,
}

impl Shared {
    fn lock_writer(&self) -> MutexGuard<'_, Writer> {
        // Writer updates are applied after the I/O they describe succeeded, so a panic while
        // holding the lock cannot leave the index pointing at unwritten bytes.
        self.writer.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The write-ahead log. `Send + Sync`: share it behind an `Arc`. See the module docs.
pub struct Wal {
    shared: Arc<Shared>,
    sync_thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal")
            .field("dir", &self.shared.dir)
            .finish_non_exhaustive()
    }
}

impl Wal {
    /// Opens the WAL in `dir` (e.g. `<data-dir>/member/wal`), creating the directory and a
    /// first segment if needed, and runs recovery (see `docs/wal.md`). Takes an exclusive lock
    /// on the directory for the life of the handle.
    ///
    /// Errors: [`WalError::Corrupt`] if the segments are damaged before their tail,
    /// [`WalError::Locked`] if another handle has the directory, [`WalError::Io`] otherwise.
    pub fn open(dir: &Path, opts: WalOptions) -> Result<Wal, WalError> {
        let opts = WalOptions {
            segment_bytes: opts.segment_bytes.max(MIN_SEGMENT_BYTES),
            ..opts
        };
        if !dir.is_dir() {
            std::fs::create_dir_all(dir)?;
            if let Some(parent) = dir.parent() {
                fsutil::fsync_dir(&fsutil::open_dir(parent)?)?;
            }
        }
        let dir_file = fsutil::open_dir(dir)?;
        if !fsutil::try_lock_exclusive(&dir_file)? {
            return Err(WalError::Locked {
                dir: dir.to_path_buf(),
            });
        }
        let mut rec = recovery::recover(dir, &opts)?;
        tracing::info!(
            dir = %dir.display(),
            segments = rec.segments.len(),
            first_index = ?rec.index.first_index(),
            last_index = ?rec.index.last_index(),
            purged_index = ?rec.index.purged(),
            cut_bytes = rec.cut_bytes,
            "WAL recovered"
        );
        if rec.segments.is_empty() {
            let seg = create_first_segment(dir, &dir_file, &opts, rec.spares.pop())?;
            rec.segments.push_back(SegSlot {
                seg,
                max_index: None,
            });
            rec.offset = HEADER_LEN;
        }
        let mut writer = Writer::new(
            dir.to_path_buf(),
            opts,
            rec.index,
            rec.segments,
            rec.offset,
            rec.spares,
        );
        if rec.last_sealed {
            writer.start_segment()?;
        }
        let victims = match writer.index.purged() {
            Some(to) => writer.take_segments_purged_to(to),
            None => Vec::new(),
        };
        let rolled = Arc::clone(&writer.rolled);
        let shared = Arc::new(Shared {
            writer: Mutex::new(writer),
            work: Condvar::new(),
            durability: Durability::default(),
            dir: dir.to_path_buf(),
            dir_file,
            stats: Stats::default(),
            rolled,
            last_lazy: AtomicU64::new(0),
        });
        if !victims.is_empty() {
            remove_segments(&shared, victims);
        }
        let thread_shared = Arc::clone(&shared);
        let sync_thread = std::thread::Builder::new()
            .name("keel-wal-sync".into())
            .spawn(move || sync::run(thread_shared))?;
        Ok(Wal {
            shared,
            sync_thread: Some(sync_thread),
        })
    }

    /// First readable entry index, `None` if the log holds no entries (empty, or everything
    /// purged or truncated).
    pub fn first_index(&self) -> Option<u64> {
        self.shared.lock_writer().index.first_index()
    }

    /// Last entry index, `None` if the log holds no entries.
    pub fn last_index(&self) -> Option<u64> {
        self.shared.lock_writer().index.last_index()
    }

    /// The highest index passed to [`Wal::purge_to`] (as recovered), `None` if never purged.
    pub fn purged_index(&self) -> Option<u64> {
        self.shared.lock_writer().index.purged()
    }

    /// Latest value written for metadata `key` by [`Wal::set_meta`], if any.
    pub fn meta(&self, key: u8) -> Option<Vec<u8>> {
        self.shared
            .lock_writer()
            .index
            .meta(key)
            .map(<[u8]>::to_vec)
    }

    /// Appends `entries` (log index, entry bytes). Indexes must be consecutive, starting at
    /// `last_index() + 1`, or, when the log holds no entries, anywhere above the purged index
    /// (the first append after a snapshot). The bytes reach the OS before this returns and are
    /// readable at once; the returned Lsn becomes durable with a later group commit.
    /// An empty slice writes nothing and returns the current Lsn.
    ///
    /// Errors: [`WalError::NotContiguous`], [`WalError::BelowPurged`], [`WalError::TooLarge`]
    /// (nothing written); [`WalError::Io`] / [`WalError::Failed`] (the WAL stops).
    pub fn append(&self, entries: &[(u64, &[u8])]) -> Result<Lsn, WalError> {
        for pair in entries.windows(2) {
            if pair[1].0 != pair[0].0.wrapping_add(1) {
                return Err(WalError::NotContiguous {
                    expected: pair[0].0.wrapping_add(1),
                    got: pair[1].0,
                });
            }
        }
        if let Some(big) = entries.iter().find(|e| e.1.len() > MAX_VALUE_BYTES) {
            return Err(WalError::TooLarge {
                len: big.1.len(),
                max: MAX_VALUE_BYTES,
            });
        }
        let result = {
            let mut w = self.shared.lock_writer();
            w.check_usable()?;
            match entries.first() {
                None => return Ok(w.written_lsn),
                Some(&(first, _)) => w.index.check_append(first)?,
            }
            w.append(entries)
        };
        self.after_write(&result, entries.len());
        result
    }

    /// Resolves once a write (an append, a metadata, truncate or purge record) opened a new
    /// segment since the last call resolved (a rollover that happened while nobody waited
    /// counts). For `--max-wals` (`raft/retention.rs`), which checks the segment count at once
    /// instead of at its next tick. Meant for one waiter.
    pub async fn rolled_over(&self) {
        self.shared.rolled.notified().await;
    }

    /// Records `value` as the latest value of metadata `key` (the raft glue uses 1 = vote,
    /// 2 = committed log id, 3 = purged log id). Every new segment starts with a copy of all
    /// values, so purging never loses them.
    ///
    /// Errors: [`WalError::TooLarge`]; [`WalError::Io`] / [`WalError::Failed`].
    pub fn set_meta(&self, key: u8, value: &[u8]) -> Result<Lsn, WalError> {
        check_meta_len(value)?;
        let result = self.shared.lock_writer().set_meta(key, value);
        self.after_write(&result, 0);
        result
    }

    /// [`Wal::set_meta`] for a value nobody waits on: the record is written (and readable) at
    /// once, but it does not start a sync round of its own; it becomes durable with the next
    /// round another write or a waiter starts, or when the WAL is dropped. For the committed
    /// log id, which openraft only uses as a hint (`RaftLogStorage::save_committed` may even
    /// skip persisting it): written with `set_meta`, each commit advance cost the leader an
    /// fdatasync of its own (docs/wal.md, "Lazy metadata").
    ///
    /// Errors: as [`Wal::set_meta`].
    pub fn set_meta_lazy(&self, key: u8, value: &[u8]) -> Result<Lsn, WalError> {
        check_meta_len(value)?;
        let result = {
            let mut w = self.shared.lock_writer();
            let result = w.set_meta_lazy(key, value);
            if let Ok(lsn) = result {
                // Before the Lsn is handed out, so any waiter for it sees it is lazy.
                self.shared.last_lazy.store(lsn, Ordering::Release);
            }
            result
        };
        if result.is_ok() {
            self.shared.stats.writes.fetch_add(1, Ordering::Relaxed);
        } else {
            // The sync thread must fail the waiters.
            self.shared.work.notify_one();
        }
        result
    }

    /// Drops entries with index >= `index` (raft log conflict truncation, Raft paper §5.3).
    /// Takes effect for reads at once; durable with the returned Lsn. If no entry is at or
    /// above `index`, nothing is written and the current Lsn is returned.
    ///
    /// Errors: [`WalError::Io`] / [`WalError::Failed`].
    pub fn truncate_from(&self, index: u64) -> Result<Lsn, WalError> {
        let result = {
            let mut w = self.shared.lock_writer();
            w.check_usable()?;
            if w.index.last_index().is_none_or(|last| last < index) {
                return Ok(w.written_lsn);
            }
            w.truncate_from(index)
        };
        self.after_write(&result, 0);
        result
    }

    /// Declares entries with index <= `index` no longer needed (log compaction after a
    /// snapshot, Raft paper §7). Reads of them return `None` at once; the purge point is
    /// recorded in the log, and once that record is durable, whole segments whose entries are
    /// all <= `index` are deleted (or kept for recycling). A lower `index` than the current
    /// purge point is a no-op.
    ///
    /// Errors: [`WalError::Io`] / [`WalError::Failed`].
    pub fn purge_to(&self, index: u64) -> Result<(), WalError> {
        let result = {
            let mut w = self.shared.lock_writer();
            w.check_usable()?;
            if w.index.purged().is_some_and(|p| p >= index) {
                return Ok(());
            }
            w.purge_to(index)
        };
        self.after_write(&result, 0);
        result.map(|_| ())
    }

    fn after_write(&self, result: &Result<Lsn, WalError>, entries: usize) {
        if result.is_ok() {
            self.shared.stats.writes.fetch_add(1, Ordering::Relaxed);
            self.shared
                .stats
                .entries
                .fetch_add(entries as u64, Ordering::Relaxed);
        }
        // On failure too: the sync thread must fail the waiters.
        self.shared.work.notify_one();
    }

    /// Group commit: calls `f(Ok(()))` once every write up to `lsn` is fdatasync'ed, or
    /// `f(Err(_))` if the WAL fails first. Never calls `f` before the data is durable. `f` runs
    /// on the WAL's sync thread (also when `lsn` is already durable), so keep it short and do
    /// not block in it; `lsn` must be one returned by this handle.
    pub fn on_durable(&self, lsn: Lsn, f: Box<dyn FnOnce(Result<(), WalError>) + Send>) {
        if self.shared.durability.register(lsn, f) {
            self.shared.lock_writer().kick = true;
            self.shared.work.notify_one();
        } else {
            self.want(lsn);
        }
    }

    /// Blocks until every write up to `lsn` is durable. Errors: [`WalError::Failed`].
    pub fn wait_durable(&self, lsn: Lsn) -> Result<(), WalError> {
        self.want(lsn);
        self.shared.durability.wait(lsn)
    }

    /// Makes sure a sync round will cover `lsn` (a lazy write starts none of its own).
    fn want(&self, lsn: Lsn) {
        // Above the newest lazy write, `lsn` is an append or other write that already asked:
        // the common case (every append's callback) takes no lock here.
        if lsn > self.shared.last_lazy.load(Ordering::Acquire) {
            return;
        }
        if self.shared.lock_writer().want(lsn) {
            self.shared.work.notify_one();
        }
    }

    /// Blocks until every write made so far is durable.
    pub fn sync(&self) -> Result<(), WalError> {
        let lsn = self.shared.lock_writer().written_lsn;
        self.wait_durable(lsn)
    }

    /// The Lsn of the last write, and the last durable Lsn.
    pub fn lsns(&self) -> (Lsn, Lsn) {
        let written = self.shared.lock_writer().written_lsn;
        (written, self.shared.durability.durable())
    }

    /// (segment seq, end offset) of the last write; lets tests map records to file bytes.
    #[cfg(test)]
    pub(crate) fn last_write_end(&self) -> (u64, u64) {
        self.shared.lock_writer().last_write_end
    }

    /// Makes the WAL behave as if a write or fdatasync had just failed.
    #[cfg(test)]
    pub(crate) fn inject_failure(&self, reason: &str) {
        self.shared
            .lock_writer()
            .failed
            .get_or_insert_with(|| reason.to_string());
        self.shared.work.notify_one();
    }

    /// Why the WAL stopped taking writes, if a write or fdatasync failed since open: the first
    /// failure, which every later write and waiter also reports ([`WalError::Failed`]).
    pub fn failure(&self) -> Option<WalFailure> {
        let w = self.shared.lock_writer();
        w.failed.clone().map(|reason| WalFailure {
            reason,
            no_space: w.failed_no_space,
        })
    }

    /// Makes the WAL behave as if `what` had just failed with `err` (the writer's failure path).
    #[cfg(test)]
    pub(crate) fn inject_io_failure(&self, what: &str, err: std::io::Error) {
        let _ = self.shared.lock_writer().fail(what, err);
        self.shared.work.notify_one();
    }

    /// The live segments, oldest first: for each, the highest entry index ever written into
    /// it (`None`: none, e.g. a segment holding only its metadata snapshot). A purge to at
    /// least a segment's value makes that segment (and every older one) obsolete. `.spare`
    /// files are not live segments.
    pub fn segments(&self) -> Vec<Option<u64>> {
        self.shared
            .lock_writer()
            .segments
            .iter()
            .map(|s| s.max_index)
            .collect()
    }

    /// Counters since open.
    pub fn stats(&self) -> WalStats {
        let s = &self.shared.stats;
        WalStats {
            writes: s.writes.load(Ordering::Relaxed),
            entries: s.entries.load(Ordering::Relaxed),
            sync_rounds: s.sync_rounds.load(Ordering::Relaxed),
            fdatasyncs: s.fdatasyncs.load(Ordering::Relaxed),
            sync_time: Duration::from_nanos(s.sync_nanos.load(Ordering::Relaxed)),
        }
    }

    /// The bytes of entry `index`, `None` if it is not in the log (purged, truncated, or not
    /// written yet). Reads the record from its segment with one pread and checks its CRC.
    ///
    /// Errors: [`WalError::Corrupt`] if the record no longer validates; [`WalError::Io`].
    pub fn read(&self, index: u64) -> Result<Option<Vec<u8>>, WalError> {
        let found = {
            let w = self.shared.lock_writer();
            match w.index.get(index) {
                Some(loc) => Some((loc, segment_of(&w, loc)?)),
                None => None,
            }
        };
        let Some((loc, seg)) = found else {
            return Ok(None);
        };
        let mut buf = vec![0u8; ENTRY_DATA_OFFSET + loc.data_len as usize];
        seg.read_at(&mut buf, loc.offset)?;
        check_entry(&seg, loc, index, &buf, 0)?;
        buf.drain(..ENTRY_DATA_OFFSET);
        Ok(Some(buf))
    }

    /// Entries with index in `[start, end)` that are in the log, in index order. Neighbouring
    /// records are fetched with one pread per run of up to [`READ_RUN_BYTES`].
    ///
    /// Errors: as [`Wal::read`].
    pub fn read_range(&self, start: u64, end: u64) -> Result<Vec<(u64, Vec<u8>)>, WalError> {
        self.read_range_limited(start, end, usize::MAX)
    }

    /// As [`Wal::read_range`], but stops before the entry that would take the entries' data
    /// past `max_bytes` (bytes of entry data, frames not counted). The first entry is always
    /// returned, however large, so a caller that reads on from the last entry it got always
    /// makes progress. Only the returned entries are read from disk.
    ///
    /// Errors: as [`Wal::read`].
    pub fn read_range_limited(
        &self,
        start: u64,
        end: u64,
        max_bytes: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>, WalError> {
        let wanted: Vec<(u64, Loc, Arc<Segment>)> = {
            let w = self.shared.lock_writer();
            let mut bytes = 0usize;
            w.index
                .range(start, end)
                .enumerate()
                .take_while(|(n, (_, loc))| {
                    bytes = bytes.saturating_add(loc.data_len as usize);
                    *n == 0 || bytes <= max_bytes
                })
                .map(|(_, (index, loc))| Ok((index, loc, segment_of(&w, loc)?)))
                .collect::<Result<_, WalError>>()?
        };
        let mut out = Vec::with_capacity(wanted.len());
        let mut buf = Vec::new();
        let mut i = 0;
        while i < wanted.len() {
            // Extend the run while the next record is in the same segment, close behind.
            let (run_start, seg) = (wanted[i].1.offset, &wanted[i].2);
            let mut run_end = frame_end(wanted[i].1);
            let mut j = i + 1;
            while j < wanted.len()
                && wanted[j].1.seq == wanted[i].1.seq
                && wanted[j].1.offset >= run_end
                && wanted[j].1.offset - run_end <= READ_GAP_BYTES
                && frame_end(wanted[j].1) - run_start <= READ_RUN_BYTES
            {
                run_end = frame_end(wanted[j].1);
                j += 1;
            }
            buf.resize((run_end - run_start) as usize, 0);
            seg.read_at(&mut buf, run_start)?;
            for (index, loc, seg) in &wanted[i..j] {
                let at = (loc.offset - run_start) as usize;
                check_entry(seg, *loc, *index, &buf, at)?;
                out.push((
                    *index,
                    buf[at + ENTRY_DATA_OFFSET..at + ENTRY_DATA_OFFSET + loc.data_len as usize]
                        .to_vec(),
                ));
            }
            i = j;
        }
        Ok(out)
    }
}

/// Upper bound of one coalesced read in [`Wal::read_range`], in bytes.
pub const READ_RUN_BYTES: u64 = 1 << 20;
/// Largest gap between two records that a coalesced read spans (sync points sit between).
const READ_GAP_BYTES: u64 = 4096;

fn frame_end(loc: Loc) -> u64 {
    loc.offset + ENTRY_DATA_OFFSET as u64 + u64::from(loc.data_len)
}

fn segment_of(w: &Writer, loc: Loc) -> Result<Arc<Segment>, WalError> {
    let front = w.segments.front().expect("at least one segment").seg.seq();
    loc.seq
        .checked_sub(front)
        .and_then(|i| w.segments.get(i as usize))
        .map(|slot| Arc::clone(&slot.seg))
        .ok_or_else(|| {
            WalError::corrupt(
                &w.dir,
                loc.offset,
                format!("index points at missing segment {:016x}", loc.seq),
            )
        })
}

/// Verifies that `buf[at..]` holds the frame of entry `index` as described by `loc`.
fn check_entry(seg: &Segment, loc: Loc, index: u64, buf: &[u8], at: usize) -> Result<(), WalError> {
    let frame = &buf[at..at + ENTRY_DATA_OFFSET + loc.data_len as usize];
    match record::decode(seg.identity(), frame) {
        Ok((Record::Entry { index: found, .. }, _)) if found == index => Ok(()),
        Ok((other, _)) => Err(WalError::corrupt(
            seg.path(),
            loc.offset,
            format!("expected entry {index}, found {other:?}"),
        )),
        Err(why) => Err(WalError::corrupt(
            seg.path(),
            loc.offset,
            format!("entry {index}: {why}"),
        )),
    }
}

/// Creates, syncs and names the first segment of a new WAL.
fn create_first_segment(
    dir: &Path,
    dir_file: &File,
    opts: &WalOptions,
    spare: Option<PathBuf>,
) -> Result<Arc<Segment>, WalError> {
    let preallocate = opts.preallocate.then_some(opts.segment_bytes);
    let seg = Segment::create(dir, 1, 0, preallocate, spare.as_deref())?;
    seg.sync_data()?;
    seg.rename_to_final()?;
    fsutil::fsync_dir(dir_file)?;
    seg.mark_named();
    Ok(Arc::new(seg))
}

/// Deletes purged segment files, or renames them to spares for recycling when no reader holds
/// them and fewer than `recycle_segments` spares exist. Failures are logged, not returned: a
/// leftover file is replayed harmlessly and removed again by the next purge or open.
fn remove_segments(shared: &Shared, victims: Vec<Arc<Segment>>) {
    let budget = {
        let w = shared.lock_writer();
        w.opts.recycle_segments.saturating_sub(w.spares.len())
    };
    let mut recycled = Vec::new();
    for seg in victims {
        let path = seg.path();
        let seq = seg.seq();
        let result = match Arc::try_unwrap(seg) {
            Ok(seg) if recycled.len() < budget => {
                drop(seg);
                let spare = shared.dir.join(spare_file_name(seq));
                std::fs::rename(&path, &spare).map(|()| recycled.push(spare))
            }
            _ => std::fs::remove_file(&path),
        };
        match result {
            Ok(()) => tracing::debug!(path = %path.display(), "removed purged WAL segment"),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "could not remove purged WAL segment")
            }
        }
    }
    if let Err(e) = fsutil::fsync_dir(&shared.dir_file) {
        tracing::warn!(error = %e, "fsync of the WAL directory after purge failed");
    }
    shared.lock_writer().spares.extend(recycled);
}

/// [`WalError::TooLarge`] for a metadata value over [`MAX_VALUE_BYTES`].
fn check_meta_len(value: &[u8]) -> Result<(), WalError> {
    match value.len() {
        len if len > MAX_VALUE_BYTES => Err(WalError::TooLarge {
            len,
            max: MAX_VALUE_BYTES,
        }),
        _ => Ok(()),
    }
}

impl Drop for Wal {
    /// Stops the sync thread after it made every write durable (or failed).
    fn drop(&mut self) {
        self.shared.lock_writer().shutdown = true;
        self.shared.work.notify_all();
        if let Some(handle) = self.sync_thread.take() {
            // A callback that owned the last handle drops it on the sync thread itself.
            if handle.thread().id() != std::thread::current().id() {
                let _ = handle.join();
            }
        }
    }
}
