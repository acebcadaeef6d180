//! Multi-process lease test: a 3-member cluster of real `keel` processes loses its leader
//! (SIGKILL) while leases are pending expiry. The leases must expire on the new leader at
//! the right time (not before their TTL, and with the remaining TTL checkpointed before
//! the crash rather than a fresh full TTL), none may be lost, and their keys must disappear
//! on every member, including the killed one once it is back.

use std::time::{Duration, Instant};

use keel_proto::etcdserverpb::kv_client::KvClient;
use keel_proto::etcdserverpb::lease_client::LeaseClient;
use keel_proto::etcdserverpb::{
    LeaseGrantRequest, LeaseLeasesRequest, LeaseTimeToLiveRequest, PutRequest, RangeRequest,
};
use keel_testkit::grpc::{self, channel, prefix_end};
use keel_testkit::schedule::exclusive;
use keel_testkit::{Cluster, MemberSpec};

use crate::keel_bin;

/// TTL of the leases that must expire across the leader change (s).
const SHORT_TTL: i64 = 8;
/// Leases pending expiry when the leader dies.
const SHORT_LEASES: usize = 20;
/// The test's checkpoint interval (ms): remaining TTLs are at most this stale at the crash.
const CHECKPOINT_MS: u64 = 1000;
/// etcd's default election timeout, which is also the TTL extension on election (ms).
const ELECTION_MS: u64 = 1000;

async fn kv(endpoint: &str) -> Option<KvClient<tonic::transport::Channel>> {
    channel(endpoint, Duration::from_secs(3))
        .await
        .ok()
        .map(KvClient::new)
}

async fn lease(endpoint: &str) -> LeaseClient<tonic::transport::Channel> {
    grpc::lease(endpoint, Duration::from_secs(10)).await
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
    let _alone = exclusive();
    let cluster = Cluster::start_with(
        &keel_bin(),
        3,
        MemberSpec::new()
            .election_timeout(ELECTION_MS)
            .flag("--lease-checkpoint-interval", &CHECKPOINT_MS.to_string()),
        None,
    );
    grpc::runtime().block_on(scenario(cluster));
}

async fn scenario(mut cluster: Cluster) {
    let leader = cluster.leader_async(Duration::from_secs(30)).await;
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
    let new_leader = cluster.leader_async(Duration::from_secs(30)).await;
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
    cluster.members[leader].spawn();
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
