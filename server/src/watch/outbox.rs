//! The outbox of one watch stream: the responses queued for its gRPC sender, in order.
//!
//! The hub pushes (under its lock, so pushes for one watcher are in revision order); the
//! stream's output pops as fast as gRPC flow control lets it. Two bounds keep memory
//! bounded whatever the client does:
//! - per watcher: at most `buffer_len` queued responses (etcd's `chanBufLen`, 128);
//! - per stream: at most `stream_buffer_bytes` of queued event bytes (an item is always
//!   accepted into an empty outbox, so one oversized revision cannot wedge a watcher).
//!
//! A push that would exceed a bound is refused; the hub then moves the watcher to the
//! unsynced group and it later catches up from the store. A pop while a watcher waits for
//! room wakes the hub's sync thread. Control responses (created, canceled, compacted) are
//! never refused: there is at most one of each per watcher.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use keel_proto::etcdserverpb::{ResponseHeader, WatchResponse};
use keel_proto::mvccpb::Event;
use prost::Message;

use super::WatchConfig;
use super::hub::SyncSignal;

/// The events of one applied revision, shared by every watcher they reach.
#[derive(Debug)]
pub struct RevisionBatch {
    /// The revision (all events carry it as `mod_revision`).
    pub revision: i64,
    /// The events in change order (`prev_kv` filled only when a watcher asked for it).
    pub events: Vec<Event>,
}

/// Which events of a [`RevisionBatch`] one watcher receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// Every event.
    All,
    /// The events at these indexes (ascending).
    Some(Box<[u32]>),
}

/// The events of one queued response.
#[derive(Debug)]
pub enum EventList {
    /// Live events: part of a batch shared with other watchers.
    Shared(Arc<RevisionBatch>, Selection),
    /// Events read from the store's history for this watcher.
    Owned(Vec<Event>),
}

impl EventList {
    /// The events, cloned out for a response; `prev_kv` is dropped unless `keep_prev_kv`.
    pub fn to_events(&self, keep_prev_kv: bool) -> Vec<Event> {
        let strip = |e: &Event| Event {
            r#type: e.r#type,
            kv: e.kv.clone(),
            prev_kv: if keep_prev_kv {
                e.prev_kv.clone()
            } else {
                None
            },
        };
        match self {
            EventList::Shared(batch, Selection::All) => batch.events.iter().map(strip).collect(),
            EventList::Shared(batch, Selection::Some(idx)) => idx
                .iter()
                .map(|&i| strip(&batch.events[i as usize]))
                .collect(),
            EventList::Owned(events) => events.iter().map(strip).collect(),
        }
    }

    /// Number of events.
    pub fn len(&self) -> usize {
        match self {
            EventList::Shared(batch, Selection::All) => batch.events.len(),
            EventList::Shared(_, Selection::Some(idx)) => idx.len(),
            EventList::Owned(events) => events.len(),
        }
    }

    /// Whether there are no events.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Events for one watcher, turned into a `WatchResponse` when popped.
#[derive(Debug)]
pub struct EventsItem {
    /// The watcher's watch ID.
    pub watch_id: i64,
    /// `header.revision`: the event revision for live events, the revision the catch-up
    /// read reached for history (etcd's `WatchResponse.Revision`).
    pub revision: i64,
    /// The events.
    pub events: EventList,
    /// Keep `prev_kv` on the events.
    pub prev_kv: bool,
    /// Split the response if it exceeds the request size limit.
    pub fragment: bool,
}

/// One queued response.
#[derive(Debug)]
pub enum Item {
    /// A response sent as is (created, canceled, compacted, progress); the API fills the
    /// header's member fields.
    Control(WatchResponse),
    /// Events for one watcher.
    Events(EventsItem),
}

/// A response with only a header revision set (the API layer fills the member fields).
pub fn bare_response(watch_id: i64, revision: i64) -> WatchResponse {
    WatchResponse {
        header: Some(ResponseHeader {
            revision,
            ..Default::default()
        }),
        watch_id,
        ..Default::default()
    }
}

/// Bookkeeping of one queued item.
#[derive(Debug)]
struct Queued {
    item: Item,
    /// The watcher whose per-watcher bound this item counts against.
    counted_for: Option<i64>,
    bytes: usize,
}

#[derive(Debug, Default)]
struct Inner {
    queue: VecDeque<Queued>,
    /// Queued items per watch ID (entries only while non-zero).
    pending: HashMap<i64, u32>,
    bytes: usize,
    waker: Option<Waker>,
    closed: bool,
    /// A push was refused since the last pop: wake the sync thread on the next pop.
    starved: bool,
    /// Watchers of this stream that are unsynced (maintained by the hub).
    unsynced: u32,
    /// A `WatchProgressRequest` waits until every watcher of the stream is synced.
    progress_pending: bool,
}

/// See the module docs.
#[derive(Debug)]
pub struct Outbox {
    inner: Mutex<Inner>,
    buffer_len: u32,
    max_bytes: usize,
    sync: Arc<SyncSignal>,
}

/// Why an item was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The watcher or the stream is at its bound.
    Full,
    /// The stream is gone.
    Closed,
}

impl Outbox {
    /// An empty outbox with the bounds of `config`; pops wake `sync` when a watcher waits
    /// for room.
    pub fn new(config: &WatchConfig, sync: Arc<SyncSignal>) -> Arc<Outbox> {
        Arc::new(Outbox {
            inner: Mutex::new(Inner::default()),
            buffer_len: u32::try_from(config.buffer_len.max(1)).unwrap_or(u32::MAX),
            max_bytes: config.stream_buffer_bytes,
            sync,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether an item of `watch_id` would be accepted now.
    pub fn has_room(&self, watch_id: i64) -> bool {
        let inner = self.lock();
        !inner.closed && self.fits(&inner, watch_id, 0)
    }

    fn fits(&self, inner: &Inner, watch_id: i64, bytes: usize) -> bool {
        let queued = inner.pending.get(&watch_id).copied().unwrap_or(0);
        queued < self.buffer_len && (inner.bytes == 0 || inner.bytes + bytes <= self.max_bytes)
    }

    /// Queues a control response; never refused while the stream is open.
    pub fn push_control(&self, response: WatchResponse) {
        let bytes = response.encoded_len();
        let mut inner = self.lock();
        if inner.closed {
            return;
        }
        Self::enqueue(&mut inner, Item::Control(response), None, bytes);
    }

    /// Queues the answer to a `WatchProgressRequest` (watch ID -1). It counts against the
    /// per-watcher bound of ID -1 only, not the stream's byte bound: it is a few bytes, and
    /// it is due exactly when a catch-up may have filled the stream, where dropping it would
    /// leave the request unanswered for good. Refused only when `--watch-buffer-len`
    /// answers are already queued unread.
    pub fn push_progress(&self, response: WatchResponse) -> Result<(), Refused> {
        let bytes = response.encoded_len();
        let mut inner = self.lock();
        if inner.closed {
            return Err(Refused::Closed);
        }
        let id = response.watch_id;
        if inner.pending.get(&id).copied().unwrap_or(0) >= self.buffer_len {
            return Err(Refused::Full);
        }
        *inner.pending.entry(id).or_insert(0) += 1;
        Self::enqueue(&mut inner, Item::Control(response), Some(id), bytes);
        Ok(())
    }

    /// Queues an item that counts against `watch_id`'s bound, if it fits. A refusal marks
    /// the outbox starved when `wake_on_room` (the watcher will be caught up once room
    /// frees up); progress notifications pass `false` and are simply dropped, as in etcd.
    pub fn try_push(
        &self,
        watch_id: i64,
        item: Item,
        bytes: usize,
        wake_on_room: bool,
    ) -> Result<(), Refused> {
        let mut inner = self.lock();
        if inner.closed {
            return Err(Refused::Closed);
        }
        if !self.fits(&inner, watch_id, bytes) {
            inner.starved |= wake_on_room;
            return Err(Refused::Full);
        }
        *inner.pending.entry(watch_id).or_insert(0) += 1;
        Self::enqueue(&mut inner, item, Some(watch_id), bytes);
        Ok(())
    }

    fn enqueue(inner: &mut Inner, item: Item, counted_for: Option<i64>, bytes: usize) {
        inner.bytes += bytes;
        inner.queue.push_back(Queued {
            item,
            counted_for,
            bytes,
        });
        if let Some(w) = inner.waker.take() {
            w.wake();
        }
    }

    /// Pops the next item for the sender; `Ready(None)` once closed and drained.
    pub fn poll_pop(&self, cx: &mut Context<'_>) -> Poll<Option<Item>> {
        let mut inner = self.lock();
        let Some(q) = inner.queue.pop_front() else {
            if inner.closed {
                return Poll::Ready(None);
            }
            inner.waker = Some(cx.waker().clone());
            return Poll::Pending;
        };
        inner.bytes -= q.bytes;
        if let Some(id) = q.counted_for
            && let Some(n) = inner.pending.get_mut(&id)
        {
            *n -= 1;
            if *n == 0 {
                inner.pending.remove(&id);
            }
        }
        if inner.queue.is_empty() && inner.queue.capacity() > 64 {
            // A burst is over: give its memory back.
            inner.queue.shrink_to(8);
        }
        let wake = std::mem::take(&mut inner.starved);
        drop(inner);
        if wake {
            self.sync.wake();
        }
        Poll::Ready(Some(q.item))
    }

    /// Closes the outbox: later pushes are dropped, queued items are discarded and the
    /// output ends.
    pub fn close(&self) {
        let mut inner = self.lock();
        inner.closed = true;
        inner.queue.clear();
        inner.pending.clear();
        inner.bytes = 0;
        if let Some(w) = inner.waker.take() {
            w.wake();
        }
    }

    /// Whether the stream is gone.
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Adds `delta` to the stream's unsynced-watcher count; returns the new count.
    pub(super) fn add_unsynced(&self, delta: i32) -> u32 {
        let mut inner = self.lock();
        inner.unsynced = inner.unsynced.saturating_add_signed(delta);
        inner.unsynced
    }

    /// The stream's unsynced-watcher count.
    #[cfg(test)]
    pub(super) fn unsynced(&self) -> u32 {
        self.lock().unsynced
    }

    /// Records that a `WatchProgressRequest` waits for every watcher to be synced.
    pub(super) fn set_progress_pending(&self) {
        self.lock().progress_pending = true;
    }

    /// Clears and returns the pending-progress flag if every watcher is synced now.
    pub(super) fn take_progress_if_synced(&self) -> bool {
        let mut inner = self.lock();
        if inner.unsynced == 0 && inner.progress_pending {
            inner.progress_pending = false;
            return true;
        }
        false
    }

    /// Queued items and bytes, for tests and metrics.
    pub fn queued(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.queue.len(), inner.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::task::noop_waker;

    fn config(buffer_len: usize, bytes: usize) -> WatchConfig {
        WatchConfig {
            buffer_len,
            stream_buffer_bytes: bytes,
            ..WatchConfig::default()
        }
    }

    fn events_item(watch_id: i64, revision: i64) -> Item {
        Item::Events(EventsItem {
            watch_id,
            revision,
            events: EventList::Owned(Vec::new()),
            prev_kv: false,
            fragment: false,
        })
    }

    fn pop(o: &Outbox) -> Option<Item> {
        let waker = noop_waker();
        match o.poll_pop(&mut Context::from_waker(&waker)) {
            Poll::Ready(item) => item,
            Poll::Pending => None,
        }
    }

    #[test]
    fn per_watcher_bound_refuses_and_pop_wakes_the_sync_thread() {
        let signal = Arc::new(SyncSignal::default());
        let o = Outbox::new(&config(2, usize::MAX), signal.clone());
        assert!(o.try_push(1, events_item(1, 5), 10, true).is_ok());
        assert!(o.try_push(1, events_item(1, 6), 10, true).is_ok());
        assert_eq!(
            o.try_push(1, events_item(1, 7), 10, true),
            Err(Refused::Full)
        );
        assert!(!o.has_room(1));
        assert!(o.has_room(2), "the bound is per watcher");
        assert!(o.try_push(2, events_item(2, 7), 10, true).is_ok());
        assert!(!signal.take(), "nothing popped yet");
        match pop(&o) {
            Some(Item::Events(e)) => assert_eq!((e.watch_id, e.revision), (1, 5)),
            other => panic!("unexpected {other:?}"),
        }
        assert!(signal.take(), "a pop after a refusal wakes the sync thread");
        assert!(o.has_room(1));
        assert_eq!(o.queued(), (2, 20));
    }

    #[test]
    fn a_progress_answer_passes_a_full_stream_but_not_its_own_bound() {
        let o = Outbox::new(&config(2, 100), Arc::new(SyncSignal::default()));
        assert!(o.try_push(1, events_item(1, 5), 1000, true).is_ok());
        assert_eq!(
            o.try_push(2, events_item(2, 5), 1, true),
            Err(Refused::Full)
        );
        let answer = || bare_response(-1, 9);
        assert!(
            o.push_progress(answer()).is_ok(),
            "the byte bound does not apply"
        );
        assert!(o.push_progress(answer()).is_ok());
        assert_eq!(
            o.push_progress(answer()),
            Err(Refused::Full),
            "2 unread answers"
        );
        pop(&o);
        match pop(&o) {
            Some(Item::Control(r)) => assert_eq!(r.watch_id, -1),
            other => panic!("unexpected {other:?}"),
        }
        assert!(o.push_progress(answer()).is_ok(), "room again after a pop");
        o.close();
        assert_eq!(o.push_progress(answer()), Err(Refused::Closed));
    }

    #[test]
    fn stream_byte_bound_accepts_one_item_into_an_empty_outbox() {
        let o = Outbox::new(&config(128, 100), Arc::new(SyncSignal::default()));
        assert!(
            o.try_push(1, events_item(1, 5), 1000, true).is_ok(),
            "empty outbox takes any item"
        );
        assert_eq!(
            o.try_push(2, events_item(2, 5), 1, true),
            Err(Refused::Full)
        );
        pop(&o);
        assert!(o.try_push(2, events_item(2, 5), 60, true).is_ok());
        assert!(o.try_push(2, events_item(2, 6), 40, true).is_ok());
        assert_eq!(
            o.try_push(3, events_item(3, 6), 1, true),
            Err(Refused::Full)
        );
    }

    #[test]
    fn control_responses_are_never_refused_and_close_ends_the_output() {
        let o = Outbox::new(&config(1, 1), Arc::new(SyncSignal::default()));
        assert!(o.try_push(1, events_item(1, 5), 10, true).is_ok());
        o.push_control(bare_response(1, 9));
        o.push_control(bare_response(2, 9));
        assert_eq!(o.queued().0, 3);
        o.close();
        assert!(pop(&o).is_none());
        assert_eq!(
            o.try_push(1, events_item(1, 5), 1, true),
            Err(Refused::Closed)
        );
        let waker = noop_waker();
        assert!(matches!(
            o.poll_pop(&mut Context::from_waker(&waker)),
            Poll::Ready(None)
        ));
    }
}
