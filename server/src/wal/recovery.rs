//! Recovery: rebuilds the log from the segment files when the WAL is opened.
//!
//! Rules (see `docs/wal.md`):
//! 1. Live segments are `<seq>-<first index>.wal`; their sequence numbers must be consecutive.
//!    `*.wal.tmp` files (segments whose predecessor was not yet durable) are deleted: nothing in
//!    them was acknowledged. `*.spare` files are kept for recycling.
//! 2. Every record of every segment is replayed in order: entries, metadata values, truncate
//!    and purge markers.
//! 3. A segment other than the last must end with a `Seal` record, and every record before it
//!    must be valid: it was fully fdatasync'ed before its successor got a name. Anything else is
//!    [`WalError::Corrupt`].
//! 4. In the last segment, the first invalid record (zeros, a torn write, stale bytes) at offset
//!    `o` ends the log, unless some valid `SyncPoint` record says bytes beyond `o` were already
//!    durable: then the invalid record was once durable and is corruption, an error. Otherwise
//!    the file is cut at `o` (truncated, re-preallocated, fdatasync'ed) so stale bytes after the
//!    cut can never be mistaken for new records, and appends continue at `o`.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::WalOptions;
use super::error::WalError;
use super::log_index::{Loc, LogIndex};
use super::record::{self, FRAME_ALIGN, Identity, Record, RecordType};
use super::segment::{FileKind, HEADER_LEN, Segment, SegmentHeader, classify};
use super::writer::SegSlot;

/// The state rebuilt from disk.
#[derive(Debug)]
pub(crate) struct Recovered {
    pub index: LogIndex,
    /// Live segments, oldest first; empty for a new WAL.
    pub segments: VecDeque<SegSlot>,
    /// Where the next record goes in the last segment.
    pub offset: u64,
    /// The last segment ends with a `Seal`: writing must continue in a new segment.
    pub last_sealed: bool,
    pub spares: Vec<PathBuf>,
    /// Bytes cut from the tail of the last segment (for the log line).
    pub cut_bytes: u64,
}

struct Found {
    seq: u64,
    first_index: u64,
    path: PathBuf,
}

/// Scans `dir` and replays it. See the module docs for the rules.
pub(crate) fn recover(dir: &Path, opts: &WalOptions) -> Result<Recovered, WalError> {
    let Listing {
        segments: found,
        temps,
        mut spares,
    } = list_dir(dir)?;
    for temp in temps {
        tracing::info!(path = %temp.display(), "removing unfinished WAL segment (never acknowledged)");
        std::fs::remove_file(&temp)?;
    }
    while spares.len() > opts.recycle_segments {
        let extra = spares.pop().expect("non-empty");
        std::fs::remove_file(&extra)?;
    }

    let mut rec = Recovered {
        index: LogIndex::default(),
        segments: VecDeque::new(),
        offset: HEADER_LEN,
        last_sealed: false,
        spares,
        cut_bytes: 0,
    };
    for (i, f) in found.iter().enumerate() {
        if i > 0 && f.seq != found[i - 1].seq + 1 {
            return Err(WalError::corrupt(
                &f.path,
                0,
                format!(
                    "segment sequence gap: {:016x} follows {:016x}",
                    f.seq,
                    found[i - 1].seq
                ),
            ));
        }
        replay_segment(f, i + 1 == found.len(), opts, &mut rec)?;
    }
    Ok(rec)
}

/// Directory entries by kind.
struct Listing {
    segments: Vec<Found>,
    temps: Vec<PathBuf>,
    spares: Vec<PathBuf>,
}

fn list_dir(dir: &Path) -> Result<Listing, WalError> {
    let mut l = Listing {
        segments: Vec::new(),
        temps: Vec::new(),
        spares: Vec::new(),
    };
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        match classify(name) {
            Some(FileKind::Segment { seq, first_index }) => l.segments.push(Found {
                seq,
                first_index,
                path: entry.path(),
            }),
            Some(FileKind::Temp { .. }) => l.temps.push(entry.path()),
            Some(FileKind::Spare) => l.spares.push(entry.path()),
            None => tracing::warn!(file = name, "ignoring unknown file in the WAL directory"),
        }
    }
    l.segments.sort_by_key(|f| f.seq);
    l.spares.sort();
    Ok(l)
}

fn replay_segment(
    f: &Found,
    is_last: bool,
    opts: &WalOptions,
    rec: &mut Recovered,
) -> Result<(), WalError> {
    let mut file = OpenOptions::new().read(true).write(true).open(&f.path)?;
    let mut buf = Vec::new();
    file.read_to_end(&mut buf)?;
    let header =
        SegmentHeader::decode(&buf).map_err(|e| WalError::corrupt(&f.path, 0, e.to_string()))?;
    if header.seq != f.seq || header.first_index != f.first_index {
        return Err(WalError::corrupt(
            &f.path,
            0,
            format!(
                "header says seq {:016x} first index {:016x}, file name disagrees",
                header.seq, header.first_index
            ),
        ));
    }
    let id = header.identity();
    let mut max_index = None;
    let mut durable_claim = 0u64;
    let mut off = HEADER_LEN as usize;
    let mut sealed = false;
    let mut invalid = None;
    while off < buf.len() {
        let (record, frame_len) = match record::decode(id, &buf[off..]) {
            Ok(ok) => ok,
            Err(why) => {
                invalid = Some(why.to_string());
                break;
            }
        };
        let at = |reason: String| WalError::corrupt(&f.path, off as u64, reason);
        match record {
            Record::Entry { index, data } => {
                rec.index
                    .check_append(index)
                    .map_err(|e| at(format!("entry does not continue the log: {e}")))?;
                let data_len =
                    u32::try_from(data.len()).map_err(|_| at("entry too large".into()))?;
                rec.index.push(
                    index,
                    Loc {
                        seq: f.seq,
                        offset: off as u64,
                        data_len,
                    },
                );
                max_index = max_index.max(Some(index));
            }
            Record::Meta { key, value } => rec.index.set_meta(key, value),
            Record::Truncate { from } => rec.index.truncate_from(from),
            Record::Purge { to } => rec.index.purge_to(to),
            Record::SyncPoint { durable_through } => {
                durable_claim = durable_claim.max(durable_through)
            }
            Record::Seal => sealed = true,
        }
        off += frame_len;
        if sealed {
            break;
        }
    }

    if !is_last && !sealed {
        let reason = invalid.unwrap_or_else(|| "file ends".into());
        return Err(WalError::corrupt(
            &f.path,
            off as u64,
            format!("{reason} before the seal record of a closed segment"),
        ));
    }
    if is_last && !sealed {
        let claim = durable_claim.max(scan_sync_points(id, &buf, off));
        if claim > off as u64 {
            let reason = invalid.unwrap_or_else(|| "file ends".into());
            return Err(WalError::corrupt(
                &f.path,
                off as u64,
                format!("{reason}, but a sync point shows bytes up to offset {claim} were durable"),
            ));
        }
        let tail = buf.get(off..).unwrap_or_default();
        if tail.iter().any(|&b| b != 0) {
            cut_tail(&file, &f.path, off as u64, opts)?;
            rec.cut_bytes = tail.len() as u64;
        } else if opts.preallocate && (buf.len() as u64) < opts.segment_bytes {
            // Shorter than configured (a crash cut it, or the option changed): appends
            // continue here, so give them preallocated space again.
            super::fsutil::preallocate(&file, opts.segment_bytes)?;
        }
        rec.offset = off as u64;
    }
    rec.last_sealed = sealed;
    file.sync_data()?;
    let seg = Segment::from_existing(f.path.parent().unwrap_or(Path::new(".")), file, header);
    rec.segments.push_back(SegSlot {
        seg: Arc::new(seg),
        max_index,
    });
    Ok(())
}

/// Cuts the last segment at `offset`: drops everything after it and re-preallocates zeros.
fn cut_tail(file: &File, path: &Path, offset: u64, opts: &WalOptions) -> Result<(), WalError> {
    tracing::warn!(path = %path.display(), offset, "cutting torn or unacknowledged WAL tail");
    file.set_len(offset)?;
    if opts.preallocate {
        super::fsutil::preallocate(file, opts.segment_bytes)?;
    }
    file.sync_all()?;
    Ok(())
}

/// Highest `durable_through` of any valid `SyncPoint` frame at an aligned offset >= `from`.
fn scan_sync_points(id: Identity, buf: &[u8], from: usize) -> u64 {
    let mut claim = 0;
    let mut p = from.next_multiple_of(FRAME_ALIGN);
    while p + record::frame_len(8) <= buf.len() {
        // Cheap pre-check of length and type before the CRC.
        if buf[p..p + 4] == 8u32.to_le_bytes()
            && buf[p + 4] == RecordType::SyncPoint as u8
            && let Ok((Record::SyncPoint { durable_through }, _)) = record::decode(id, &buf[p..])
        {
            claim = claim.max(durable_through);
        }
        p += FRAME_ALIGN;
    }
    claim
}
