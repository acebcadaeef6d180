//! The harness of the watch tests: a real MVCC store and a hub fed the way apply feeds it,
//! and a client's view of a stream's output. The scenarios are goldenscripts
//! (`watch/testscripts/`, run by `tests/golden.rs`); the model test is `tests_model.rs`.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use futures::task::noop_waker;
use keel_proto::etcdserverpb::request_op::Request as Op;
use keel_proto::etcdserverpb::{
    DeleteRangeRequest, PutRequest, RequestOp, TxnRequest, WatchResponse,
};

use super::sync::SyncOutcome;
use super::{StoreHistory, WatchConfig, WatchHub, WatchOutput};
use crate::mvcc::MvccStore;
use crate::mvcc::SharedStore;

/// The scenarios: goldenscripts in `watch/testscripts/` (docs/testing.md).
mod golden;

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

    pub fn commit(&self, f: impl FnOnce(&mut crate::mvcc::WriteTxn<'_>)) -> i64 {
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
