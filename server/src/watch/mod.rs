//! The watchable store: etcd's Watch service semantics on top of the MVCC store.
//!
//! - [`hub`]: [`WatchHub`], one per member, fed by apply; synced and unsynced watcher
//!   groups, live fan-out, cancel, progress, snapshot resync.
//! - [`sync`]: the thread that catches unsynced watchers up from the store's history.
//! - [`stream`]: one gRPC stream's request handling ([`WatchStream`]) and response side
//!   ([`WatchOutput`]).
//! - [`outbox`]: a stream's bounded response queue; [`response`]: responses and fragments.
//! - [`ring`]: the events of the most recent revisions, for watchers slightly behind.
//! - [`group`]: the index from keys to synced watchers; [`watcher`]: one watcher.
//! - [`key_range`], [`progress`], [`source`]: what a watcher watches, the progress
//!   interval, the store as seen by the hub.
//!
//! Guarantees, design and measured figures: `docs/watch.md`.

pub mod group;
pub mod hub;
pub mod key_range;
pub mod outbox;
pub mod progress;
pub mod response;
pub mod ring;
pub mod source;
pub mod stream;
pub mod sync;
pub mod watcher;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_model;
#[cfg(test)]
mod tests_ring;

use std::time::Duration;

pub use hub::{HubStats, WatchHub, WatcherSpec};
pub use source::{HistorySource, StoreHistory};
pub use stream::{WatchOutput, WatchStream};

/// etcd's per-stream watch channel length (`chanBufLen`), Keel's default per-watcher
/// bound in responses.
pub const DEFAULT_BUFFER_LEN: usize = 128;
/// Default bound on the bytes one stream may have queued (16 MiB).
pub const DEFAULT_STREAM_BUFFER_BYTES: usize = 16 * 1024 * 1024;
/// etcd's `watchBatchMaxRevs`: revisions per catch-up response.
pub const BATCH_MAX_REVISIONS: usize = 1000;
/// etcd's `maxWatchersPerSync`: unsynced watchers served per sync round.
pub const SYNC_BATCH: usize = 512;
/// Default split size of `fragment` responses: etcd's default `--max-request-bytes`
/// (1.5 MiB) plus its gRPC overhead allowance (512 KiB). `config/` derives the value from
/// the flags (and its tests tie this default to them).
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 1_572_864 + 512 * 1024;

/// Limits of the watch subsystem. Every one comes from a flag or an etcd constant (a
/// member's come from its flags: `WatchConfig::from_config` in `config/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchConfig {
    /// Responses one watcher may have queued before it falls behind and catches up from
    /// the store (`--watch-buffer-len`).
    pub buffer_len: usize,
    /// Bytes of events one stream may have queued (`--watch-stream-buffer-bytes`).
    pub stream_buffer_bytes: usize,
    /// Period of progress notifications for `progress_notify` watchers
    /// (`--experimental-watch-progress-notify-interval`, after etcd's default and minimum).
    pub progress_interval: Duration,
    /// Responses of `fragment` watchers at or above this size are split (etcd: the request
    /// limit plus gRPC overhead, `--max-request-bytes` + 512 KiB); also the byte budget of
    /// one catch-up read.
    pub max_response_bytes: usize,
    /// Revisions per catch-up response ([`BATCH_MAX_REVISIONS`]).
    pub batch_max_revisions: usize,
    /// Unsynced watchers per sync round ([`SYNC_BATCH`]).
    pub sync_batch: usize,
    /// Most revisions the ring of recent events holds ([`ring::DEFAULT_RING_REVISIONS`]; 0
    /// turns the ring off).
    pub ring_revisions: usize,
    /// Most encoded event bytes the ring holds ([`ring::DEFAULT_RING_BYTES`]).
    pub ring_bytes: usize,
}

impl Default for WatchConfig {
    fn default() -> WatchConfig {
        WatchConfig {
            buffer_len: DEFAULT_BUFFER_LEN,
            stream_buffer_bytes: DEFAULT_STREAM_BUFFER_BYTES,
            progress_interval: progress::DEFAULT_PROGRESS_INTERVAL,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            batch_max_revisions: BATCH_MAX_REVISIONS,
            sync_batch: SYNC_BATCH,
            ring_revisions: ring::DEFAULT_RING_REVISIONS,
            ring_bytes: ring::DEFAULT_RING_BYTES,
        }
    }
}
