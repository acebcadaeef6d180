//! The sync thread: catches unsynced watchers up from the store (etcd
//! `watchableStore.syncWatchers`).
//!
//! One round:
//! 1. under the hub lock, pick up to `sync_batch` unsynced watchers whose outbox has room,
//!    starting after where the previous round stopped, and note the hub revision `cur`;
//! 2. without any lock, read each watcher's events `next_rev..=cur` (watchers with the same
//!    range, start and `prev_kv` share one read), at most `batch_max_revisions` revisions
//!    and about `max_response_bytes` per read: from the ring of recent events when it holds
//!    `next_rev` (a slice of it taken in step 1, so it ends at `cur`), else from the store;
//!    both give the same events (`ring` module docs);
//! 3. under the hub lock again, queue each watcher's events in one response (header revision
//!    = the last revision read) and advance its `next_rev`; a watcher that reached the hub
//!    revision moves to the synced group. A watcher whose `next_rev` is below the compact
//!    revision is canceled with `compact_revision` set instead.
//!
//! Step 3 drops every result if a snapshot install happened meanwhile (the generation
//! changed), or for a watcher that changed meanwhile (canceled). Between steps 1 and 3 apply
//! keeps notifying the synced watchers; the unsynced ones simply read further next round.

use std::collections::HashMap;
use std::ops::Bound;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use prost::Message;

use super::hub::WatchHub;
use super::key_range::{EventFilter, WatchKeyRange};
use super::outbox::{EventList, EventsItem, Item, Refused, bare_response};
use super::ring::RingSlice;
use super::source::{History, HistoryLimit, is_create};
use super::watcher::{WatcherFlags, WatcherId, WatcherState};
use crate::error::EtcdError;

/// How long the sync thread sleeps when there is nothing it can do (etcd: 100 ms).
pub const IDLE_WAIT: Duration = Duration::from_millis(100);

/// What a sync round achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncOutcome {
    /// No unsynced watchers (or an install is in progress).
    Idle,
    /// Unsynced watchers exist but none has room in its outbox (or reads failed).
    Blocked,
    /// Some watchers were served; call again.
    Progress,
}

/// One watcher picked for a round.
struct Job {
    id: WatcherId,
    range: WatchKeyRange,
    next_rev: i64,
    filter: EventFilter,
    flags: WatcherFlags,
}

enum Outcome {
    Events(Arc<History>),
    Compacted(i64),
}

impl WatchHub {
    /// Starts the sync thread (`keel-watch-sync`). It holds only a weak reference and ends
    /// within [`IDLE_WAIT`] after the hub is dropped.
    ///
    /// Errors: the OS cannot create the thread.
    pub fn spawn_sync_thread(self: &Arc<Self>) -> std::io::Result<()> {
        let weak: Weak<WatchHub> = Arc::downgrade(self);
        let signal = self.signal.clone();
        std::thread::Builder::new()
            .name("keel-watch-sync".into())
            .spawn(move || {
                loop {
                    let Some(hub) = weak.upgrade() else { return };
                    let outcome = hub.sync_round();
                    drop(hub);
                    if outcome != SyncOutcome::Progress {
                        signal.wait(IDLE_WAIT);
                    }
                }
            })
            .map(|_| ())
    }

    /// Runs one sync round (module docs).
    pub fn sync_round(&self) -> SyncOutcome {
        let Some((jobs, cur, generation, recent)) = self.pick_jobs() else {
            return SyncOutcome::Idle;
        };
        if jobs.is_empty() {
            return SyncOutcome::Blocked;
        }
        let outcomes = self.read_history(&jobs, cur, recent.as_ref());
        let mut st = self.lock();
        if st.generation != generation {
            return SyncOutcome::Progress;
        }
        let mut served = false;
        for (job, outcome) in jobs.iter().zip(outcomes) {
            let Some(outcome) = outcome else { continue };
            let rev = st.rev;
            let Some(w) = st.watchers.get_mut(job.id) else {
                continue;
            };
            if w.state != WatcherState::Unsynced || w.next_rev != job.next_rev {
                continue;
            }
            let outbox = w.outbox.clone();
            match outcome {
                Outcome::Compacted(compact) => {
                    // etcd `chooseAll`: header revision 0, compact_revision set, canceled.
                    let mut resp = bare_response(w.watch_id, 0);
                    resp.compact_revision = compact;
                    resp.canceled = true;
                    w.state = WatcherState::Compacted;
                    outbox.push_control(resp);
                    st.unsynced.remove(&job.id);
                    outbox.add_unsynced(-1);
                    Self::answer_pending_progress(rev, &outbox);
                    served = true;
                }
                Outcome::Events(history) => {
                    let events: Vec<_> = history
                        .events
                        .iter()
                        .filter(|e| job.filter.passes(e))
                        .cloned()
                        .collect();
                    if !events.is_empty() {
                        let bytes = events.iter().map(|e| e.encoded_len() + 4).sum();
                        let item = Item::Events(EventsItem {
                            watch_id: w.watch_id,
                            revision: history.last_revision,
                            events: EventList::Owned(events),
                            prev_kv: job.flags.prev_kv(),
                            fragment: job.flags.fragment(),
                        });
                        match outbox.try_push(w.watch_id, item, bytes, true) {
                            Ok(()) => w.events_since_tick = true,
                            Err(Refused::Full | Refused::Closed) => continue,
                        }
                    }
                    served = true;
                    w.next_rev = w.next_rev.max(history.last_revision + 1);
                    if w.next_rev > rev {
                        w.state = WatcherState::Synced;
                        let range = w.range.clone();
                        st.unsynced.remove(&job.id);
                        st.synced.insert(&range, job.id);
                        outbox.add_unsynced(-1);
                        Self::answer_pending_progress(rev, &outbox);
                    }
                }
            }
        }
        if served {
            SyncOutcome::Progress
        } else {
            SyncOutcome::Blocked
        }
    }

    /// Step 1: the watchers of this round, the hub revision and generation, and the ring's
    /// revisions from the oldest `next_rev` it holds on; `None` when there is nothing to
    /// sync.
    fn pick_jobs(&self) -> Option<(Vec<Job>, i64, u64, Option<RingSlice>)> {
        let mut guard = self.lock();
        let st = &mut *guard;
        if st.installing || st.unsynced.is_empty() {
            return None;
        }
        // Round robin: continue after the last watcher looked at, then wrap around.
        let cursor = st.sync_cursor;
        let after = cursor.map_or(st.unsynced.range(..), |c| {
            st.unsynced.range((Bound::Excluded(c), Bound::Unbounded))
        });
        let before = cursor
            .map(|c| st.unsynced.range(..=c))
            .into_iter()
            .flatten();
        let max_scan = self.config.sync_batch.saturating_mul(8).max(1);
        let mut jobs = Vec::new();
        let mut last = None;
        for &id in after.chain(before).take(max_scan) {
            if jobs.len() >= self.config.sync_batch {
                break;
            }
            let Some(w) = st.watchers.get(id) else {
                continue;
            };
            last = Some(id);
            if !w.outbox.has_room(w.watch_id) {
                continue;
            }
            jobs.push(Job {
                id,
                range: w.range.clone(),
                next_rev: w.next_rev,
                filter: w.filter,
                flags: w.flags,
            });
        }
        st.sync_cursor = last;
        let oldest = jobs
            .iter()
            .map(|j| j.next_rev)
            .filter(|&r| st.ring.first().is_some_and(|first| r >= first))
            .min();
        let recent = oldest.and_then(|from| st.ring.slice_from(from));
        if let Some(slice) = &recent {
            assert_eq!(
                slice.last(),
                st.rev,
                "a ring slice ends at the hub revision"
            );
        }
        Some((jobs, st.rev, st.generation, recent))
    }

    /// Step 2: one outcome per job (`None` = a read failed; retried next round).
    fn read_history(
        &self,
        jobs: &[Job],
        cur: i64,
        recent: Option<&RingSlice>,
    ) -> Vec<Option<Outcome>> {
        let limit = HistoryLimit {
            max_revisions: self.config.batch_max_revisions,
            max_bytes: self.config.max_response_bytes,
        };
        type ReadKey = (WatchKeyRange, i64, bool);
        let mut shared: HashMap<ReadKey, Result<Arc<History>, EtcdError>> = HashMap::new();
        jobs.iter()
            .map(|job| {
                let compact = self.source.compact_revision();
                if job.next_rev < compact {
                    return Some(Outcome::Compacted(compact));
                }
                if job.next_rev < 1 {
                    // Only -1 on a store never compacted gets here. etcd 3.4 and 3.5 read its
                    // history from revision bytes that sort after every record (the
                    // revision's two's complement), find nothing, and go on from the next
                    // revision: a live watcher without history.
                    return Some(Outcome::Events(Arc::new(History {
                        events: Vec::new(),
                        last_revision: cur,
                    })));
                }
                let key = (job.range.clone(), job.next_rev, job.flags.prev_kv());
                let read = shared.entry(key).or_insert_with(|| {
                    let prev_kv = job.flags.prev_kv();
                    let from_ring =
                        recent.and_then(|r| r.history(&job.range, job.next_rev, cur, limit));
                    let read = match from_ring {
                        Some(history) => {
                            self.ring_hits.fetch_add(1, Ordering::Relaxed);
                            self.with_prev_kv(history, prev_kv)
                        }
                        None => {
                            self.ring_misses.fetch_add(1, Ordering::Relaxed);
                            self.source
                                .history(&job.range, job.next_rev, cur, limit, prev_kv)
                        }
                    };
                    read.map(Arc::new)
                });
                match read {
                    Ok(h) => Some(Outcome::Events(h.clone())),
                    Err(EtcdError::Compacted) => {
                        Some(Outcome::Compacted(self.source.compact_revision()))
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "watch: reading history failed; retrying");
                        None
                    }
                }
            })
            .collect()
    }
}

impl WatchHub {
    /// Fills `prev_kv` into the events of a ring read when the watcher asked for it, from
    /// the store as its history read does (none for a key creation; `Compacted` when the
    /// previous version is gone).
    pub(super) fn with_prev_kv(
        &self,
        mut history: History,
        prev_kv: bool,
    ) -> Result<History, EtcdError> {
        if !prev_kv {
            return Ok(history);
        }
        for ev in &mut history.events {
            if is_create(ev) {
                continue;
            }
            if let Some(kv) = ev.kv.as_ref() {
                ev.prev_kv = self.source.prev_kv(&kv.key, kv.mod_revision)?;
            }
        }
        Ok(history)
    }
}
