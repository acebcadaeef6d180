//! Waiting for keys to go: [`Watches`] (watchers on the member's hub, consumed in
//! process), [`wait_deletes`] (etcd `concurrency.waitDeletes`, plus an early end when the
//! waiter's own key goes) and [`recheck`] (the check etcd's Lock got in 3.5 and its Campaign
//! never got, etcd-io/etcd#11456).

use std::collections::HashSet;

use futures::StreamExt;
use keel_proto::etcdserverpb::watch_create_request::FilterType;
use keel_proto::etcdserverpb::{ResponseHeader, WatchCreateRequest, WatchResponse};
use keel_proto::mvccpb::event::EventType;
use tonic::Status;

use super::caller::Caller;
use super::{ConcurrencyError, last_created_before};
use crate::error::EtcdError;
use crate::node::Node;
use crate::watch::{WatchOutput, WatchStream};

/// Why a wait did not end in ownership.
#[derive(Debug)]
pub enum WaitError {
    /// The caller's own key went (or was re-created) while it waited: it lost its place,
    /// and there is nothing of its own left to clean up.
    SessionExpired,
    /// A read or watch failed (auth, no leader, compaction); the caller's key may still be
    /// queued.
    Failed(Status),
}

impl From<Status> for WaitError {
    fn from(s: Status) -> WaitError {
        WaitError::Failed(s)
    }
}

impl From<WaitError> for Status {
    fn from(e: WaitError) -> Status {
        match e {
            WaitError::SessionExpired => ConcurrencyError::SessionExpired.into(),
            WaitError::Failed(s) => s,
        }
    }
}

/// The key a Lock or Campaign put (or found) for its lease, as it was then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnKey {
    /// `<name>/<lease hex>`.
    pub key: Vec<u8>,
    /// Its create revision: its place in the queue, and the revision to fence with.
    pub create_revision: i64,
    /// The lease it is attached to.
    pub lease: i64,
    /// The revision at which it was seen (the Txn's header revision); a delete after this
    /// revision means the caller lost its place.
    pub seen_at: i64,
}

/// Watchers of one in-process watch stream on the member's hub. Dropping it removes them.
pub struct Watches {
    stream: WatchStream,
    output: WatchOutput,
    next_id: i64,
    /// IDs not canceled by us: a cancel of one of them is an error.
    live: HashSet<i64>,
}

impl Watches {
    /// A new stream on `node`'s watch hub.
    pub fn new(node: &Node) -> Watches {
        let (stream, output) = WatchStream::new(node.watch.clone());
        Watches {
            stream,
            output,
            next_id: 1,
            live: HashSet::new(),
        }
    }

    /// Watches deletes of `key` from revision `start` on; returns the watch ID.
    pub fn deletes_of(&mut self, key: &[u8], start: i64) -> i64 {
        self.add(key, &[], start, vec![FilterType::Noput as i32])
    }

    /// Watches every change of `[key, range_end)` (`range_end` empty: `key` alone) from
    /// revision `start` on; returns the watch ID.
    pub fn changes_of(&mut self, key: &[u8], range_end: &[u8], start: i64) -> i64 {
        self.add(key, range_end, start, Vec::new())
    }

    fn add(&mut self, key: &[u8], range_end: &[u8], start: i64, filters: Vec<i32>) -> i64 {
        let watch_id = self.next_id;
        self.next_id += 1;
        self.stream.create(&WatchCreateRequest {
            key: key.to_vec(),
            range_end: range_end.to_vec(),
            start_revision: start,
            filters,
            watch_id,
            ..Default::default()
        });
        self.live.insert(watch_id);
        watch_id
    }

    /// Stops watcher `watch_id`; its later responses are skipped.
    pub fn cancel(&mut self, watch_id: i64) {
        self.live.remove(&watch_id);
        self.stream.cancel(watch_id);
    }

    /// The next response carrying events of a live watcher (header revision only).
    ///
    /// Errors: a live watcher canceled by the hub: `Compacted` if its start revision was
    /// compacted (etcd `ErrCompacted`), else [`ConcurrencyError::LostWatcher`]; the stream
    /// ended: [`ConcurrencyError::LostWatcher`].
    pub async fn next(&mut self) -> Result<WatchResponse, Status> {
        loop {
            let Some(resp) = self.output.next().await else {
                return Err(ConcurrencyError::LostWatcher.into());
            };
            if !self.live.contains(&resp.watch_id) {
                continue;
            }
            if resp.canceled {
                if resp.compact_revision > 0 {
                    return Err(EtcdError::Compacted.into());
                }
                return Err(ConcurrencyError::LostWatcher.into());
            }
            if !resp.events.is_empty() {
                return Ok(resp);
            }
        }
    }
}

fn deletes(resp: &WatchResponse) -> bool {
    resp.events
        .iter()
        .any(|e| e.r#type == EventType::Delete as i32)
}

/// Waits until no key under `prefix` is older than `own` (etcd `waitDeletes`): reads the
/// newest older key, waits for its delete, and again, until none is left.
///
/// Unlike etcd, the wait also ends when `own.key` is deleted after `own.seen_at` (its lease
/// expired or was revoked, or someone deleted it): the caller lost its place, so it gets
/// [`WaitError::SessionExpired`] at once instead of when its predecessors are gone.
///
/// Errors: [`WaitError::SessionExpired`]; [`WaitError::Failed`] with those of the Range
/// (auth, no leader) and of [`Watches::next`] (compaction).
pub async fn wait_deletes(caller: &Caller, prefix: &[u8], own: &OwnKey) -> Result<(), WaitError> {
    let mut watches = Watches::new(caller.node());
    let own_watch = watches.deletes_of(&own.key, own.seen_at + 1);
    loop {
        let older = caller
            .range(last_created_before(prefix, own.create_revision - 1))
            .await?;
        let Some(kv) = older.kvs.first() else {
            return Ok(());
        };
        let read_at = older.header.as_ref().map_or(0, |h| h.revision);
        let pred_watch = watches.deletes_of(&kv.key, read_at);
        loop {
            let resp = watches.next().await?;
            if resp.watch_id == own_watch && deletes(&resp) {
                return Err(WaitError::SessionExpired);
            }
            if resp.watch_id == pred_watch && deletes(&resp) {
                break;
            }
        }
        watches.cancel(pred_watch);
    }
}

/// Confirms, with a linearizable read, that `own.key` still exists with the create revision
/// and lease it had: the caller really holds the lock or leadership now. Returns the read's
/// header (its revision is the point at which ownership was confirmed).
///
/// Errors: [`WaitError::SessionExpired`] if the key is gone or was re-created;
/// [`WaitError::Failed`] with those of the Range.
pub async fn recheck(caller: &Caller, own: &OwnKey) -> Result<Option<ResponseHeader>, WaitError> {
    let resp = caller
        .range(keel_proto::etcdserverpb::RangeRequest {
            key: own.key.clone(),
            ..Default::default()
        })
        .await?;
    match resp.kvs.first() {
        Some(kv) if kv.create_revision == own.create_revision && kv.lease == own.lease => {
            Ok(resp.header)
        }
        _ => Err(WaitError::SessionExpired),
    }
}

/// What Lock and Campaign do once queued behind an older key: [`wait_deletes`], then
/// [`recheck`]; returns the header of the read that confirmed ownership. `release` gives
/// `own` up (Lock: delete the key; Campaign: resign) when the wait fails, or, on a new
/// task, when the call is abandoned mid-wait (etcd's `Unlock`/`Resign` on error and on
/// context cancel). A key that vanished is left alone.
///
/// Errors: `mutex: session is expired` ([`WaitError::SessionExpired`]); those of the reads
/// and watches.
pub async fn wait_for_turn<F, Fut>(
    caller: &Caller,
    prefix: &[u8],
    own: OwnKey,
    release: F,
) -> Result<Option<ResponseHeader>, Status>
where
    F: Fn(Caller, OwnKey) -> Fut + Copy + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let abandoned = {
        let own = own.clone();
        caller.on_abandon(move |caller| release(caller, own))
    };
    let result = match wait_deletes(caller, prefix, &own).await {
        Ok(()) => recheck(caller, &own).await,
        Err(e) => Err(e),
    };
    if let Err(WaitError::Failed(_)) = result {
        release(caller.clone(), own).await;
    }
    abandoned.disarm();
    result.map_err(Status::from)
}
