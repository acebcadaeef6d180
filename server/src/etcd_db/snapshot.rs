//! The `Maintenance.Snapshot` framing and the snapshot file checks of etcd's tools.
//!
//! Server side (`etcd@v3.4.23:etcdserver/api/v3rpc/maintenance.go` `Snapshot`): the database
//! file is sent in blobs of [`CHUNK_SIZE`] bytes, each with `remaining_bytes` = bytes still
//! to come after it, then one final message whose blob is the sha256 of every earlier byte,
//! with `remaining_bytes` = 0.
//!
//! Client side: `etcdctl snapshot save` writes the blobs one after the other, so a snapshot
//! file is the database followed by its 32-byte sha256. A file "has a hash" iff its length
//! is 32 more than a multiple of 512 (`hasChecksum`: database files are whole pages);
//! `snapshot restore` strips the hash and, unless `--skip-hash-check`, compares it.

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;

use keel_proto::etcdserverpb::SnapshotResponse;
use sha2::{Digest, Sha256};

use super::{EtcdDbError, Result};

/// Blob size of a snapshot message (`snapshotSendBufferSize`).
pub const CHUNK_SIZE: usize = 32 * 1024;
/// Length of the trailing hash (`sha256.Size`).
pub const HASH_LEN: u64 = 32;

/// Whether a file of `len` bytes ends with a snapshot hash (etcd `hasChecksum`).
pub fn has_checksum(len: u64) -> bool {
    len % 512 == HASH_LEN
}

/// One message of the snapshot stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotChunk {
    /// Blob bytes still to be sent after this message (0 on the last data chunk and on the
    /// hash).
    pub remaining_bytes: u64,
    /// The next bytes of the file, or the sha256 on the final message.
    pub blob: Vec<u8>,
}

impl From<SnapshotChunk> for SnapshotResponse {
    /// The response message; the API layer fills `header` (and, for 3.6, `version`).
    fn from(c: SnapshotChunk) -> SnapshotResponse {
        SnapshotResponse {
            header: None,
            remaining_bytes: c.remaining_bytes,
            blob: c.blob,
            version: String::new(),
        }
    }
}

/// The messages of a snapshot of `total` bytes read from `src`: data chunks, then the hash.
/// Reads [`CHUNK_SIZE`] bytes at a time, so memory stays at one chunk.
///
/// Errors: a read error, or `src` ending before `total` bytes (`UnexpectedEof`).
pub struct SnapshotStream<R> {
    src: R,
    total: u64,
    sent: u64,
    hasher: Option<Sha256>,
}

impl SnapshotStream<File> {
    /// Streams the database file at `path` (all of it: the writer truncates it to the
    /// database size).
    pub fn open(path: &Path) -> std::io::Result<SnapshotStream<File>> {
        let f = File::open(path)?;
        let total = f.metadata()?.len();
        Ok(SnapshotStream::new(f, total))
    }
}

impl<R: Read> SnapshotStream<R> {
    /// Streams `total` bytes of `src`.
    pub fn new(src: R, total: u64) -> SnapshotStream<R> {
        SnapshotStream {
            src,
            total,
            sent: 0,
            hasher: Some(Sha256::new()),
        }
    }

    /// Bytes of database (without the hash) the stream sends.
    pub fn total(&self) -> u64 {
        self.total
    }
}

impl<R: Read> Iterator for SnapshotStream<R> {
    type Item = std::io::Result<SnapshotChunk>;

    fn next(&mut self) -> Option<Self::Item> {
        let hasher = self.hasher.as_mut()?;
        if self.sent == self.total {
            let sha = self.hasher.take()?.finalize().to_vec();
            return Some(Ok(SnapshotChunk {
                remaining_bytes: 0,
                blob: sha,
            }));
        }
        let n = (self.total - self.sent).min(CHUNK_SIZE as u64) as usize;
        let mut blob = vec![0u8; n];
        if let Err(e) = self.src.read_exact(&mut blob) {
            self.hasher = None;
            return Some(Err(e));
        }
        hasher.update(&blob);
        self.sent += n as u64;
        Some(Ok(SnapshotChunk {
            remaining_bytes: self.total - self.sent,
            blob,
        }))
    }
}

/// Writes a snapshot file as `etcdctl snapshot save` does from a stream: every blob in
/// order to `<out>.part`, a check that the size has a hash, fsync, rename to `out`.
/// Returns the file size (database + 32).
pub fn save_stream<I>(chunks: I, out: &Path) -> Result<u64>
where
    I: IntoIterator<Item = std::io::Result<SnapshotChunk>>,
{
    let part = super::writer::part_path(out);
    let mut f = File::create(&part)?;
    let mut size = 0u64;
    for c in chunks {
        let c = c?;
        f.write_all(&c.blob)?;
        size += c.blob.len() as u64;
    }
    if !has_checksum(size) {
        let _ = std::fs::remove_file(&part);
        // etcd's text (`v3_snapshot.go` Save).
        return Err(EtcdDbError::Invalid(format!(
            "sha256 checksum not found [bytes: {size}]"
        )));
    }
    f.sync_all()?;
    drop(f);
    std::fs::rename(&part, out)?;
    super::writer::sync_parent(out)?;
    Ok(size)
}

/// Checks the trailing hash of a snapshot file of `len` bytes and returns the length of its
/// database part. With `verify`, a file without a hash is an error
/// ([`EtcdDbError::MissingHash`]) and a wrong hash too ([`EtcdDbError::HashMismatch`]);
/// without, a hash is stripped if present and not compared (`--skip-hash-check`).
pub fn check_hash(f: &File, len: u64, verify: bool) -> Result<u64> {
    use std::os::unix::fs::FileExt;
    if !has_checksum(len) {
        return if verify {
            Err(EtcdDbError::MissingHash)
        } else {
            Ok(len)
        };
    }
    let db_len = len - HASH_LEN;
    if verify {
        let mut expected = vec![0u8; HASH_LEN as usize];
        f.read_exact_at(&mut expected, db_len)?;
        let mut h = Sha256::new();
        let mut buf = vec![0u8; CHUNK_SIZE * 8];
        let mut at = 0u64;
        while at < db_len {
            let n = (db_len - at).min(buf.len() as u64) as usize;
            f.read_exact_at(&mut buf[..n], at)?;
            h.update(&buf[..n]);
            at += n as u64;
        }
        let got = h.finalize().to_vec();
        if got != expected {
            return Err(EtcdDbError::HashMismatch { expected, got });
        }
    }
    Ok(db_len)
}
