//! Watch benchmarks against a running member. Not part of `cargo test`; run in release and
//! copy the figures into docs/watch.md and docs/benchmarks.md:
//!
//! ```sh
//! keel --data-dir /tmp/wb ... &            # a release member, note its PID
//! cargo run --release -p keel-benches --bin watch-bench -- memory --endpoint 127.0.0.1:2379 --pid <pid>
//! cargo run --release -p keel-benches --bin watch-bench -- throughput --endpoint 127.0.0.1:2379 --pid <pid>
//! ```
//!
//! - `memory`: the member's RSS growth per watch stream and per watcher (etcd's watch memory
//!   benchmark: about 350 bytes per watcher plus 18 KB per stream). Opens `--streams`
//!   streams with one watcher each, then adds watchers up to `--watchers` in total, each on
//!   its own key, and reads `/proc/<pid>/status` after each phase.
//! - `throughput`: writers put for `--seconds`, alone and with one watcher that receives
//!   every write but never reads its stream (measured after 2 s of writes have filled the
//!   client's HTTP/2 windows), alternating `--rounds` times in ABBA order; reports puts/s,
//!   the member's CPU time per put and its RSS growth per put of both.
//! - `scale`: starts its own 3 local members, 10,000 watchers over 100 streams, puts at a
//!   target rate with progress requests, and checks every watch guarantee on every watcher
//!   (`keel_benches::watch_scale`; `watch-bench scale --keel target/release/keel`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use keel_proto::etcdserverpb::kv_client::KvClient;
use keel_proto::etcdserverpb::watch_client::WatchClient;
use keel_proto::etcdserverpb::watch_request::RequestUnion;
use keel_proto::etcdserverpb::{PutRequest, WatchCreateRequest, WatchRequest, WatchResponse};
use tokio_stream::StreamExt;
use tonic::Streaming;
use tonic::transport::{Channel, Endpoint};

#[derive(Parser)]
#[command(
    about = "Keel watch benchmarks (memory per watcher, writer throughput with a stalled watcher)"
)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// RSS per stream and per watcher.
    Memory {
        #[arg(long, default_value = "127.0.0.1:2379")]
        endpoint: String,
        /// PID of the keel process (its RSS is read from /proc).
        #[arg(long)]
        pid: u32,
        /// Watchers in total (each on its own key).
        #[arg(long, default_value_t = 100_000)]
        watchers: usize,
        /// Streams (the first phase opens each with one watcher).
        #[arg(long, default_value_t = 1000)]
        streams: usize,
        /// gRPC connections the streams are spread over.
        #[arg(long, default_value_t = 10)]
        connections: usize,
    },
    /// Writer throughput alone and with a watcher that never reads.
    Throughput {
        #[arg(long, default_value = "127.0.0.1:2379")]
        endpoint: String,
        #[arg(long)]
        pid: u32,
        /// Concurrent writers (each on its own connection).
        #[arg(long, default_value_t = 32)]
        writers: usize,
        /// Value size in bytes.
        #[arg(long, default_value_t = 256)]
        value_bytes: usize,
        /// Distinct keys written.
        #[arg(long, default_value_t = 1000)]
        keys: usize,
        /// Seconds per measurement.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Measurements of each kind, alternating.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
    /// Many watchers on a local 3-member cluster under a write rate; checks every watch
    /// guarantee on every watcher (`keel_benches::watch_scale`).
    Scale(keel_benches::watch_scale::ScaleArgs),
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    match Args::parse().cmd {
        Cmd::Memory {
            endpoint,
            pid,
            watchers,
            streams,
            connections,
        } => rt.block_on(memory(&endpoint, pid, watchers, streams, connections)),
        Cmd::Throughput {
            endpoint,
            pid,
            writers,
            value_bytes,
            keys,
            seconds,
            rounds,
        } => rt.block_on(throughput(
            &endpoint,
            pid,
            writers,
            value_bytes,
            keys,
            seconds,
            rounds,
        )),
        Cmd::Scale(args) => {
            if rt.block_on(keel_benches::watch_scale::run(args)) > 0 {
                std::process::exit(1);
            }
        }
    }
}

async fn connect(endpoint: &str) -> Channel {
    Endpoint::from_shared(format!("http://{endpoint}"))
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(3))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect {endpoint}: {e}"))
}

/// Resident set size of `pid` in bytes.
fn rss(pid: u32) -> u64 {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/<pid>/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS")
        * 1024
}

/// CPU time (user + system) the process `pid` used so far, in seconds (`/proc/<pid>/stat`).
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc/<pid>/stat");
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 =
        fields[11].parse::<f64>().expect("utime") + fields[12].parse::<f64>().expect("stime");
    ticks / USER_HZ
}

/// Clock ticks per second in `/proc/<pid>/stat` (Linux's `USER_HZ`, 100 on every
/// mainstream configuration).
const USER_HZ: f64 = 100.0;

/// RSS after the member had time to settle.
async fn settled_rss(pid: u32) -> u64 {
    tokio::time::sleep(Duration::from_secs(2)).await;
    rss(pid)
}

fn create(key: String) -> WatchRequest {
    WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: key.into_bytes(),
            ..Default::default()
        })),
    }
}

/// Opens a stream on `channel`, sends `requests` and keeps the request side open.
async fn open_stream(channel: Channel, requests: Vec<WatchRequest>) -> Streaming<WatchResponse> {
    let outbound = tokio_stream::iter(requests).chain(tokio_stream::pending());
    WatchClient::new(channel)
        .watch(outbound)
        .await
        .expect("watch")
        .into_inner()
}

/// Waits for `n` created responses on `stream`.
async fn await_created(stream: &mut Streaming<WatchResponse>, n: usize) {
    let mut created = 0;
    while created < n {
        let r = tokio::time::timeout(Duration::from_secs(60), stream.message())
            .await
            .expect("created responses in time")
            .expect("stream")
            .expect("stream open");
        created += usize::from(r.created);
    }
}

/// A stream whose request side stays open for more creates.
struct Conn {
    tx: tokio::sync::mpsc::Sender<WatchRequest>,
    rx: Streaming<WatchResponse>,
}

async fn open_conn(channel: Channel) -> Conn {
    let (tx, requests) = tokio::sync::mpsc::channel(1024);
    let rx = WatchClient::new(channel)
        .watch(tokio_stream::wrappers::ReceiverStream::new(requests))
        .await
        .expect("watch")
        .into_inner();
    Conn { tx, rx }
}

async fn memory(endpoint: &str, pid: u32, watchers: usize, streams: usize, connections: usize) {
    let streams = streams.max(1);
    let mut channels = Vec::new();
    for _ in 0..connections.max(1) {
        channels.push(connect(endpoint).await);
    }
    let base = settled_rss(pid).await;

    // Phase 1: the streams, one watcher each.
    let mut tasks = Vec::with_capacity(streams);
    for s in 0..streams {
        let ch = channels[s % channels.len()].clone();
        tasks.push(tokio::spawn(async move {
            let mut c = open_conn(ch).await;
            c.tx.send(create(format!("/bench/{s:06}/{:06}", 0)))
                .await
                .expect("send");
            await_created(&mut c.rx, 1).await;
            c
        }));
    }
    let mut conns = Vec::with_capacity(streams);
    for t in tasks {
        conns.push(t.await.expect("stream task"));
    }
    let after_streams = settled_rss(pid).await;

    // Phase 2: the other watchers on the same streams, each on its own key.
    let extra = watchers.saturating_sub(streams);
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(streams);
    for (s, mut c) in conns.into_iter().enumerate() {
        let n = extra / streams + usize::from(s < extra % streams);
        tasks.push(tokio::spawn(async move {
            for i in 1..=n {
                c.tx.send(create(format!("/bench/{s:06}/{i:06}")))
                    .await
                    .expect("send");
            }
            await_created(&mut c.rx, n).await;
            c
        }));
    }
    let mut live = Vec::with_capacity(streams);
    for t in tasks {
        live.push(t.await.expect("watcher task"));
    }
    let create_secs = started.elapsed().as_secs_f64();
    let after_watchers = settled_rss(pid).await;

    let per_stream = after_streams.saturating_sub(base) as f64 / streams as f64;
    let per_watcher = after_watchers.saturating_sub(after_streams) as f64 / extra.max(1) as f64;
    println!(
        "watch memory: {watchers} watchers on {streams} streams over {connections} connections"
    );
    println!(
        "  member RSS: base {:.1} MiB, after the streams {:.1} MiB, after all watchers {:.1} MiB",
        mib(base),
        mib(after_streams),
        mib(after_watchers)
    );
    println!(
        "  per stream (with its first watcher): {:.1} KiB",
        per_stream / 1024.0
    );
    println!("  per watcher: {per_watcher:.0} bytes");
    println!(
        "  created {extra} watchers in {create_secs:.2} s ({:.0}/s)",
        extra as f64 / create_secs
    );
    drop(live);
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

/// Puts/s and puts done by `writers` writers for `seconds`.
async fn write_for(
    writers: &[KvClient<Channel>],
    value: &Arc<Vec<u8>>,
    keys: usize,
    seconds: u64,
) -> (f64, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    let stride = writers.len();
    for (w, client) in writers.iter().enumerate() {
        let (mut client, stop, done, value) =
            (client.clone(), stop.clone(), done.clone(), value.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = w;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("/tp/{:06}", i % keys).into_bytes();
                client
                    .put(PutRequest {
                        key,
                        value: value.to_vec(),
                        ..Default::default()
                    })
                    .await
                    .expect("put");
                done.fetch_add(1, Ordering::Relaxed);
                i += stride;
            }
        }));
    }
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("writer");
    }
    let n = done.load(Ordering::Relaxed);
    (n as f64 / started.elapsed().as_secs_f64(), n)
}

async fn throughput(
    endpoint: &str,
    pid: u32,
    writers: usize,
    value_bytes: usize,
    keys: usize,
    seconds: u64,
    rounds: usize,
) {
    let mut clients = Vec::new();
    for _ in 0..writers {
        clients.push(KvClient::new(connect(endpoint).await));
    }
    let value = Arc::new(vec![b'v'; value_bytes]);
    // Warm-up: every key exists, caches are hot.
    write_for(&clients, &value, keys, 2).await;
    let rss_start = rss(pid);
    let (mut alone, mut stalled) = (Vec::new(), Vec::new());
    // RSS growth and puts per phase kind, to tell the stalled watcher's memory apart from
    // the store's own growth (every put adds a revision).
    let (mut grow_alone, mut puts_alone, mut grow_stalled, mut puts_stalled) =
        (0i64, 0u64, 0i64, 0u64);
    // Member CPU seconds per phase kind: robust to other load on a shared machine.
    let (mut cpu_alone, mut cpu_stalled) = (0f64, 0f64);
    let mut rss_max = rss_start;
    for round in 0..rounds {
        // ABBA order: a load drift on the shared machine hits both kinds alike.
        for stalled_first in [round % 2 == 1, round % 2 == 0] {
            if !stalled_first {
                let (before, cpu) = (rss(pid) as i64, cpu_secs(pid));
                let (a, n) = write_for(&clients, &value, keys, seconds).await;
                cpu_alone += cpu_secs(pid) - cpu;
                grow_alone += rss(pid) as i64 - before;
                puts_alone += n;
                alone.push(a);
                continue;
            }
            // A watcher on every written key, on its own connection, that never reads.
            let mut stream = open_stream(
                connect(endpoint).await,
                vec![WatchRequest {
                    request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                        key: b"/tp/".to_vec(),
                        range_end: b"/tp0".to_vec(),
                        ..Default::default()
                    })),
                }],
            )
            .await;
            await_created(&mut stream, 1).await;
            // Until the client's HTTP/2 windows (2 MiB per stream with tonic's defaults) are
            // full, the member still sends to this watcher like to any other; measure the
            // stalled state that follows.
            write_for(&clients, &value, keys, 2).await;
            let (before, cpu) = (rss(pid) as i64, cpu_secs(pid));
            let (s, n) = write_for(&clients, &value, keys, seconds).await;
            cpu_stalled += cpu_secs(pid) - cpu;
            let after = rss(pid);
            grow_stalled += after as i64 - before;
            puts_stalled += n;
            rss_max = rss_max.max(after);
            stalled.push(s);
            drop(stream);
        }
        println!(
            "round {}: alone {:.0} puts/s, with a stalled watcher {:.0} puts/s, member RSS {:.1} MiB",
            round + 1,
            alone[round],
            stalled[round],
            mib(rss(pid))
        );
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let (a, s) = (mean(&alone), mean(&stalled));
    let per_k = |g: i64, n: u64| g as f64 / 1024.0 / (n.max(1) as f64 / 1000.0);
    println!(
        "writer throughput ({writers} writers, {value_bytes} B values, {keys} keys, {seconds} s x {rounds}):"
    );
    println!("  alone:                  {a:.0} puts/s");
    let mut ratios: Vec<f64> = alone.iter().zip(&stalled).map(|(a, s)| s / a).collect();
    ratios.sort_by(f64::total_cmp);
    let median = ratios[ratios.len() / 2];
    println!(
        "  with a stalled watcher: {s:.0} puts/s ({:+.1}% of the means, median round {:+.1}%)",
        (s / a - 1.0) * 100.0,
        (median - 1.0) * 100.0
    );
    println!(
        "  member RSS: {:.1} MiB at start, at most {:.1} MiB",
        mib(rss_start),
        mib(rss_max)
    );
    println!(
        "  member CPU per put: {:.1} µs alone, {:.1} µs with the stalled watcher",
        cpu_alone * 1e6 / puts_alone.max(1) as f64,
        cpu_stalled * 1e6 / puts_stalled.max(1) as f64
    );
    println!(
        "  RSS growth per 1000 puts: {:.0} KiB alone, {:.0} KiB with the stalled watcher",
        per_k(grow_alone, puts_alone),
        per_k(grow_stalled, puts_stalled)
    );
}
