//! One gRPC watch stream: [`WatchStream`] handles the client's requests (etcd
//! `serverWatchStream.recvLoop`), [`WatchOutput`] is the response stream gRPC pulls from
//! (etcd `sendLoop`).
//!
//! Request handling follows etcd exactly, and a bad request never ends the stream:
//! - create: an empty key means `"\0"`, `range_end "\0"` means "from key"; a range with
//!   `key >= range_end` is answered `created + canceled`, watch ID -1, `cancel_reason
//!   "mvcc: watcher range is empty"`; a client-chosen `watch_id` already in use on this
//!   stream gets the same with `"mvcc: duplicate watch ID provided on the WatchStream"`;
//!   `watch_id` 0 means "pick one": the smallest unused ID counting up from 0 on this
//!   stream; a start revision in the future is accepted and waits for it; a negative
//!   `start_revision` is treated as etcd 3.4 and 3.5 treat it: compared with the compact
//!   revision, which is -1 until the first compaction, so the watcher is created, then
//!   canceled with `compact_revision` set (-1 on a store never compacted), except that -1
//!   on a store never compacted watches from the next revision;
//! - cancel: of a watcher of this stream answers `canceled` with its ID; of an unknown ID is
//!   ignored without a response (etcd);
//! - progress request: see [`WatchHub::request_progress`];
//! - a request with no request set is ignored.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use keel_proto::etcdserverpb::watch_request::RequestUnion;
use keel_proto::etcdserverpb::{WatchCreateRequest, WatchRequest, WatchResponse};

use super::hub::{INVALID_WATCH_ID, WatchHub, WatcherSpec};
use super::key_range::{EventFilter, WatchKeyRange};
use super::outbox::{Outbox, bare_response};
use super::response::push_responses;
use super::watcher::{WatcherFlags, WatcherId};

/// etcd's `mvcc.ErrWatcherDuplicateID` text, sent as `cancel_reason` (from the catalogue).
pub const DUPLICATE_ID_REASON: &str = keel_proto::rpctypes::WATCH_DUPLICATE_ID;

/// `watch_id` value asking the server to choose (etcd's `AutoWatchID`).
pub const AUTO_WATCH_ID: i64 = 0;

/// The request side of one stream: its watchers by watch ID. Dropping it removes them.
pub struct WatchStream {
    hub: Arc<WatchHub>,
    outbox: Arc<Outbox>,
    watchers: HashMap<i64, WatcherId>,
    next_id: i64,
}

impl WatchStream {
    /// A new stream on `hub` and its response side.
    pub fn new(hub: Arc<WatchHub>) -> (WatchStream, WatchOutput) {
        let outbox = hub.new_outbox();
        let output = WatchOutput {
            outbox: outbox.clone(),
            ready: VecDeque::new(),
            max_bytes: hub.config().max_response_bytes,
            on_drop: None,
        };
        let stream = WatchStream {
            hub,
            outbox,
            watchers: HashMap::new(),
            next_id: 0,
        };
        (stream, output)
    }

    /// Handles one client request (module docs).
    pub fn handle(&mut self, request: WatchRequest) {
        match request.request_union {
            Some(RequestUnion::CreateRequest(create)) => self.create(&create),
            Some(RequestUnion::CancelRequest(cancel)) => self.cancel(cancel.watch_id),
            Some(RequestUnion::ProgressRequest(_)) => self.hub.request_progress(&self.outbox),
            None => {}
        }
    }

    /// A create request: registers the watcher, or answers why not.
    pub fn create(&mut self, req: &WatchCreateRequest) {
        let range = match WatchKeyRange::from_request(&req.key, &req.range_end) {
            Ok(r) => r,
            Err(reason) => return self.reject(reason),
        };
        let watch_id = if req.watch_id == AUTO_WATCH_ID {
            while self.watchers.contains_key(&self.next_id) {
                self.next_id += 1;
            }
            self.next_id += 1;
            self.next_id - 1
        } else if self.watchers.contains_key(&req.watch_id) {
            return self.reject(DUPLICATE_ID_REASON);
        } else {
            req.watch_id
        };
        let id = self.hub.add(
            &self.outbox,
            WatcherSpec {
                watch_id,
                range,
                start_revision: req.start_revision,
                filter: EventFilter::from_request(&req.filters),
                flags: WatcherFlags::new(req.prev_kv, req.fragment, req.progress_notify),
            },
        );
        self.watchers.insert(watch_id, id);
    }

    /// etcd's answer to a create it refuses: `created` and `canceled`, watch ID -1, the
    /// reason, header revision = the current revision. The stream stays open. Also how the
    /// API answers a create the caller may not make (`reason` = the permission error's text).
    pub fn reject(&self, reason: &str) {
        let mut resp = bare_response(INVALID_WATCH_ID, self.hub.current_revision());
        resp.created = true;
        resp.canceled = true;
        resp.cancel_reason = reason.to_string();
        self.outbox.push_control(resp);
    }

    /// A cancel request for `watch_id`.
    pub fn cancel(&mut self, watch_id: i64) {
        if let Some(id) = self.watchers.remove(&watch_id) {
            self.hub.cancel(id);
        }
    }

    /// The periodic progress tick of this stream (see [`WatchHub::progress_tick`]).
    pub fn progress_tick(&self) {
        if self.watchers.is_empty() {
            return;
        }
        let ids: Vec<WatcherId> = self.watchers.values().copied().collect();
        self.hub.progress_tick(&ids);
    }

    /// Number of watchers registered on this stream.
    pub fn len(&self) -> usize {
        self.watchers.len()
    }

    /// Whether no watcher is registered.
    pub fn is_empty(&self) -> bool {
        self.watchers.is_empty()
    }
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        self.hub.remove(self.watchers.drain().map(|(_, id)| id));
        self.outbox.close();
    }
}

/// The response side of one stream: yields `WatchResponse`s (header revision only; the API
/// fills the member fields) in queue order, splitting fragments as needed. Ends when the
/// request side is dropped. Dropping it closes the outbox and runs the drop hook (the API
/// aborts the request task there).
pub struct WatchOutput {
    outbox: Arc<Outbox>,
    ready: VecDeque<WatchResponse>,
    max_bytes: usize,
    on_drop: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl WatchOutput {
    /// Runs `hook` when the output is dropped (the client went away).
    pub fn on_drop(&mut self, hook: impl FnOnce() + Send + Sync + 'static) {
        self.on_drop = Some(Box::new(hook));
    }
}

impl Stream for WatchOutput {
    type Item = WatchResponse;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<WatchResponse>> {
        let this = &mut *self;
        if let Some(r) = this.ready.pop_front() {
            return Poll::Ready(Some(r));
        }
        match this.outbox.poll_pop(cx) {
            Poll::Ready(Some(item)) => {
                push_responses(item, this.max_bytes, &mut this.ready);
                Poll::Ready(this.ready.pop_front())
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for WatchOutput {
    fn drop(&mut self) {
        self.outbox.close();
        if let Some(hook) = self.on_drop.take() {
            hook();
        }
    }
}
