//! Record framing: `len | type | reserved | crc32 | payload | padding`.
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | payload length in bytes, u32 little-endian |
//! | 4 | 1 | record type ([`RecordType`]); 0 never occurs, so zero-filled space is not a record |
//! | 5 | 3 | reserved, must be zero |
//! | 8 | 4 | crc32 (IEEE, `crc32fast`) over segment identity (seq u64 LE, nonce u64 LE), bytes 0..8, payload |
//! | 12 | len | payload (layout per type below) |
//! | 12+len | 0..7 | zero padding so every frame starts at a multiple of 8 |
//!
//! Because the CRC covers the segment identity, a frame copied from another segment, or left in a
//! preallocated or recycled file by an earlier incarnation, never validates in this segment.
//! Frames are 8-byte aligned so recovery can scan a tail for sync points cheaply.

use std::fmt;

/// Bytes before the payload.
pub(crate) const FRAME_HEADER_LEN: usize = 12;
/// Every frame starts at a multiple of this many bytes (relative to the file start).
pub(crate) const FRAME_ALIGN: usize = 8;

/// Segment identity mixed into every record CRC: the segment sequence number and the random
/// nonce chosen when the segment file was created or recycled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    pub seq: u64,
    pub nonce: u64,
}

impl Identity {
    fn bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.seq.to_le_bytes());
        b[8..].copy_from_slice(&self.nonce.to_le_bytes());
        b
    }
}

/// On-disk record type tags. Never renumber: they are part of the format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum RecordType {
    /// payload: log index u64 LE, then the entry bytes.
    Entry = 1,
    /// payload: key u8, then the value bytes.
    Meta = 2,
    /// payload: log index u64 LE; entries with index >= it are dropped.
    Truncate = 3,
    /// payload: log index u64 LE; entries with index <= it are dropped.
    Purge = 4,
    /// payload: offset u64 LE; every byte of this segment before it was fdatasync'ed before this
    /// record was written.
    SyncPoint = 5,
    /// empty payload; the last record of a segment that was closed by rollover.
    Seal = 6,
}

impl RecordType {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => RecordType::Entry,
            2 => RecordType::Meta,
            3 => RecordType::Truncate,
            4 => RecordType::Purge,
            5 => RecordType::SyncPoint,
            6 => RecordType::Seal,
            _ => return None,
        })
    }
}

/// A decoded record; borrows its bytes from the buffer it was decoded from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Record<'a> {
    Entry { index: u64, data: &'a [u8] },
    Meta { key: u8, value: &'a [u8] },
    Truncate { from: u64 },
    Purge { to: u64 },
    SyncPoint { durable_through: u64 },
    Seal,
}

impl Record<'_> {
    fn kind(&self) -> RecordType {
        match self {
            Record::Entry { .. } => RecordType::Entry,
            Record::Meta { .. } => RecordType::Meta,
            Record::Truncate { .. } => RecordType::Truncate,
            Record::Purge { .. } => RecordType::Purge,
            Record::SyncPoint { .. } => RecordType::SyncPoint,
            Record::Seal => RecordType::Seal,
        }
    }

    fn payload_len(&self) -> usize {
        match self {
            Record::Entry { data, .. } => 8 + data.len(),
            Record::Meta { value, .. } => 1 + value.len(),
            Record::Truncate { .. } | Record::Purge { .. } | Record::SyncPoint { .. } => 8,
            Record::Seal => 0,
        }
    }

    /// Size of the whole frame on disk, padding included.
    pub(crate) fn frame_len(&self) -> usize {
        frame_len(self.payload_len())
    }
}

/// Frame size in bytes (header + payload + padding) for a payload of `payload_len` bytes.
pub(crate) const fn frame_len(payload_len: usize) -> usize {
    (FRAME_HEADER_LEN + payload_len).next_multiple_of(FRAME_ALIGN)
}

/// Offset of an entry's data bytes from the start of its frame.
pub(crate) const ENTRY_DATA_OFFSET: usize = FRAME_HEADER_LEN + 8;

/// Appends the framed `record` to `out`. `out.len()` must be a multiple of [`FRAME_ALIGN`] so the
/// frame keeps its alignment once written at an aligned file offset.
pub(crate) fn encode(id: Identity, record: &Record<'_>, out: &mut Vec<u8>) {
    debug_assert_eq!(
        out.len() % FRAME_ALIGN,
        0,
        "frames must stay 8-byte aligned"
    );
    let start = out.len();
    let payload_len = record.payload_len();
    let len = u32::try_from(payload_len).expect("payload length is bounded by MAX_VALUE_BYTES");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&[record.kind() as u8, 0, 0, 0]);
    out.extend_from_slice(&[0u8; 4]); // crc, filled below
    match record {
        Record::Entry { index, data } => {
            out.extend_from_slice(&index.to_le_bytes());
            out.extend_from_slice(data);
        }
        Record::Meta { key, value } => {
            out.push(*key);
            out.extend_from_slice(value);
        }
        Record::Truncate { from: v } | Record::Purge { to: v } => {
            out.extend_from_slice(&v.to_le_bytes())
        }
        Record::SyncPoint { durable_through } => {
            out.extend_from_slice(&durable_through.to_le_bytes())
        }
        Record::Seal => {}
    }
    let crc = checksum(id, &out[start..start + 8], &out[start + FRAME_HEADER_LEN..]);
    out[start + 8..start + 12].copy_from_slice(&crc.to_le_bytes());
    out.resize(start + frame_len(payload_len), 0);
}

fn checksum(id: Identity, head: &[u8], payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&id.bytes());
    h.update(head);
    h.update(payload);
    h.finalize()
}

/// Why the bytes at some offset are not a valid record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Invalid {
    /// The frame header is all zeros: preallocated space (the normal end of data).
    Zeroed,
    /// Anything else: torn write, garbage, stale bytes of another incarnation, or corruption.
    Bad(String),
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Invalid::Zeroed => f.write_str("zero-filled space where a record was expected"),
            Invalid::Bad(reason) => f.write_str(reason),
        }
    }
}

/// Decodes the frame at the start of `buf` (which may extend past the frame, up to the end of
/// the file). On success returns the record and the frame length including padding; the padding
/// may extend past the end of `buf` when a file ends right after a record.
pub(crate) fn decode(id: Identity, buf: &[u8]) -> Result<(Record<'_>, usize), Invalid> {
    if buf.len() < FRAME_HEADER_LEN {
        return Err(if buf.iter().all(|&b| b == 0) {
            Invalid::Zeroed
        } else {
            Invalid::Bad(format!(
                "frame header cut short: {} of {FRAME_HEADER_LEN} bytes",
                buf.len()
            ))
        });
    }
    if buf[..FRAME_HEADER_LEN].iter().all(|&b| b == 0) {
        return Err(Invalid::Zeroed);
    }
    let len = u32::from_le_bytes(buf[0..4].try_into().expect("4 bytes")) as usize;
    let kind = RecordType::from_u8(buf[4])
        .ok_or_else(|| Invalid::Bad(format!("unknown record type {}", buf[4])))?;
    if buf[5..8] != [0, 0, 0] {
        return Err(Invalid::Bad("reserved frame bytes are not zero".into()));
    }
    let stored_crc = u32::from_le_bytes(buf[8..12].try_into().expect("4 bytes"));
    let available = buf.len() - FRAME_HEADER_LEN;
    if len > available {
        return Err(Invalid::Bad(format!(
            "payload length {len} exceeds the {available} bytes left in the file"
        )));
    }
    let payload = &buf[FRAME_HEADER_LEN..FRAME_HEADER_LEN + len];
    let crc = checksum(id, &buf[..8], payload);
    if crc != stored_crc {
        return Err(Invalid::Bad(format!(
            "crc mismatch: stored {stored_crc:#010x}, computed {crc:#010x}"
        )));
    }
    let u64_at = |p: &[u8]| u64::from_le_bytes(p[..8].try_into().expect("8 bytes"));
    let bad_len = || Invalid::Bad(format!("payload length {len} is invalid for {kind:?}"));
    let record = match kind {
        RecordType::Entry if len >= 8 => Record::Entry {
            index: u64_at(payload),
            data: &payload[8..],
        },
        RecordType::Meta if len >= 1 => Record::Meta {
            key: payload[0],
            value: &payload[1..],
        },
        RecordType::Truncate if len == 8 => Record::Truncate {
            from: u64_at(payload),
        },
        RecordType::Purge if len == 8 => Record::Purge {
            to: u64_at(payload),
        },
        RecordType::SyncPoint if len == 8 => Record::SyncPoint {
            durable_through: u64_at(payload),
        },
        RecordType::Seal if len == 0 => Record::Seal,
        _ => return Err(bad_len()),
    };
    Ok((record, frame_len(len)))
}
