//! [`WatchHub`]: the watchable store of one member (etcd `watchableStore`).
//!
//! Every member has one hub, fed by its apply loop, so watches work on followers as well
//! as on the leader. The hub owns every watcher of every stream and sorts them into two
//! groups:
//! - **synced** watchers have everything up to the hub revision queued. When apply commits
//!   a revision, [`WatchHub::notify`] pushes its events to the matching synced watchers, one
//!   response per watcher per revision (so the events of one txn arrive together);
//! - **unsynced** watchers are behind: they started at an old revision, their outbox was
//!   full when an event came, or a snapshot was installed. The sync thread
//!   ([`super::sync`]) reads their missing events from the store's history and moves them
//!   back to synced once they reach the hub revision.
//!
//! Apply is never blocked by a watcher: a push into a full outbox is refused at once and the
//! watcher becomes unsynced, with `next_rev` at the refused revision, so nothing is dropped
//! and nothing is sent twice. History reads run on the sync thread without the hub lock.
//!
//! Lock order: hub state, then an outbox. Nothing holds the hub lock across a history read;
//! `notify` may read `prev_kv` values from the store under it (only for events that a
//! `prev_kv` watcher receives), which is a local sled read, never a wait on a client.
//!
//! Invariants (checked by `check_invariants` in tests):
//! - a watcher is in exactly the place its state names (synced index, unsynced set, or
//!   neither when compacted);
//! - an outbox's unsynced count equals the number of its unsynced watchers;
//! - an unsynced watcher has `next_rev <=` the hub revision;
//! - the ring of recent events ([`super::ring`]) ends at the hub revision (`EventRing::record`
//!   asserts it): it is updated under the hub lock together with the hub revision.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use keel_proto::mvccpb::Event;
use prost::Message;

use super::WatchConfig;
use super::group::WatcherIndex;
use super::key_range::{EventFilter, WatchKeyRange};
use super::outbox::{
    EventList, EventsItem, Item, Outbox, Refused, RevisionBatch, Selection, bare_response,
};
use super::ring::EventRing;
use super::source::{HistorySource, is_create};
use super::watcher::{Slab, Watcher, WatcherFlags, WatcherId, WatcherState};

/// `watch_id` of responses not tied to one watcher (etcd's `clientv3.InvalidWatchID`):
/// rejected creates and `WatchProgressRequest` answers.
pub const INVALID_WATCH_ID: i64 = -1;

/// Wakes the sync thread: a coalescing flag plus a condition variable.
#[derive(Debug, Default)]
pub struct SyncSignal {
    flag: Mutex<bool>,
    cv: Condvar,
}

impl SyncSignal {
    /// Sets the flag and wakes the waiter.
    pub fn wake(&self) {
        *self.flag.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cv.notify_one();
    }

    /// Waits until woken or `timeout` passes; clears the flag.
    pub fn wait(&self, timeout: Duration) {
        let guard = self.flag.lock().unwrap_or_else(|e| e.into_inner());
        let (mut guard, _) = self
            .cv
            .wait_timeout_while(guard, timeout, |woken| !*woken)
            .unwrap_or_else(|e| e.into_inner());
        *guard = false;
    }

    /// Clears the flag and returns whether it was set (tests).
    pub fn take(&self) -> bool {
        std::mem::take(&mut *self.flag.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// What a create request asks for, after validation.
#[derive(Debug, Clone)]
pub struct WatcherSpec {
    /// The client-visible watch ID.
    pub watch_id: i64,
    /// Watched keys.
    pub range: WatchKeyRange,
    /// `start_revision` (0 = from the next revision). A negative one is compared with the
    /// compact revision as etcd 3.4 and 3.5 do, where it is -1 until the first compaction:
    /// below it the watcher is canceled as compacted; -1 on a store never compacted is a
    /// watcher from the next revision.
    pub start_revision: i64,
    /// Event types filtered out.
    pub filter: EventFilter,
    /// `prev_kv`, `fragment`, `progress_notify`.
    pub flags: WatcherFlags,
}

/// Counts for tests, metrics and the memory benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HubStats {
    /// The hub revision (last revision notified by apply).
    pub revision: i64,
    /// Watchers in the synced group.
    pub synced: usize,
    /// Watchers in the unsynced group.
    pub unsynced: usize,
    /// All watchers, including compacted ones not yet canceled by their client.
    pub watchers: usize,
    /// Catch-up reads the ring of recent events answered (since the hub started).
    pub ring_hits: u64,
    /// Catch-up reads that went to the store (older than the ring, or the ring is off).
    pub ring_misses: u64,
    /// Revisions the ring holds now.
    pub ring_revisions: usize,
    /// Encoded event bytes the ring holds now.
    pub ring_bytes: usize,
}

pub(super) struct HubState {
    /// The revision of the last applied entry the hub was told about.
    pub rev: i64,
    /// Bumped when the store is replaced (snapshot install): history read before is void.
    pub generation: u64,
    /// A snapshot install is replacing the store: the sync thread waits.
    pub installing: bool,
    pub watchers: Slab,
    pub synced: WatcherIndex,
    pub unsynced: BTreeSet<WatcherId>,
    /// Where the last sync round stopped, so every unsynced watcher gets its turn.
    pub sync_cursor: Option<WatcherId>,
    /// The events of the most recent revisions, ending at `rev`.
    pub ring: EventRing,
}

/// See the module docs.
pub struct WatchHub {
    pub(super) state: Mutex<HubState>,
    pub(super) source: Arc<dyn HistorySource>,
    pub(super) config: WatchConfig,
    pub(super) signal: Arc<SyncSignal>,
    /// Catch-up reads answered by the ring / by the store ([`HubStats`]).
    pub(super) ring_hits: AtomicU64,
    pub(super) ring_misses: AtomicU64,
}

impl WatchHub {
    /// A hub over `source`, at the store's current revision. It does not catch watchers up
    /// until [`WatchHub::spawn_sync_thread`] runs (tests call `sync_round` directly).
    pub fn new(source: Arc<dyn HistorySource>, config: WatchConfig) -> Arc<WatchHub> {
        let rev = source.current_revision();
        Arc::new(WatchHub {
            state: Mutex::new(HubState {
                rev,
                generation: 0,
                installing: false,
                watchers: Slab::default(),
                synced: WatcherIndex::default(),
                unsynced: BTreeSet::new(),
                sync_cursor: None,
                ring: EventRing::new(rev, config.ring_revisions, config.ring_bytes),
            }),
            source,
            config,
            signal: Arc::new(SyncSignal::default()),
            ring_hits: AtomicU64::new(0),
            ring_misses: AtomicU64::new(0),
        })
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, HubState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The limits this hub runs with.
    pub fn config(&self) -> &WatchConfig {
        &self.config
    }

    /// The hub revision: the last revision apply reported (etcd `watchStream.Rev`).
    pub fn current_revision(&self) -> i64 {
        self.lock().rev
    }

    /// A new, empty outbox for one stream.
    pub fn new_outbox(&self) -> Arc<Outbox> {
        Outbox::new(&self.config, self.signal.clone())
    }

    /// Counts of watchers per group.
    pub fn stats(&self) -> HubStats {
        let st = self.lock();
        HubStats {
            revision: st.rev,
            synced: st.synced.len(),
            unsynced: st.unsynced.len(),
            watchers: st.watchers.len(),
            ring_hits: self.ring_hits.load(Ordering::Relaxed),
            ring_misses: self.ring_misses.load(Ordering::Relaxed),
            ring_revisions: st.ring.len(),
            ring_bytes: st.ring.bytes(),
        }
    }

    /// Approximate heap bytes of the hub's own structures (slab, index, unsynced set), not
    /// counting outboxes and key bytes.
    pub fn heap_bytes(&self) -> usize {
        let st = self.lock();
        st.watchers.heap_bytes() + st.synced.heap_bytes() + st.unsynced.len() * 16
    }

    /// Registers a watcher of `outbox` and queues its `created` response (etcd: `created`,
    /// the watch ID, header revision = the hub revision; events start after that revision
    /// unless `start_revision` says otherwise). A start revision in the past makes the
    /// watcher unsynced: the sync thread sends the history, or cancels it with the compact
    /// revision.
    pub fn add(&self, outbox: &Arc<Outbox>, spec: WatcherSpec) -> WatcherId {
        let mut st = self.lock();
        let rev = st.rev;
        let start = if spec.start_revision == 0 {
            rev + 1
        } else {
            spec.start_revision
        };
        let synced = start > rev;
        let id = st.watchers.insert(Watcher {
            outbox: outbox.clone(),
            watch_id: spec.watch_id,
            range: spec.range.clone(),
            next_rev: start,
            filter: spec.filter,
            flags: spec.flags,
            state: if synced {
                WatcherState::Synced
            } else {
                WatcherState::Unsynced
            },
            events_since_tick: false,
        });
        let mut created = bare_response(spec.watch_id, rev);
        created.created = true;
        outbox.push_control(created);
        if synced {
            st.synced.insert(&spec.range, id);
        } else {
            st.unsynced.insert(id);
            outbox.add_unsynced(1);
            self.signal.wake();
        }
        id
    }

    /// Cancels watcher `id` on its client's request and queues the `canceled` response
    /// (header revision = the hub revision). Returns false if it no longer exists.
    pub fn cancel(&self, id: WatcherId) -> bool {
        let mut st = self.lock();
        let Some(w) = st.watchers.remove(id) else {
            return false;
        };
        let rev = st.rev;
        Self::detach(&mut st, id, &w);
        let mut resp = bare_response(w.watch_id, rev);
        resp.canceled = true;
        w.outbox.push_control(resp);
        // After the cancel: a deferred progress answer must not precede it.
        Self::answer_pending_progress(rev, &w.outbox);
        true
    }

    /// Removes watchers without responses (their stream is gone).
    pub fn remove(&self, ids: impl IntoIterator<Item = WatcherId>) {
        let mut st = self.lock();
        for id in ids {
            if let Some(w) = st.watchers.remove(id) {
                Self::detach(&mut st, id, &w);
            }
        }
    }

    /// Takes a removed watcher out of its group.
    fn detach(st: &mut HubState, id: WatcherId, w: &Watcher) {
        match w.state {
            WatcherState::Synced => {
                st.synced.remove(&w.range, id);
            }
            WatcherState::Unsynced => {
                st.unsynced.remove(&id);
                w.outbox.add_unsynced(-1);
            }
            WatcherState::Compacted => {}
        }
    }

    /// Answers a deferred `WatchProgressRequest` once every watcher of `outbox` is synced.
    pub(super) fn answer_pending_progress(rev: i64, outbox: &Outbox) {
        if outbox.take_progress_if_synced() {
            let _ = outbox.push_progress(bare_response(INVALID_WATCH_ID, rev));
        }
    }

    /// Moves a synced watcher that could not take the events of `revision` to the unsynced
    /// group; it will read them from the store.
    pub(super) fn fall_behind(&self, st: &mut HubState, id: WatcherId, revision: i64) {
        let Some(w) = st.watchers.get_mut(id) else {
            return;
        };
        debug_assert_eq!(w.state, WatcherState::Synced);
        w.state = WatcherState::Unsynced;
        w.next_rev = w.next_rev.max(revision);
        let range = w.range.clone();
        w.outbox.add_unsynced(1);
        st.synced.remove(&range, id);
        st.unsynced.insert(id);
    }

    /// Called by apply after each committed entry with its store revision and events
    /// (etcd `watchableStore.notify`). Queues, for every synced watcher the events reach,
    /// one response holding all its events of this revision. Never waits for a client.
    /// The revision is also recorded in the ring of recent events.
    pub fn notify(&self, revision: i64, events: Vec<Event>) {
        let mut st = self.lock();
        debug_assert!(
            revision >= st.rev,
            "revisions go backwards: {revision} < {}",
            st.rev
        );
        st.rev = st.rev.max(revision);
        let recent = self.fan_out(&mut st, revision, events);
        st.ring.record(recent);
    }

    /// `notify`'s delivery to the synced watchers; returns the revision's events without
    /// `prev_kv` for the ring (shared with the deliveries unless `prev_kv` was filled in).
    fn fan_out(&self, st: &mut HubState, revision: i64, events: Vec<Event>) -> Arc<RevisionBatch> {
        let bare = |events| Arc::new(RevisionBatch { revision, events });
        if events.is_empty() || st.synced.is_empty() {
            return bare(events);
        }
        // (watcher, event index) pairs; sorted, they group by watcher in event order.
        let mut hits: Vec<(WatcherId, u32)> = Vec::new();
        for (i, ev) in events.iter().enumerate() {
            let key = ev.kv.as_ref().map_or(&[][..], |kv| &kv.key[..]);
            st.synced
                .for_each_match(key, |id| hits.push((id, i as u32)));
        }
        if hits.is_empty() {
            return bare(events);
        }
        if events.len() > 1 {
            hits.sort_unstable();
        }
        let mut deliveries: Vec<(WatcherId, Selection)> = Vec::new();
        let mut need_prev = vec![false; events.len()];
        for group in hits.chunk_by(|a, b| a.0 == b.0) {
            let id = group[0].0;
            let Some(w) = st.watchers.get(id) else {
                continue;
            };
            if revision < w.next_rev {
                continue; // a watcher whose start revision is still ahead
            }
            let chosen: Vec<u32> = group
                .iter()
                .map(|&(_, i)| i)
                .filter(|&i| w.filter.passes(&events[i as usize]))
                .collect();
            if chosen.is_empty() {
                continue;
            }
            if w.flags.prev_kv() {
                for &i in &chosen {
                    need_prev[i as usize] = true;
                }
            }
            let selection = if chosen.len() == events.len() {
                Selection::All
            } else {
                Selection::Some(chosen.into_boxed_slice())
            };
            deliveries.push((id, selection));
        }
        if deliveries.is_empty() {
            return bare(events);
        }
        if events.len() > 1 {
            // Responses in the order of each watcher's first event, so a stream with several
            // watchers sees a txn's responses in the txn's order (etcd's order is a Go map's).
            deliveries.sort_by_key(|(id, sel)| match sel {
                Selection::All => (0, *id),
                Selection::Some(idx) => (idx[0], *id),
            });
        }
        let mut events = events;
        let recent = need_prev.contains(&true).then(|| bare(events.clone()));
        let prev_failed = self.fill_prev_kv(&mut events, &need_prev, revision);
        let sizes: Vec<usize> = events.iter().map(|e| e.encoded_len() + 4).collect();
        let batch = Arc::new(RevisionBatch { revision, events });
        for (id, selection) in deliveries {
            let behind = {
                let Some(w) = st.watchers.get_mut(id) else {
                    continue;
                };
                if prev_failed && w.flags.prev_kv() {
                    // The store could not give this revision's prev_kv now; let the
                    // history path retry (or cancel the watcher if it was compacted).
                    true
                } else {
                    let bytes = match &selection {
                        Selection::All => sizes.iter().sum(),
                        Selection::Some(idx) => idx.iter().map(|&i| sizes[i as usize]).sum(),
                    };
                    let item = Item::Events(EventsItem {
                        watch_id: w.watch_id,
                        revision,
                        events: EventList::Shared(batch.clone(), selection),
                        prev_kv: w.flags.prev_kv(),
                        fragment: w.flags.fragment(),
                    });
                    match w.outbox.try_push(w.watch_id, item, bytes, true) {
                        Ok(()) => {
                            w.events_since_tick = true;
                            w.next_rev = w.next_rev.max(revision);
                            false
                        }
                        Err(Refused::Full) => true,
                        // The stream is being torn down; its watchers are removed next.
                        Err(Refused::Closed) => false,
                    }
                }
            };
            if behind {
                self.fall_behind(st, id, revision);
            }
        }
        recent.unwrap_or(batch)
    }

    /// Sets `prev_kv` on the events marked in `need`; returns true if a lookup failed.
    fn fill_prev_kv(&self, events: &mut [Event], need: &[bool], revision: i64) -> bool {
        let mut failed = false;
        for (ev, _) in events.iter_mut().zip(need).filter(|(_, n)| **n) {
            if is_create(ev) {
                continue;
            }
            let Some(key) = ev.kv.as_ref().map(|kv| kv.key.as_slice()) else {
                continue;
            };
            match self.source.prev_kv(key, revision) {
                Ok(prev) => ev.prev_kv = prev,
                Err(e) => {
                    tracing::warn!(revision, error = %e, "watch: cannot read prev_kv of a live event");
                    failed = true;
                }
            }
        }
        failed
    }

    /// The periodic progress notification of one stream (etcd `sendLoop` ticker): every
    /// watcher in `ids` that asked for `progress_notify`, is synced and got no events since
    /// the previous tick receives an empty response with the hub revision. A full outbox
    /// drops it (the watcher is receiving events anyway).
    pub fn progress_tick(&self, ids: &[WatcherId]) {
        let mut st = self.lock();
        let rev = st.rev;
        for &id in ids {
            let Some(w) = st.watchers.get_mut(id) else {
                continue;
            };
            if !w.flags.progress_notify() {
                continue;
            }
            if w.state == WatcherState::Synced && !w.events_since_tick {
                let resp = bare_response(w.watch_id, rev);
                let bytes = resp.encoded_len();
                let _ = w
                    .outbox
                    .try_push(w.watch_id, Item::Control(resp), bytes, false);
            }
            w.events_since_tick = false;
        }
    }

    /// A `WatchProgressRequest`: queues a response with watch ID -1 and the hub revision as
    /// soon as every watcher of the stream is synced, i.e. after every event up to that
    /// revision is queued, so the progress revision never runs ahead of undelivered events
    /// (etcd ≥ 3.5.8 `RequestProgressAll`; a stream without watchers is answered at once).
    pub fn request_progress(&self, outbox: &Outbox) {
        let st = self.lock();
        outbox.set_progress_pending();
        Self::answer_pending_progress(st.rev, outbox);
    }

    /// A snapshot install is about to replace the store: history reads in flight are void
    /// and the sync thread pauses. Apply does not run meanwhile.
    pub fn begin_install(&self) {
        let mut st = self.lock();
        st.installing = true;
        st.generation += 1;
        let rev = st.rev;
        st.ring.reset(rev);
    }

    /// The store was replaced by a snapshot (etcd `watchableStore.Restore`): every watcher
    /// becomes unsynced and catches up from the new store, from the revision after the last
    /// one it was sent (or is canceled as compacted).
    pub fn finish_install(&self) {
        let mut st = self.lock();
        let old_rev = st.rev;
        st.rev = self.source.current_revision();
        st.generation += 1;
        st.installing = false;
        // The ring holds the old store's revisions; the new store is read instead.
        let rev = st.rev;
        st.ring.reset(rev);
        for id in st.watchers.ids() {
            let Some(w) = st.watchers.get_mut(id) else {
                continue;
            };
            if w.state != WatcherState::Synced {
                continue;
            }
            w.next_rev = w.next_rev.max(old_rev + 1);
            let (range, outbox) = (w.range.clone(), w.outbox.clone());
            w.state = WatcherState::Unsynced;
            st.synced.remove(&range, id);
            st.unsynced.insert(id);
            outbox.add_unsynced(1);
        }
        // An unsynced watcher must not be ahead of the hub; the new store cannot be behind
        // the old one under raft, but keep the invariant if it ever is.
        let rev = st.rev;
        for id in st.unsynced.clone() {
            if let Some(w) = st.watchers.get_mut(id)
                && w.next_rev > rev
            {
                let (range, outbox) = (w.range.clone(), w.outbox.clone());
                w.state = WatcherState::Synced;
                st.unsynced.remove(&id);
                st.synced.insert(&range, id);
                outbox.add_unsynced(-1);
            }
        }
        drop(st);
        self.signal.wake();
    }

    /// Asserts the invariants of the module docs (tests).
    #[cfg(test)]
    pub(super) fn check_invariants(&self) {
        use std::collections::HashMap;
        let st = self.lock();
        let mut per_outbox: HashMap<*const Outbox, (u32, &Outbox)> = HashMap::new();
        let mut synced = 0;
        for id in st.watchers.ids() {
            let w = st.watchers.get(id).expect("listed");
            let entry = per_outbox
                .entry(Arc::as_ptr(&w.outbox))
                .or_insert((0, &w.outbox));
            match w.state {
                WatcherState::Synced => {
                    synced += 1;
                    assert!(!st.unsynced.contains(&id));
                }
                WatcherState::Unsynced => {
                    entry.0 += 1;
                    assert!(
                        st.unsynced.contains(&id),
                        "unsynced watcher missing from the set"
                    );
                    assert!(w.next_rev <= st.rev, "unsynced watcher ahead of the hub");
                }
                WatcherState::Compacted => assert!(!st.unsynced.contains(&id)),
            }
        }
        assert_eq!(synced, st.synced.len(), "synced index size");
        for (count, outbox) in per_outbox.values() {
            assert_eq!(*count, outbox.unsynced(), "outbox unsynced count");
        }
    }
}
