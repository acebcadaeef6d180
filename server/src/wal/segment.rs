//! Segment files: naming, the fixed header, and positional I/O on one file.
//!
//! File names (all in the WAL directory):
//! - `<seq:016x>-<first index:016x>.wal`: a live segment (etcd-like naming). `first index` is
//!   the log index the next entry was going to have when the segment was created.
//! - `<seq:016x>.wal.tmp`: a segment being filled whose predecessor may not be durable yet.
//!   It gets its final name only after every earlier segment is fdatasync'ed, so recovery never
//!   sees a later segment next to a torn earlier one. Recovery ignores (recycles) these files.
//! - `<seq:016x>.spare`: a purged segment kept for recycling. Ignored by recovery.
//!
//! Header (48 bytes, little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `KEELWAL\0` |
//! | 8 | 4 | format version (1) |
//! | 12 | 4 | header length in bytes (48) |
//! | 16 | 8 | segment sequence number (same as the file name) |
//! | 24 | 8 | nonce: random, new each time the file is created or recycled |
//! | 32 | 8 | first log index (same as the file name) |
//! | 40 | 4 | crc32 of bytes 0..40 |
//! | 44 | 4 | reserved, zero |

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use super::fsutil;
use super::record::Identity;

/// `KEELWAL\0`.
pub(crate) const MAGIC: [u8; 8] = *b"KEELWAL\0";
/// Current on-disk format version. Bump it (and keep a reader for the old one) on any change.
pub(crate) const FORMAT_VERSION: u32 = 1;
/// Size of the segment header; the first record starts here.
pub(crate) const HEADER_LEN: u64 = 48;

/// Why bytes are not a valid segment header ([`SegmentHeader::decode`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HeaderError {
    /// Fewer bytes than a header.
    #[error("file is {len} bytes, shorter than the {HEADER_LEN}-byte header")]
    Short {
        /// Length of what was read, in bytes.
        len: usize,
    },
    /// The first 8 bytes are not [`MAGIC`].
    #[error("bad magic: not a Keel WAL segment")]
    BadMagic,
    /// A format version this build cannot read.
    #[error("unsupported format version {found} (this build reads {FORMAT_VERSION})")]
    UnsupportedVersion {
        /// The version in the header.
        found: u32,
    },
    /// A header length other than [`HEADER_LEN`].
    #[error("unexpected header length {found}")]
    Length {
        /// The length in the header.
        found: u32,
    },
    /// The header's crc32 does not match its bytes.
    #[error("header crc mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Crc {
        /// The crc32 stored at offset 40.
        stored: u32,
        /// The crc32 of bytes 0..40.
        computed: u32,
    },
}

/// The fixed header at the start of every segment file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegmentHeader {
    pub seq: u64,
    pub nonce: u64,
    pub first_index: u64,
}

impl SegmentHeader {
    pub(crate) fn identity(&self) -> Identity {
        Identity {
            seq: self.seq,
            nonce: self.nonce,
        }
    }

    pub(crate) fn encode(&self) -> [u8; HEADER_LEN as usize] {
        let mut b = [0u8; HEADER_LEN as usize];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.nonce.to_le_bytes());
        b[32..40].copy_from_slice(&self.first_index.to_le_bytes());
        let crc = crc32fast::hash(&b[0..40]);
        b[40..44].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Parses and checks a header.
    ///
    /// Errors: [`HeaderError`], naming what is wrong.
    pub(crate) fn decode(b: &[u8]) -> Result<SegmentHeader, HeaderError> {
        if b.len() < HEADER_LEN as usize {
            return Err(HeaderError::Short { len: b.len() });
        }
        if b[0..8] != MAGIC {
            return Err(HeaderError::BadMagic);
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let version = u32_at(8);
        if version != FORMAT_VERSION {
            return Err(HeaderError::UnsupportedVersion { found: version });
        }
        if u32_at(12) != HEADER_LEN as u32 {
            return Err(HeaderError::Length { found: u32_at(12) });
        }
        let crc = crc32fast::hash(&b[0..40]);
        if crc != u32_at(40) {
            return Err(HeaderError::Crc {
                stored: u32_at(40),
                computed: crc,
            });
        }
        Ok(SegmentHeader {
            seq: u64_at(16),
            nonce: u64_at(24),
            first_index: u64_at(32),
        })
    }
}

/// What a directory entry is, judged by its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FileKind {
    Segment { seq: u64, first_index: u64 },
    Temp { seq: u64 },
    Spare,
}

pub(crate) fn segment_file_name(seq: u64, first_index: u64) -> String {
    format!("{seq:016x}-{first_index:016x}.wal")
}

fn temp_file_name(seq: u64) -> String {
    format!("{seq:016x}.wal.tmp")
}

pub(crate) fn spare_file_name(seq: u64) -> String {
    format!("{seq:016x}.spare")
}

fn parse_hex16(s: &str) -> Option<u64> {
    if s.len() == 16
        && s.bytes()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
    {
        u64::from_str_radix(s, 16).ok()
    } else {
        None
    }
}

/// Classifies a WAL directory entry; `None` for names that are not ours.
pub(crate) fn classify(name: &str) -> Option<FileKind> {
    if let Some(stem) = name.strip_suffix(".wal.tmp") {
        return parse_hex16(stem).map(|seq| FileKind::Temp { seq });
    }
    if let Some(stem) = name.strip_suffix(".spare") {
        return parse_hex16(stem).map(|_| FileKind::Spare);
    }
    let stem = name.strip_suffix(".wal")?;
    let (seq, first) = stem.split_once('-')?;
    Some(FileKind::Segment {
        seq: parse_hex16(seq)?,
        first_index: parse_hex16(first)?,
    })
}

/// One open segment file. Shared (`Arc`) between the writer, readers and the sync thread; the
/// descriptor stays valid after a rename or unlink, so readers holding it are never cut off.
#[derive(Debug)]
pub(crate) struct Segment {
    pub header: SegmentHeader,
    file: File,
    dir: PathBuf,
    /// True once the file has its final name and the directory entry is durable.
    named: AtomicBool,
}

impl Segment {
    /// Creates a new segment under its temporary name, reusing `spare` (a recycled file) when
    /// given: renames it, writes a fresh header with a new nonce, and preallocates
    /// `preallocate` bytes when set. Nothing is fsync'ed here; the sync thread does that before
    /// giving the file its final name.
    pub(crate) fn create(
        dir: &Path,
        seq: u64,
        first_index: u64,
        preallocate: Option<u64>,
        spare: Option<&Path>,
    ) -> io::Result<Segment> {
        let path = dir.join(temp_file_name(seq));
        let file = match spare {
            Some(spare) => {
                std::fs::rename(spare, &path)?;
                OpenOptions::new().read(true).write(true).open(&path)?
            }
            None => OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)?,
        };
        if let Some(len) = preallocate {
            fsutil::preallocate(&file, len)?;
        }
        let header = SegmentHeader {
            seq,
            nonce: fsutil::random_nonce(),
            first_index,
        };
        file.write_all_at(&header.encode(), 0)?;
        Ok(Segment {
            header,
            file,
            dir: dir.to_path_buf(),
            named: AtomicBool::new(false),
        })
    }

    /// Wraps an already named segment found by recovery.
    pub(crate) fn from_existing(dir: &Path, file: File, header: SegmentHeader) -> Segment {
        Segment {
            header,
            file,
            dir: dir.to_path_buf(),
            named: AtomicBool::new(true),
        }
    }

    pub(crate) fn seq(&self) -> u64 {
        self.header.seq
    }

    pub(crate) fn identity(&self) -> Identity {
        self.header.identity()
    }

    pub(crate) fn is_named(&self) -> bool {
        self.named.load(Ordering::Acquire)
    }

    /// The path the file has now (temporary until named).
    pub(crate) fn path(&self) -> PathBuf {
        if self.is_named() {
            self.final_path()
        } else {
            self.dir.join(temp_file_name(self.header.seq))
        }
    }

    pub(crate) fn final_path(&self) -> PathBuf {
        self.dir
            .join(segment_file_name(self.header.seq, self.header.first_index))
    }

    /// Renames the file to its final name. The caller must fdatasync every earlier segment and
    /// this one before, and fsync the directory after, then call [`Segment::mark_named`].
    pub(crate) fn rename_to_final(&self) -> io::Result<()> {
        std::fs::rename(
            self.dir.join(temp_file_name(self.header.seq)),
            self.final_path(),
        )
    }

    pub(crate) fn mark_named(&self) {
        self.named.store(true, Ordering::Release);
    }

    pub(crate) fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }

    pub(crate) fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    /// fdatasync(2).
    pub(crate) fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }
}
