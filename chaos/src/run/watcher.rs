//! Watchers on the workload's key range, each on a random member, with progress
//! notifications (`progress_notify` plus a `WatchProgressRequest` every second). When a
//! stream fails, stalls (no response for [`STALL`]) or is cancelled, the watcher resumes on a
//! random member from the last event's revision + 1 (or from the compact revision after a
//! compaction cancel); each stream is one [`WatchRecord`].

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use keel_proto::etcdserverpb::watch_client::WatchClient;
use keel_proto::etcdserverpb::watch_request::RequestUnion;
use keel_proto::etcdserverpb::{WatchCreateRequest, WatchProgressRequest, WatchRequest};
use keel_proto::mvccpb;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::cluster::Cluster;
use super::rpc::connect;
use super::workload::{KEY_PREFIX, KEY_RANGE_END};
use crate::history::{EventKind, WatchEvent, WatchRecord, WatchResponseRecord};

/// A stream with no response for this long is abandoned (a paused member, a dead link).
const STALL: Duration = Duration::from_secs(3);
/// Interval of `WatchProgressRequest`s.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// What one watcher shares with the harness.
#[derive(Default)]
pub struct WatcherState {
    /// Closed streams.
    pub records: Mutex<Vec<WatchRecord>>,
    /// Highest header revision received on any stream (events or progress).
    pub seen_revision: AtomicI64,
}

/// Runs watcher `id` until `stop` is set; the open stream is then recorded with
/// `ended = None`.
pub async fn run_watcher(
    id: u32,
    cluster: Arc<Cluster>,
    seed: u64,
    t0: Instant,
    stop: Arc<AtomicBool>,
    state: Arc<WatcherState>,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5741_5443_4845_5200 ^ u64::from(id));
    // Revision 1 is the first a new cluster assigns: the first stream sees every change.
    let mut next_revision = 1i64;
    while !stop.load(Ordering::SeqCst) {
        let member = rng.gen_range(0..cluster.len());
        let mut record = WatchRecord {
            watcher: id,
            member,
            key: KEY_PREFIX.to_string(),
            range_end: KEY_RANGE_END.to_string(),
            start_revision: next_revision,
            created_revision: 0,
            responses: Vec::new(),
            ended: None,
        };
        let ended = stream(&cluster, member, t0, &stop, &state, &mut record).await;
        let opened = record.created_revision != 0;
        if let Some(last) = record
            .responses
            .iter()
            .flat_map(|r| r.events.iter())
            .map(|e| e.mod_revision)
            .max()
        {
            next_revision = last + 1;
        }
        if let Some(c) = record.responses.iter().map(|r| r.compact_revision).max()
            && c > next_revision
        {
            next_revision = c;
        }
        record.ended = ended;
        // Streams that never opened saw nothing: only opened ones are history.
        if opened {
            state
                .records
                .lock()
                .expect("watch records lock")
                .push(record);
        }
        if !stop.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(rng.gen_range(50..200))).await;
        }
    }
}

/// One stream; returns why it ended (`None` when stopped by the harness).
async fn stream(
    cluster: &Cluster,
    member: usize,
    t0: Instant,
    stop: &AtomicBool,
    state: &WatcherState,
    record: &mut WatchRecord,
) -> Option<String> {
    let channel = match connect(&cluster.members[member].client_url, STALL).await {
        Ok(c) => c,
        Err(e) => return Some(format!("connect: {e}")),
    };
    let (tx, rx) = mpsc::channel(4);
    let create = WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: record.key.clone().into_bytes(),
            range_end: record.range_end.clone().into_bytes(),
            start_revision: record.start_revision,
            progress_notify: true,
            ..Default::default()
        })),
    };
    if tx.send(create).await.is_err() {
        return Some("request channel closed".into());
    }
    let opened = tokio::time::timeout(
        STALL,
        WatchClient::new(channel).watch(tokio_stream_from(rx)),
    )
    .await;
    let mut responses = match opened {
        Ok(Ok(r)) => r.into_inner(),
        Ok(Err(s)) => return Some(format!("watch: {s}")),
        Err(_) => return Some("watch: no answer".into()),
    };
    let mut progress = tokio::time::interval(PROGRESS_EVERY);
    let mut last_response = Instant::now();
    loop {
        if stop.load(Ordering::SeqCst) {
            return None;
        }
        tokio::select! {
            msg = responses.next() => {
                let r = match msg {
                    None => return Some("stream closed".into()),
                    Some(Err(s)) => return Some(format!("stream error: {s}")),
                    Some(Ok(r)) => r,
                };
                last_response = Instant::now();
                let header_revision = r.header.as_ref().map(|h| h.revision).unwrap_or(0);
                state.seen_revision.fetch_max(header_revision, Ordering::SeqCst);
                if r.created {
                    record.created_revision = header_revision;
                    if !r.canceled {
                        continue;
                    }
                }
                record.responses.push(WatchResponseRecord {
                    at_ns: t0.elapsed().as_nanos() as u64,
                    header_revision,
                    events: r.events.iter().map(event).collect(),
                    compact_revision: r.compact_revision,
                });
                if r.canceled {
                    return Some(format!("canceled: {}", r.cancel_reason));
                }
            }
            _ = progress.tick() => {
                if last_response.elapsed() > STALL {
                    return Some(format!("stalled: no response for {STALL:?}"));
                }
                let req = WatchRequest {
                    request_union: Some(RequestUnion::ProgressRequest(WatchProgressRequest {})),
                };
                if tx.send(req).await.is_err() {
                    return Some("request channel closed".into());
                }
            }
        }
    }
}

/// The request stream of a watch, fed through `rx`.
pub(crate) fn tokio_stream_from(
    mut rx: mpsc::Receiver<WatchRequest>,
) -> impl futures::Stream<Item = WatchRequest> + Send + 'static {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

pub(crate) fn event(e: &mvccpb::Event) -> WatchEvent {
    let kv = e.kv.clone().unwrap_or_default();
    WatchEvent {
        kind: if e.r#type == mvccpb::event::EventType::Delete as i32 {
            EventKind::Delete
        } else {
            EventKind::Put
        },
        key: String::from_utf8_lossy(&kv.key).into_owned(),
        value: String::from_utf8_lossy(&kv.value).into_owned(),
        mod_revision: kv.mod_revision,
        create_revision: kv.create_revision,
        version: kv.version,
    }
}
