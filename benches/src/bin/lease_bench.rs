//! Lease benchmarks against a real 3-member `keel` cluster on 127.0.0.1. Not part of
//! `cargo test`; run in release and copy the figures into docs/benchmarks.md and
//! docs/lease.md:
//!
//! ```sh
//! cargo build --release -p keel-server --bin keel -p keel-benches --bin lease-bench
//! target/release/lease-bench                       # all phases, default sizes
//! target/release/lease-bench --phases storm --storm 100000
//! ```
//!
//! Phases:
//! - `grant`: LeaseGrant then LeaseRevoke of `--grants` leases with `--clients` concurrent
//!   requests on the leader: grants/s, revokes/s.
//! - `keepalive`: `--keepalive-streams` LeaseKeepAlive streams renewing
//!   `--keepalive-leases` leases for `--seconds`, on the leader and on a follower (which
//!   forwards to the leader): keepalives/s.
//! - `churn`: `--churn-rounds` rounds of `--churn` grant/expire cycles (minimum TTL, no
//!   keys); follower and leader RSS before and after each round, follower peak.
//! - `storm`: `--storm` leases with one key each (attached 100 per txn), all due at once:
//!   the leader is killed, so the new leader schedules every lease at the same instant
//!   (TTL plus the election extension; the TTL is below the checkpoint interval, so no lease
//!   carries a checkpoint); expiry throughput = leases / (last key gone - first key gone).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use keel_proto::etcdserverpb::kv_client::KvClient;
use keel_proto::etcdserverpb::lease_client::LeaseClient;
use keel_proto::etcdserverpb::{
    LeaseGrantRequest, LeaseKeepAliveRequest, LeaseLeasesRequest, LeaseRevokeRequest, PutRequest,
    RangeRequest, RequestOp, TxnRequest, request_op,
};
use keel_testkit::process::rss_kib;
use keel_testkit::{Cluster, MemberSpec, grpc};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

#[derive(Parser)]
#[command(about = "Keel lease benchmarks on a local 3-member cluster")]
struct Args {
    /// The keel binary (default: `$KEEL_BIN`, else `keel` next to this executable).
    #[arg(long)]
    keel: Option<PathBuf>,
    /// Comma-separated phases: grant, keepalive, churn, storm.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "grant,keepalive,churn,storm"
    )]
    phases: Vec<String>,
    /// Concurrent unary requests.
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// Leases granted and revoked in the `grant` phase.
    #[arg(long, default_value_t = 20_000)]
    grants: usize,
    /// Leases renewed in the `keepalive` phase.
    #[arg(long, default_value_t = 1000)]
    keepalive_leases: usize,
    /// Keepalive streams in the `keepalive` phase.
    #[arg(long, default_value_t = 16)]
    keepalive_streams: usize,
    /// Duration of each keepalive measurement (s).
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Grant/expire cycles per round in the `churn` phase.
    #[arg(long, default_value_t = 100_000)]
    churn: usize,
    /// Rounds of the `churn` phase: RSS is reported after each, so growth per round shows.
    #[arg(long, default_value_t = 2)]
    churn_rounds: usize,
    /// Leases due at once in the `storm` phase.
    #[arg(long, default_value_t = 100_000)]
    storm: usize,
    /// TTL of the storm's leases (s); must outlast granting them and attaching their keys.
    #[arg(long, default_value_t = 150)]
    storm_ttl: i64,
    /// Extra flag for every member (repeat), e.g. `--member-flag=--lease-revoke-rate=1000`.
    #[arg(long, allow_hyphen_values = true)]
    member_flag: Vec<String>,
    /// Parent of the members' data dirs (default: the current directory).
    #[arg(long)]
    dir: Option<PathBuf>,
}

fn main() {
    let args = Args::parse();
    let keel = args
        .keel
        .clone()
        .unwrap_or_else(|| keel_testkit::find_keel(None));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run(args, keel));
}

async fn run(args: Args, keel: PathBuf) {
    let parent = args.dir.clone().unwrap_or_else(|| PathBuf::from("."));
    let members = MemberSpec::new().log_level("warn").args(&args.member_flag);
    let mut cluster = Cluster::start_with(&keel, 3, members, Some(&parent));
    let leader = cluster.leader_async(Duration::from_secs(30)).await;
    let follower = (0..3).find(|&i| i != leader).unwrap();
    let lep = cluster.members[leader].endpoint();
    let fep = cluster.members[follower].endpoint();
    println!(
        "cluster: leader {} ({lep}), follower {} ({fep})",
        cluster.members[leader].name(),
        cluster.members[follower].name()
    );
    for phase in &args.phases {
        match phase.as_str() {
            "grant" => grant_revoke(&lep, args.clients, args.grants).await,
            "keepalive" => {
                keepalive(
                    &lep,
                    "leader",
                    args.keepalive_leases,
                    args.keepalive_streams,
                    args.seconds,
                )
                .await;
                keepalive(
                    &fep,
                    "follower",
                    args.keepalive_leases,
                    args.keepalive_streams,
                    args.seconds,
                )
                .await;
            }
            "churn" => {
                churn(
                    &cluster,
                    leader,
                    follower,
                    args.clients,
                    args.churn,
                    args.churn_rounds,
                )
                .await
            }
            "storm" => {
                storm(
                    &mut cluster,
                    leader,
                    args.clients,
                    args.storm,
                    args.storm_ttl,
                )
                .await
            }
            other => eprintln!("unknown phase {other}"),
        }
    }
}

/// A channel to `endpoint` with a 30 s per-RPC deadline (a storm's requests queue long).
async fn channel(endpoint: &str) -> Result<Channel, String> {
    grpc::channel(endpoint, Duration::from_secs(30)).await
}

async fn lease_client(endpoint: &str) -> LeaseClient<Channel> {
    LeaseClient::new(channel(endpoint).await.expect("connect"))
}

/// Runs `total` operations with `clients` concurrent tasks; `op(i)` performs operation `i`.
/// Returns the elapsed time.
async fn concurrently<F, Fut>(clients: usize, total: usize, op: F) -> Duration
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let op = Arc::new(op);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (next, op) = (next.clone(), op.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    break;
                }
                op(i).await;
            }
        }));
    }
    for t in tasks {
        t.await.expect("client task");
    }
    start.elapsed()
}

async fn grant_revoke(endpoint: &str, clients: usize, n: usize) {
    let lease = lease_client(endpoint).await;
    let ids = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let (l, out) = (lease.clone(), ids.clone());
    let took = concurrently(clients, n, move |_| {
        let (mut l, out) = (l.clone(), out.clone());
        async move {
            let g = l
                .lease_grant(LeaseGrantRequest { ttl: 600, id: 0 })
                .await
                .expect("grant")
                .into_inner();
            out.lock().unwrap().push(g.id);
        }
    })
    .await;
    println!(
        "grant: {n} LeaseGrant, {clients} clients: {:.0} grants/s",
        n as f64 / took.as_secs_f64()
    );
    let ids = Arc::new(std::mem::take(&mut *ids.lock().unwrap()));
    let list = ids.clone();
    let took = concurrently(clients, n, move |i| {
        let (mut l, id) = (lease.clone(), list[i]);
        async move {
            l.lease_revoke(LeaseRevokeRequest { id })
                .await
                .expect("revoke");
        }
    })
    .await;
    println!(
        "revoke: {n} LeaseRevoke, {clients} clients: {:.0} revokes/s",
        n as f64 / took.as_secs_f64()
    );
}

/// Grants `n` leases with `ttl` seconds; returns their IDs. A failed grant (e.g. a timeout
/// on an overloaded box) is counted and reported, not retried.
async fn grant_many(endpoint: &str, clients: usize, n: usize, ttl: i64) -> Vec<i64> {
    let lease = lease_client(endpoint).await;
    let ids = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let failed = Arc::new(AtomicUsize::new(0));
    let (out, errors) = (ids.clone(), failed.clone());
    concurrently(clients, n, move |_| {
        let (mut l, out, errors) = (lease.clone(), out.clone(), errors.clone());
        async move {
            match l.lease_grant(LeaseGrantRequest { ttl, id: 0 }).await {
                Ok(g) => out.lock().unwrap().push(g.into_inner().id),
                Err(e) => {
                    if errors.fetch_add(1, Ordering::Relaxed) == 0 {
                        eprintln!("grant failed: {e}");
                    }
                }
            }
        }
    })
    .await;
    let failed = failed.load(Ordering::Relaxed);
    if failed > 0 {
        eprintln!("{failed} of {n} grants failed");
    }
    std::mem::take(&mut *ids.lock().unwrap())
}

async fn keepalive(endpoint: &str, role: &str, leases: usize, streams: usize, seconds: u64) {
    let ids = Arc::new(grant_many(endpoint, 64, leases, 600).await);
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for s in 0..streams {
        let (ids, done, endpoint) = (ids.clone(), done.clone(), endpoint.to_string());
        tasks.push(tokio::spawn(async move {
            let mut client = lease_client(&endpoint).await;
            let (tx, rx) = mpsc::channel(256);
            let mut responses = client
                .lease_keep_alive(ReceiverStream::new(rx))
                .await
                .expect("keepalive stream")
                .into_inner();
            let sender = tokio::spawn(async move {
                let mut i = s;
                while Instant::now() < deadline {
                    if tx
                        .send(LeaseKeepAliveRequest {
                            id: ids[i % ids.len()],
                        })
                        .await
                        .is_err()
                    {
                        break;
                    }
                    i += streams;
                }
            });
            while Instant::now() < deadline {
                match tokio::time::timeout_at(deadline.into(), responses.message()).await {
                    Ok(Ok(Some(r))) => {
                        assert!(
                            r.ttl > 0,
                            "keepalive of a live lease answered TTL {}",
                            r.ttl
                        );
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(other) => panic!("keepalive stream ended: {other:?}"),
                    Err(_) => break,
                }
            }
            sender.abort();
        }));
    }
    for t in tasks {
        t.await.expect("stream task");
    }
    let n = done.load(Ordering::Relaxed);
    println!(
        "keepalive via {role}: {streams} streams over {leases} leases for {seconds} s: {:.0} keepalives/s",
        n as f64 / seconds as f64
    );
    let mut l = lease_client(endpoint).await;
    for &id in ids.iter() {
        let _ = l.lease_revoke(LeaseRevokeRequest { id }).await;
    }
}

async fn lease_count(endpoint: &str) -> Option<usize> {
    let mut l = LeaseClient::new(channel(endpoint).await.ok()?);
    Some(
        l.lease_leases(LeaseLeasesRequest {})
            .await
            .ok()?
            .into_inner()
            .leases
            .len(),
    )
}

async fn churn(
    cluster: &Cluster,
    leader: usize,
    follower: usize,
    clients: usize,
    n: usize,
    rounds: usize,
) {
    let (lep, fep) = (
        cluster.members[leader].endpoint(),
        cluster.members[follower].endpoint(),
    );
    let f_pid = cluster.members[follower].pid().expect("follower runs");
    let l_pid = cluster.members[leader].pid().expect("leader runs");
    // KiB, 0 once the process is gone.
    let rss = |pid| rss_kib(pid).unwrap_or(0);
    let mib = |pid| rss(pid) / 1024;
    let peak = Arc::new(AtomicU64::new(rss(f_pid)));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (peak, sampling) = (peak.clone(), sampling.clone());
        tokio::spawn(async move {
            while sampling.load(Ordering::Relaxed) {
                peak.fetch_max(rss(f_pid), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    println!(
        "churn: before: follower RSS {} MiB, leader RSS {} MiB",
        mib(f_pid),
        mib(l_pid)
    );
    for round in 1..=rounds {
        let start = Instant::now();
        // Minimum TTL (the server raises 1 s to etcd's minimum, 2 s by default), no keys.
        let granted = grant_many(&lep, clients, n, 1).await.len();
        let grant_secs = start.elapsed().as_secs_f64();
        let end = Instant::now() + Duration::from_secs(300);
        while Instant::now() < end {
            if lease_count(&fep).await == Some(0) && lease_count(&lep).await == Some(0) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let cycle_secs = start.elapsed().as_secs_f64();
        tokio::time::sleep(Duration::from_secs(3)).await;
        println!(
            "churn: after round {round} ({granted} grant/expire cycles, {:.0} grants/s, all expired after {cycle_secs:.1} s): follower RSS {} MiB (peak so far {} MiB), leader RSS {} MiB",
            granted as f64 / grant_secs,
            mib(f_pid),
            peak.load(Ordering::Relaxed) / 1024,
            mib(l_pid)
        );
    }
    sampling.store(false, Ordering::Relaxed);
    let _ = sampler.await;
}

async fn key_count(endpoint: &str, prefix: &str) -> Option<i64> {
    let mut kv = KvClient::new(channel(endpoint).await.ok()?);
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().expect("non-empty prefix") += 1;
    let req = RangeRequest {
        key: prefix.as_bytes().to_vec(),
        range_end: end,
        count_only: true,
        serializable: true,
        ..Default::default()
    };
    Some(kv.range(req).await.ok()?.into_inner().count)
}

/// Attaches key `<prefix><i>` to lease `ids[i]` for every `i`, 100 puts per txn.
async fn attach_keys(endpoint: &str, clients: usize, ids: Arc<Vec<i64>>, prefix: &'static str) {
    const PER_TXN: usize = 100;
    let kv = KvClient::new(channel(endpoint).await.expect("connect"));
    let txns = ids.len().div_ceil(PER_TXN);
    concurrently(clients, txns, move |t| {
        let (mut kv, ids) = (kv.clone(), ids.clone());
        async move {
            let success = (t * PER_TXN..((t + 1) * PER_TXN).min(ids.len()))
                .map(|i| RequestOp {
                    request: Some(request_op::Request::RequestPut(PutRequest {
                        key: format!("{prefix}{i:08}").into_bytes(),
                        value: b"session".to_vec(),
                        lease: ids[i],
                        ..Default::default()
                    })),
                })
                .collect();
            kv.txn(TxnRequest {
                success,
                ..Default::default()
            })
            .await
            .expect("txn of leased puts");
        }
    })
    .await;
}

async fn storm(cluster: &mut Cluster, leader: usize, clients: usize, n: usize, ttl: i64) {
    let lep = cluster.members[leader].endpoint();
    let start = Instant::now();
    let ids = Arc::new(grant_many(&lep, clients, n, ttl).await);
    let granted = ids.len();
    attach_keys(&lep, clients, ids, "storm/").await;
    let took = start.elapsed();
    assert!(
        took < Duration::from_secs(ttl as u64),
        "granting took {took:?}, longer than the {ttl} s TTL: raise --storm-ttl"
    );
    // Kill the leader: the new leader schedules every lease at promotion + TTL + extension,
    // so all of them are due at the same instant.
    cluster.members[leader].kill9();
    let killed = Instant::now();
    let new_leader = cluster.leader_async(Duration::from_secs(30)).await;
    let elected = Instant::now();
    let nep = cluster.members[new_leader].endpoint();
    let mut first_gone = None;
    let end = Instant::now() + Duration::from_secs(ttl as u64 + 300);
    let last_gone = loop {
        let c = key_count(&nep, "storm/").await;
        if first_gone.is_none() && c.is_some_and(|c| (c as usize) < granted) {
            first_gone = Some(Instant::now());
        }
        if c == Some(0) {
            break Instant::now();
        }
        assert!(Instant::now() < end, "storm keys still present");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let first = first_gone.unwrap_or(last_gone);
    let span = (last_gone - first).max(Duration::from_millis(20));
    let leases_left = lease_count(&nep).await;
    println!(
        "storm: {granted} leases (1 key each) set up in {:.1} s; leader killed, new leader after {:.1} s; first expiry {:.1} s after election (TTL {ttl} s); all {granted} revoked in {:.2} s: {:.0} leases expired/s (leases left: {leases_left:?})",
        took.as_secs_f64(),
        (elected - killed).as_secs_f64(),
        (first - elected).as_secs_f64(),
        span.as_secs_f64(),
        granted as f64 / span.as_secs_f64()
    );
}
