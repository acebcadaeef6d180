//! etcd's on-disk database format: read and write a bbolt file in etcd's schema.
//!
//! An etcd member keeps its whole applied state in one bbolt file (`member/snap/db`), and
//! `Maintenance.Snapshot` streams that file. This module is the codec between that format
//! and plain Rust values, independent of the rest of Keel:
//!
//! - [`schema`]: bucket and key names and the byte encoding of every value (revision keys,
//!   big-endian integers, `mvccpb.KeyValue`, `leasepb.Lease`, member JSON, ...), with the etcd
//!   source of each;
//! - [`model`]: the values a database holds ([`MvccRecord`], [`Meta`], [`Member`], ...);
//! - [`writer`]: [`DbWriter`] streams records and metadata into a fresh, compact bbolt file
//!   (through the `bbolt-rs` crate), in bounded transactions;
//! - [`reader`]: [`EtcdDb`] opens a database or a snapshot file (checking its trailing
//!   sha256 unless told not to) and yields the same values, streaming the `key` bucket;
//! - [`bolt`]: the read-only bbolt page walker the reader uses (bbolt-rs cannot open files
//!   written by etcd: they carry no freelist, see `docs/etcd-format.md`);
//! - [`snapshot`]: the `Maintenance.Snapshot` framing (32 KiB chunks, then the file's
//!   sha256) and the checks `etcdctl snapshot restore` makes on a snapshot file.
//!
//! Invariants:
//! - the `key` bucket is written in strictly increasing key order (revision order), so a
//!   written file holds each record once and its pages are filled in append order; the
//!   writer rejects out-of-order input instead of writing it;
//! - record values are copied byte for byte: a record read back equals the record written,
//!   and equals what etcd stored, so `HashKV` and `snapshot status` hashes agree;
//! - nothing is held in memory beyond one write transaction (at most [`writer::BATCH_ENTRIES`]
//!   entries or [`writer::BATCH_BYTES`] bytes) or, when reading, one root-to-leaf path of pages.
//!
//! The format, and how `Maintenance.Snapshot` and `keelutl` use it, are in
//! `docs/etcd-format.md`.

pub mod bolt;
pub mod model;
pub mod reader;
pub mod schema;
pub mod snapshot;
pub mod writer;

#[cfg(test)]
mod tests;

pub use model::{
    AuthMeta, Cluster, ConfState, DowngradeInfo, Member, Members, Meta, MvccRecord, Status,
};
pub use reader::{EtcdDb, HashCheck};
pub use snapshot::{SnapshotChunk, SnapshotStream};
pub use writer::DbWriter;

/// Why an etcd database could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum EtcdDbError {
    /// The file system failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// bbolt-rs failed while writing.
    #[error("bbolt: {0}")]
    Bolt(#[from] bbolt_rs::Error),
    /// The file is not a bbolt file, or its pages are inconsistent.
    #[error("invalid database: {0}")]
    Invalid(String),
    /// A value in a bucket does not decode as etcd writes it.
    #[error("corrupt {bucket} entry {}: {why}", key.escape_ascii())]
    Corrupt {
        /// Bucket name.
        bucket: &'static str,
        /// The entry's key.
        key: Vec<u8>,
        /// What is wrong.
        why: String,
    },
    /// A snapshot file without a trailing sha256 opened with [`HashCheck::Verify`]
    /// (etcd's text, `etcdutl snapshot restore`).
    #[error("snapshot missing hash but --skip-hash-check=false")]
    MissingHash,
    /// The trailing sha256 differs from the hash of the database bytes (etcd's text; Go
    /// prints byte slices as `[1 2 3]`).
    #[error("expected sha256 {}, got {}", go_bytes(expected), go_bytes(got))]
    HashMismatch {
        /// The hash stored at the end of the file.
        expected: Vec<u8>,
        /// The hash of the bytes before it.
        got: Vec<u8>,
    },
    /// The writer was given records not in strictly increasing revision order.
    #[error("mvcc record {next} does not follow {prev}: records must be in revision order")]
    OutOfOrder {
        /// The previous record (`main_sub`, `t` for a tombstone).
        prev: String,
        /// The offending record.
        next: String,
    },
    /// The source of the data being written failed (e.g. reading the store).
    #[error("reading the source: {0}")]
    Source(Box<dyn std::error::Error + Send + Sync>),
}

/// Result of this module's operations.
pub type Result<T> = std::result::Result<T, EtcdDbError>;

/// Formats bytes as Go's `%v` does for a `[]byte`: `[1 2 255]`.
fn go_bytes(b: &[u8]) -> String {
    let parts: Vec<String> = b.iter().map(|x| x.to_string()).collect();
    format!("[{}]", parts.join(" "))
}
