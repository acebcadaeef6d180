//! Online defragment (issue 15 part 4): `etcdctl defrag` on a live member rewrites its store
//! into a fresh database while reads and writes go on, the file shrinks to about the live
//! data (`Status.dbSize`, `etcdctl endpoint status`), and every acknowledged write, the
//! revision and the HashKV survive it and a restart. The stalls it measures are in
//! docs/benchmarks.md ("Online defragment").

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use keel_proto::etcdserverpb::{CompactionRequest, DeleteRangeRequest, PutRequest, RangeRequest};
use keel_testkit::etcdctl::{etcdctl, hashkv};
use keel_testkit::{Member, grpc};

use crate::keel_bin;

const KEYS: usize = 20_000;
const VALUE: usize = 1024;
const DELETED: usize = KEYS * 3 / 4;

fn key(i: usize) -> Vec<u8> {
    format!("k/{i:05}").into_bytes()
}

/// Writes `KEYS` keys of 1 KiB, 100 per txn.
async fn fill(endpoint: &str) {
    let mut kv = grpc::kv(endpoint).await;
    let kvs = (0..KEYS).map(|i| (key(i), vec![b'v'; VALUE]));
    grpc::put_all(&mut kv, kvs, 100).await;
}

/// Longest call of a loop that ran `op` until `stop`, how many calls it made, and every
/// call's start and duration (to tell stalls during the defragment from the box's own).
#[derive(Debug, Default, Clone)]
struct Stalls {
    max: Duration,
    /// When the longest call began.
    at: Option<Instant>,
    calls: usize,
    each: Vec<(Instant, Duration)>,
}

impl Stalls {
    fn record(&mut self, began: Instant) {
        let took = began.elapsed();
        if took > self.max {
            (self.max, self.at) = (took, Some(began));
        }
        self.calls += 1;
        self.each.push((began, took));
    }

    /// The longest call that overlapped `[from, to]` (`inside`), or that did not.
    fn longest(&self, from: Instant, to: Instant, inside: bool) -> Duration {
        self.each
            .iter()
            .filter(|(began, took)| (*began <= to && *began + *took >= from) == inside)
            .map(|(_, took)| *took)
            .max()
            .unwrap_or_default()
    }
}

#[test]
fn defrag_shrinks_a_live_store_while_reads_and_writes_go_on() {
    let _alone = keel_testkit::schedule::exclusive();
    let mut keel = Member::start_with(&keel_bin(), &[]);
    let ep = keel.endpoint();
    let rt = grpc::runtime();
    rt.block_on(fill(&ep));
    // Delete 75%, compact physically: the records are gone, the file keeps its size.
    let rev = rt.block_on(async {
        let mut kv = grpc::kv(&ep).await;
        let del = kv
            .delete_range(DeleteRangeRequest {
                key: key(0),
                range_end: key(DELETED),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(del.deleted, DELETED as i64);
        let rev = del.header.unwrap().revision;
        kv.compact(CompactionRequest {
            revision: rev,
            physical: true,
        })
        .await
        .unwrap();
        rev
    });
    let hash_before = hashkv(&ep, rev);
    // Status.dbSize is refreshed every second.
    std::thread::sleep(Duration::from_millis(1500));
    let before = grpc::status(&ep).unwrap().db_size;

    // Readers and a writer run through the defragment; each records its longest call.
    let stop = Arc::new(AtomicBool::new(false));
    let reader = |serializable: bool| {
        let (ep, stop) = (ep.clone(), stop.clone());
        rt.spawn(async move {
            let mut kv = grpc::kv(&ep).await;
            let mut s = Stalls::default();
            while !stop.load(Ordering::Acquire) {
                let t = Instant::now();
                let r = kv
                    .range(RangeRequest {
                        key: key(KEYS - 1 - s.calls % 1000),
                        serializable,
                        ..Default::default()
                    })
                    .await
                    .unwrap()
                    .into_inner();
                s.record(t);
                assert_eq!(r.kvs.len(), 1);
            }
            s
        })
    };
    let writer = {
        let (ep, stop) = (ep.clone(), stop.clone());
        rt.spawn(async move {
            let mut kv = grpc::kv(&ep).await;
            let (mut s, mut acked) = (Stalls::default(), Vec::new());
            while !stop.load(Ordering::Acquire) {
                let t = Instant::now();
                let k = format!("w/{:05}", s.calls).into_bytes();
                let r = kv
                    .put(PutRequest {
                        key: k.clone(),
                        value: b"during".to_vec(),
                        ..Default::default()
                    })
                    .await
                    .unwrap()
                    .into_inner();
                let rev = r.header.unwrap().revision;
                acked.push((k, rev));
                s.record(t);
            }
            (s, acked)
        })
    };
    let (linearizable, serializable) = (reader(false), reader(true));
    // 2 s of calls before the defragment: the box's own stalls, to compare with.
    std::thread::sleep(Duration::from_secs(2));
    let started = Instant::now();
    eprintln!("defrag starts at {:?}", std::time::SystemTime::now());
    // etcdctl's default 5 s command timeout is short for a debug build on a busy box.
    let out = etcdctl(&ep, &["defrag", "--command-timeout=60s"]);
    let took = started.elapsed();
    let ended = Instant::now();
    out.ok();
    assert!(
        out.lines()
            .iter()
            .any(|l| l.starts_with("Finished defragmenting etcd member[")),
        "{:?}",
        out.lines()
    );
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Release);
    let reads = rt.block_on(linearizable).unwrap();
    let local_reads = rt.block_on(serializable).unwrap();
    let (writes, acked) = rt.block_on(writer).unwrap();
    let since = |s: &Stalls| s.at.map(|a| a.saturating_duration_since(started));
    eprintln!(
        "defrag of {KEYS} x {VALUE} B with {DELETED} deleted: dbSize {before} -> {} bytes, \
         defrag {took:?}; longest linearizable read {:?} (at +{:?}) of {}, serializable \
         {:?} (at +{:?}) of {}, write {:?} (at +{:?}) of {}",
        grpc::status(&ep).unwrap().db_size,
        reads.max,
        since(&reads),
        reads.calls,
        local_reads.max,
        since(&local_reads),
        local_reads.calls,
        writes.max,
        since(&writes),
        writes.calls
    );
    let window = |s: &Stalls, inside| s.longest(started, ended, inside);
    eprintln!(
        "longest calls overlapping the defrag: linearizable read {:?}, serializable read {:?}, \
         write {:?}; outside it: {:?}, {:?}, {:?}",
        window(&reads, true),
        window(&local_reads, true),
        window(&writes, true),
        window(&reads, false),
        window(&local_reads, false),
        window(&writes, false)
    );
    let log = std::fs::read_to_string(keel.log_path()).unwrap_or_default();
    for line in log.lines().filter(|l| l.contains("defragment: ")) {
        eprintln!("{line}");
    }
    assert!(reads.calls > 0 && writes.calls > 0);
    // Generous bounds for a shared 2-core box; the numbers of a quiet run are in
    // docs/benchmarks.md.
    assert!(
        local_reads.max < Duration::from_secs(1),
        "a serializable read waited {:?}",
        local_reads.max
    );

    // The file shrank, and both Status and etcdctl say so.
    let after = grpc::status(&ep).unwrap().db_size;
    assert!(
        after * 100 <= before * 60,
        "dbSize {before} -> {after}: not at most 60%"
    );
    let status = etcdctl(&ep, &["endpoint", "status", "-w", "json"]).json();
    let shown = status[0]["Status"]["dbSize"].as_i64().unwrap();
    assert!(shown * 100 <= before * 60, "etcdctl shows dbSize {shown}");

    let check = |keel: &Member| {
        let ep = keel.endpoint();
        assert_eq!(hashkv(&ep, rev), hash_before, "HashKV at {rev} unchanged");
        rt.block_on(async {
            let mut kv = grpc::kv(&ep).await;
            let live = grpc::range(&mut kv, b"k/", &grpc::prefix_end(b"k/")).await;
            assert_eq!(live.kvs.len(), KEYS - DELETED);
            assert!(live.kvs.iter().all(|kv| kv.value.len() == VALUE));
            let during = grpc::range(&mut kv, b"w/", &grpc::prefix_end(b"w/")).await;
            assert_eq!(
                during.kvs.len(),
                acked.len(),
                "every acknowledged write is there"
            );
            for (kv, (k, rev)) in during.kvs.iter().zip(&acked) {
                assert_eq!((&kv.key, kv.mod_revision), (k, *rev));
            }
        });
    };
    check(&keel);
    // A crash and restart open the new generation (every acknowledged write is in it); the
    // old one is gone.
    keel.kill9();
    keel.restart();
    check(&keel);
    let member = keel.data_dir().join("member");
    let link = std::fs::read_link(member.join("db")).unwrap();
    assert_eq!(link.to_str(), Some("db.gen-1"));
    let generations: Vec<_> = std::fs::read_dir(&member)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("db.gen-"))
        .collect();
    assert_eq!(generations, ["db.gen-1"]);
}

#[test]
fn defrag_twice_and_after_a_restart_keeps_every_key() {
    let (_guard, mut keel) = crate::member(&[]);
    let ep = keel.endpoint();
    for round in 0..3 {
        etcdctl(&ep, &["put", &format!("r{round}"), "x"]).ok();
        etcdctl(&ep, &["defrag"]).ok();
        if round == 1 {
            keel.terminate();
            keel.restart();
        }
    }
    let out = etcdctl(&ep, &["get", "r", "--prefix", "--keys-only"]);
    assert_eq!(out.ok().lines(), ["r0", "", "r1", "", "r2", ""]);
    let link = std::fs::read_link(keel.data_dir().join("member/db")).unwrap();
    assert_eq!(link.to_str(), Some("db.gen-3"));
}
