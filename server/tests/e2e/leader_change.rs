//! Writes across leader changes: every write is answered promptly, with its result or one of
//! etcd's errors, never left to run into the request timeout.
//!
//! - Leadership transfers (`MoveLeader`) while clients write through every member. Found by a
//!   fresh-user check: the new leader's proposer slots were held by forwards to the old
//!   leader, whose slots held forwards to the new one, so writes hung for the full 7 s and
//!   clients got gRPC's `Internal: Timeout expired` (a forwarded entry now takes one hop at
//!   most: `raft::proposer`, and a peer deadline reads as etcd's "request timed out").
//! - A deposed leader that catches up by installing a snapshot: the write it held, which the
//!   snapshot supersedes, is answered at once with etcd's "request timed out, possibly due to
//!   previous leader failure" (openraft patch for upstream #1761, docs/third_party.md).
//! - SIGTERM on the leader: it hands leadership over before it stops (etcd's `Stop`), so
//!   writes through the followers go on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use keel_proto::etcdserverpb::{MoveLeaderRequest, PutRequest};
use keel_testkit::etcdctl::etcdctl;
use keel_testkit::grpc;

use crate::cluster;

/// etcd's request timeout with the default 1 s election timeout (5 s + 2 × 1 s): how long a
/// stranded write used to wait.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(7);
const WRITERS: usize = 24;
const TRANSFERS: usize = 6;

/// One answered write: how long it took and, if it failed, its gRPC code and message.
type Answer = (Duration, Result<(), String>);

/// A writer putting `<prefix>/<n>` through `endpoint` until `stop`, recording every answer.
fn spawn_writer(
    rt: &tokio::runtime::Runtime,
    endpoint: String,
    prefix: String,
    answers: &Arc<Mutex<Vec<Answer>>>,
    stop: &Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    let (answers, stop) = (answers.clone(), stop.clone());
    rt.spawn(async move {
        let channel = grpc::channel(&endpoint, 2 * REQUEST_TIMEOUT).await.unwrap();
        let mut kv = keel_proto::etcdserverpb::kv_client::KvClient::new(channel);
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let started = Instant::now();
            let put = kv
                .put(PutRequest {
                    key: format!("{prefix}/{n}").into_bytes(),
                    value: vec![b'v'; 64],
                    ..Default::default()
                })
                .await;
            let result = put
                .map(|_| ())
                .map_err(|s| format!("{:?}: {}", s.code(), s.message()));
            answers.lock().unwrap().push((started.elapsed(), result));
            n += 1;
        }
    })
}

#[test]
fn writes_through_every_member_are_answered_promptly_across_leader_transfers() {
    let (_alone, cluster) = cluster(3, &[]);
    let endpoints: Vec<String> = (0..3).map(|i| cluster.members[i].endpoint()).collect();
    let ids: Vec<u64> = (0..3).map(|i| cluster.member_id(i).unwrap()).collect();
    let rt = grpc::runtime();
    let answers: Arc<Mutex<Vec<Answer>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let key = format!("w{w}");
            spawn_writer(&rt, endpoints[w % 3].clone(), key, &answers, &stop)
        })
        .collect();

    std::thread::sleep(Duration::from_secs(1));
    for round in 0..TRANSFERS {
        let leader = cluster.leader(Duration::from_secs(15));
        let target = (leader + 1 + round % 2) % 3;
        let moved = rt.block_on(async {
            grpc::maintenance(&endpoints[leader])
                .await
                .move_leader(MoveLeaderRequest {
                    target_id: ids[target],
                })
                .await
        });
        assert!(
            moved.is_ok(),
            "transfer {round} to {target}: {moved:?}\n{}",
            cluster.log_tails()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    rt.block_on(async {
        for w in writers {
            tokio::time::timeout(3 * REQUEST_TIMEOUT, w)
                .await
                .expect("a writer stopped")
                .unwrap();
        }
    });

    let answers = answers.lock().unwrap();
    let failed: Vec<&Answer> = answers.iter().filter(|(_, r)| r.is_err()).collect();
    let slowest = answers.iter().map(|(t, _)| *t).max().unwrap();
    eprintln!(
        "{} writes across {TRANSFERS} transfers, {} failed, slowest {slowest:?}",
        answers.len(),
        failed.len()
    );
    assert!(answers.len() > 500, "only {} writes", answers.len());
    // A transfer holds new writes on the old leader for about one election timeout; none
    // may wait anywhere near the request timeout.
    assert!(
        slowest < REQUEST_TIMEOUT / 2,
        "a write took {slowest:?}; failures: {failed:?}"
    );
    assert_eq!(
        failed,
        Vec::<&Answer>::new(),
        "writes failed across transfers"
    );
}

/// Attempts of the superseded-write scenario before giving up on ever seeing the snapshot
/// path (each takes about 6 s; the path came up in 3 of 5 attempts on the dev box).
const SUPERSEDE_ATTEMPTS: usize = 6;

/// What became of the write a deposed leader held.
#[derive(Debug, PartialEq)]
enum Superseded {
    /// A snapshot install dropped it, and the client was told so.
    BySnapshot,
    /// The new leader's log cut it (a conflicting entry), so it was forwarded to the new leader
    /// and applied there: also right, but not the path under test.
    ByConflict,
}

/// The leader takes a write while both followers are down (SIGKILL), so the entry is in its
/// log only and is never committed; then it is stopped itself (SIGSTOP), the followers
/// restart, elect a new leader and write past several snapshots (`--snapshot-count 20`, 5
/// entries kept), and the old leader resumes.
///
/// Where the new leader's first probes of the old leader's log land decides its path: a probe
/// at the write's index finds a conflict and cuts it (openraft answers `ForwardToLeader`, and
/// the write goes to the new leader: it was never committed, so it is applied exactly once);
/// otherwise the old leader installs a snapshot past its whole log, which supersedes the
/// write, and the client must hear etcd's "request timed out, possibly due to previous leader
/// failure" at once, not at its request timeout. Each attempt checks the path it took; the
/// test needs the snapshot path at least once.
#[test]
fn a_deposed_leaders_pending_write_is_answered_when_a_snapshot_supersedes_it() {
    let mut paths = Vec::new();
    for _ in 0..SUPERSEDE_ATTEMPTS {
        let path = supersede_a_pending_write();
        paths.push(path);
        if paths.last() == Some(&Superseded::BySnapshot) {
            return;
        }
    }
    panic!("no attempt took the snapshot path: {paths:?}");
}

fn supersede_a_pending_write() -> Superseded {
    let (_alone, mut cluster) = cluster(
        3,
        &[
            "--snapshot-count",
            "20",
            "--experimental-snapshot-catchup-entries",
            "5",
        ],
    );
    let rt = grpc::runtime();
    let old = cluster.leader(Duration::from_secs(15));
    let followers: Vec<usize> = (0..3).filter(|i| *i != old).collect();
    let old_endpoint = cluster.members[old].endpoint();
    let mut kv_old = rt.block_on(async {
        let channel = grpc::channel(&old_endpoint, 3 * REQUEST_TIMEOUT)
            .await
            .unwrap();
        keel_proto::etcdserverpb::kv_client::KvClient::new(channel)
    });

    for &f in &followers {
        cluster.members[f].kill9();
    }
    let sent = Instant::now();
    let pending = rt.spawn(async move {
        let put = kv_old
            .put(PutRequest {
                key: b"stranded".to_vec(),
                value: b"v".to_vec(),
                ..Default::default()
            })
            .await;
        let answered = Instant::now();
        (
            answered,
            put.map(|_| ())
                .map_err(|s| (s.code(), s.message().to_string())),
        )
    });
    // Long enough for the leader to append the entry; it cannot commit it.
    std::thread::sleep(Duration::from_millis(200));
    cluster.members[old].pause();
    for &f in &followers {
        cluster.members[f].spawn();
    }
    for &f in &followers {
        cluster.members[f].wait_ready();
    }
    let new_leader = followers
        .iter()
        .copied()
        .find(|&f| {
            let s = cluster.status(f).unwrap();
            s.header.is_some_and(|h| h.member_id == s.leader)
        })
        .expect("one of the restarted followers leads");
    rt.block_on(async {
        let mut kv = grpc::kv(&cluster.members[new_leader].endpoint()).await;
        for i in 0..60 {
            grpc::put(&mut kv, &format!("after/{i}"), "v").await;
        }
        // Give the calls in flight to the stopped member time to fail: openraft purges no
        // entry they cover. Then snapshot (and purge) once more.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        for i in 60..80 {
            grpc::put(&mut kv, &format!("after/{i}"), "v").await;
        }
    });
    let resumed = Instant::now();
    cluster.members[old].resume();

    let (answered, result) = rt.block_on(pending).unwrap();
    // Whether a snapshot install dropped the write, once the old leader caught up.
    let count = rt.block_on(async {
        let mut kv = grpc::kv(&cluster.members[old].endpoint()).await;
        grpc::put(&mut kv, "after-resume", "v").await;
        grpc::range(&mut kv, b"stranded", b"").await.count
    });
    let dropped = cluster.members[old]
        .log()
        .contains("pending client writes: dropped unanswered");
    eprintln!(
        "setup took {:?}; the write was answered {:?} after the resume: {result:?} \
         (dropped by a snapshot: {dropped})",
        resumed - sent,
        answered.saturating_duration_since(resumed)
    );
    assert!(
        answered < sent + REQUEST_TIMEOUT,
        "answered only at its request timeout ({:?} after it was sent): {result:?}\n{}",
        answered - sent,
        cluster.log_tails()
    );
    if dropped {
        assert_eq!(
            result,
            Err((
                tonic::Code::Unavailable,
                "etcdserver: request timed out, possibly due to previous leader failure"
                    .to_string()
            ))
        );
        assert_eq!(count, 0, "the superseded write was applied");
        Superseded::BySnapshot
    } else {
        assert_eq!(result, Ok(()), "{}", cluster.log_tails());
        assert_eq!(count, 1, "the forwarded write was applied once");
        Superseded::ByConflict
    }
}

/// `MoveLeader` to a member that does not answer (SIGSTOP) fails within about two election
/// timeouts with etcd's error; the leader keeps leading in the same term, and writes through
/// it wait no longer than the attempt. Once resumed, the target handles the `TimeoutNow` that
/// waited in its socket, asks the leader (`ConfirmTransfer`) and starts no election: before
/// that check it campaigned and won in 10 of 30 runs on a loaded machine, and once in CI.
/// (etcd bounds a transfer by one election timeout and
/// keeps heartbeating; Keel waited 7 s with heartbeats off, so the third member took over and
/// the old leader held its clients' writes for 7 s: found by a fresh-user check.)
#[test]
fn a_transfer_to_a_member_that_does_not_answer_fails_fast_and_keeps_the_leader() {
    let (_alone, mut cluster) = cluster(3, &[]);
    let rt = grpc::runtime();
    let leader = cluster.leader(Duration::from_secs(15));
    let target = (leader + 1) % 3;
    let target_id = cluster.member_id(target).unwrap();
    let term = cluster.status(leader).unwrap().raft_term;
    let endpoint = cluster.members[leader].endpoint();
    cluster.members[target].pause();

    let writer = rt.spawn({
        let endpoint = endpoint.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let mut kv = grpc::kv(&endpoint).await;
            let started = Instant::now();
            grpc::put(&mut kv, "during-transfer", "v").await;
            started.elapsed()
        }
    });
    let started = Instant::now();
    let moved = rt.block_on(async {
        grpc::maintenance(&endpoint)
            .await
            .move_leader(MoveLeaderRequest { target_id })
            .await
    });
    let took = started.elapsed();
    let write_took = rt.block_on(writer).unwrap();
    cluster.members[target].resume();
    eprintln!("the transfer failed after {took:?}; a write during it took {write_took:?}");
    grpc::assert_fails_with(
        moved,
        tonic::Code::Unknown,
        "etcdserver: request timed out, leader transfer took too long",
    );
    assert!(
        took < Duration::from_millis(2500),
        "the transfer took {took:?}"
    );
    assert!(
        write_took < Duration::from_millis(2500),
        "a write took {write_took:?}"
    );
    let kept = |when: &str| {
        let status = cluster.status(leader).unwrap();
        assert_eq!(
            (status.leader, status.raft_term),
            (cluster.member_id(leader).unwrap(), term),
            "the leader changed {when}\n{}",
            cluster.log_tails()
        );
    };
    kept("during the transfer");
    // The `TimeoutNow` waited in the paused target's socket; handled after SIGCONT, it must
    // find the leader's offer withdrawn and start no election.
    assert!(
        cluster.members[target].wait_for_log(
            "the leader withdrew this leadership transfer",
            Duration::from_secs(5)
        ),
        "the target never refused the late TimeoutNow\n{}",
        cluster.log_tails()
    );
    std::thread::sleep(Duration::from_millis(500));
    kept("after the target refused");
}

/// SIGTERM on the leader while clients write through the two followers: the leader hands
/// leadership to a follower before it drains and exits (etcd's `EtcdServer.Stop`), so no write
/// fails and none waits near the request timeout. Before, the stopping leader kept leading
/// (and heartbeating) through its 5 s drain with its peer listener closed, so writes through
/// the followers could reach no leader until it exited and an election followed: up to 7 s.
#[test]
fn sigterm_on_the_leader_hands_leadership_over_and_writes_go_on() {
    const FOLLOWER_WRITERS: usize = 8;
    let (_alone, mut cluster) = cluster(3, &[]);
    let leader = cluster.leader(Duration::from_secs(15));
    let followers: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    let ids: Vec<u64> = (0..3).map(|i| cluster.member_id(i).unwrap()).collect();
    let rt = grpc::runtime();
    let answers: Arc<Mutex<Vec<Answer>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..FOLLOWER_WRITERS)
        .map(|w| {
            let endpoint = cluster.members[followers[w % 2]].endpoint();
            spawn_writer(&rt, endpoint, format!("s{w}"), &answers, &stop)
        })
        .collect();

    std::thread::sleep(Duration::from_secs(1));
    let before = answers.lock().unwrap().len();
    let status = cluster.members[leader].terminate();
    assert_eq!(status.code(), Some(0), "SIGTERM: {status}");
    let log = cluster.members[leader].log();
    assert!(
        log.contains("stopping the leader: transferring leadership first"),
        "the stopping leader did not try to hand over:\n{}",
        cluster.members[leader].log_tail()
    );
    assert!(
        !log.contains("leadership transfer failed"),
        "the hand-over failed:\n{}",
        cluster.members[leader].log_tail()
    );
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    rt.block_on(async {
        for w in writers {
            tokio::time::timeout(3 * REQUEST_TIMEOUT, w)
                .await
                .expect("a writer stopped")
                .unwrap();
        }
    });

    // The survivors agree on a leader, one of them.
    let new_leader = cluster.leader(Duration::from_secs(15));
    assert!(followers.contains(&new_leader), "leader {new_leader}");
    assert_ne!(ids[new_leader], ids[leader]);
    let answers = answers.lock().unwrap();
    let failed: Vec<&Answer> = answers.iter().filter(|(_, r)| r.is_err()).collect();
    let slowest = answers.iter().map(|(t, _)| *t).max().unwrap();
    eprintln!(
        "{} writes through the followers ({} after the SIGTERM), {} failed, slowest {slowest:?}",
        answers.len(),
        answers.len() - before,
        failed.len()
    );
    assert!(
        answers.len() > before + 50,
        "writes stalled after the SIGTERM: {} before, {} in all",
        before,
        answers.len()
    );
    assert_eq!(
        failed,
        Vec::<&Answer>::new(),
        "writes failed across the stop\n{}",
        cluster.log_tails()
    );
    assert!(
        slowest < REQUEST_TIMEOUT / 2,
        "a write took {slowest:?} across the leader's stop"
    );
}

/// A stopping leader does not wait for a paused follower: once it handed leadership over and
/// drained, it gives its peer connections a short grace to close and exits, although the
/// paused member never closes its own. Before, the leader's exit waited until the follower
/// resumed (or the 5 s drain ran out): 2.2 s after SIGTERM with a 2.5 s pause.
#[test]
fn a_stopping_leader_does_not_wait_for_a_paused_follower() {
    let (_alone, mut cluster) = cluster(3, &[]);
    let leader = cluster.leader(Duration::from_secs(15));
    let followers: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    let paused = followers[0];
    // A write through the follower opens its leader-call stream to the leader.
    etcdctl(
        &cluster.members[paused].endpoint(),
        &["put", "via-paused", "v"],
    )
    .ok();
    cluster.members[paused].pause();
    // Past two heartbeat intervals: the hand-over passes over a member that stopped answering.
    std::thread::sleep(Duration::from_millis(500));
    let sent = Instant::now();
    let status = cluster.members[leader].terminate();
    let took = sent.elapsed();
    cluster.members[paused].resume();
    eprintln!("the leader exited {took:?} after SIGTERM");
    assert_eq!(status.code(), Some(0), "SIGTERM: {status}");
    let log = cluster.members[leader].log();
    assert!(
        log.lines()
            .any(|l| l.contains("leadership transfer finished") && l.contains("ok=true")),
        "the hand-over to the running follower failed:\n{}",
        cluster.members[leader].log_tail()
    );
    assert!(
        log.contains("stopped waiting for peer connections to close"),
        "the leader waited for the paused follower's connections:\n{}",
        cluster.members[leader].log_tail()
    );
    // The two left agree on a leader and take writes.
    let survivors = followers
        .iter()
        .map(|i| cluster.members[*i].endpoint())
        .collect::<Vec<_>>()
        .join(",");
    etcdctl(&survivors, &["put", "after-the-stop", "v"]).ok();
}
