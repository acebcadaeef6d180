//! Leadership under peer-link faults, on real members behind the chaos harness's link proxies
//! (port range 26000-27999, as the other chaos tests).
//!
//! **Pre-vote** (Raft thesis §9.6; etcd's `--pre-vote`, on by default). A follower is cut off from both other members for five election timeouts, then the links
//! heal:
//! - with pre-vote (the default) it never raises its term: nobody answers its pre-votes. When
//!   it rejoins, the leader and the term are the ones from before the partition;
//! - with `--pre-vote=false` it campaigns on every timeout, and when it rejoins its higher term
//!   deposes the leader: the cluster ends at a higher term. This half also shows that the
//!   partition really cut the member off, so the first half cannot pass by accident;
//! - cut off one way only (the others' messages do not reach it, its own go out and are
//!   answered), its pre-votes reach members that hear the leader and are refused: again no
//!   higher term and no election.
//!
//! **Slow links.** A peer round trip longer than `--heartbeat-interval` (every link delayed
//! 80 ms each way, heartbeat 100 ms) slows writes and linearizable reads, and stops nothing:
//! etcd serves on such links, and Keel once timed out every heartbeat and read-index round
//! after the heartbeat interval, so its leader never saw a quorum and refused every request.

use std::time::Duration;

use keel_chaos::run::cluster::{Cluster, ClusterSpec};
use keel_chaos::run::ports::PortRange;
use keel_chaos::run::proxy::LinkMode;
use keel_chaos::run::rpc;
use keel_proto::etcdserverpb::kv_client::KvClient;
use keel_proto::etcdserverpb::{PutRequest, RangeRequest};

const HEARTBEAT_MS: u64 = 100;
const ELECTION_MS: u64 = 1000;

/// What one partition of a follower did to the cluster's terms and leader.
#[derive(Debug)]
struct Outcome {
    leader_before: usize,
    term_before: u64,
    /// The cut-off follower's term at the end of the partition.
    isolated_term: u64,
    /// Leader and term once every member agrees on a leader after the heal.
    leader_after: usize,
    term_after: u64,
}

/// Waits (at most 15 s) until every member names the same leader; returns it and its term.
async fn settled_leader(cluster: &Cluster) -> (usize, u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(leader) = cluster.leader().await {
            let mut statuses = Vec::new();
            for i in 0..cluster.len() {
                statuses.push(cluster.status(i).await.ok());
            }
            let terms: Vec<u64> = statuses.iter().flatten().map(|s| s.raft_term).collect();
            if terms.len() == cluster.len() && terms.iter().all(|&t| t == terms[0]) {
                return (leader, terms[0]);
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no agreed leader and term within 15 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Which links of the cut-off follower drop.
#[derive(Clone, Copy, Debug)]
enum Cut {
    /// Neither side reaches the other.
    Both,
    /// The others cannot send to the follower; it still sends to them (and gets answers).
    Inbound,
}

/// Starts 3 members (heartbeat 100 ms, election timeout 1000 ms) in `dir` with `extra_args`.
async fn start(dir: &tempfile::TempDir, extra_args: Vec<String>) -> Cluster {
    let spec = ClusterSpec {
        nodes: 3,
        binary: keel_testkit::keel_binary!(),
        dir: dir.path().to_path_buf(),
        ports: Some(PortRange {
            lo: 26000,
            hi: 27999,
        }),
        heartbeat_ms: HEARTBEAT_MS,
        election_ms: ELECTION_MS,
        extra_args,
        env: Vec::new(),
        tls: None,
    };
    Cluster::start(spec, Duration::from_secs(30))
        .await
        .expect("cluster starts")
}

/// Starts 3 members with `--pre-vote=<pre_vote>`, cuts one follower off (`cut`) for 5
/// election timeouts, heals, and reports the terms and leaders.
async fn partition_a_follower(pre_vote: bool, cut: Cut) -> Outcome {
    let dir = tempfile::tempdir().expect("temp dir");
    let cluster = start(&dir, vec![format!("--pre-vote={pre_vote}")]).await;
    let (leader_before, term_before) = settled_leader(&cluster).await;
    let follower = (leader_before + 1) % cluster.len();
    for other in (0..cluster.len()).filter(|&o| o != follower) {
        if matches!(cut, Cut::Both) {
            cluster.set_link(follower, other, LinkMode::Drop);
        }
        cluster.set_link(other, follower, LinkMode::Drop);
    }
    tokio::time::sleep(Duration::from_millis(5 * ELECTION_MS)).await;
    // Client URLs are not proxied: the cut-off member still answers Status.
    let isolated_term = cluster
        .status(follower)
        .await
        .expect("the cut-off member answers Status")
        .raft_term;
    cluster.heal_links();
    // Give a rejoin time to disturb the cluster before reading the outcome.
    tokio::time::sleep(Duration::from_millis(2 * ELECTION_MS)).await;
    let (leader_after, term_after) = settled_leader(&cluster).await;
    cluster.shutdown().await;
    Outcome {
        leader_before,
        term_before,
        isolated_term,
        leader_after,
        term_after,
    }
}

/// The cut-off member kept its term, and the leader and term after the heal are the ones
/// from before the partition.
fn assert_no_election(o: &Outcome) {
    assert_eq!(
        o.isolated_term, o.term_before,
        "the cut-off member raised its term: {o:?}"
    );
    assert_eq!(o.leader_after, o.leader_before, "the leader changed: {o:?}");
    assert_eq!(o.term_after, o.term_before, "an election ran: {o:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_cut_off_by_a_partition_rejoins_without_an_election() {
    let o = partition_a_follower(true, Cut::Both).await;
    assert_no_election(&o);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_pre_vote_the_rejoining_follower_deposes_the_leader() {
    let o = partition_a_follower(false, Cut::Both).await;
    assert!(
        o.isolated_term > o.term_before,
        "the cut-off member did not campaign: {o:?}"
    );
    assert!(
        o.term_after > o.term_before,
        "the rejoin did not raise the cluster's term: {o:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_that_stops_hearing_the_leader_is_refused_its_pre_votes() {
    let o = partition_a_follower(true, Cut::Inbound).await;
    assert_no_election(&o);
}

/// The answer of the call `what`, which must succeed within 10 s.
async fn answered<T>(
    call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    what: &str,
) -> T {
    tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .unwrap_or_else(|_| panic!("{what} hung"))
        .unwrap_or_else(|e| panic!("{what}: {e}"))
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_trip_longer_than_the_heartbeat_interval_slows_requests_but_stops_none() {
    const ONE_WAY: Duration = Duration::from_millis(80);
    let dir = tempfile::tempdir().expect("temp dir");
    let cluster = start(&dir, Vec::new()).await;
    let (leader, term) = settled_leader(&cluster).await;
    for from in 0..cluster.len() {
        for to in (0..cluster.len()).filter(|&to| to != from) {
            cluster.set_link(from, to, LinkMode::Delay(ONE_WAY));
        }
    }
    // Through the leader and through a follower (forwarded, and its linearizable reads ask
    // the leader for a read index): each put needs a replication round trip (160 ms or more).
    for member in [leader, (leader + 1) % cluster.len()] {
        let url = &cluster.members[member].client_url;
        let channel = rpc::connect(url, Duration::from_secs(5))
            .await
            .expect("connect");
        let mut kv = KvClient::new(channel);
        for i in 0..5 {
            let key = format!("slow-{member}-{i}").into_bytes();
            let put = kv.put(PutRequest {
                key: key.clone(),
                value: b"v".to_vec(),
                ..Default::default()
            });
            let put = answered(put, &format!("put {i} through member {member}")).await;
            let range = kv.range(RangeRequest {
                key,
                ..Default::default()
            });
            let range = answered(range, &format!("read {i} through member {member}")).await;
            let revision = put.header.expect("put header").revision;
            assert_eq!(range.kvs.len(), 1, "the put {i} is read back");
            assert_eq!(range.kvs[0].mod_revision, revision);
        }
    }
    cluster.heal_links();
    let (leader_after, term_after) = settled_leader(&cluster).await;
    cluster.shutdown().await;
    assert_eq!(
        (leader_after, term_after),
        (leader, term),
        "slow links caused an election"
    );
}
