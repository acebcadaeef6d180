//! Crash and fault failpoints (docs/failpoints.md) on the real `keel` built with the
//! `failpoints` feature:
//!
//! `cargo test -p keel-server --features failpoints --test failpoints`
//!
//! Each crash test starts a member, restarts it with `FAILPOINTS` set so it aborts at the
//! failpoint under load, checks that it died of that failpoint (SIGABRT and the failpoint's
//! message in its log), restarts it without `FAILPOINTS`, and checks that every acknowledged
//! write is there at its revision, exactly once, and nothing else changed.

#![cfg(feature = "failpoints")]

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use keel_proto::etcdserverpb::{
    CompactionRequest, DefragmentRequest, HashKvRequest, PutRequest, RangeRequest, RequestOp,
    TxnRequest, request_op,
};
use keel_testkit::{Cluster, Member, grpc};

#[path = "failpoints/disk.rs"]
mod disk;
#[path = "failpoints/replication.rs"]
mod replication;

/// The `keel` under test: always the one cargo built for this test binary, with the
/// `failpoints` feature (a `$KEEL_BIN` would be a build without failpoints).
fn keel_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_keel"))
}

/// How long a member may take to reach its failpoint under load and die.
const CRASH_TIMEOUT: Duration = Duration::from_secs(30);
/// The key the sequential writer puts over and over.
const KEY: &str = "fp-key";

/// One acknowledged put of the sequential writer: value `v{i}` at `revision`.
#[derive(Debug, Clone, Copy)]
struct Acked {
    i: usize,
    revision: i64,
}

/// Puts `KEY = v{i}` for i = 0, 1, ... one at a time until a put fails (the member died) or
/// `CRASH_TIMEOUT` passes, and returns the acknowledged ones.
fn write_until_crash(endpoint: &str) -> Vec<Acked> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut kv = grpc::kv(endpoint).await;
        let deadline = Instant::now() + CRASH_TIMEOUT;
        let mut acked = Vec::new();
        for i in 0.. {
            if Instant::now() > deadline {
                break;
            }
            let put = PutRequest {
                key: KEY.into(),
                value: format!("v{i}").into(),
                ..Default::default()
            };
            match kv.put(put).await {
                Ok(r) => acked.push(Acked {
                    i,
                    revision: r.into_inner().header.unwrap().revision,
                }),
                Err(_) => break,
            }
        }
        acked
    })
}

/// Asserts that the member exited by abort at `failpoint` (within [`CRASH_TIMEOUT`]).
fn assert_crashed_at(keel: &mut Member, failpoint: &str) {
    let status = keel
        .wait_exit(CRASH_TIMEOUT)
        .unwrap_or_else(|| panic!("keel did not crash at {failpoint}\n{}", keel.log_tail()));
    assert_eq!(
        status.signal(),
        Some(libc::SIGABRT),
        "{status}\n{}",
        keel.log_tail()
    );
    assert!(
        keel.log()
            .contains(&format!("keel: failpoint {failpoint} fired: aborting")),
        "{}",
        keel.log_tail()
    );
}

/// A fresh member, started once without failpoints (so it bootstraps normally), then stopped
/// and restarted with `FAILPOINTS=failpoints`.
fn start_with_failpoints(failpoints: &str) -> Member {
    let mut keel = Member::start(&keel_bin());
    keel.terminate();
    keel.set_failpoints(Some(failpoints));
    keel.restart();
    keel
}

/// Restarts a member with `FAILPOINTS=failpoints`, writes until it crashes at `failpoint`,
/// restarts it without failpoints and checks the sequential writer's history.
fn crash_and_recover(failpoint: &str, failpoints: &str) {
    let mut keel = start_with_failpoints(failpoints);
    let acked = write_until_crash(&keel.endpoint());
    assert_crashed_at(&mut keel, failpoint);
    assert!(
        !acked.is_empty(),
        "no write was acknowledged before the crash"
    );
    keel.set_failpoints(None);
    keel.restart();
    check_sequential_history(&keel.endpoint(), &acked);
}

/// Checks the history of `KEY` after a crash: every acknowledged put `v{i}` is at revision
/// `first + i` with version `i + 1` (so revisions are contiguous and nothing was applied
/// twice), and the current value is the last acknowledged put or the one in flight at the
/// crash (its outcome was unknown).
fn check_sequential_history(endpoint: &str, acked: &[Acked]) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut kv = grpc::kv(endpoint).await;
        let first = acked[0].revision;
        for a in acked {
            assert_eq!(
                a.revision,
                first + a.i as i64,
                "acknowledged revisions: {acked:?}"
            );
            let got = kv
                .range(RangeRequest {
                    key: KEY.into(),
                    revision: a.revision,
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(got.kvs.len(), 1, "put #{} lost", a.i);
            let kv_ = &got.kvs[0];
            assert_eq!(kv_.value, format!("v{}", a.i).into_bytes());
            assert_eq!(kv_.mod_revision, a.revision);
            assert_eq!(kv_.create_revision, first);
            assert_eq!(kv_.version, a.i as i64 + 1);
        }
        let last = acked.last().unwrap();
        let now = grpc::range(&mut kv, KEY.as_bytes(), b"").await;
        let current = &now.kvs[0];
        let j = current.version - 1;
        assert!(
            j == last.i as i64 || j == last.i as i64 + 1,
            "current version {} after {} acknowledged puts",
            current.version,
            acked.len()
        );
        assert_eq!(current.value, format!("v{j}").into_bytes());
        assert_eq!(current.mod_revision, first + j, "a put was applied twice");
        assert_eq!(
            now.header.unwrap().revision,
            current.mod_revision,
            "nothing else was written"
        );
    });
}

#[test]
fn crash_before_wal_fsync_keeps_every_acknowledged_write() {
    crash_and_recover("wal_before_fsync", "wal_before_fsync=20*off->return");
}

#[test]
fn crash_after_wal_fsync_keeps_every_acknowledged_write() {
    crash_and_recover("wal_after_fsync", "wal_after_fsync=20*off->return");
}

#[test]
fn torn_wal_write_is_cut_on_recovery() {
    crash_and_recover("wal_torn_write", "wal_torn_write=20*off->return");
}

#[test]
fn crash_mid_apply_applies_each_entry_exactly_once() {
    crash_and_recover("apply_before_cindex", "apply_before_cindex=20*off->return");
}

#[test]
fn slow_fsync_delays_acknowledgement() {
    let keel = start_with_failpoints("wal_slow_fsync=sleep(300)");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut kv = grpc::kv(&keel.endpoint()).await;
        let started = Instant::now();
        grpc::put(&mut kv, KEY, "slow").await;
        // A put is acknowledged after its entry is fsynced, which sleeps 300 ms first.
        assert!(
            started.elapsed() >= Duration::from_millis(300),
            "{:?}",
            started.elapsed()
        );
    });
}

/// Puts `rounds` txns that each write keys `c000`..`c{keys-1}` (value = round number).
async fn write_rounds(
    kv: &mut keel_proto::etcdserverpb::kv_client::KvClient<tonic::transport::Channel>,
    rounds: usize,
    keys: usize,
) -> i64 {
    let mut rev = 0;
    for round in 0..rounds {
        let success = (0..keys)
            .map(|k| RequestOp {
                request: Some(request_op::Request::RequestPut(PutRequest {
                    key: format!("c{k:03}").into(),
                    value: round.to_string().into(),
                    ..Default::default()
                })),
            })
            .collect();
        rev = kv
            .txn(TxnRequest {
                success,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .header
            .unwrap()
            .revision;
    }
    rev
}

#[test]
fn crash_mid_compaction_keeps_the_compacted_state() {
    const ROUNDS: usize = 20;
    const KEYS: usize = 100;
    let mut keel = start_with_failpoints("compact_mid=return");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (rev, hash) = rt.block_on(async {
        let mut kv = grpc::kv(&keel.endpoint()).await;
        // 19 superseded records per key: 1900 to remove, more than the 1000 removed inline,
        // so the background remover runs and hits the failpoint after its first batch.
        let rev = write_rounds(&mut kv, ROUNDS, KEYS).await;
        let mut m = grpc::maintenance(&keel.endpoint()).await;
        let hash = m
            .hash_kv(HashKvRequest { revision: rev })
            .await
            .unwrap()
            .into_inner()
            .hash;
        // The answer may lose the race with the crash; the compaction is committed either way.
        let _ = kv
            .compact(CompactionRequest {
                revision: rev,
                physical: false,
            })
            .await;
        (rev, hash)
    });
    assert_crashed_at(&mut keel, "compact_mid");
    keel.set_failpoints(None);
    keel.restart();
    rt.block_on(async {
        let mut kv = grpc::kv(&keel.endpoint()).await;
        let all = grpc::range(&mut kv, b"c", &grpc::prefix_end(b"c")).await;
        assert_eq!(all.kvs.len(), KEYS);
        for k in &all.kvs {
            assert_eq!(k.value, (ROUNDS - 1).to_string().into_bytes());
            assert_eq!(k.version, ROUNDS as i64);
            assert_eq!(k.mod_revision, rev);
        }
        let old = kv
            .range(RangeRequest {
                key: b"c000".to_vec(),
                revision: rev - 1,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert!(old.message().contains("compacted"), "{old:?}");
        let mut m = grpc::maintenance(&keel.endpoint()).await;
        let after = m
            .hash_kv(HashKvRequest { revision: rev })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            after.hash, hash,
            "the key-value state at {rev} is unchanged"
        );
        assert_eq!(after.compact_revision, rev);
    });
}

#[test]
fn crash_mid_defragment_loses_nothing() {
    let mut keel = start_with_failpoints("defrag_mid=return");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let rev = rt.block_on(async {
        let mut kv = grpc::kv(&keel.endpoint()).await;
        let rev = write_rounds(&mut kv, 3, 10).await;
        let mut m = grpc::maintenance(&keel.endpoint()).await;
        m.defragment(DefragmentRequest {})
            .await
            .expect_err("the member aborts inside Defragment");
        rev
    });
    assert_crashed_at(&mut keel, "defrag_mid");
    keel.set_failpoints(None);
    keel.restart();
    rt.block_on(async {
        let mut m = grpc::maintenance(&keel.endpoint()).await;
        m.defragment(DefragmentRequest {}).await.unwrap();
        let mut kv = grpc::kv(&keel.endpoint()).await;
        let all = grpc::range(&mut kv, b"c", &grpc::prefix_end(b"c")).await;
        assert_eq!(all.kvs.len(), 10);
        assert!(
            all.kvs
                .iter()
                .all(|k| k.mod_revision == rev && k.value == b"2")
        );
    });
}

#[test]
fn crash_after_the_defragment_switch_opens_the_new_generation_with_every_write() {
    let mut keel = start_with_failpoints("defrag_switch=return");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let rev = rt.block_on(async {
        let mut kv = grpc::kv(&keel.endpoint()).await;
        let rev = write_rounds(&mut kv, 3, 10).await;
        let mut m = grpc::maintenance(&keel.endpoint()).await;
        m.defragment(DefragmentRequest {})
            .await
            .expect_err("the member aborts inside Defragment");
        rev
    });
    assert_crashed_at(&mut keel, "defrag_switch");
    let member = keel.data_dir().join("member");
    assert_eq!(
        std::fs::read_link(member.join("db")).unwrap().to_str(),
        Some("db.gen-1"),
        "the link names the new generation"
    );
    keel.set_failpoints(None);
    keel.restart();
    assert!(
        !member.join("db.gen-0").exists(),
        "the start removes the old generation"
    );
    rt.block_on(async {
        let mut kv = grpc::kv(&keel.endpoint()).await;
        let all = grpc::range(&mut kv, b"c", &grpc::prefix_end(b"c")).await;
        assert_eq!(all.kvs.len(), 10);
        assert!(
            all.kvs
                .iter()
                .all(|k| k.mod_revision == rev && k.value == b"2")
        );
        // Writes go on in the new generation and survive the next restart.
        grpc::put(&mut kv, "after", "x").await;
    });
    keel.kill9();
    keel.restart();
    rt.block_on(async {
        let mut kv = grpc::kv(&keel.endpoint()).await;
        let after = grpc::range(&mut kv, b"after", b"").await;
        assert_eq!(after.kvs.len(), 1);
    });
}

#[test]
fn crash_mid_snapshot_install_finishes_the_install_on_restart() {
    const KEYS: usize = 300;
    // Snapshot every 100 entries and keep only 10 after it, so a member that misses 300
    // writes must be sent a snapshot.
    let mut c = Cluster::start(
        &keel_bin(),
        3,
        &[
            "--snapshot-count",
            "100",
            "--experimental-snapshot-catchup-entries",
            "10",
        ],
    );
    let leader = c.leader(Duration::from_secs(20));
    let lagger = (0..3).find(|i| *i != leader).unwrap();
    c.members[lagger].kill9();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut kv = grpc::kv(&c.members[leader].endpoint()).await;
        for k in 0..KEYS {
            grpc::put(&mut kv, &format!("s{k:03}"), "x").await;
        }
    });
    // The lagger gets a snapshot only once the leader dropped the entries it misses. The
    // leader purges its log after a snapshot unless a replication request covering those
    // entries is in flight (openraft retries to the dead lagger); wait for the purge, or the
    // lagger may come back in time to be sent the entries.
    let purged = c.members[leader].wait_for_raft_log_compaction(100, Duration::from_secs(20));
    assert!(
        purged,
        "the leader kept its log while the lagger was down\n{}",
        c.log_tails()
    );
    c.members[lagger].set_failpoints(Some("snapshot_install_mid=return"));
    c.members[lagger].spawn();
    let status = c.members[lagger]
        .wait_exit(CRASH_TIMEOUT)
        .unwrap_or_else(|| panic!("no crash in the snapshot install\n{}", c.log_tails()));
    assert_eq!(status.signal(), Some(libc::SIGABRT), "{}", c.log_tails());
    assert!(
        c.members[lagger]
            .log()
            .contains("keel: failpoint snapshot_install_mid fired: aborting")
    );
    c.members[lagger].set_failpoints(None);
    c.members[lagger].spawn();
    c.wait_ready(&[lagger]);
    assert!(
        c.members[lagger]
            .log()
            .contains("finishing a snapshot install interrupted by a crash"),
        "{}",
        c.members[lagger].log_tail()
    );
    rt.block_on(async {
        let mut kv = grpc::kv(&c.members[lagger].endpoint()).await;
        let all = grpc::range(&mut kv, b"s", &grpc::prefix_end(b"s")).await;
        assert_eq!(all.kvs.len(), KEYS);
        let rev = all.header.unwrap().revision;
        let hash_of = |i: usize| {
            let endpoint = c.members[i].endpoint();
            async move {
                grpc::maintenance(&endpoint)
                    .await
                    .hash_kv(HashKvRequest { revision: rev })
                    .await
                    .unwrap()
                    .into_inner()
                    .hash
            }
        };
        assert_eq!(hash_of(lagger).await, hash_of(leader).await);
    });
}

/// A linearizable Range of `key` on `endpoint` with a 3 s deadline.
fn linearizable_get(endpoint: &str, key: &str) -> Result<Vec<u8>, tonic::Status> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let channel = grpc::channel(endpoint, Duration::from_secs(3))
            .await
            .map_err(tonic::Status::unavailable)?;
        let resp = keel_proto::etcdserverpb::kv_client::KvClient::new(channel)
            .range(RangeRequest {
                key: key.into(),
                ..Default::default()
            })
            .await?
            .into_inner();
        Ok(resp
            .kvs
            .first()
            .map(|k| k.value.clone())
            .unwrap_or_default())
    })
}

#[test]
fn stale_read_failpoint_skips_read_index() {
    let mut c = Cluster::start(&keel_bin(), 3, &[]);
    let stale = 2;
    c.members[stale].terminate();
    c.members[stale].set_failpoints(Some("linearizable_read_stale=return"));
    c.members[stale].spawn();
    c.wait_ready(&[stale]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut kv = grpc::kv(&c.members[0].endpoint()).await;
        grpc::put(&mut kv, "r", "before").await;
    });
    let applied = c.status(0).unwrap().raft_applied_index;
    c.wait_applied(applied, Duration::from_secs(10));

    // With the other two members frozen no ReadIndex can succeed, yet the failpoint member
    // answers a linearizable read from its local state.
    c.members[0].pause();
    c.members[1].pause();
    let got = linearizable_get(&c.members[stale].endpoint(), "r");
    c.members[0].resume();
    c.members[1].resume();
    assert_eq!(got.expect("served without ReadIndex"), b"before");

    // Control: a member without the failpoint cannot serve it in the same situation.
    c.members[0].pause();
    c.members[stale].pause();
    let control = linearizable_get(&c.members[1].endpoint(), "r");
    c.members[0].resume();
    c.members[stale].resume();
    assert!(control.is_err(), "{control:?}");
}
