//! Entries whose apply may take long run without holding up the member's other tasks
//! (`crate::heavy`, `state_machine::may_run_long`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use keel_proto::etcdserverpb::request_op::Request as Op;
use keel_proto::etcdserverpb::{
    DeleteRangeRequest, LeaseRevokeRequest, PutRequest, RequestOp, TxnRequest,
};
use keel_proto::keelpb::{RaftRequest, RequestBatch, raft_request::Request as Rq};
use openraft::EntryPayload;
use openraft::storage::RaftStateMachine;

use super::snapshot_race_test::Member;
use super::state_machine::may_run_long;
use super::types::Entry;

fn delete(key: &str, end: &str) -> DeleteRangeRequest {
    DeleteRangeRequest {
        key: key.into(),
        range_end: end.into(),
        ..Default::default()
    }
}

fn txn(success: Vec<Op>) -> TxnRequest {
    TxnRequest {
        success: success
            .into_iter()
            .map(|r| RequestOp { request: Some(r) })
            .collect(),
        ..Default::default()
    }
}

fn request(e: &Entry) -> RaftRequest {
    match &e.payload {
        EntryPayload::Normal(r) => r.message().clone(),
        _ => unreachable!("test entries are normal"),
    }
}

#[test]
fn range_deletes_compactions_and_lease_revokes_may_run_long() {
    let mut m = Member::new();
    let put = m.put("k", "v");
    assert!(!may_run_long(&put));
    assert!(!may_run_long(&m.entry(Rq::DeleteRange(delete("k", "")))));
    let range_delete = m.entry(Rq::DeleteRange(delete("a", "z")));
    assert!(may_run_long(&range_delete));
    assert!(may_run_long(&m.compact(1)));
    assert!(may_run_long(
        &m.entry(Rq::LeaseRevoke(LeaseRevokeRequest { id: 7 }))
    ));
    let puts_only = txn(vec![Op::RequestPut(PutRequest::default())]);
    assert!(!may_run_long(&m.entry(Rq::Txn(puts_only.clone()))));
    let nested = txn(vec![
        Op::RequestPut(PutRequest::default()),
        Op::RequestTxn(txn(vec![Op::RequestDeleteRange(delete("a", "\0"))])),
    ]);
    assert!(may_run_long(&m.entry(Rq::Txn(nested))));
    let in_failure = TxnRequest {
        failure: vec![RequestOp {
            request: Some(Op::RequestDeleteRange(delete("a", "b"))),
        }],
        ..Default::default()
    };
    assert!(may_run_long(&m.entry(Rq::Txn(in_failure))));
    let mut batch = |requests| m.entry(Rq::Batch(RequestBatch { requests }));
    assert!(!may_run_long(&batch(vec![request(&put)])));
    assert!(may_run_long(&batch(vec![
        request(&put),
        request(&range_delete)
    ])));
}

/// On a runtime with one worker thread, a task spawned before a 20,000-key range delete is
/// applied keeps ticking while the delete runs (before `heavy::run`, it stood still until
/// apply returned, and a member's heartbeats and election watchdog with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_long_apply_leaves_the_only_worker_to_the_other_tasks() {
    const KEYS: usize = 20_000;
    let mut m = Member::new();
    let puts: Vec<Entry> = (0..KEYS)
        .map(|k| m.put(&format!("key-{k:05}"), "value"))
        .collect();
    m.sm.apply(puts).await.unwrap();
    let delete_all = m.entry(Rq::DeleteRange(delete("key-", "key.")));

    let ticks = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let seen = Arc::clone(&ticks);
    // Both on the runtime's only worker (the test body runs in `block_on` on the test
    // thread, not there).
    let ticker = tokio::spawn(async move {
        let stop = Instant::now() + Duration::from_secs(60);
        while Instant::now() < stop {
            seen.lock().unwrap().push(Instant::now());
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
    // Let the ticker start, so it is due on the worker when apply begins.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (m, started, ended) = tokio::spawn(async move {
        let started = Instant::now();
        m.sm.apply(vec![delete_all]).await.unwrap();
        (m, started, Instant::now())
    })
    .await
    .unwrap();
    ticker.abort();

    let took = ended - started;
    assert!(
        took > Duration::from_millis(30),
        "the delete took {took:?}: too short to tell (raise KEYS)"
    );
    let during = ticks
        .lock()
        .unwrap()
        .iter()
        .filter(|t| **t > started + Duration::from_millis(5) && **t < ended)
        .count();
    assert!(
        during >= 3,
        "the ticker ran {during} times during a {took:?} apply"
    );
    let left = m
        .shared
        .get()
        .range(&keel_proto::etcdserverpb::RangeRequest {
            key: b"key-".to_vec(),
            range_end: b"key.".to_vec(),
            count_only: true,
            ..Default::default()
        })
        .unwrap()
        .count;
    assert_eq!(left, 0, "every key deleted");
}
