//! [`EventRing`]: the events of the most recent revisions, kept in memory so the sync thread
//! catches a slightly-behind watcher up without a store read (an outbox that refused an
//! event, a `start_revision` a few revisions back).
//!
//! The hub appends every revision apply notifies it of and drops the oldest ones once the
//! ring holds more than `ring_revisions` revisions or more than `ring_bytes` encoded event
//! bytes. A read that starts before the ring's first revision is a miss and goes to the store
//! exactly as before the ring existed, as do reads after a snapshot install (the ring is
//! emptied) and reads below the compact revision (checked before the ring is asked).
//!
//! Invariants (asserted; a break would lose or duplicate events):
//! - the ring holds whole revisions (every event apply reported for a revision, in change
//!   order, or none of that revision), without `prev_kv`;
//! - its revisions are contiguous, `start..=end`, and `end` is the hub revision: a revision
//!   apply skipped (never observed here) empties the ring instead of leaving a hole;
//! - [`RingSlice::history`] returns exactly what the store's `watch_history` returns for the
//!   same range, span and limits (same events in the same order, same `last_revision`), as
//!   both cut reads with [`crate::mvcc::Collector`]. `prev_kv` is filled by the caller from
//!   the store, as the store read does.

use std::collections::VecDeque;
use std::sync::Arc;

use prost::Message;

use super::key_range::WatchKeyRange;
use super::outbox::RevisionBatch;
use super::source::{History, HistoryLimit};
use crate::mvcc::Collector;

/// Default bound on the revisions the ring holds: at 5,000 writes/s about 0.8 s of history,
/// four catch-up responses of [`super::BATCH_MAX_REVISIONS`]; a watcher further behind than
/// that is not "slightly" behind and reads the store.
pub const DEFAULT_RING_REVISIONS: usize = 4096;
/// Default bound on the encoded event bytes the ring holds (8 MiB): half of one stream's
/// default queue bound (`--watch-stream-buffer-bytes`, 16 MiB), so large values cannot make
/// the ring a second, member-wide copy of everything queued. The batches are shared (`Arc`)
/// with the outboxes that hold them, so this is an upper bound of the extra memory.
pub const DEFAULT_RING_BYTES: usize = 8 * 1024 * 1024;

/// The recent revisions of one hub (module docs).
#[derive(Debug)]
pub struct EventRing {
    /// First revision held; `end + 1` when empty.
    start: i64,
    /// `batches[i].revision == start + i`.
    batches: VecDeque<Arc<RevisionBatch>>,
    /// Encoded bytes of the events held (`Event::encoded_len`, as the store's read limit).
    bytes: usize,
    max_revisions: usize,
    max_bytes: usize,
}

/// The ring's revisions from some revision up to the hub revision, taken under the hub lock
/// and read without it.
#[derive(Debug, Clone)]
pub struct RingSlice {
    batches: Vec<Arc<RevisionBatch>>,
}

fn batch_bytes(batch: &RevisionBatch) -> usize {
    batch.events.iter().map(Message::encoded_len).sum()
}

impl EventRing {
    /// An empty ring at hub revision `revision`, bounded by `max_revisions` revisions (0
    /// disables it) and `max_bytes` encoded event bytes.
    pub fn new(revision: i64, max_revisions: usize, max_bytes: usize) -> EventRing {
        EventRing {
            start: revision + 1,
            batches: VecDeque::new(),
            bytes: 0,
            max_revisions,
            max_bytes,
        }
    }

    /// The last revision covered (the hub revision).
    pub fn end(&self) -> i64 {
        self.start + self.batches.len() as i64 - 1
    }

    /// The first revision held, if any.
    pub fn first(&self) -> Option<i64> {
        (!self.batches.is_empty()).then_some(self.start)
    }

    /// Revisions held.
    pub fn len(&self) -> usize {
        self.batches.len()
    }

    /// Whether no revision is held.
    pub fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }

    /// Encoded event bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Empties the ring; it continues at hub revision `revision` (a snapshot install).
    pub fn reset(&mut self, revision: i64) {
        self.batches.clear();
        self.bytes = 0;
        self.start = revision + 1;
    }

    /// Records the whole revision `batch` (its events without `prev_kv`), reported by apply
    /// after every revision before it. A revision at or below the end with no events is an
    /// entry that did not change the revision (ignored); anything else out of order empties
    /// the ring, which then restarts at this revision.
    pub fn record(&mut self, batch: Arc<RevisionBatch>) {
        let revision = batch.revision;
        let end = self.end();
        if revision <= end {
            if !batch.events.is_empty() {
                tracing::warn!(
                    revision,
                    end,
                    "watch ring: events for an old revision; emptied"
                );
                self.reset(end);
            }
            return;
        }
        if revision != end + 1 {
            self.reset(revision - 1);
        }
        assert!(
            batch.events.iter().all(|e| e.prev_kv.is_none()),
            "the ring holds events without prev_kv"
        );
        self.bytes += batch_bytes(&batch);
        self.batches.push_back(batch);
        while self.batches.len() > self.max_revisions
            || (self.bytes > self.max_bytes && !self.batches.is_empty())
        {
            let old = self.batches.pop_front().expect("not empty");
            self.bytes -= batch_bytes(&old);
            self.start += 1;
        }
        assert_eq!(self.end(), revision, "the ring ends at the hub revision");
    }

    /// The revisions `from..=end`, or `None` if the ring does not hold `from` (then the
    /// store must be read).
    pub fn slice_from(&self, from: i64) -> Option<RingSlice> {
        let from = from.max(1);
        if self.batches.is_empty() || from < self.start || from > self.end() {
            return None;
        }
        let skip = (from - self.start) as usize;
        Some(RingSlice {
            batches: self.batches.iter().skip(skip).cloned().collect(),
        })
    }
}

impl RingSlice {
    /// The first revision of the slice.
    pub fn first(&self) -> i64 {
        self.batches.first().map_or(i64::MAX, |b| b.revision)
    }

    /// The last revision of the slice.
    pub fn last(&self) -> i64 {
        self.batches.last().map_or(i64::MIN, |b| b.revision)
    }

    /// The events of `range` at revisions `from..=to` cut by `limit`, as the store's
    /// `watch_history` returns them (without `prev_kv`); `None` if the slice does not cover
    /// the whole span (the caller reads the store).
    pub fn history(
        &self,
        range: &WatchKeyRange,
        from: i64,
        to: i64,
        limit: HistoryLimit,
    ) -> Option<History> {
        let from = from.max(1);
        if from < self.first() || to > self.last() || from > to {
            return None;
        }
        let skip = (from - self.first()) as usize;
        let mut out = Collector::new(limit.max_revisions, limit.max_bytes);
        let mut complete = true;
        'revisions: for batch in self.batches.iter().skip(skip) {
            if batch.revision > to {
                break;
            }
            for ev in &batch.events {
                let key = ev.kv.as_ref().map_or(&[][..], |kv| &kv.key[..]);
                if !range.contains(key) {
                    continue;
                }
                if !out.admits(batch.revision) {
                    complete = false;
                    break 'revisions;
                }
                out.push(batch.revision, ev.clone());
            }
        }
        let batch = out.finish(complete, to);
        Some(History {
            events: batch.events,
            last_revision: batch.last_revision,
        })
    }
}
