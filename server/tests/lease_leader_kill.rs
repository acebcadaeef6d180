//! Multi-process lease test: a 3-member cluster of real `keel` processes loses its leader
//! (SIGKILL) while leases are pending expiry. The leases must expire on the new leader at
//! the right time (not before their TTL, and with the remaining TTL checkpointed before
//! the crash rather than a fresh full TTL), none may be lost, and their keys must disappear
//! on every member, including the killed one once it is back.

mod support;

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use keel_proto::etcdserverpb::kv_client::KvClient;
use keel_proto::etcdserverpb::lease_client::LeaseClient;
use keel_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use keel_proto::etcdserverpb::{
    LeaseGrantRequest, LeaseLeasesRequest, LeaseTimeToLiveRequest, PutRequest, RangeRequest,
    StatusRequest,
};
use support::grpc::{channel, prefix_end};
use support::ports::free_ports;

/// TTL of the leases that must expire across the leader change (s).
const SHORT_TTL: i64 = 8;
/// Leases pending expiry when the leader dies.
const SHORT_LEASES: usize = 20;
/// The test's checkpoint interval (ms): remaining TTLs are at most this stale at the crash.
const CHECKPOINT_MS: u64 = 1000;
/// etcd's default election timeout, which is also the TTL extension on election (ms).
const ELECTION_MS: u64 = 1000;

/// One member process of the test cluster.
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Member {
    fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("keel.log")
    }

    fn spawn(&mut self, initial_cluster: &str) {
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("member log");
        let child = Command::new(env!("CARGO_BIN_EXE_keel"))
            .args(["--name", &self.name])
            .args([
                "--data-dir",
                &self.dir.path().join("data").display().to_string(),
            ])
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args(["--listen-peer-urls", &self.peer_url()])
            .args(["--initial-advertise-peer-urls", &self.peer_url()])
            .args(["--initial-cluster", initial_cluster])
            .args(["--election-timeout", &ELECTION_MS.to_string()])
            .args(["--lease-checkpoint-interval", &CHECKPOINT_MS.to_string()])
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn keel");
        self.child = Some(child);
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<_> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- log of member {} ---\n{}", self.name, self.log_tail());
        }
        self.kill9();
    }
}

struct Cluster {
    members: Vec<Member>,
    initial_cluster: String,
}

impl Cluster {
    fn start(n: usize) -> Cluster {
        let ports = free_ports(2 * n);
        let mut members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: ports[2 * i],
                peer_port: ports[2 * i + 1],
                dir: tempfile::Builder::new()
                    .prefix("keel-lease-kill-")
                    .tempdir()
                    .expect("temp dir"),
                child: None,
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect::<Vec<_>>()
            .join(",");
        for m in &mut members {
            m.spawn(&initial_cluster);
        }
        Cluster {
            members,
            initial_cluster,
        }
    }
}

async fn kv(endpoint: &str) -> Option<KvClient<tonic::transport::Channel>> {
    channel(endpoint, Duration::from_secs(3))
        .await
        .ok()
        .map(KvClient::new)
}

async fn lease(endpoint: &str) -> LeaseClient<tonic::transport::Channel> {
    LeaseClient::new(
        channel(endpoint, Duration::from_secs(10))
            .await
            .expect("lease client"),
    )
}

/// `(member id, leader id)` as `endpoint` reports them, if it answers.
async fn status(endpoint: &str) -> Option<(u64, u64)> {
    let ch = channel(endpoint, Duration::from_secs(2)).await.ok()?;
    let s = MaintenanceClient::new(ch)
        .status(StatusRequest {})
        .await
        .ok()?
        .into_inner();
    Some((s.header?.member_id, s.leader))
}

/// Waits until every listed member reports the same leader, which is one of them; returns
/// its index.
async fn wait_leader(cluster: &Cluster, among: &[usize], limit: Duration) -> usize {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        let mut ids = Vec::new();
        for &i in among {
            ids.push(status(&cluster.members[i].endpoint()).await);
        }
        if let Some(Some((_, leader))) = ids.first() {
            let agreed = *leader != 0 && ids.iter().all(|s| s.is_some_and(|(_, l)| l == *leader));
            if agreed
                && let Some(pos) = ids
                    .iter()
                    .position(|s| s.is_some_and(|(me, _)| me == *leader))
            {
                return among[pos];
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no leader among members {among:?} within {limit:?}");
}

/// Serializable read of `prefix*` on one member: what that member has applied.
async fn local_keys(endpoint: &str, prefix: &str) -> Option<(i64, usize)> {
    let mut c = kv(endpoint).await?;
    let r = c
        .range(RangeRequest {
            key: prefix.into(),
            range_end: prefix_end(prefix.as_bytes()),
            serializable: true,
            count_only: true,
            ..Default::default()
        })
        .await
        .ok()?
        .into_inner();
    Some((r.header?.revision, r.count as usize))
}

/// Polls every 50 ms until `prefix*` is empty on `endpoint`; returns when it was seen empty.
async fn vanished(endpoint: &str, prefix: &str, limit: Duration) -> Instant {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if let Some((_, 0)) = local_keys(endpoint, prefix).await {
            return Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("keys {prefix}* still on {endpoint} after {limit:?}");
}

#[test]
fn leases_expire_on_the_new_leader_after_the_leader_is_killed() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(scenario());
}

async fn scenario() {
    let mut cluster = Cluster::start(3);
    let leader = wait_leader(&cluster, &[0, 1, 2], Duration::from_secs(30)).await;
    let endpoint = cluster.members[leader].endpoint();
    let mut leases = lease(&endpoint).await;
    let mut kv_leader = kv(&endpoint).await.expect("kv client on the leader");

    // Leases pending expiry, each with a key, plus one long lease that must survive.
    let grants_sent = Instant::now();
    let mut short_ids = Vec::new();
    for i in 0..SHORT_LEASES {
        let g = leases
            .lease_grant(LeaseGrantRequest {
                ttl: SHORT_TTL,
                id: 0,
            })
            .await
            .expect("grant")
            .into_inner();
        assert_eq!(g.ttl, SHORT_TTL);
        kv_leader
            .put(PutRequest {
                key: format!("short/{i}").into(),
                value: b"v".to_vec(),
                lease: g.id,
                ..Default::default()
            })
            .await
            .expect("put with lease");
        short_ids.push(g.id);
    }
    let grants_done = Instant::now();
    let long = leases
        .lease_grant(LeaseGrantRequest { ttl: 600, id: 0 })
        .await
        .expect("grant")
        .into_inner()
        .id;
    kv_leader
        .put(PutRequest {
            key: b"long".to_vec(),
            value: b"v".to_vec(),
            lease: long,
            ..Default::default()
        })
        .await
        .expect("put with lease");

    // Let a few checkpoints go through raft, then crash the leader 3 s into the 8 s TTL.
    tokio::time::sleep_until((grants_done + Duration::from_secs(3)).into()).await;
    let killed_at = Instant::now();
    cluster.members[leader].kill9();
    let survivors: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let new_leader = wait_leader(&cluster, &survivors, Duration::from_secs(30)).await;
    let elected_at = Instant::now();
    assert_ne!(new_leader, leader);

    // The keys disappear on both survivors.
    let mut gone = Vec::new();
    for &i in &survivors {
        gone.push(
            vanished(
                &cluster.members[i].endpoint(),
                "short/",
                Duration::from_secs(40),
            )
            .await,
        );
    }
    let first_gone = *gone.iter().min().unwrap();
    let last_gone = *gone.iter().max().unwrap();
    let since_grant = first_gone - grants_sent;
    // Not early: no lease may expire before its TTL from its grant.
    assert!(
        since_grant >= Duration::from_secs(SHORT_TTL as u64),
        "leases expired {since_grant:?} after their grant, before their {SHORT_TTL} s TTL"
    );
    // On time: the new leader used the checkpointed remaining TTL (at most one interval
    // stale, TTL - 3 s + 1 s) plus the election extension, not a fresh full TTL.
    let remaining_at_crash =
        Duration::from_secs(SHORT_TTL as u64 - 3) + Duration::from_millis(CHECKPOINT_MS);
    let latest = elected_at
        + remaining_at_crash
        + Duration::from_millis(ELECTION_MS)
        + Duration::from_millis(1500);
    assert!(
        last_gone <= latest,
        "leases expired {:?} after the new leader was elected; the checkpointed remaining TTL bounds it at {:?}",
        last_gone - elected_at,
        latest - elected_at
    );
    eprintln!(
        "killed {:?} after the grants; new leader after {:?}; keys gone {:?} after grant ({:?} after election)",
        killed_at - grants_done,
        elected_at - killed_at,
        since_grant,
        first_gone.saturating_duration_since(elected_at)
    );

    // Not lost: every short lease is gone from every survivor's lease list; the long lease
    // stayed, with its key and about the remaining TTL it had.
    for &i in &survivors {
        let ep = cluster.members[i].endpoint();
        let list = lease(&ep)
            .await
            .lease_leases(LeaseLeasesRequest {})
            .await
            .expect("leases")
            .into_inner();
        let ids: Vec<i64> = list.leases.iter().map(|l| l.id).collect();
        assert_eq!(ids, vec![long], "member {i} still lists expired leases");
        let ttl = lease(&ep)
            .await
            .lease_time_to_live(LeaseTimeToLiveRequest {
                id: long,
                keys: true,
            })
            .await
            .expect("time to live")
            .into_inner();
        assert_eq!(ttl.granted_ttl, 600);
        assert_eq!(ttl.keys, vec![b"long".to_vec()]);
        // 600 s minus the time since the grant; the lease may gain what checkpointing
        // cannot see: the checkpoint's staleness, the election, the extension, rounding.
        let elapsed = (Instant::now() - grants_done).as_secs() as i64;
        let election = (elected_at - killed_at).as_secs() as i64 + 1;
        let slack = ((CHECKPOINT_MS + ELECTION_MS) / 1000) as i64 + election + 2;
        assert!(
            ttl.ttl <= 600 - elapsed + slack && ttl.ttl >= 600 - elapsed - 2,
            "long lease has {} s left after {elapsed} s",
            ttl.ttl
        );
        assert_eq!(local_keys(&ep, "long").await.map(|k| k.1), Some(1));
    }
    let mut on_new_leader = lease(&cluster.members[new_leader].endpoint()).await;
    for id in short_ids {
        let t = on_new_leader
            .lease_time_to_live(LeaseTimeToLiveRequest { id, keys: false })
            .await;
        assert_eq!(
            t.expect("time to live").into_inner().ttl,
            -1,
            "lease {id:x} was not revoked"
        );
    }

    // The killed member comes back, catches up and has deleted the keys too.
    let ic = cluster.initial_cluster.clone();
    cluster.members[leader].spawn(&ic);
    let target = local_keys(&cluster.members[new_leader].endpoint(), "short/")
        .await
        .expect("leader revision")
        .0;
    let end = Instant::now() + Duration::from_secs(40);
    loop {
        if let Some((rev, n)) = local_keys(&cluster.members[leader].endpoint(), "short/").await
            && rev >= target
        {
            assert_eq!(n, 0, "the restarted member kept keys of expired leases");
            break;
        }
        assert!(
            Instant::now() < end,
            "the restarted member did not catch up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
