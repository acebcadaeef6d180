//! Errors returned by the write-ahead log.

use std::path::PathBuf;

/// Everything that can go wrong in [`crate::wal::Wal`].
///
/// `Corrupt` and `Failed` are fatal for the member: the first means the bytes on disk cannot be
/// trusted (an operator must repair or restore the data dir), the second means an I/O error left
/// the WAL in an unknown state, so it refuses further writes until it is reopened (reopening runs
/// recovery, which re-establishes a consistent prefix). This mirrors etcd, which stops the member
/// when a WAL write or fsync fails.
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    /// An operating-system I/O error (open, read, write, fdatasync, rename, ...).
    #[error("WAL I/O error: {0}")]
    Io(#[from] std::io::Error),

    /// Bytes on disk that must be valid are not: an invalid record inside a sealed segment, an
    /// invalid record before data that a sync point proves was durable, a bad segment header, or a
    /// missing segment. `offset` is the byte offset inside `segment` where the problem starts.
    #[error("WAL corrupt: {}: offset {offset}: {reason}", segment.display())]
    Corrupt {
        /// Path of the segment file (or of the directory, for directory-level problems).
        segment: PathBuf,
        /// Byte offset inside the segment file.
        offset: u64,
        /// What is wrong, in words.
        reason: String,
    },

    /// `append` was given an entry whose log index does not continue the log: the first entry
    /// must be `last_index() + 1` (or, on an empty log, above the purged index) and the entries of
    /// one call must be consecutive.
    #[error("append out of order: expected log index {expected}, got {got}")]
    NotContiguous {
        /// The log index the WAL expected next.
        expected: u64,
        /// The log index it was given.
        got: u64,
    },

    /// `append` on an empty log was given a log index at or below the purged index; entries up to
    /// the purged index live in a snapshot, not in the log.
    #[error("log index {index} is at or below the purged log index {purged}")]
    BelowPurged {
        /// The log index that was given.
        index: u64,
        /// The last purged log index.
        purged: u64,
    },

    /// A single entry or metadata value is larger than [`crate::wal::MAX_VALUE_BYTES`].
    #[error("WAL record of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Size of the value in bytes.
        len: usize,
        /// The limit in bytes.
        max: usize,
    },

    /// An earlier write or fdatasync failed. After a failed fdatasync the kernel may have dropped
    /// the dirty pages, so retrying could acknowledge data that is not on disk; the WAL therefore
    /// stops. Reopen it to run recovery.
    #[error("WAL stopped after an earlier I/O failure ({0}); reopen it to recover")]
    Failed(String),

    /// Another `Wal` (in this or another process) holds the directory lock.
    #[error("WAL directory {} is locked by another process or handle", dir.display())]
    Locked {
        /// The WAL directory.
        dir: PathBuf,
    },
}

impl WalError {
    /// Builds a [`WalError::Corrupt`].
    pub(crate) fn corrupt(
        segment: impl Into<PathBuf>,
        offset: u64,
        reason: impl Into<String>,
    ) -> Self {
        WalError::Corrupt {
            segment: segment.into(),
            offset,
            reason: reason.into(),
        }
    }
}
