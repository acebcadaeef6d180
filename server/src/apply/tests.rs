//! Crash-recovery tests of the apply path and the consistent index.

use std::sync::Arc;

use keel_proto::etcdserverpb::{PutRequest, RangeRequest};
use keel_proto::keelpb::{RaftRequest, raft_request};
use openraft::{CommittedLeaderId, EntryPayload};

use super::Applier;
use crate::membership::Attributes;
use crate::mvcc::MvccStore;
use crate::raft::types::{Entry, LogId, Request};

fn log_id(index: u64) -> LogId {
    openraft::LogId::new(CommittedLeaderId::new(1, 1), index)
}

fn put(index: u64) -> Entry {
    Entry {
        log_id: log_id(index),
        payload: EntryPayload::Normal(Request(RaftRequest {
            id: index,
            request: Some(raft_request::Request::Put(PutRequest {
                key: format!("key-{}", index % 4).into_bytes(),
                value: format!("value-{index}").into_bytes(),
                ..Default::default()
            })),
        })),
    }
}

fn open(tree: &sled::Tree) -> Applier {
    let store = Arc::new(MvccStore::open(tree.clone()).expect("mvcc"));
    Applier::open(tree.clone(), store, Arc::new(Attributes::default())).expect("applier")
}

fn fingerprint(a: &Applier) -> (i64, u32, Vec<(Vec<u8>, i64, i64, i64)>) {
    let store = a.store();
    let all = store
        .range(&RangeRequest {
            key: vec![0],
            range_end: vec![0],
            ..Default::default()
        })
        .expect("range");
    let kvs = all
        .kvs
        .iter()
        .map(|kv| {
            (
                kv.value.clone(),
                kv.create_revision,
                kv.mod_revision,
                kv.version,
            )
        })
        .collect();
    (
        store.current_revision(),
        store.hash_kv(0).expect("hash").hash,
        kvs,
    )
}

/// A crash that loses the store's last batches (sled was not flushed) leaves an older
/// consistent index; replaying the whole log must skip what is in the store and apply the
/// rest exactly once, giving the same store as an uninterrupted run.
#[test]
fn replay_after_losing_unflushed_batches_applies_each_entry_once() {
    let reference_db = sled::Config::new().temporary(true).open().unwrap();
    let mut reference = open(&reference_db.open_tree("t").unwrap());
    for i in 1..=10 {
        reference.apply(&put(i)).unwrap();
    }

    // The "crashed" member durably holds entries 1..=6 only.
    let db = sled::Config::new().temporary(true).open().unwrap();
    let tree = db.open_tree("t").unwrap();
    {
        let mut a = open(&tree);
        for i in 1..=6 {
            a.apply(&put(i)).unwrap();
        }
    }
    // Restart: the consistent index says 6, and the WAL replays 1..=10.
    let mut a = open(&tree);
    assert_eq!(a.last_applied(), Some(log_id(6)));
    for i in 1..=10 {
        a.apply(&put(i)).unwrap();
    }
    assert_eq!(a.last_applied(), Some(log_id(10)));
    assert_eq!(fingerprint(&a), fingerprint(&reference));
    // 10 puts → revisions 2..=11; key-2 was written by entries 2, 6 and 10: version 3.
    let (rev, _, kvs) = fingerprint(&a);
    assert_eq!(rev, 11);
    assert!(kvs.contains(&(b"value-10".to_vec(), 3, 11, 3)));
}

/// An entry whose request fails (a compaction of a future revision) still advances the
/// consistent index and writes nothing else.
#[test]
fn failed_request_advances_consistent_index_only() {
    let db = sled::Config::new().temporary(true).open().unwrap();
    let mut a = open(&db.open_tree("t").unwrap());
    a.apply(&put(1)).unwrap();
    let before = fingerprint(&a);
    let compact = Entry {
        log_id: log_id(2),
        payload: EntryPayload::Normal(Request(RaftRequest {
            id: 2,
            request: Some(raft_request::Request::Compaction(
                keel_proto::etcdserverpb::CompactionRequest {
                    revision: 100,
                    physical: false,
                },
            )),
        })),
    };
    let resp = a.apply(&compact).unwrap();
    match resp.0.response {
        Some(keel_proto::keelpb::raft_response::Response::Error(e)) => {
            assert_eq!(
                e.message,
                "etcdserver: mvcc: required revision is a future revision"
            );
            assert_eq!(e.code, tonic::Code::OutOfRange as i32);
        }
        other => panic!("expected an apply error, got {other:?}"),
    }
    assert_eq!(a.last_applied(), Some(log_id(2)));
    assert_eq!(fingerprint(&a), before);
    // And the consistent index survives a reopen.
    let reopened = open(a.tree());
    assert_eq!(reopened.last_applied(), Some(log_id(2)));
}

fn batch(index: u64, n: u64) -> Entry {
    let requests = (0..n)
        .map(|k| RaftRequest {
            id: index * 100 + k,
            request: Some(raft_request::Request::Put(PutRequest {
                key: format!("b{k}").into_bytes(),
                value: format!("v{index}-{k}").into_bytes(),
                ..Default::default()
            })),
        })
        .collect();
    Entry {
        log_id: log_id(index),
        payload: EntryPayload::Normal(Request(RaftRequest {
            id: index,
            request: Some(raft_request::Request::Batch(
                keel_proto::keelpb::RequestBatch { requests },
            )),
        })),
    }
}

/// Every request of a batch entry gets its own revision and response, in order.
#[test]
fn batch_entry_applies_each_request_at_its_own_revision() {
    let db = sled::Config::new().temporary(true).open().unwrap();
    let mut a = open(&db.open_tree("t").unwrap());
    let resp = a.apply(&batch(1, 3)).unwrap();
    let Some(keel_proto::keelpb::raft_response::Response::Batch(b)) = resp.0.response else {
        panic!("batch response expected");
    };
    let revisions: Vec<i64> = b.responses.iter().map(|r| r.revision).collect();
    assert_eq!(revisions, vec![2, 3, 4]);
    assert_eq!(a.last_applied(), Some(log_id(1)));
}

/// A crash in the middle of a batch entry: the store holds its first requests and a
/// consistent index saying so; replaying the entry applies only the rest, once.
#[test]
fn crash_inside_a_batch_entry_resumes_at_the_first_unapplied_request() {
    let reference_db = sled::Config::new().temporary(true).open().unwrap();
    let mut reference = open(&reference_db.open_tree("t").unwrap());
    reference.apply(&put(1)).unwrap();
    reference.apply(&batch(2, 5)).unwrap();

    let db = sled::Config::new().temporary(true).open().unwrap();
    let tree = db.open_tree("t").unwrap();
    {
        let mut a = open(&tree);
        a.apply(&put(1)).unwrap();
        // The first two requests of entry 2 land, then the member dies.
        let EntryPayload::Normal(Request(entry)) = batch(2, 5).payload else {
            unreachable!()
        };
        let Some(raft_request::Request::Batch(b)) = entry.request else {
            unreachable!()
        };
        for k in 0..2u32 {
            let next = crate::cindex::ConsistentIndex {
                applied: Some(log_id(1)),
                partial: Some((log_id(2), k + 1)),
            };
            a.apply_request(b.requests[k as usize].request.as_ref(), next)
                .unwrap();
        }
    }
    let mut a = open(&tree);
    assert_eq!(a.last_applied(), Some(log_id(1)), "entry 2 is not complete");
    a.apply(&put(1)).unwrap(); // replayed, skipped
    a.apply(&batch(2, 5)).unwrap();
    assert_eq!(a.last_applied(), Some(log_id(2)));
    assert_eq!(fingerprint(&a), fingerprint(&reference));
    assert_eq!(
        a.store().current_revision(),
        7,
        "1 put + 5 batched puts after revision 1"
    );
}
