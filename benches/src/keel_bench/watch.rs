//! The watch workload: `--watchers` watchers, each on its own stream, watch the whole key
//! space while the clients put; every put carries its send time, so each watcher measures
//! the latency from sending a put to receiving its event (etcd `benchmark watch-latency`
//! measures the same span).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use keel_client::etcdserverpb::PutRequest;
use keel_client::{Client, ClientError, WatchStream};
use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::sync::watch;
use tokio::time::Instant;

use super::keys::{KeyGen, random_value};
use super::report::{EventSummary, Latency, Recorder, over_slow_share};
use super::runner::{self, Outcome, Plan, Worker};

/// Bytes of the send time (ns since the run's base instant, little endian) at the front of
/// each value.
const STAMP: usize = 8;
/// After the last put, wait this long without a new event before giving up on missing ones.
const DRAIN_IDLE: Duration = Duration::from_secs(2);

/// A put worker whose values start with their send time.
pub struct StampedPut {
    client: Client,
    keys: KeyGen,
    value: Vec<u8>,
    rng: StdRng,
    base: Instant,
}

impl Worker for StampedPut {
    async fn request(&mut self) -> Result<(), ClientError> {
        let sent = self.base.elapsed().as_nanos() as u64;
        let mut value = self.value.clone();
        value[..STAMP].copy_from_slice(&sent.to_le_bytes());
        let put = PutRequest {
            key: self.keys.key(&mut self.rng),
            value,
            ..Default::default()
        };
        self.client.put_request(put).await.map(drop)
    }
}

/// Runs the watch workload: opens `watchers` watchers, then the put `workers` (keys from
/// `keys`, values of `max(val_size, 8)` bytes) per `plan`, then waits for the events to
/// arrive. Returns the put outcome and the event summary.
///
/// Errors: opening a watcher failed.
pub async fn run(
    client: &Client,
    watchers: usize,
    clients: usize,
    keys: KeyGen,
    val_size: usize,
    plan: &Plan,
) -> Result<(Outcome, EventSummary), ClientError> {
    let base = Instant::now();
    let received = Arc::new(AtomicU64::new(0));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = Vec::with_capacity(watchers);
    for _ in 0..watchers {
        // Key "\0" with range end "\0": every key (etcd's "all keys >= key" convention).
        let stream = client.watch_key(vec![0], vec![0], 0).await?;
        tasks.push(tokio::spawn(receive(
            stream,
            base,
            received.clone(),
            stop_rx.clone(),
        )));
    }
    let workers = (0..clients)
        .map(|i| {
            let mut rng = StdRng::seed_from_u64(0x7761_7463 ^ i as u64);
            StampedPut {
                client: client.clone(),
                keys: keys.clone(),
                value: random_value(val_size.max(STAMP), &mut rng),
                rng,
                base,
            }
        })
        .collect();
    let outcome = runner::run(plan, workers).await;

    let expected = outcome.recorder.ok_count() * watchers as u64;
    let mut last = (received.load(Ordering::Relaxed), Instant::now());
    while last.0 < expected && last.1.elapsed() < DRAIN_IDLE {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = received.load(Ordering::Relaxed);
        if now != last.0 {
            last = (now, Instant::now());
        }
    }
    let _ = stop_tx.send(true);
    let mut events = Recorder::default();
    for t in tasks {
        match t.await {
            Ok(r) => events.merge(&r),
            Err(e) => events.error(format!("watcher_panicked: {e}")),
        }
    }
    let summary = EventSummary {
        watchers,
        received: events.ok_count(),
        latency_ms: Latency::of(&events.latency_us),
        over_30ms_share: over_slow_share(&events.latency_us),
    };
    Ok((outcome, summary))
}

async fn receive(
    mut stream: WatchStream,
    base: Instant,
    received: Arc<AtomicU64>,
    mut stop: watch::Receiver<bool>,
) -> Recorder {
    let mut rec = Recorder::default();
    loop {
        tokio::select! {
            _ = stop.changed() => return rec,
            r = stream.next() => match r {
                Ok(Some(resp)) => {
                    let now = base.elapsed().as_nanos() as u64;
                    for ev in resp.events {
                        let Some(kv) = ev.kv else { continue };
                        let Some(stamp) = kv.value.get(..STAMP) else { continue };
                        let sent = u64::from_le_bytes(stamp.try_into().unwrap_or_default());
                        rec.ok(Duration::from_nanos(now.saturating_sub(sent)));
                        received.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Ok(None) => return rec,
                Err(e) => {
                    rec.error(e.kind());
                    return rec;
                }
            }
        }
    }
}
