//! Scenario tests of the hub and the stream session against a real MVCC store: each test
//! writes through the store, hands the committed events to the hub (as apply does), and
//! checks the exact responses a client would receive (etcd 3.4 behaviour, see
//! `../shared/conformance/cases/{watch,grpc-watch}`).

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use futures::task::noop_waker;
use keel_proto::etcdserverpb::request_op::Request as Op;
use keel_proto::etcdserverpb::watch_create_request::FilterType;
use keel_proto::etcdserverpb::watch_request::RequestUnion;
use keel_proto::etcdserverpb::{
    DeleteRangeRequest, PutRequest, RequestOp, TxnRequest, WatchCancelRequest, WatchCreateRequest,
    WatchProgressRequest, WatchRequest, WatchResponse,
};
use keel_proto::mvccpb::event::EventType;

use super::sync::SyncOutcome;
use super::{StoreHistory, WatchConfig, WatchHub, WatchOutput, WatchStream};
use crate::mvcc::MvccStore;
use crate::raft::SharedStore;

/// A store plus a hub fed the way apply feeds it.
pub(super) struct Harness {
    pub store: Arc<MvccStore>,
    pub hub: Arc<WatchHub>,
}

impl Harness {
    pub fn new(config: WatchConfig) -> Harness {
        let tree = sled::Config::new()
            .temporary(true)
            .open()
            .expect("temporary sled")
            .open_tree("keel")
            .expect("tree");
        let store = Arc::new(MvccStore::open(tree).expect("open store"));
        let shared = Arc::new(SharedStore::new(store.clone()));
        let hub = WatchHub::new(Arc::new(StoreHistory(shared)), config);
        Harness { store, hub }
    }

    fn commit(&self, f: impl FnOnce(&mut crate::mvcc::WriteTxn<'_>)) -> i64 {
        let mut w = self.store.write();
        f(&mut w);
        let c = w.commit().expect("commit");
        self.hub.notify(c.revision, c.events);
        c.revision
    }

    pub fn put(&self, key: &str, value: &str) -> i64 {
        self.commit(|w| {
            w.put(&PutRequest {
                key: key.into(),
                value: value.into(),
                ..Default::default()
            })
            .expect("put");
        })
    }

    pub fn del(&self, key: &str) -> i64 {
        self.commit(|w| {
            w.delete_range(&DeleteRangeRequest {
                key: key.into(),
                ..Default::default()
            })
            .expect("delete");
        })
    }

    pub fn txn(&self, ops: &[(&str, Option<&str>)]) -> i64 {
        let success = ops
            .iter()
            .map(|(k, v)| RequestOp {
                request: Some(match v {
                    Some(v) => Op::RequestPut(PutRequest {
                        key: (*k).into(),
                        value: (*v).into(),
                        ..Default::default()
                    }),
                    None => Op::RequestDeleteRange(DeleteRangeRequest {
                        key: (*k).into(),
                        ..Default::default()
                    }),
                }),
            })
            .collect();
        self.commit(|w| {
            w.txn(&TxnRequest {
                success,
                ..Default::default()
            })
            .expect("txn");
        })
    }

    pub fn compact(&self, rev: i64) {
        self.commit(|w| {
            w.compact(rev).expect("compact");
        });
    }

    /// Runs sync rounds until nothing is left to do (bounded).
    pub fn sync_all(&self) {
        for _ in 0..10_000 {
            if self.hub.sync_round() != SyncOutcome::Progress {
                return;
            }
        }
        panic!("sync rounds never settle");
    }
}

/// Every response the output has ready now.
pub(super) fn drain(output: &mut WatchOutput) -> Vec<WatchResponse> {
    let waker = noop_waker();
    let mut cx = Context::from_waker(&waker);
    let mut out = Vec::new();
    while let Poll::Ready(Some(r)) = std::pin::Pin::new(&mut *output).poll_next(&mut cx) {
        out.push(r);
    }
    out
}

/// Up to `n` responses the output has ready now (a slow client).
pub(super) fn read(output: &mut WatchOutput, n: usize) -> Vec<WatchResponse> {
    let waker = noop_waker();
    let mut cx = Context::from_waker(&waker);
    let mut out = Vec::new();
    while out.len() < n {
        match std::pin::Pin::new(&mut *output).poll_next(&mut cx) {
            Poll::Ready(Some(r)) => out.push(r),
            _ => break,
        }
    }
    out
}

pub(super) fn create(key: &str) -> WatchCreateRequest {
    WatchCreateRequest {
        key: key.into(),
        ..Default::default()
    }
}

fn request(create: WatchCreateRequest) -> WatchRequest {
    WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(create)),
    }
}

fn cancel(watch_id: i64) -> WatchRequest {
    WatchRequest {
        request_union: Some(RequestUnion::CancelRequest(WatchCancelRequest { watch_id })),
    }
}

fn progress() -> WatchRequest {
    WatchRequest {
        request_union: Some(RequestUnion::ProgressRequest(WatchProgressRequest {})),
    }
}

fn header_rev(r: &WatchResponse) -> i64 {
    r.header.as_ref().map_or(-99, |h| h.revision)
}

/// `(type, key, mod_revision, value)` of each event of `r`.
fn events(r: &WatchResponse) -> Vec<(&'static str, String, i64, String)> {
    r.events
        .iter()
        .map(|e| {
            let kv = e.kv.as_ref().expect("event kv");
            let t = if e.r#type == EventType::Delete as i32 {
                "DELETE"
            } else {
                "PUT"
            };
            (
                t,
                String::from_utf8_lossy(&kv.key).into(),
                kv.mod_revision,
                String::from_utf8_lossy(&kv.value).into(),
            )
        })
        .collect()
}

fn ev(t: &'static str, key: &str, rev: i64, value: &str) -> (&'static str, String, i64, String) {
    (t, key.into(), rev, value.into())
}

#[test]
fn created_then_one_response_per_live_revision() {
    let h = Harness::new(WatchConfig::default());
    let r0 = h.put("other", "x");
    let (mut s, mut out) = WatchStream::new(h.hub.clone());
    s.handle(request(create("k")));
    let created = drain(&mut out);
    assert_eq!(created.len(), 1);
    assert!(created[0].created && !created[0].canceled);
    assert_eq!((created[0].watch_id, header_rev(&created[0])), (0, r0));
    let r1 = h.put("k", "1");
    h.put("other", "y");
    let r3 = h.put("k", "2");
    let got = drain(&mut out);
    assert_eq!(got.len(), 2);
    assert_eq!(events(&got[0]), vec![ev("PUT", "k", r1, "1")]);
    assert_eq!(
        header_rev(&got[0]),
        r1,
        "live events: header revision = event revision"
    );
    assert_eq!(events(&got[1]), vec![ev("PUT", "k", r3, "2")]);
    h.hub.check_invariants();
}

#[test]
fn txn_events_share_one_response() {
    let h = Harness::new(WatchConfig::default());
    h.put("t0", "x");
    let (mut s, mut out) = WatchStream::new(h.hub.clone());
    s.handle(request(WatchCreateRequest {
        key: "t".into(),
        range_end: "u".into(),
        ..Default::default()
    }));
    drain(&mut out);
    let r = h.txn(&[
        ("t1", Some("a")),
        ("t2", Some("b")),
        ("t0", None),
        ("x", Some("z")),
    ]);
    let got = drain(&mut out);
    assert_eq!(got.len(), 1, "one response per revision");
    assert_eq!(
        events(&got[0]),
        vec![
            ev("PUT", "t1", r, "a"),
            ev("PUT", "t2", r, "b"),
            ev("DELETE", "t0", r, "")
        ]
    );
}

#[test]
fn one_txn_reaches_several_watchers_in_txn_order() {
    let h = Harness::new(WatchConfig::default());
    let (mut s, mut out) = WatchStream::new(h.hub.clone());
    // Created in the opposite order of the txn's writes.
    for key in ["c", "b", "a"] {
        s.handle(request(create(key)));
    }
    drain(&mut out);
    for _ in 0..5 {
        let r = h.txn(&[("a", Some("1")), ("b", Some("2")), ("c", Some("3"))]);
        let got = drain(&mut out);
        let order: Vec<(i64, i64)> = got.iter().map(|x| (x.watch_id, header_rev(x))).collect();
        assert_eq!(order, vec![(2, r), (1, r), (0, r)]);
    }
}

#[test]
fn watch_ids_auto_client_chosen_and_duplicate() {
    let h = Harness::new(WatchConfig::default());
    let rev = h.hub.current_revision();
    let (mut s, mut out) = WatchStream::new(h.hub.clone());
    s.handle(request(WatchCreateRequest {
        key: "a".into(),
        watch_id: 1,
        ..Default::default()
    }));
    s.handle(request(WatchCreateRequest {
        key: "b".into(),
        watch_id: 1,
        ..Default::default()
    }));
    s.handle(request(create("c")));
    s.handle(request(create("d")));
    let got = drain(&mut out);
    assert_eq!(got.len(), 4);
    assert_eq!(
        (got[0].watch_id, got[0].created, got[0].canceled),
        (1, true, false)
    );
    assert_eq!(
        (got[1].watch_id, got[1].created, got[1].canceled),
        (-1, true, true)
    );
    assert_eq!(
        got[1].cancel_reason,
        "mvcc: duplicate watch ID provided on the WatchStream"
    );
    assert_eq!(header_rev(&got[1]), rev);
    assert_eq!(got[2].watch_id, 0, "auto IDs count from 0");
    assert_eq!(got[3].watch_id, 2, "auto IDs skip IDs in use");
    assert_eq!(s.len(), 3);
}

#[test]
fn bad_requests_keep_the_stream_usable() {
    let h = Harness::new(WatchConfig::default());
    let (mut s, mut out) = WatchStream::new(h.hub.clone());
    s.handle(request(WatchCreateRequest {
        key: "b".into(),
        range_end: "a".into(),
        ..Default::default()
    }));
    s.handle(request(WatchCreateRequest {
        key: "k".into(),
        start_revision: -3,
        ..Default::default()
    }));
    s.handle(cancel(42));
    s.handle(WatchRequest {
        request_union: None,
    });
    h.sync_all();
    let got = drain(&mut out);
    assert_eq!(
        got.len(),
        3,
        "unknown cancel and empty requests get no response"
    );
    assert_eq!(
        (got[0].watch_id, got[0].created, got[0].canceled),
        (-1, true, true)
    );
    assert_eq!(got[0].cancel_reason, "mvcc: watcher range is empty");
    // etcd 3.4: a negative start is a compacted start.
    assert_eq!(
        (got[1].watch_id, got[1].created, got[1].canceled),
        (0, true, false)
    );
    assert_eq!(
        (got[2].watch_id, got[2].canceled, header_rev(&got[2])),
        (0, true, 0)
    );
    s.handle(request(create("k")));
    let r = h.put("k", "1");
    let got = drain(&mut out);
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].watch_id, 1);
    assert_eq!(events(&got[1]), vec![ev("PUT", "k", r, "1")]);
}

#[test]
fn cancel_answers_and_stops_events() {
    let h = Harness::new(WatchConfig::default());
    let (mut s, mut out) = WatchStream::new(h.hub.clone());
    s.handle(request(create("k")));
    drain(&mut out);
    s.handle(cancel(0));
    let got = drain(&mut out);
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].watch_id, got[0].created, got[0].canceled),
        (0, false, true)
    );
    assert_eq!(header_rev(&got[0]), h.hub.current_revision());
    h.put("k", "1");
    assert!(drain(&mut out).is_empty());
    assert_eq!(h.hub.stats().watchers, 0);
}

#[test]
fn historical_watch_batches_history_then_goes_live() {
    let h = Harness::new(WatchConfig::default());
    let r1 = h.put("k", "1");
    let r2 = h.put("k", "2");
    let r3 = h.del("k");
    let r4 = h.put("k", "3");
    let (mut s, mut out) = WatchStream::new(h.hub.clone());
    s.handle(request(WatchCreateRequest {
        key: "k".into(),
        start_revision: r1,
        prev_kv: true,
        ..Default::default()
    }));
    let created = drain(&mut out);
    assert_eq!(created.len(), 1);
    assert_eq!(header_rev(&created[0]), r4);
    h.sync_all();
    let got = drain(&mut out);
    assert_eq!(got.len(), 1, "history arrives in one response");
    assert_eq!(header_rev(&got[0]), r4);
    assert_eq!(
        events(&got[0]),
        vec![
            ev("PUT", "k", r1, "1"),
            ev("PUT", "k", r2, "2"),
            ev("DELETE", "k", r3, ""),
            ev("PUT", "k", r4, "3")
        ]
    );
    let prev: Vec<Option<Vec<u8>>> = got[0]
        .events
        .iter()
        .map(|e| e.prev_kv.as_ref().map(|p| p.value.clone()))
        .collect();
    assert_eq!(
        prev,
        vec![None, Some(b"1".to_vec()), Some(b"2".to_vec()), None]
    );
    let r5 = h.put("k", "4");
    let live = drain(&mut out);
    assert_eq!(events(&live[0]), vec![ev("PUT", "k", r5, "4")]);
    assert_eq!(
        live[0].events[0].prev_kv.as_ref().map(|p| p.value.clone()),
        Some(b"3".to_vec())
    );
    assert_eq!(h.hub.stats().unsynced, 0);
}

#[test]
fn future_start_revision_waits() {
    let h = Harness::new(WatchConfig::default());
    let now = h.hub.current_revision();
    let (mut s, mut out) = WatchStream::new(h.hub.clone());
    s.handle(request(WatchCreateRequest {
        key: "f".into(),
        start_revision: now + 3,
        ..Default::default()
    }));
    drain(&mut out);
    h.put("f", "1");
    h.put("f", "2");
    let r3 = h.put("f", "3");
    let got = drain(&mut out);
    assert_eq!(got.len(), 1);
    assert_eq!(events(&got[0]), vec![ev("PUT", "f", r3, "3")]);
}

#[test]
fn compacted_start_is_canceled_with_the_compact_revision() {
    let h = Harness::new(WatchConfig::default());
    let r1 = h.put("foo", "1");
    let r2 = h.put("foo", "2");
    h.put("foo", "3");
    h.compact(r2);
    let (mut s, mut out) = WatchStream::new(h.hub.clone());
    s.handle(request(WatchCreateRequest {
        key: "foo".into(),
        start_revision: r1,
        ..Default::default()
    }));
    h.sync_all();
    let got = drain(&mut out);
    assert_eq!(got.len(), 2);
    assert!(got[0].created);
    assert_eq!(
        (got[1].watch_id, got[1].canceled, got[1].compact_revision),
        (0, true, r2)
    );
    assert_eq!(
        header_rev(&got[1]),
        0,
        "etcd sends the compaction cancel with header revision 0"
    );
    // The ID stays registered until the client cancels it, as in etcd.
    s.handle(cancel(0));
    let got = drain(&mut out);
    assert_eq!((got.len(), got[0].canceled), (1, true));
    h.hub.check_invariants();
}

#[test]
fn filters_apply_to_live_and_historical_events() {
    let h = Harness::new(WatchConfig::default());
    let r1 = h.put("k", "1");
    let r2 = h.del("k");
    let (mut s, mut out) = WatchStream::new(h.hub.clone());
    s.handle(request(WatchCreateRequest {
        key: "k".into(),
        start_revision: r1,
        filters: vec![FilterType::Noput as i32],
        ..Default::default()
    }));
    s.handle(request(WatchCreateRequest {
        key: "k".into(),
        filters: vec![FilterType::Nodelete as i32],
        ..Default::default()
    }));
    h.sync_all();
    let r3 = h.put("k", "2");
    let r4 = h.del("k");
    let got: Vec<_> = drain(&mut out).into_iter().filter(|r| !r.created).collect();
    let noput: Vec<_> = got
        .iter()
        .filter(|r| r.watch_id == 0)
        .flat_map(events)
        .collect();
    let nodel: Vec<_> = got
        .iter()
        .filter(|r| r.watch_id == 1)
        .flat_map(events)
        .collect();
    assert_eq!(
        noput,
        vec![ev("DELETE", "k", r2, ""), ev("DELETE", "k", r4, "")]
    );
    assert_eq!(nodel, vec![ev("PUT", "k", r3, "2")]);
}

#[test]
fn a_stalled_watcher_falls_behind_and_catches_up_without_gaps() {
    let h = Harness::new(WatchConfig {
        buffer_len: 2,
        batch_max_revisions: 3,
        ..WatchConfig::default()
    });
    let (mut s, mut out) = WatchStream::new(h.hub.clone());
    s.handle(request(WatchCreateRequest {
        key: "k".into(),
        prev_kv: true,
        ..Default::default()
    }));
    drain(&mut out);
    let revs: Vec<i64> = (0..20).map(|i| h.put("k", &i.to_string())).collect();
    assert_eq!(
        h.hub.stats().unsynced,
        1,
        "the full watcher moved to unsynced; apply went on"
    );
    let mut seen = Vec::new();
    for _ in 0..100 {
        seen.extend(drain(&mut out));
        if h.hub.sync_round() == SyncOutcome::Idle && h.hub.stats().unsynced == 0 {
            break;
        }
    }
    seen.extend(drain(&mut out));
    let got: Vec<i64> = seen
        .iter()
        .flat_map(|r| r.events.iter().map(|e| e.kv.as_ref().unwrap().mod_revision))
        .collect();
    assert_eq!(got, revs, "every revision once, in order");
    for r in &seen {
        let last = r.events.last().unwrap().kv.as_ref().unwrap().mod_revision;
        assert!(header_rev(r) >= last);
    }
    let prevs: Vec<String> = seen
        .iter()
        .flat_map(|r| {
            r.events
                .iter()
                .skip_while(|e| e.prev_kv.is_none())
                .map(|e| String::from_utf8_lossy(&e.prev_kv.as_ref().unwrap().value).to_string())
        })
        .collect();
    assert_eq!(
        prevs,
        (0..19).map(|i| i.to_string()).collect::<Vec<_>>(),
        "prev_kv of every update"
    );
    assert_eq!(h.hub.stats().synced, 1);
    h.hub.check_invariants();
}

#[test]
fn progress_request_waits_for_unsynced_watchers() {
    let h = Harness::new(WatchConfig::default());
    let (mut s, mut out) = WatchStream::new(h.hub.clone());
    s.handle(progress());
    let got = drain(&mut out);
    assert_eq!(
        got.len(),
        1,
        "a stream without watchers is answered at once"
    );
    assert_eq!(
        (got[0].watch_id, header_rev(&got[0])),
        (-1, h.hub.current_revision())
    );
    assert!(got[0].events.is_empty() && !got[0].created && !got[0].canceled);

    let r1 = h.put("k", "1");
    let r2 = h.put("k", "2");
    s.handle(request(WatchCreateRequest {
        key: "k".into(),
        start_revision: r1,
        ..Default::default()
    }));
    s.handle(progress());
    let got = drain(&mut out);
    assert_eq!(
        got.len(),
        1,
        "only the created response: the progress waits for the history"
    );
    h.sync_all();
    let got = drain(&mut out);
    assert_eq!(got.len(), 2);
    assert_eq!(events(&got[0]).len(), 2);
    assert_eq!(
        (got[1].watch_id, header_rev(&got[1])),
        (-1, r2),
        "progress after the events it covers"
    );
}

#[test]
fn periodic_progress_is_per_watcher_and_elided_after_events() {
    let h = Harness::new(WatchConfig::default());
    let (mut s, mut out) = WatchStream::new(h.hub.clone());
    s.handle(request(WatchCreateRequest {
        key: "k".into(),
        progress_notify: true,
        ..Default::default()
    }));
    s.handle(request(create("other")));
    drain(&mut out);
    s.progress_tick();
    let got = drain(&mut out);
    assert_eq!(got.len(), 1, "only the progress_notify watcher");
    assert_eq!(
        (got[0].watch_id, header_rev(&got[0])),
        (0, h.hub.current_revision())
    );
    let r = h.put("k", "1");
    drain(&mut out);
    s.progress_tick();
    assert!(
        drain(&mut out).is_empty(),
        "a tick right after events is skipped"
    );
    s.progress_tick();
    let got = drain(&mut out);
    assert_eq!((got.len(), header_rev(&got[0])), (1, r));
}

#[test]
fn fragment_splits_a_large_txn() {
    let h = Harness::new(WatchConfig {
        max_response_bytes: 1000,
        ..WatchConfig::default()
    });
    let (mut s, mut out) = WatchStream::new(h.hub.clone());
    s.handle(request(WatchCreateRequest {
        key: "f".into(),
        range_end: "g".into(),
        fragment: true,
        ..Default::default()
    }));
    s.handle(request(WatchCreateRequest {
        key: "f".into(),
        range_end: "g".into(),
        ..Default::default()
    }));
    drain(&mut out);
    let big = "v".repeat(300);
    let ops: Vec<(String, Option<&str>)> = (0..8)
        .map(|i| (format!("f{i}"), Some(big.as_str())))
        .collect();
    let ops: Vec<(&str, Option<&str>)> = ops.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    let r = h.txn(&ops);
    let got = drain(&mut out);
    let frag: Vec<_> = got.iter().filter(|x| x.watch_id == 0).collect();
    let whole: Vec<_> = got.iter().filter(|x| x.watch_id == 1).collect();
    assert_eq!(whole.len(), 1);
    assert_eq!(whole[0].events.len(), 8);
    assert!(frag.len() > 1, "split into fragments");
    assert!(frag[..frag.len() - 1].iter().all(|x| x.fragment) && !frag.last().unwrap().fragment);
    assert!(frag.iter().all(|x| header_rev(x) == r));
    assert_eq!(frag.iter().map(|x| x.events.len()).sum::<usize>(), 8);
}

#[test]
fn snapshot_install_resyncs_every_watcher_without_duplicates() {
    let h = Harness::new(WatchConfig::default());
    let (mut s, mut out) = WatchStream::new(h.hub.clone());
    s.handle(request(WatchCreateRequest {
        key: "k".into(),
        range_end: "\0".into(),
        ..Default::default()
    }));
    drain(&mut out);
    let r1 = h.put("k1", "a");
    h.hub.begin_install();
    // The "snapshot" brings revisions the hub was never told about.
    let mut w = h.store.write();
    w.put(&PutRequest {
        key: "k2".into(),
        value: "b".into(),
        ..Default::default()
    })
    .unwrap();
    let r2 = w.commit().unwrap().revision;
    h.hub.finish_install();
    assert_eq!(h.hub.stats().unsynced, 1);
    h.sync_all();
    let r3 = h.put("k3", "c");
    let got: Vec<i64> = drain(&mut out)
        .iter()
        .flat_map(|r| r.events.iter().map(|e| e.kv.as_ref().unwrap().mod_revision))
        .collect();
    assert_eq!(got, vec![r1, r2, r3]);
    h.hub.check_invariants();
}

#[test]
fn dropping_the_stream_removes_its_watchers() {
    let h = Harness::new(WatchConfig::default());
    let (mut s, mut out) = WatchStream::new(h.hub.clone());
    for i in 0..10 {
        s.handle(request(create(&format!("k{i}"))));
    }
    assert_eq!(h.hub.stats().watchers, 10);
    drop(s);
    assert_eq!(h.hub.stats().watchers, 0);
    assert!(
        drain(&mut out).is_empty(),
        "a closed outbox drops what was queued"
    );
    let waker = noop_waker();
    let polled = std::pin::Pin::new(&mut out).poll_next(&mut Context::from_waker(&waker));
    assert!(matches!(polled, Poll::Ready(None)), "the output ends");
}

#[test]
fn the_sync_thread_catches_up_on_its_own() {
    let h = Harness::new(WatchConfig::default());
    h.hub.spawn_sync_thread().unwrap();
    let r1 = h.put("k", "1");
    let (mut s, mut out) = WatchStream::new(h.hub.clone());
    s.handle(request(WatchCreateRequest {
        key: "k".into(),
        start_revision: r1,
        ..Default::default()
    }));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut got = Vec::new();
    while got.len() < 2 && std::time::Instant::now() < deadline {
        got.extend(drain(&mut out));
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(got.len(), 2, "created, then the history");
    assert_eq!(events(&got[1]), vec![ev("PUT", "k", r1, "1")]);
}
