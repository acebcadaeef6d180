//! `watch-bench scale`: many watchers on a 3-member cluster under a steady write rate, with
//! every watch guarantee checked on every watcher (issue 18 part 6, docs/watch.md).
//!
//! Starts 3 members of the given `keel` binary, opens `streams` watch streams spread over the
//! members (followers included), each with `watchers` watchers: every `prefix_every`-th one
//! watches a prefix of `keys_per_group` keys, the others one key; every `history_every`-th
//! starts `history_back` revisions in the past (a catch-up from the ring or the store). Then
//! writers put random keys at `rate` puts/s for `seconds`, each stream sends a
//! `WatchProgressRequest` every `progress_ms`. At the end every watcher must have received
//! exactly the acknowledged puts of its keys from its start revision on, in revision order,
//! without gap or duplicate; and at every progress answer of revision R a watcher must
//! already have every event at or below R, and R never goes backwards on a stream.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use keel_proto::etcdserverpb::watch_client::WatchClient;
use keel_proto::etcdserverpb::watch_request::RequestUnion;
use keel_proto::etcdserverpb::{
    PutRequest, WatchCreateRequest, WatchProgressRequest, WatchRequest,
};
use keel_testkit::{Cluster, MemberSpec, grpc};
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;

/// What the scale run does (module docs); the `watch-bench scale` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ScaleArgs {
    /// The keel binary (default: `$KEEL_BIN`, else `keel` next to this executable).
    #[arg(long)]
    pub keel: Option<PathBuf>,
    /// Parent of the members' data dirs (default: the system temp dir).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Watch streams (spread over the 3 members).
    #[arg(long, default_value_t = 100)]
    pub streams: usize,
    /// Watchers per stream.
    #[arg(long, default_value_t = 100)]
    pub watchers: usize,
    /// Key groups; a prefix watcher watches one group.
    #[arg(long, default_value_t = 100)]
    pub groups: usize,
    /// Keys per group.
    #[arg(long, default_value_t = 100)]
    pub keys_per_group: usize,
    /// Every n-th watcher watches a prefix (a group).
    #[arg(long, default_value_t = 10)]
    pub prefix_every: usize,
    /// Every n-th watcher starts `--history-back` revisions in the past.
    #[arg(long, default_value_t = 4)]
    pub history_every: usize,
    /// How far back such a watcher starts (revisions).
    #[arg(long, default_value_t = 50)]
    pub history_back: i64,
    /// Target puts per second.
    #[arg(long, default_value_t = 5000)]
    pub rate: u64,
    /// Concurrent writers.
    #[arg(long, default_value_t = 64)]
    pub writers: usize,
    /// Seconds of writes.
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
    /// Period of each stream's progress requests (ms).
    #[arg(long, default_value_t = 1000)]
    pub progress_ms: u64,
}

/// One watcher as the checker sees it.
struct Watched {
    /// Key (single) or prefix.
    key: String,
    prefix: bool,
    start: i64,
}

/// What one stream's reader recorded.
#[derive(Default)]
struct StreamLog {
    /// Per watcher: the revisions received, in arrival order.
    received: Vec<Vec<i64>>,
    /// Progress answers: revision and each watcher's received count at that moment.
    progress: Vec<(i64, Vec<u32>)>,
    /// `(revision, arrival)` of every event, for latencies.
    arrivals: Vec<(i64, Instant)>,
    /// Violations seen while reading (progress going backwards, a progress answer below an
    /// event already received).
    violations: Vec<String>,
}

fn key_name(group: usize, k: usize) -> String {
    format!("/ws/{group:03}/{k:04}")
}

/// Resident set size of `pid` in KiB (0 if unreadable).
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// `keel_watch_ring_reads_total{result}` of a member: (hits, misses).
fn ring_reads(endpoint: &str) -> (u64, u64) {
    let Ok(mut conn) = std::net::TcpStream::connect(endpoint) else {
        return (0, 0);
    };
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let req = format!("GET /metrics HTTP/1.1\r\nHost: {endpoint}\r\nConnection: close\r\n\r\n");
    if conn.write_all(req.as_bytes()).is_err() {
        return (0, 0);
    }
    let mut body = String::new();
    let _ = conn.read_to_string(&mut body);
    let value = |label: &str| {
        body.lines()
            .find(|l| {
                l.starts_with(&format!(
                    "keel_watch_ring_reads_total{{result=\"{label}\"}}"
                ))
            })
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(0, |v| v as u64)
    };
    (value("hit"), value("miss"))
}

fn create(w: &Watched, watch_id: i64) -> WatchRequest {
    let range_end = if w.prefix {
        let mut end = w.key.clone().into_bytes();
        *end.last_mut().expect("non-empty") += 1;
        end
    } else {
        Vec::new()
    };
    WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: w.key.clone().into_bytes(),
            range_end,
            start_revision: w.start,
            watch_id,
            ..Default::default()
        })),
    }
}

fn progress_request() -> WatchRequest {
    WatchRequest {
        request_union: Some(RequestUnion::ProgressRequest(WatchProgressRequest {})),
    }
}

/// Runs the scale benchmark and prints its report; returns the number of violations.
pub async fn run(args: ScaleArgs) -> usize {
    let keel = args
        .keel
        .clone()
        .unwrap_or_else(|| keel_testkit::find_keel(None));
    let dir = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let cluster = Cluster::start_with(&keel, 3, MemberSpec::new().log_level("warn"), Some(&dir));
    let leader = cluster.leader_async(Duration::from_secs(30)).await;
    let endpoints: Vec<String> = cluster.members.iter().map(|m| m.endpoint()).collect();
    let pids: Vec<u32> = cluster.members.iter().filter_map(|m| m.pid()).collect();
    let rss_before: Vec<u64> = pids.iter().map(|&p| rss_kib(p)).collect();
    let nkeys = args.groups * args.keys_per_group;

    // Warm-up puts so that history watchers have a past to start in.
    let mut kv = grpc::kv(&endpoints[leader]).await;
    let sent: Arc<Mutex<HashMap<i64, (String, Instant)>>> = Arc::default();
    let mut base = 0;
    for i in 0..(args.history_back as usize + 10) {
        let key = key_name(i % args.groups, i % args.keys_per_group);
        let at = Instant::now();
        let resp = kv
            .put(PutRequest {
                key: key.clone().into_bytes(),
                value: b"w".to_vec(),
                ..Default::default()
            })
            .await
            .expect("warm-up put")
            .into_inner();
        base = resp.header.map_or(0, |h| h.revision);
        sent.lock().unwrap().insert(base, (key, at));
    }

    // Watchers.
    let mut plan: Vec<Vec<Watched>> = Vec::new();
    let mut n = 0usize;
    for _ in 0..args.streams {
        let mut ws = Vec::new();
        for _ in 0..args.watchers {
            let group = n % args.groups;
            let prefix = args.prefix_every > 0 && n.is_multiple_of(args.prefix_every);
            let key = if prefix {
                format!("/ws/{group:03}/")
            } else {
                key_name(group, (n / args.groups) % args.keys_per_group)
            };
            let history = args.history_every > 0 && n % args.history_every == 1;
            let start = if history {
                base + 1 - args.history_back
            } else {
                base + 1
            };
            ws.push(Watched { key, prefix, start });
            n += 1;
        }
        plan.push(ws);
    }
    let plan = Arc::new(plan);
    let stop_progress = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let final_rev = Arc::new(std::sync::atomic::AtomicI64::new(i64::MAX));
    let mut readers = Vec::new();
    let mut senders = Vec::new();
    let setup = Instant::now();
    for s in 0..args.streams {
        let endpoint = endpoints[s % endpoints.len()].clone();
        let (tx, rx) = mpsc::channel::<WatchRequest>(args.watchers + 16);
        let mut client = WatchClient::new(grpc::stream_channel(&endpoint).await);
        let mut stream = client
            .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .expect("watch")
            .into_inner();
        for (i, w) in plan[s].iter().enumerate() {
            tx.send(create(w, i as i64 + 1)).await.expect("create");
        }
        let (plan, final_rev) = (plan.clone(), final_rev.clone());
        let watchers = args.watchers;
        let seconds = args.seconds;
        readers.push(tokio::spawn(async move {
            let mut log = StreamLog {
                received: vec![Vec::new(); watchers],
                ..Default::default()
            };
            let mut last_progress = 0i64;
            let mut max_event = 0i64;
            let _ = &plan;
            // Done once a progress answer covers the last write: it comes after every event
            // at or below it (checked below), so nothing of this stream is still due.
            let deadline = Instant::now() + Duration::from_secs(seconds + 180);
            loop {
                let fin = final_rev.load(std::sync::atomic::Ordering::Relaxed);
                if last_progress >= fin {
                    break;
                }
                if Instant::now() > deadline {
                    log.violations
                        .push(format!("stream {s}: no progress answer at {fin} in time"));
                    break;
                }
                let next = tokio::time::timeout(Duration::from_millis(500), stream.next()).await;
                let resp = match next {
                    Ok(Some(Ok(r))) => r,
                    Ok(Some(Err(e))) => {
                        log.violations.push(format!("stream {s}: error {e}"));
                        break;
                    }
                    Ok(None) => break,
                    Err(_) => continue,
                };
                let now = Instant::now();
                let rev = resp.header.as_ref().map_or(0, |h| h.revision);
                if resp.created {
                    continue;
                }
                if resp.canceled {
                    log.violations
                        .push(format!("stream {s}: watcher {} canceled", resp.watch_id));
                    continue;
                }
                if resp.watch_id == -1 && resp.events.is_empty() {
                    if rev < last_progress {
                        log.violations
                            .push(format!("stream {s}: progress {rev} after {last_progress}"));
                    }
                    if rev < max_event {
                        log.violations.push(format!(
                            "stream {s}: progress {rev} below event {max_event}"
                        ));
                    }
                    last_progress = rev;
                    let counts = log.received.iter().map(|r| r.len() as u32).collect();
                    log.progress.push((rev, counts));
                    continue;
                }
                let idx = (resp.watch_id - 1) as usize;
                for ev in &resp.events {
                    let r = ev.kv.as_ref().map_or(0, |kv| kv.mod_revision);
                    max_event = max_event.max(r);
                    if let Some(v) = log.received.get_mut(idx) {
                        v.push(r);
                    }
                    log.arrivals.push((r, now));
                }
            }
            log
        }));
        senders.push(tx);
    }
    let setup_s = setup.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_watching: Vec<u64> = pids.iter().map(|&p| rss_kib(p)).collect();

    // Progress requests.
    let progress_task = {
        let (senders, stop) = (senders.clone(), stop_progress.clone());
        let period = Duration::from_millis(args.progress_ms.max(10));
        tokio::spawn(async move {
            let mut sent = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                tokio::time::sleep(period).await;
                for tx in &senders {
                    let _ = tx.try_send(progress_request());
                    sent += 1;
                }
            }
            sent
        })
    };

    // Writers at the target rate.
    let started = Instant::now();
    let interval = Duration::from_secs_f64(args.writers as f64 / args.rate.max(1) as f64);
    let mut tasks = Vec::new();
    for w in 0..args.writers {
        let endpoint = endpoints[leader].clone();
        let sent = sent.clone();
        let (seconds, writers, per_group) = (args.seconds, args.writers, args.keys_per_group);
        tasks.push(tokio::spawn(async move {
            let mut kv = grpc::kv(&endpoint).await;
            // Writer w's n-th put is due at (n * writers + w) / rate.
            let mut next = started + interval.mul_f64(w as f64 / writers as f64);
            let mut done = 0u64;
            let mut rng = rand::rngs::StdRng::seed_from_u64(w as u64);
            while started.elapsed() < Duration::from_secs(seconds) {
                let now = Instant::now();
                if next > now {
                    tokio::time::sleep(next - now).await;
                }
                next += interval;
                let k: usize = rng.gen_range(0..nkeys);
                let key = key_name(k / per_group, k % per_group);
                let at = Instant::now();
                let resp = kv
                    .put(PutRequest {
                        key: key.clone().into_bytes(),
                        value: vec![b'v'; 64],
                        ..Default::default()
                    })
                    .await
                    .expect("put")
                    .into_inner();
                let rev = resp.header.map_or(0, |h| h.revision);
                sent.lock().unwrap().insert(rev, (key, at));
                done += 1;
            }
            done
        }));
    }
    let mut puts = 0u64;
    for t in tasks {
        puts += t.await.expect("writer");
    }
    let write_secs = started.elapsed().as_secs_f64();
    let last = sent.lock().unwrap().keys().copied().max().unwrap_or(0);
    final_rev.store(last, std::sync::atomic::Ordering::Relaxed);
    // Readers end once a progress answer covers the last write.
    let drained = Instant::now();
    let mut logs = Vec::new();
    for r in readers {
        logs.push(r.await.expect("reader"));
    }
    let drain_s = drained.elapsed().as_secs_f64();
    stop_progress.store(true, std::sync::atomic::Ordering::Relaxed);
    let progress_sent = progress_task.await.expect("progress");
    drop(senders);
    let rss_after: Vec<u64> = pids.iter().map(|&p| rss_kib(p)).collect();
    let ring: Vec<(u64, u64)> = endpoints.iter().map(|e| ring_reads(e)).collect();

    // Check.
    let sent = sent.lock().unwrap();
    let mut by_key: HashMap<&str, Vec<i64>> = HashMap::new();
    for (rev, (key, _)) in sent.iter() {
        by_key.entry(key.as_str()).or_default().push(*rev);
    }
    for revs in by_key.values_mut() {
        revs.sort_unstable();
    }
    let mut violations: Vec<String> = Vec::new();
    let mut delivered = 0u64;
    let mut progress_checked = 0u64;
    for (s, log) in logs.iter().enumerate() {
        violations.extend(log.violations.iter().cloned());
        for (i, w) in plan[s].iter().enumerate() {
            let mut expected: Vec<i64> = by_key
                .iter()
                .filter(|(k, _)| {
                    if w.prefix {
                        k.starts_with(&w.key)
                    } else {
                        **k == w.key
                    }
                })
                .flat_map(|(_, revs)| revs.iter().copied().filter(|&r| r >= w.start))
                .collect();
            expected.sort_unstable();
            let got = &log.received[i];
            delivered += got.len() as u64;
            if *got != expected {
                let first_diff = got.iter().zip(&expected).position(|(a, b)| a != b);
                violations.push(format!(
                    "stream {s} watcher {i} ({}{}): got {} events, expected {}, first difference at {first_diff:?}",
                    w.key,
                    if w.prefix { "*" } else { "" },
                    got.len(),
                    expected.len()
                ));
                continue;
            }
            for (rev, counts) in &log.progress {
                let due = expected.partition_point(|&r| r <= *rev) as u32;
                progress_checked += 1;
                if counts[i] < due {
                    violations.push(format!(
                        "stream {s} watcher {i}: progress {rev} with {} of {due} events",
                        counts[i]
                    ));
                }
            }
        }
    }
    let mut latency = Histogram::<u64>::new(3).expect("histogram");
    for log in &logs {
        for (rev, at) in &log.arrivals {
            if let Some((_, sent_at)) = sent.get(rev) {
                let us = at.saturating_duration_since(*sent_at).as_micros() as u64;
                let _ = latency.record(us.max(1));
            }
        }
    }
    let (hits, misses) = ring.iter().fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    println!(
        "watch-bench scale: 3 members, {} streams x {} watchers = {} watchers (every {}th a prefix of {} keys, every {}th starting {} revisions back), {} keys",
        args.streams,
        args.watchers,
        args.streams * args.watchers,
        args.prefix_every,
        args.keys_per_group,
        args.history_every,
        args.history_back,
        nkeys
    );
    println!("setup: watchers created in {setup_s:.1} s");
    println!(
        "writes: {puts} puts in {write_secs:.1} s = {:.0}/s (target {}/s, {} writers, to the leader)",
        puts as f64 / write_secs,
        args.rate,
        args.writers
    );
    println!(
        "progress requests sent: {progress_sent}; progress answers checked against watchers: {progress_checked}"
    );
    println!("events delivered: {delivered}; drain after the last write: {drain_s:.1} s");
    println!(
        "delivery latency (put sent -> event received): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        latency.value_at_quantile(0.5) as f64 / 1000.0,
        latency.value_at_quantile(0.99) as f64 / 1000.0,
        latency.max() as f64 / 1000.0
    );
    for (i, p) in pids.iter().enumerate() {
        println!(
            "member {i} (pid {p}{}): RSS {} MiB before, {} MiB with watchers, {} MiB after; ring reads {} hit / {} miss",
            if i == leader { ", leader" } else { "" },
            rss_before[i] / 1024,
            rss_watching[i] / 1024,
            rss_after[i] / 1024,
            ring[i].0,
            ring[i].1
        );
    }
    println!(
        "ring hit rate: {:.1}% ({hits} of {} catch-up reads)",
        if hits + misses > 0 {
            100.0 * hits as f64 / (hits + misses) as f64
        } else {
            0.0
        },
        hits + misses
    );
    println!("violations: {}", violations.len());
    for v in violations.iter().take(20) {
        println!("  {v}");
    }
    drop(cluster);
    violations.len()
}
