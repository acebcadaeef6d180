//! Auto-compaction and the compact-hash check on real members (issue 15 parts 6 and 5c):
//!
//! - periodic mode with a 5 s retention compacts on etcd's schedule: every ~5 s, to the
//!   revision the store had 5–5.5 s earlier (11 samples half a second apart), and only the
//!   leader starts compactions (followers apply them through raft);
//! - revision mode keeps the last N revisions and skips an unchanged target;
//! - the compact-hash check raises CORRUPT naming the member whose store was altered;
//! - a member SIGKILLed while an auto-compaction's records are being removed restarts with
//!   every acknowledged write, and finishes the removal.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use keel_proto::etcdserverpb::{
    Compare, HashKvRequest, PutRequest, RangeRequest, RequestOp, TxnRequest, request_op,
};
use keel_testkit::etcdctl::etcdctl;
use keel_testkit::{Member, grpc};

use crate::corrupt::{assert_corrupt_everywhere, corrupt_value};
use crate::{cluster, keel_bin, member};

/// The compact revision `endpoint` reports (`HashKV.compact_revision`; -1 before the first
/// compaction).
async fn compact_revision(endpoint: &str) -> i64 {
    let mut m = grpc::maintenance(endpoint).await;
    m.hash_kv(HashKvRequest { revision: 0 })
        .await
        .unwrap_or_else(|s| panic!("hashkv on {endpoint}: {s:?}"))
        .into_inner()
        .compact_revision
}

/// Whether a Range at `revision` is refused as compacted.
async fn compacted_at(endpoint: &str, revision: i64) -> bool {
    let mut kv = grpc::kv(endpoint).await;
    let r = kv
        .range(RangeRequest {
            key: b"a".to_vec(),
            revision,
            serializable: true,
            ..Default::default()
        })
        .await;
    match r {
        Ok(_) => false,
        Err(s) if s.message() == "etcdserver: mvcc: required revision has been compacted" => true,
        Err(s) => panic!("range at {revision}: {s:?}"),
    }
}

/// The revisions in `log`'s lines that contain `message` (the `revision=N` field).
fn logged_revisions(log: &str, message: &str) -> Vec<i64> {
    log.lines()
        .filter(|l| l.contains(message))
        .filter_map(|l| {
            let rest = l.split_once(" revision=")?.1;
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

#[test]
fn periodic_five_seconds_compacts_to_the_revision_seen_five_seconds_earlier_on_the_leader_only() {
    let (_alone, c) = cluster(3, &["--auto-compaction-retention=5s"]);
    let leader = c.leader(Duration::from_secs(10));
    let leader_ep = c.members[leader].endpoint();
    let rt = grpc::runtime();
    // One put every 100 ms for 17 s; the leader's compact revision is read between puts.
    // `written[i]` = (time, revision) of each put; `seen` = (time, compact revision) of each
    // change observed.
    let (written, seen) = rt.block_on(async {
        let mut kv = grpc::kv(&leader_ep).await;
        let start = Instant::now();
        let mut written = Vec::new();
        let mut seen: Vec<(Instant, i64)> = Vec::new();
        while start.elapsed() < Duration::from_secs(17) {
            let rev = grpc::put(&mut kv, "a", "v").await;
            written.push((Instant::now(), rev));
            let compact = compact_revision(&leader_ep).await;
            if seen.last().is_none_or(|&(_, c)| c != compact) {
                seen.push((Instant::now(), compact));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (written, seen)
    });
    let first_written = written[0].1;
    // Compactions to a revision written by this test (the first ones compact to the
    // revision the leader saw at start, before any put).
    let real: Vec<(Instant, i64)> = seen
        .iter()
        .copied()
        .filter(|&(_, c)| c > first_written)
        .collect();
    assert!(
        real.len() >= 2,
        "at least two compactions to written revisions in 17 s: {seen:?}\n{}",
        c.log_tails()
    );
    for &(at, compact) in &real {
        let (written_at, _) = written
            .iter()
            .find(|&&(_, r)| r == compact)
            .expect("compacted to a revision this test wrote");
        let age = at.duration_since(*written_at);
        eprintln!("compacted to revision {compact}, written {age:?} before it was seen");
        assert!(
            (Duration::from_millis(4800)..=Duration::from_millis(6500)).contains(&age),
            "compacted to revision {compact}, written {age:?} before the compaction was seen (etcd's schedule: 5 to 5.5 s)"
        );
    }
    for pair in real.windows(2) {
        let gap = pair[1].0.duration_since(pair[0].0);
        assert!(
            (Duration::from_millis(4400)..=Duration::from_millis(6500)).contains(&gap),
            "compactions {gap:?} apart, expected every 5 s: {real:?}"
        );
    }
    // Real revisions: a read below the compact revision is refused, at it served.
    let last = real.last().unwrap().1;
    rt.block_on(async {
        for m in &c.members {
            let ep = m.endpoint();
            assert!(compacted_at(&ep, last - 1).await, "{ep}");
            assert!(!compacted_at(&ep, last).await, "{ep}");
        }
    });
    // Only the leader started compactions; every member applied them.
    let leader_log = c.members[leader].log();
    let started = logged_revisions(&leader_log, "starting auto periodic compaction");
    let completed = logged_revisions(&leader_log, "completed auto periodic compaction");
    for &(_, compact) in &real {
        assert!(started.contains(&compact), "{started:?} lacks {compact}");
        assert!(
            completed.contains(&compact),
            "{completed:?} lacks {compact}"
        );
    }
    for (i, m) in c.members.iter().enumerate().filter(|&(i, _)| i != leader) {
        let log = m.log();
        assert!(log.contains("auto-compaction enabled"), "member {i}");
        assert_eq!(
            logged_revisions(&log, "starting auto periodic compaction"),
            Vec::<i64>::new(),
            "follower {i} started a compaction"
        );
        assert!(
            rt.block_on(compact_revision(&m.endpoint())) >= last,
            "follower {i} applied the leader's compactions"
        );
    }
}

#[test]
fn revision_mode_keeps_the_last_n_revisions() {
    let (_guard, keel) = member(&[
        "--auto-compaction-mode=revision",
        "--auto-compaction-retention=10",
        "--auto-compaction-revision-interval=1s",
    ]);
    let ep = keel.endpoint();
    let rt = grpc::runtime();
    rt.block_on(async {
        let mut kv = grpc::kv(&ep).await;
        let mut rev = 0;
        for i in 0..30 {
            rev = grpc::put(&mut kv, "a", format!("v{i}")).await;
        }
        let wait_for = |target: i64| {
            let ep = ep.clone();
            async move {
                let deadline = Instant::now() + Duration::from_secs(15);
                while compact_revision(&ep).await != target {
                    assert!(Instant::now() < deadline, "compact revision never {target}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        wait_for(rev - 10).await;
        assert!(compacted_at(&ep, rev - 11).await);
        assert!(
            !compacted_at(&ep, rev - 10).await,
            "the last 10 revisions and the current one"
        );
        for i in 0..5 {
            rev = grpc::put(&mut kv, "a", format!("w{i}")).await;
        }
        wait_for(rev - 10).await;
        // No writes: the same target is not compacted again (etcd's `rev == prev`).
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert_eq!(compact_revision(&ep).await, rev - 10);
        let log = keel.log();
        let started = logged_revisions(&log, "starting auto revision compaction");
        assert_eq!(
            started.iter().filter(|&&r| r == rev - 10).count(),
            1,
            "{started:?}"
        );
    });
}

#[test]
fn compact_hash_check_raises_corrupt_for_the_member_whose_store_differs() {
    let (_alone, mut c) = cluster(
        3,
        &[
            "--experimental-initial-corrupt-check=false",
            "--experimental-compact-hash-check-enabled",
            "--experimental-compact-hash-check-time=1s",
        ],
    );
    etcdctl(&c.endpoints(), &["put", "a", "1"]).ok();
    etcdctl(&c.endpoints(), &["put", "b", "2"]).ok();
    let leader = c.leader(Duration::from_secs(10));
    let f = (leader + 1) % 3;
    std::thread::sleep(Duration::from_millis(500));
    c.members[f].terminate();
    corrupt_value(&c.members[f], b"a");
    c.members[f].restart();
    // No alarm yet: nothing was compacted, so there is no hash to compare.
    std::thread::sleep(Duration::from_millis(2500));
    let leader_ep = c.members[leader].endpoint();
    assert_eq!(
        grpc::status(&leader_ep).unwrap().errors,
        Vec::<String>::new()
    );
    etcdctl(&c.endpoints(), &["put", "b", "3"]).ok();
    let rev = keel_testkit::etcdctl::revision(&c.endpoints());
    etcdctl(&c.endpoints(), &["compact", &rev.to_string()]).ok();
    assert_corrupt_everywhere(&c, f);
    let leader_log = c.members[leader].log();
    assert!(
        leader_log.contains("Detected compaction hash mismatch"),
        "raised by the compact-hash check"
    );
    assert!(
        !leader_log.contains("found data inconsistency with peers"),
        "not by the periodic check (off)"
    );
}

/// Keys overwritten by [`write_history`].
const HOT_KEYS: usize = 128;
/// Txns of [`HOT_KEYS`] puts: `(TXNS - 1) * HOT_KEYS` superseded records to remove.
const TXNS: usize = 400;

/// Writes [`TXNS`] txns, each putting every hot key `h{k}` = `t{txn}`.
async fn write_history(endpoint: &str) -> i64 {
    let mut kv = grpc::kv(endpoint).await;
    let mut rev = 0;
    for t in 0..TXNS {
        let success = (0..HOT_KEYS)
            .map(|k| RequestOp {
                request: Some(request_op::Request::RequestPut(PutRequest {
                    key: format!("h{k:03}").into_bytes(),
                    value: format!("t{t}").into_bytes(),
                    ..Default::default()
                })),
            })
            .collect();
        let resp = kv
            .txn(TxnRequest {
                compare: Vec::<Compare>::new(),
                success,
                failure: vec![],
            })
            .await
            .expect("txn")
            .into_inner();
        rev = resp.header.unwrap().revision;
    }
    rev
}

#[test]
fn sigkill_during_an_auto_compaction_loses_no_acknowledged_write() {
    let (_guard, mut first) = member(&[]);
    let rt = grpc::runtime();
    let history_rev = rt.block_on(write_history(&first.endpoint()));
    first.terminate();
    // The same data dir and ports, now with auto-compaction: its first round (after 1 s)
    // compacts every superseded record at once, most of them in the background.
    let spec = first.spec().clone().args([
        "--auto-compaction-mode=revision",
        "--auto-compaction-retention=1",
        "--auto-compaction-revision-interval=1s",
    ]);
    let mut keel = Member::new(&keel_bin(), spec);
    keel.restart();
    let ep = keel.endpoint();
    // A writer of unique keys until the kill: each acknowledged key must survive.
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    let writer = {
        let (stop, acked, ep) = (stop.clone(), acked.clone(), ep.clone());
        std::thread::spawn(move || {
            grpc::runtime().block_on(async {
                let mut kv = grpc::kv(&ep).await;
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("ack{i:05}");
                    let put = PutRequest {
                        key: key.clone().into_bytes(),
                        value: b"x".to_vec(),
                        ..Default::default()
                    };
                    match tokio::time::timeout(Duration::from_secs(2), kv.put(put)).await {
                        Ok(Ok(_)) => acked.lock().unwrap().push(key),
                        _ => return,
                    }
                    i += 1;
                }
            })
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while logged_revisions(&keel.log(), "completed auto revision compaction").is_empty() {
        assert!(
            Instant::now() < deadline,
            "no auto-compaction\n{}",
            keel.log_tail()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    keel.kill9();
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let compacted = logged_revisions(&keel.log(), "completed auto revision compaction")[0];
    assert!(
        compacted >= history_rev - 1,
        "{compacted} < {history_rev} - 1"
    );
    let acked = acked.lock().unwrap().clone();
    keel.restart();
    // Killed in the middle: the restart found records of the compaction left to remove, or
    // the compaction's apply had not reached sled yet (sled flushes every 500 ms; the WAL
    // replays the compaction entry after the rebuild). Either way it was not finished.
    let log = keel.log();
    let rebuilt = log
        .lines()
        .rfind(|l| l.contains("mvcc: key index rebuilt"))
        .expect("rebuild line");
    let field = |name: &str| -> i64 {
        let (_, rest) = rebuilt.split_once(name).expect(name);
        let digits: String = rest
            .chars()
            .take_while(|c| *c == '-' || c.is_ascii_digit())
            .collect();
        digits.parse().expect(name)
    };
    let leftovers = field("leftover_records=");
    let stored_compaction = field("compact_revision=");
    assert!(
        leftovers > 0 || stored_compaction < compacted,
        "the kill came after the removal: {rebuilt}"
    );
    rt.block_on(async {
        let mut kv = grpc::kv(&ep).await;
        let hot = grpc::range(&mut kv, b"h", b"i").await;
        assert_eq!(hot.kvs.len(), HOT_KEYS);
        for kv in &hot.kvs {
            assert_eq!(kv.value, format!("t{}", TXNS - 1).into_bytes());
            assert_eq!(kv.version, TXNS as i64);
        }
        let written = grpc::range(&mut kv, b"ack", b"acl").await;
        let keys: Vec<String> = written
            .kvs
            .iter()
            .map(|kv| String::from_utf8(kv.key.clone()).unwrap())
            .collect();
        for key in &acked {
            assert!(keys.contains(key), "acknowledged {key} lost");
        }
        assert!(compact_revision(&ep).await >= compacted);
        assert!(compacted_at(&ep, compacted - 1).await);
    });
    // The restarted member removes what the crash left.
    let since_restart = log.rfind("mvcc: key index rebuilt").unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !keel.log()[since_restart..].contains("mvcc: physical compaction done") {
        assert!(Instant::now() < deadline, "leftovers never removed");
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "killed with {leftovers} of {} records left (stored compact revision \
         {stored_compaction}, compacted to {compacted}); {} acknowledged writes during the \
         compaction",
        (TXNS - 1) * HOT_KEYS,
        acked.len()
    );
}
