//! The Watch service end to end: the real `etcdctl watch` and the generated gRPC
//! `WatchClient` against real `keel` processes (one member, and a three-member cluster to
//! watch on followers). Expected outputs are etcd 3.4's (see
//! `../shared/conformance/cases/{watch,grpc-watch}`).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use keel_proto::etcdserverpb::kv_client::KvClient;
use keel_proto::etcdserverpb::request_op::Request as Op;
use keel_proto::etcdserverpb::watch_request::RequestUnion;
use keel_proto::etcdserverpb::{
    CompactionRequest, PutRequest, RequestOp, TxnRequest, WatchCancelRequest, WatchCreateRequest,
    WatchProgressRequest, WatchRequest, WatchResponse,
};
use keel_proto::mvccpb::event::EventType;
use keel_testkit::Member;
use keel_testkit::etcdctl::{self, etcdctl};
use keel_testkit::grpc::{self, put, runtime};
use keel_testkit::process::{KillOnDrop, rss_kib};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::transport::Channel;

use crate::{cluster, member};

/// How long a test waits for one expected watch response.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);

/// A KV client without a per-RPC deadline (the tests bound their own loops).
async fn kv(endpoint: &str) -> KvClient<Channel> {
    KvClient::new(grpc::stream_channel(endpoint).await)
}

/// One watch stream: requests go in through `tx`, responses come out of `rx`.
struct WatchConn {
    tx: mpsc::Sender<WatchRequest>,
    rx: Streaming<WatchResponse>,
}

impl WatchConn {
    async fn open(endpoint: &str) -> WatchConn {
        let (tx, requests) = mpsc::channel(16);
        let rx = grpc::watch(endpoint)
            .await
            .watch(ReceiverStream::new(requests))
            .await
            .unwrap_or_else(|s| panic!("watch: {s:?}"))
            .into_inner();
        WatchConn { tx, rx }
    }

    async fn send(&self, request: RequestUnion) {
        self.tx
            .send(WatchRequest {
                request_union: Some(request),
            })
            .await
            .expect("send watch request");
    }

    async fn create(&self, create: WatchCreateRequest) {
        self.send(RequestUnion::CreateRequest(create)).await;
    }

    async fn next(&mut self) -> WatchResponse {
        match tokio::time::timeout(RESPONSE_TIMEOUT, self.rx.message()).await {
            Ok(Ok(Some(r))) => r,
            other => panic!("no watch response within {RESPONSE_TIMEOUT:?}: {other:?}"),
        }
    }

    /// Asserts that nothing arrives for `quiet`.
    async fn expect_nothing(&mut self, quiet: Duration) {
        if let Ok(r) = tokio::time::timeout(quiet, self.rx.message()).await {
            panic!("unexpected watch response: {r:?}");
        }
    }
}

fn header_rev(r: &WatchResponse) -> i64 {
    r.header.as_ref().map_or(-1, |h| h.revision)
}

/// `(type, key, mod_revision, value)` of each event.
fn events(r: &WatchResponse) -> Vec<(String, String, i64, String)> {
    r.events
        .iter()
        .map(|e| {
            let kv = e.kv.as_ref().expect("kv");
            let t = if e.r#type == EventType::Delete as i32 {
                "DELETE"
            } else {
                "PUT"
            };
            (
                t.into(),
                String::from_utf8_lossy(&kv.key).into(),
                kv.mod_revision,
                String::from_utf8_lossy(&kv.value).into(),
            )
        })
        .collect()
}

fn ev(t: &str, key: &str, rev: i64, value: &str) -> (String, String, i64, String) {
    (t.into(), key.into(), rev, value.into())
}

/// A background `etcdctl watch ...` whose stdout goes to a file.
struct BgCtl {
    child: KillOnDrop,
    out: PathBuf,
    _dir: tempfile::TempDir,
}

impl BgCtl {
    fn start(endpoint: &str, args: &[&str]) -> BgCtl {
        let dir = tempfile::tempdir().expect("temp dir");
        let out = dir.path().join("stdout");
        let file = std::fs::File::create(&out).expect("stdout file");
        let child = etcdctl::command(endpoint, args)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn etcdctl");
        BgCtl {
            child: KillOnDrop(child),
            out,
            _dir: dir,
        }
    }

    fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Waits until stdout has `n` lines (bounded), then stops etcdctl and returns them.
    fn stop_after(mut self, n: usize) -> Vec<String> {
        let deadline = Instant::now() + RESPONSE_TIMEOUT;
        while self.lines().len() < n && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(300)); // anything extra shows up too
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.lines()
    }

    /// Waits (bounded) for etcdctl to exit on its own; returns (exit code, stdout, stderr).
    fn wait_exit(mut self) -> (Option<i32>, Vec<String>, String) {
        let deadline = Instant::now() + RESPONSE_TIMEOUT;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                let mut err = String::new();
                if let Some(mut e) = self.child.stderr.take() {
                    use std::io::Read;
                    let _ = e.read_to_string(&mut err);
                }
                return (status.code(), self.lines(), err);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("etcdctl did not exit within {RESPONSE_TIMEOUT:?}");
    }
}

#[test]
fn etcdctl_watch_replays_history_then_follows_live_writes() {
    let (_guard, keel) = member(&[]);
    let ep = keel.endpoint();
    etcdctl(&ep, &["put", "foo", "1"]).ok();
    etcdctl(&ep, &["put", "bar", "x"]).ok();
    etcdctl(&ep, &["put", "foo", "2"]).ok();
    etcdctl(&ep, &["del", "foo"]).ok();
    let watch = BgCtl::start(&ep, &["watch", "foo", "--rev=2", "--prev-kv"]);
    std::thread::sleep(Duration::from_millis(500));
    etcdctl(&ep, &["put", "foo", "3"]).ok();
    let lines = watch.stop_after(16);
    assert_eq!(
        lines,
        [
            "PUT", "foo", "1", "PUT", "foo", "1", "foo", "2", "DELETE", "foo", "2", "foo", "",
            "PUT", "foo", "3"
        ],
        "history (with prev values; a delete has an empty value), then the live put"
    );
}

#[test]
fn etcdctl_watch_prefix_sees_a_txn_and_a_compacted_start_is_canceled() {
    let (_guard, keel) = member(&[]);
    let ep = keel.endpoint();
    let watch = BgCtl::start(&ep, &["watch", "t", "--prefix"]);
    std::thread::sleep(Duration::from_millis(500));
    etcdctl::etcdctl_stdin(&ep, &["txn"], "\nput t1 a\nput t2 b\nput x c\n\n\n").ok();
    assert_eq!(watch.stop_after(6), ["PUT", "t1", "a", "PUT", "t2", "b"]);

    etcdctl(&ep, &["put", "c", "1"]).ok();
    etcdctl(&ep, &["put", "c", "2"]).ok();
    etcdctl(&ep, &["compact", "4"]).ok();
    let (code, out, err) = BgCtl::start(&ep, &["watch", "c", "--rev=3"]).wait_exit();
    assert!(out.is_empty(), "no events: {out:?}");
    assert!(
        err.contains("watch was canceled (etcdserver: mvcc: required revision has been compacted)"),
        "stderr: {err}"
    );
    assert_eq!(
        code,
        Some(5),
        "etcdctl's exit code for a watch canceled by the server"
    );
}

#[test]
fn grpc_watch_follows_etcd_semantics_on_one_stream() {
    let (_guard, keel) = member(&[]);
    grpc_watch_body(&keel);
}

/// The body of [`grpc_watch_follows_etcd_semantics_on_one_stream`] on any ready single member (also run over TLS by `tls.rs`).
pub(crate) fn grpc_watch_body(keel: &Member) {
    let ep = keel.endpoint();
    runtime().block_on(async {
        let mut kv = kv(&ep).await;
        let r1 = put(&mut kv, "k", b"1").await;
        let r2 = put(&mut kv, "k", b"2").await;
        let mut w = WatchConn::open(&ep).await;

        // A historical watch with prev_kv: created (header = current revision), then history.
        w.create(WatchCreateRequest {
            key: "k".into(),
            start_revision: r1,
            prev_kv: true,
            ..Default::default()
        })
        .await;
        let created = w.next().await;
        assert!(created.created && !created.canceled);
        assert_eq!((created.watch_id, header_rev(&created)), (0, r2));
        let hist = w.next().await;
        assert_eq!(
            events(&hist),
            vec![ev("PUT", "k", r1, "1"), ev("PUT", "k", r2, "2")]
        );
        assert!(hist.events[0].prev_kv.is_none(), "no prev_kv on a creation");
        assert_eq!(
            hist.events[1].prev_kv.as_ref().map(|p| p.value.clone()),
            Some(b"1".to_vec())
        );

        // Client-chosen ID, duplicate ID, invalid range: the stream stays usable.
        w.create(WatchCreateRequest {
            key: "t".into(),
            range_end: "u".into(),
            watch_id: 7,
            ..Default::default()
        })
        .await;
        w.create(WatchCreateRequest {
            key: "x".into(),
            watch_id: 7,
            ..Default::default()
        })
        .await;
        w.create(WatchCreateRequest {
            key: "b".into(),
            range_end: "a".into(),
            ..Default::default()
        })
        .await;
        let ok = w.next().await;
        assert_eq!((ok.watch_id, ok.created), (7, true));
        let dup = w.next().await;
        assert_eq!((dup.watch_id, dup.created, dup.canceled), (-1, true, true));
        assert_eq!(
            dup.cancel_reason,
            "mvcc: duplicate watch ID provided on the WatchStream"
        );
        let bad = w.next().await;
        assert_eq!(
            (bad.watch_id, bad.cancel_reason.as_str()),
            (-1, "mvcc: watcher range is empty")
        );

        // The events of one txn arrive in one response.
        let txn = kv
            .txn(TxnRequest {
                success: ["t1", "t2", "z"]
                    .iter()
                    .map(|k| RequestOp {
                        request: Some(Op::RequestPut(PutRequest {
                            key: (*k).into(),
                            value: b"v".to_vec(),
                            ..Default::default()
                        })),
                    })
                    .collect(),
                ..Default::default()
            })
            .await
            .expect("txn")
            .into_inner();
        let r3 = txn.header.expect("header").revision;
        let live = w.next().await;
        assert_eq!(live.watch_id, 7);
        assert_eq!(header_rev(&live), r3);
        assert_eq!(
            events(&live),
            vec![ev("PUT", "t1", r3, "v"), ev("PUT", "t2", r3, "v")]
        );

        // Progress: watch ID -1 and the current revision, after the events it covers.
        w.send(RequestUnion::ProgressRequest(WatchProgressRequest {}))
            .await;
        let progress = w.next().await;
        assert_eq!(
            (
                progress.watch_id,
                header_rev(&progress),
                progress.events.len()
            ),
            (-1, r3, 0)
        );

        // Cancel: an unknown ID gets nothing, a real one its canceled response.
        w.send(RequestUnion::CancelRequest(WatchCancelRequest {
            watch_id: 42,
        }))
        .await;
        w.send(RequestUnion::CancelRequest(WatchCancelRequest {
            watch_id: 0,
        }))
        .await;
        let canceled = w.next().await;
        assert_eq!(
            (canceled.watch_id, canceled.canceled, canceled.created),
            (0, true, false)
        );
        put(&mut kv, "k", b"3").await;
        w.expect_nothing(Duration::from_millis(500)).await;

        // A start revision below the compact revision: created, then canceled with it.
        kv.compact(CompactionRequest {
            revision: r2,
            physical: true,
        })
        .await
        .expect("compact");
        w.create(WatchCreateRequest {
            key: "k".into(),
            start_revision: r1,
            ..Default::default()
        })
        .await;
        let created = w.next().await;
        assert!(created.created);
        let compacted = w.next().await;
        assert_eq!(
            (
                compacted.watch_id,
                compacted.canceled,
                compacted.compact_revision
            ),
            (created.watch_id, true, r2)
        );
    });
}

/// Resident set size of `pid` in bytes (Linux `/proc/<pid>/status` `VmRSS`).
fn rss_bytes(pid: u32) -> u64 {
    rss_kib(pid).expect("VmRSS") * 1024
}

#[test]
fn a_stalled_stream_never_blocks_writes_and_catches_up_in_order() {
    // A small per-watcher buffer so the stalled watcher falls behind early.
    let (_guard, keel) = member(&["--watch-buffer-len", "4"]);
    let ep = keel.endpoint();
    let pid = keel.pid().expect("running");
    runtime().block_on(async {
        let mut kv = kv(&ep).await;
        let mut stalled = WatchConn::open(&ep).await;
        stalled
            .create(WatchCreateRequest {
                key: "s".into(),
                range_end: "t".into(),
                ..Default::default()
            })
            .await;
        let created = stalled.next().await;
        let first = header_rev(&created) + 1;
        let rss_before = rss_bytes(pid);
        // 2000 writes of 8 KiB (16 MiB of events) while the client reads nothing.
        let value = vec![b'v'; 8192];
        let started = Instant::now();
        let mut last = 0;
        for i in 0..2000 {
            last = put(&mut kv, &format!("s{:04}", i % 50), &value).await;
        }
        let elapsed = started.elapsed();
        let grown = rss_bytes(pid).saturating_sub(rss_before);
        eprintln!("stalled watcher: member RSS grew by {} KiB", grown >> 10);
        assert!(
            elapsed < Duration::from_secs(120),
            "writes took {elapsed:?}"
        );
        // Measured on 2026-12-04: 71–79 MiB before sled commits were batched (100 ms), 78–102
        // MiB after (sled holds more of its I/O buffers per larger batch; docs/benchmarks.md,
        // "Deferred sled commits"). 16 MiB of events buffered per copy would show as far more.
        assert!(
            grown < 128 << 20,
            "member RSS grew by {} MiB for a stalled watcher",
            grown >> 20
        );

        // Now read: every revision exactly once, in order.
        let mut next = first;
        let deadline = Instant::now() + Duration::from_secs(60);
        while next <= last {
            assert!(
                Instant::now() < deadline,
                "caught up only to {next} of {last}"
            );
            let r = stalled.next().await;
            for e in &r.events {
                let rev = e.kv.as_ref().expect("kv").mod_revision;
                assert_eq!(rev, next, "gap or duplicate");
                next += 1;
            }
        }
    });
}

#[test]
fn every_member_serves_watches_including_followers() {
    let (_alone, cluster) = cluster(3, &[]);
    let eps: Vec<String> = cluster.members.iter().map(Member::endpoint).collect();
    runtime().block_on(async {
        let mut watches = Vec::new();
        for ep in &eps {
            let mut w = WatchConn::open(ep).await;
            w.create(WatchCreateRequest {
                key: "f".into(),
                prev_kv: true,
                ..Default::default()
            })
            .await;
            assert!(w.next().await.created);
            watches.push(w);
        }
        // Writes through different members (followers forward them to the leader).
        let mut revs = Vec::new();
        for (i, ep) in eps.iter().enumerate() {
            let mut kv = kv(ep).await;
            revs.push(put(&mut kv, "f", format!("v{i}")).await);
        }
        for w in &mut watches {
            let mut got = Vec::new();
            while got.len() < 3 {
                got.extend(events(&w.next().await));
            }
            assert_eq!(
                got,
                vec![
                    ev("PUT", "f", revs[0], "v0"),
                    ev("PUT", "f", revs[1], "v1"),
                    ev("PUT", "f", revs[2], "v2")
                ]
            );
        }
    });
}
