//! The writer: state guarded by the WAL's one narrow mutex.
//!
//! Appenders encode their records and `pwrite` them into the current segment while holding the
//! mutex (no fsync inside it), then update the [`LogIndex`]. Rollover happens inline when the
//! next write would not fit: the current segment gets a `Seal` record, a new segment is created
//! (or a spare is recycled) under a temporary name, and it starts with a snapshot of every
//! metadata value and the purge point, so deleting older segments never loses them.
//!
//! The sync thread takes the mutex only to snapshot what to sync and to record the result.

use std::collections::VecDeque;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use super::error::WalError;
use super::log_index::{Loc, LogIndex};
use super::record::{self, Record};
use super::segment::{HEADER_LEN, Segment};
use super::{Lsn, WalOptions};

/// Frame size of a `Seal` record; every segment keeps room for one.
pub(crate) const SEAL_FRAME_LEN: u64 = record::frame_len(0) as u64;
/// Frame size of a `SyncPoint` record.
const SYNC_POINT_FRAME_LEN: u64 = record::frame_len(8) as u64;

/// A live segment and the highest entry index ever written into it (used to decide when a
/// purge makes the whole segment obsolete).
#[derive(Debug)]
pub(crate) struct SegSlot {
    pub seg: Arc<Segment>,
    pub max_index: Option<u64>,
}

/// See the module docs. Fields are read by the sync thread and `Wal`.
#[derive(Debug)]
pub(crate) struct Writer {
    pub dir: PathBuf,
    pub opts: WalOptions,
    pub index: LogIndex,
    /// Live segments, oldest first, consecutive sequence numbers; the last one is written to.
    pub segments: VecDeque<SegSlot>,
    /// Next write offset in the current segment.
    pub offset: u64,
    /// Offset right after the current segment's metadata snapshot: a segment holding nothing
    /// else is never rolled over, so an oversized snapshot cannot loop.
    pub data_start: u64,
    /// Lsn of the last write handed out; `synced_lsn` is the last one made durable.
    pub written_lsn: Lsn,
    pub synced_lsn: Lsn,
    /// Highest Lsn somebody needs durable: every write but a lazy metadata write
    /// ([`crate::wal::Wal::set_meta_lazy`]), and any Lsn waited for. The sync thread starts a
    /// round only while this is above `synced_lsn`; the round then covers `written_lsn`.
    pub wanted_lsn: Lsn,
    /// Lowest segment sequence number that may hold bytes not yet fdatasync'ed.
    pub sync_from_seq: u64,
    /// Highest segment sequence number whose final name is durable.
    pub named_seq: u64,
    /// Set when callbacks may be ready without a new write (wakes the sync thread).
    pub kick: bool,
    pub shutdown: bool,
    /// Set after any failed write or fdatasync; every later write is refused.
    pub failed: Option<String>,
    /// Whether that first failure was ENOSPC (the member raises NOSPACE before it fences).
    pub failed_no_space: bool,
    /// Purged segment files kept for recycling.
    pub spares: Vec<PathBuf>,
    /// Purges waiting for their record to be durable before segments are removed: (lsn, index).
    pub pending_purges: Vec<(Lsn, u64)>,
    /// Signalled by every rollover, whichever write caused it ([`crate::wal::Wal::rolled_over`]).
    pub rolled: Arc<tokio::sync::Notify>,
    buf: Vec<u8>,
    /// (segment seq, end offset) of the last user write, so tests can map records to bytes.
    #[cfg(test)]
    pub last_write_end: (u64, u64),
}

impl Writer {
    /// Builds the writer over recovered state; `segments` must not be empty.
    pub(crate) fn new(
        dir: PathBuf,
        opts: WalOptions,
        index: LogIndex,
        segments: VecDeque<SegSlot>,
        offset: u64,
        spares: Vec<PathBuf>,
    ) -> Writer {
        let current = segments.back().expect("at least one segment").seg.seq();
        Writer {
            dir,
            opts,
            index,
            segments,
            offset,
            data_start: HEADER_LEN,
            written_lsn: 0,
            synced_lsn: 0,
            wanted_lsn: 0,
            sync_from_seq: current,
            named_seq: current,
            kick: false,
            shutdown: false,
            failed: None,
            failed_no_space: false,
            spares,
            pending_purges: Vec::new(),
            rolled: Arc::default(),
            buf: Vec::new(),
            #[cfg(test)]
            last_write_end: (0, 0),
        }
    }

    pub(crate) fn current(&self) -> &SegSlot {
        self.segments.back().expect("at least one segment")
    }

    pub(crate) fn check_usable(&self) -> Result<(), WalError> {
        match &self.failed {
            Some(reason) => Err(WalError::Failed(reason.clone())),
            None => Ok(()),
        }
    }

    /// Records an I/O failure; the WAL refuses writes from now on.
    pub(crate) fn fail(&mut self, what: &str, err: io::Error) -> WalError {
        let reason = format!("{what}: {err}");
        tracing::error!(error = %reason, "WAL write failed; refusing further writes");
        self.record_failure(reason, &err);
        WalError::Io(err)
    }

    /// Makes `reason` the sticky failure unless an earlier one is recorded.
    pub(crate) fn record_failure(&mut self, reason: String, err: &io::Error) {
        if self.failed.is_none() {
            self.failed = Some(reason);
            self.failed_no_space = err.raw_os_error() == Some(libc::ENOSPC);
        }
    }

    /// Writes `records` as one contiguous batch into the current segment, rolling over first if
    /// they do not fit. Returns the segment sequence number and the offset of the first frame;
    /// frames follow each other, each `Record::frame_len` long. Does not advance the Lsn.
    pub(crate) fn write(&mut self, records: &[Record<'_>]) -> Result<(u64, u64), WalError> {
        self.check_usable()?;
        let total: u64 = records.iter().map(|r| r.frame_len() as u64).sum();
        if self.offset + total + SEAL_FRAME_LEN > self.opts.segment_bytes
            && self.offset > self.data_start
        {
            self.rollover()?;
        }
        let written = self.write_in_current(records)?;
        #[cfg(test)]
        {
            self.last_write_end = (written.0, self.offset);
        }
        Ok(written)
    }

    fn write_in_current(&mut self, records: &[Record<'_>]) -> Result<(u64, u64), WalError> {
        let seg = Arc::clone(&self.current().seg);
        self.buf.clear();
        for r in records {
            record::encode(seg.identity(), r, &mut self.buf);
        }
        let start = self.offset;
        if crate::failpoint::hit("wal_torn_write") {
            // A torn write: only a prefix of the batch reaches the file, then the process dies.
            let torn = self.buf.len() / 2;
            let _ = seg.write_at(&self.buf[..torn], start);
            crate::failpoint::crash("wal_torn_write");
        }
        if let Err(e) = injected_write_error(&seg, &self.buf, start)
            .map_or_else(|| seg.write_at(&self.buf, start), Err)
        {
            return Err(self.fail(&format!("write {}", seg.path().display()), e));
        }
        self.offset += self.buf.len() as u64;
        Ok((seg.seq(), start))
    }

    /// Seals the current segment and starts the next one. See the module docs.
    pub(crate) fn rollover(&mut self) -> Result<(), WalError> {
        self.write_in_current(&[Record::Seal])?;
        self.start_segment()?;
        self.rolled.notify_one();
        Ok(())
    }

    /// Starts the next segment (the current one must be sealed already): creates or recycles the
    /// file under its temporary name and writes the metadata snapshot into it.
    pub(crate) fn start_segment(&mut self) -> Result<(), WalError> {
        let seq = self.current().seg.seq() + 1;
        let spare = self.spares.pop();
        let preallocate = self.opts.preallocate.then_some(self.opts.segment_bytes);
        let seg = match Segment::create(
            &self.dir,
            seq,
            self.index.next_index(),
            preallocate,
            spare.as_deref(),
        ) {
            Ok(seg) => Arc::new(seg),
            Err(e) => return Err(self.fail(&format!("create segment {seq:016x}"), e)),
        };
        tracing::debug!(seq, recycled = spare.is_some(), "WAL rollover");
        self.segments.push_back(SegSlot {
            seg,
            max_index: None,
        });
        self.offset = HEADER_LEN;
        let index = std::mem::take(&mut self.index);
        let mut snapshot: Vec<Record<'_>> = index
            .metas()
            .map(|(key, value)| Record::Meta { key, value })
            .collect();
        if let Some(to) = index.purged() {
            snapshot.push(Record::Purge { to });
        }
        let written = self.write_in_current(&snapshot);
        drop(snapshot);
        self.index = index;
        written?;
        self.data_start = self.offset;
        Ok(())
    }

    /// Appends entries (already validated by the caller) and indexes them.
    pub(crate) fn append(&mut self, entries: &[(u64, &[u8])]) -> Result<Lsn, WalError> {
        let records: Vec<Record<'_>> = entries
            .iter()
            .map(|&(index, data)| Record::Entry { index, data })
            .collect();
        let (seq, mut offset) = self.write(&records)?;
        for (r, &(index, data)) in records.iter().zip(entries) {
            let data_len = u32::try_from(data.len()).expect("bounded by MAX_VALUE_BYTES");
            self.index.push(
                index,
                Loc {
                    seq,
                    offset,
                    data_len,
                },
            );
            offset += r.frame_len() as u64;
        }
        let slot = self.segments.back_mut().expect("at least one segment");
        slot.max_index = slot.max_index.max(entries.last().map(|e| e.0));
        Ok(self.next_lsn())
    }

    pub(crate) fn set_meta(&mut self, key: u8, value: &[u8]) -> Result<Lsn, WalError> {
        let lsn = self.set_meta_lazy(key, value)?;
        self.wanted_lsn = lsn;
        Ok(lsn)
    }

    /// [`Writer::set_meta`] without asking for a sync: the write is durable with the next
    /// round some other write or waiter starts.
    pub(crate) fn set_meta_lazy(&mut self, key: u8, value: &[u8]) -> Result<Lsn, WalError> {
        self.write(&[Record::Meta { key, value }])?;
        self.index.set_meta(key, value);
        self.written_lsn += 1;
        Ok(self.written_lsn)
    }

    /// Asks the sync thread to make everything up to `lsn` durable; true when that is news
    /// (the caller then wakes the sync thread).
    pub(crate) fn want(&mut self, lsn: Lsn) -> bool {
        let news = lsn > self.wanted_lsn.max(self.synced_lsn);
        self.wanted_lsn = self.wanted_lsn.max(lsn);
        news
    }

    pub(crate) fn truncate_from(&mut self, from: u64) -> Result<Lsn, WalError> {
        self.write(&[Record::Truncate { from }])?;
        self.index.truncate_from(from);
        Ok(self.next_lsn())
    }

    pub(crate) fn purge_to(&mut self, to: u64) -> Result<Lsn, WalError> {
        self.write(&[Record::Purge { to }])?;
        self.index.purge_to(to);
        let lsn = self.next_lsn();
        self.pending_purges.push((lsn, to));
        Ok(lsn)
    }

    fn next_lsn(&mut self) -> Lsn {
        self.written_lsn += 1;
        self.wanted_lsn = self.written_lsn;
        self.written_lsn
    }

    /// Writes a `SyncPoint` saying bytes `[0, durable_through)` of segment `seq` are durable, if
    /// `seq` is still the current segment and the record fits. Not part of the Lsn sequence.
    pub(crate) fn write_sync_point(&mut self, seq: u64, durable_through: u64) {
        if self.failed.is_some()
            || self.current().seg.seq() != seq
            || self.offset + SYNC_POINT_FRAME_LEN + SEAL_FRAME_LEN > self.opts.segment_bytes
        {
            return;
        }
        // A failure here poisons the WAL through `fail`; the sync thread reports it.
        let _ = self.write_in_current(&[Record::SyncPoint { durable_through }]);
    }

    /// Removes and returns the oldest segments made obsolete by purges whose record is durable
    /// up to `durable`: a prefix of segments whose entries are all <= the purged index, never
    /// the newest durably named segment or anything after it (the files that recovery needs).
    pub(crate) fn take_purged_segments(&mut self, durable: Lsn) -> Vec<Arc<Segment>> {
        let Some(to) = self
            .pending_purges
            .iter()
            .filter(|(lsn, _)| *lsn <= durable)
            .map(|p| p.1)
            .max()
        else {
            return Vec::new();
        };
        self.pending_purges.retain(|(lsn, _)| *lsn > durable);
        self.take_segments_purged_to(to)
    }

    /// See [`Writer::take_purged_segments`]; `to` must be a durable purge point.
    pub(crate) fn take_segments_purged_to(&mut self, to: u64) -> Vec<Arc<Segment>> {
        let mut victims = Vec::new();
        while let Some(front) = self.segments.front() {
            if front.seg.seq() >= self.named_seq || front.max_index.is_some_and(|m| m > to) {
                break;
            }
            victims.push(self.segments.pop_front().expect("front exists").seg);
        }
        victims
    }
}

/// The failpoints `wal_write_enospc` and `wal_write_eio` (docs/failpoints.md): a short write
/// (the first half of the batch reaches the file, as when `write(2)` fills the disk part-way)
/// followed by that error, which the writer then handles as a real one.
fn injected_write_error(seg: &Segment, buf: &[u8], start: u64) -> Option<io::Error> {
    let err = crate::failpoint::io_error("wal_write_enospc", libc::ENOSPC)
        .or_else(|| crate::failpoint::io_error("wal_write_eio", libc::EIO))?;
    let _ = seg.write_at(&buf[..buf.len() / 2], start);
    Some(err)
}
