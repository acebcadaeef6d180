//! The write-path timeline (issue 20 part 1): one `tracing` event per stage a raft entry
//! passes on this member, with a wall-clock timestamp, so the timelines of the members of
//! one machine line up by log index.
//!
//! Off unless the target [`TARGET`] is enabled at DEBUG, e.g.
//! `RUST_LOG=info,openraft=warn,keel::trace=debug`; when off each call site costs one
//! cached callsite-interest check (no clock read, no formatting). The events are meant for
//! `scripts/put-trace.py`, which joins them by log index across the members' logs and prints
//! per-stage medians and p99s.
//!
//! Every event carries `stage` (a [`Stage`] name), `first` and `last` (the log index range
//! it covers, inclusive; the request id for [`Stage::Receive`]), `peer` (the follower of a
//! replication RPC, on the leader and on the follower alike, else 0) and `t_us`
//! (microseconds since the Unix epoch).
//!
//! On the leader a put passes, in order: `receive` (the oldest request of the batch entered
//! the proposer), `propose` (client_write called), `append` and `durable` (its WAL write and
//! the fdatasync covering it), `ae_send` / `ae_ack` per follower (AppendEntries RPC out and
//! answered), `commit`, `apply`, `response` (client_write returned: applied here). On a
//! follower: `ae_recv`, `append`, `durable`, `ae_reply`, `commit`, `apply`.
//!
//! The events run on the paths they time (the raft core, the WAL sync thread, replication
//! tasks), so a run with the timeline on is slower than one without; compare stages within
//! one traced run.

use std::time::{SystemTime, UNIX_EPOCH};

/// The `tracing` target of the timeline events.
pub const TARGET: &str = "keel::trace";

/// A stage of a raft entry on one member. See the module docs for the order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The oldest client request of a batch entered the proposer (`first` = `last` = the
    /// entry's request id, joined to its index by [`Stage::Propose`]).
    Receive,
    /// `client_write` was called for the entry (emitted when it returns, with the index).
    Propose,
    /// The log store was handed the entries (WAL write, not yet durable).
    Append,
    /// The fdatasync covering the entries finished.
    Durable,
    /// An AppendEntries RPC carrying the entries was sent to `peer`.
    AeSend,
    /// `peer` answered that AppendEntries RPC.
    AeAck,
    /// Follower `peer` (this member) received an AppendEntries RPC carrying the entries.
    AeRecv,
    /// A follower answered that AppendEntries RPC (after its own append was durable).
    AeReply,
    /// The committed index reached `last`.
    Commit,
    /// The entries were applied to the state machine (their sled batch written).
    Apply,
    /// `client_write` returned on the proposing member: applied here, answer on its way.
    Response,
}

impl Stage {
    /// The name in the `stage` field.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Receive => "receive",
            Stage::Propose => "propose",
            Stage::Append => "append",
            Stage::Durable => "durable",
            Stage::AeSend => "ae_send",
            Stage::AeAck => "ae_ack",
            Stage::AeRecv => "ae_recv",
            Stage::AeReply => "ae_reply",
            Stage::Commit => "commit",
            Stage::Apply => "apply",
            Stage::Response => "response",
        }
    }
}

/// Whether the timeline is on (the [`TARGET`] is enabled at DEBUG).
#[inline]
pub fn enabled() -> bool {
    tracing::enabled!(target: TARGET, tracing::Level::DEBUG)
}

/// Microseconds since the Unix epoch: comparable between processes of one machine.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// The index range `(first, last)` of `items` when the timeline is on and `items` is not
/// empty, else `None` (so callers mark only what they measured).
#[inline]
pub fn covered<T>(items: &[T], index: impl Fn(&T) -> u64) -> Option<(u64, u64)> {
    if !enabled() {
        return None;
    }
    Some((index(items.first()?), index(items.last()?)))
}

/// Records `stage` for log indexes `first..=last` now. A no-op when the timeline is off.
#[inline]
pub fn mark(stage: Stage, first: u64, last: u64, peer: u64) {
    if enabled() {
        mark_at(stage, first, last, peer, now_us());
    }
}

/// Records `stage` for `first..=last` at `t_us` (from [`now_us`], taken earlier).
pub fn mark_at(stage: Stage, first: u64, last: u64, peer: u64, t_us: u64) {
    tracing::debug!(
        target: TARGET,
        stage = stage.name(),
        first,
        last,
        peer,
        t_us,
        "trace"
    );
}

/// Records that the entry of request `id` got log index `index`, proposed at `t_us`
/// ([`Stage::Propose`] with an `id` field, which joins [`Stage::Receive`] to the index).
pub fn mark_proposed(id: u64, index: u64, t_us: u64) {
    tracing::debug!(
        target: TARGET,
        stage = Stage::Propose.name(),
        first = index,
        last = index,
        peer = 0u64,
        t_us,
        id,
        "trace"
    );
}

/// `now_us()` when the timeline is on, else 0 (so a caller can stamp a start time without
/// reading the clock when off).
#[inline]
pub fn start() -> u64 {
    if enabled() { now_us() } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_names_are_distinct() {
        let all = [
            Stage::Receive,
            Stage::Propose,
            Stage::Append,
            Stage::Durable,
            Stage::AeSend,
            Stage::AeAck,
            Stage::AeRecv,
            Stage::AeReply,
            Stage::Commit,
            Stage::Apply,
            Stage::Response,
        ];
        let names: std::collections::HashSet<_> = all.iter().map(|s| s.name()).collect();
        assert_eq!(names.len(), all.len());
        assert!(names.contains("ae_send") && names.contains("durable"));
    }

    #[test]
    fn on_only_when_the_target_is_enabled_at_debug() {
        use tracing_subscriber::EnvFilter;
        let off = tracing_subscriber::fmt()
            .with_env_filter(EnvFilter::new("debug,keel::trace=info"))
            .finish();
        tracing::subscriber::with_default(off, || {
            assert!(!enabled());
            assert_eq!(start(), 0, "no clock read when off");
        });
        let on = tracing_subscriber::fmt()
            .with_env_filter(EnvFilter::new("warn,keel::trace=debug"))
            .finish();
        tracing::subscriber::with_default(on, || {
            assert!(enabled());
            assert!(
                start() > 1_700_000_000_000_000,
                "microseconds since the epoch"
            );
        });
    }
}
