//! Crash-recovery tests of the apply path and the consistent index.

use std::sync::Arc;

use keel_proto::etcdserverpb::{PutRequest, RangeRequest};
use keel_proto::keelpb::{RaftRequest, raft_request};
use openraft::{CommittedLeaderId, EntryPayload};

use super::Applier;
use crate::membership::Attributes;
use crate::mvcc::MvccStore;
use crate::mvcc::test_support::temp_tree;
use crate::raft::types::{Entry, LogId, Request};

fn log_id(index: u64) -> LogId {
    openraft::LogId::new(CommittedLeaderId::new(1, 1), index)
}

fn put(index: u64) -> Entry {
    Entry {
        log_id: log_id(index),
        payload: EntryPayload::Normal(Request::new(RaftRequest {
            auth_header: None,
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

/// (current revision, HashKV, every key's (value, create, mod, version)).
type Fingerprint = (i64, u32, Vec<(Vec<u8>, i64, i64, i64)>);

fn fingerprint(a: &Applier) -> Fingerprint {
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
    let tree = temp_tree();
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
    let mut a = open(&temp_tree());
    a.apply(&put(1)).unwrap();
    let before = fingerprint(&a);
    let compact = Entry {
        log_id: log_id(2),
        payload: EntryPayload::Normal(Request::new(RaftRequest {
            auth_header: None,
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
    let reopened = open(&a.tree());
    assert_eq!(reopened.last_applied(), Some(log_id(2)));
}

fn batch(index: u64, n: u64) -> Entry {
    let requests = (0..n)
        .map(|k| RaftRequest {
            auth_header: None,
            id: index * 100 + k,
            request: Some(raft_request::Request::Put(PutRequest {
                key: format!("b{k}").into_bytes(),
                value: format!("v{index}-{k}").into_bytes(),
                ..Default::default()
            })),
        })
        .collect();
    batch_entry(index, requests)
}

/// The raft entry at `index` carrying `requests` as one `RequestBatch`.
fn batch_entry(index: u64, requests: Vec<RaftRequest>) -> Entry {
    Entry {
        log_id: log_id(index),
        payload: EntryPayload::Normal(Request::new(RaftRequest {
            auth_header: None,
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
    let mut a = open(&temp_tree());
    let resp = a.apply(&batch(1, 3)).unwrap();
    let Some(keel_proto::keelpb::raft_response::Response::Batch(b)) = resp.0.response else {
        panic!("batch response expected");
    };
    let revisions: Vec<i64> = b.responses.iter().map(|r| r.revision).collect();
    assert_eq!(revisions, vec![2, 3, 4]);
    assert_eq!(a.last_applied(), Some(log_id(1)));
}

/// An alarm entry changes what later requests of the same group may do, and the alarm is
/// stored with the consistent index: a reopened applier has it raised, and refuses alike.
#[test]
fn an_alarm_gates_later_requests_and_is_stored_with_the_consistent_index() {
    use keel_proto::etcdserverpb::alarm_request::AlarmAction;
    use keel_proto::etcdserverpb::{AlarmRequest, AlarmType, DeleteRangeRequest};
    use keel_proto::keelpb::raft_response::Response as Rs;
    let alarm = |action: AlarmAction| RaftRequest {
        auth_header: None,
        id: 0,
        request: Some(raft_request::Request::Alarm(AlarmRequest {
            action: action as i32,
            member_id: 9,
            alarm: AlarmType::Nospace as i32,
        })),
    };
    let put = |key: &str| RaftRequest {
        auth_header: None,
        id: 0,
        request: Some(raft_request::Request::Put(PutRequest {
            key: key.as_bytes().to_vec(),
            ..Default::default()
        })),
    };
    let del = RaftRequest {
        auth_header: None,
        id: 0,
        request: Some(raft_request::Request::DeleteRange(DeleteRangeRequest {
            key: b"a".to_vec(),
            ..Default::default()
        })),
    };
    let tree = temp_tree();
    // Alarms need cluster version 0.2 (version::gates).
    crate::version::store_for_test(&tree, crate::version::Version::V0_2);
    let mut a = open(&tree);
    let requests = vec![
        put("a"),
        alarm(AlarmAction::Activate),
        put("b"),
        del,
        alarm(AlarmAction::Get),
    ];
    let resp = a.apply(&batch_entry(1, requests)).unwrap();
    let Some(Rs::Batch(b)) = resp.0.response else {
        panic!("batch response expected");
    };
    let shapes: Vec<String> = b
        .responses
        .iter()
        .map(|r| match &r.response {
            Some(Rs::Put(_)) => format!("put@{}", r.revision),
            Some(Rs::DeleteRange(d)) => format!("deleted {}@{}", d.deleted, r.revision),
            Some(Rs::Alarm(al)) => format!("alarms {}", al.alarms.len()),
            Some(Rs::Error(e)) => e.message.clone(),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(
        shapes,
        [
            "put@2",
            "alarms 1",
            "etcdserver: mvcc: database space exceeded",
            "deleted 1@3",
            "alarms 1"
        ]
    );
    drop(a);
    let mut reopened = open(&tree);
    assert_eq!(reopened.alarms().get(AlarmType::None).len(), 1);
    let refused = reopened
        .apply(&batch_entry(
            2,
            vec![put("c"), alarm(AlarmAction::Deactivate), put("d")],
        ))
        .unwrap();
    let Some(Rs::Batch(b)) = refused.0.response else {
        panic!("batch response expected");
    };
    assert!(matches!(&b.responses[0].response, Some(Rs::Error(_))));
    assert!(matches!(&b.responses[2].response, Some(Rs::Put(_))));
    assert!(open(&tree).alarms().get(AlarmType::None).is_empty());
}

/// A crash in the middle of a batch entry loses the whole entry (its requests are staged in
/// one group that never reached sled); replaying it applies every request once.
#[test]
fn crash_inside_a_batch_entry_loses_the_entry_and_replay_applies_it_once() {
    let reference = put_then_batch_of_five();
    let tree = temp_tree();
    {
        // The first two requests of entry 2 are staged, then the member dies.
        let a = put_then_first_two_of_entry_2(&tree, false);
        assert_eq!(a.store().current_revision(), 2, "staged, not published");
    }
    let mut a = open(&tree);
    assert_eq!(a.last_applied(), Some(log_id(1)), "entry 2 is not complete");
    assert_eq!(
        a.store().current_revision(),
        2,
        "nothing of entry 2 in sled"
    );
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

/// Keel versions before group commit stored each request of a batch entry on its own, with a
/// partial consistent index; a member upgraded after a crash resumes at the first request
/// not yet applied.
#[test]
fn partial_index_from_per_request_commits_resumes_at_the_first_unapplied_request() {
    let reference = put_then_batch_of_five();
    let tree = temp_tree();
    put_then_first_two_of_entry_2(&tree, true); // the old per-request commits
    let mut a = open(&tree);
    assert_eq!(a.last_applied(), Some(log_id(1)));
    assert_eq!(
        a.store().current_revision(),
        4,
        "two requests of entry 2 landed"
    );
    a.apply(&batch(2, 5)).unwrap();
    assert_eq!(a.last_applied(), Some(log_id(2)));
    assert_eq!(fingerprint(&a), fingerprint(&reference));
}

/// A store that applied `put(1)` and then `batch(2, 5)` without interruption.
fn put_then_batch_of_five() -> Applier {
    let mut a = open(&temp_tree());
    a.apply(&put(1)).unwrap();
    a.apply(&batch(2, 5)).unwrap();
    a
}

/// A store on `tree` that applied `put(1)` and then only the first two requests of
/// `batch(2, 5)`, with the partial consistent index each stages, flushing each one (as Keel
/// did before group commit) when `flush_each`. Dropping it is the crash.
fn put_then_first_two_of_entry_2(tree: &sled::Tree, flush_each: bool) -> Applier {
    let mut a = open(tree);
    a.apply(&put(1)).unwrap();
    for (k, req) in batch_requests(2, 5).iter().take(2).enumerate() {
        let next = crate::cindex::ConsistentIndex {
            applied: Some(log_id(1)),
            partial: Some((log_id(2), k as u32 + 1)),
        };
        a.apply_request(req.request.as_ref(), None, 2, next)
            .unwrap();
        if flush_each {
            a.store().flush().unwrap();
        }
    }
    a
}

fn batch_requests(index: u64, n: u64) -> Vec<RaftRequest> {
    let EntryPayload::Normal(entry) = batch(index, n).payload else {
        unreachable!()
    };
    let Some(raft_request::Request::Batch(b)) = &entry.request else {
        unreachable!()
    };
    b.requests.clone()
}

mod grouping {
    //! Requests applied as one batch entry (one apply group) must give exactly the results
    //! and the store they give as separate entries: later requests of a group read the
    //! staged changes of earlier ones.
    use super::*;
    use keel_proto::etcdserverpb::{
        Compare, DeleteRangeRequest, RequestOp, TxnRequest, compare, request_op,
    };
    use proptest::prelude::*;

    fn op(kind: u8, key: u8, value: u16) -> raft_request::Request {
        let key = format!("g{}", key % 3).into_bytes();
        let value = format!("v{value}").into_bytes();
        match kind % 4 {
            0 => raft_request::Request::Put(PutRequest {
                key,
                value,
                prev_kv: true,
                ..Default::default()
            }),
            1 => raft_request::Request::DeleteRange(DeleteRangeRequest {
                key,
                prev_kv: true,
                ..Default::default()
            }),
            2 => raft_request::Request::Put(PutRequest {
                key,
                ignore_value: true,
                ..Default::default()
            }),
            _ => raft_request::Request::Txn(TxnRequest {
                compare: vec![Compare {
                    key: key.clone(),
                    result: compare::CompareResult::Greater as i32,
                    target: compare::CompareTarget::Version as i32,
                    target_union: Some(compare::TargetUnion::Version(1)),
                    ..Default::default()
                }],
                success: vec![RequestOp {
                    request: Some(request_op::Request::RequestPut(PutRequest {
                        key: key.clone(),
                        value,
                        prev_kv: true,
                        ..Default::default()
                    })),
                }],
                failure: vec![RequestOp {
                    request: Some(request_op::Request::RequestRange(RangeRequest {
                        key,
                        ..Default::default()
                    })),
                }],
            }),
        }
    }

    fn entry(index: u64, requests: Vec<raft_request::Request>) -> Entry {
        let requests = requests
            .into_iter()
            .enumerate()
            .map(|(k, r)| RaftRequest {
                auth_header: None,
                id: index * 1000 + k as u64,
                request: Some(r),
            })
            .collect();
        batch_entry(index, requests)
    }

    fn responses(resp: crate::raft::types::Response) -> Vec<keel_proto::keelpb::RaftResponse> {
        match resp.0.response {
            Some(keel_proto::keelpb::raft_response::Response::Batch(b)) => b.responses,
            other => panic!("batch response expected, got {other:?}"),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
        #[test]
        fn a_group_equals_its_requests_applied_one_by_one(
            ops in proptest::collection::vec((any::<u8>(), any::<u8>(), any::<u16>()), 1..40),
            cut in 1usize..8,
        ) {
            let requests: Vec<_> = ops.iter().map(|&(k, key, v)| op(k, key, v)).collect();
            let one_db = sled::Config::new().temporary(true).open().unwrap();
            let mut one = open(&one_db.open_tree("t").unwrap());
            let mut expected = Vec::new();
            for (i, r) in requests.iter().enumerate() {
                expected.extend(responses(one.apply(&entry(i as u64 + 1, vec![r.clone()])).unwrap()));
            }
            let group_db = sled::Config::new().temporary(true).open().unwrap();
            let mut group = open(&group_db.open_tree("t").unwrap());
            let mut got = Vec::new();
            for (i, chunk) in requests.chunks(cut).enumerate() {
                got.extend(responses(group.apply(&entry(i as u64 + 1, chunk.to_vec())).unwrap()));
            }
            prop_assert_eq!(got, expected);
            prop_assert_eq!(fingerprint(&group), fingerprint(&one));
        }
    }
}

mod invariants {
    //! The apply invariants of the module docs are asserted: breaking one panics instead of
    //! writing a store that no longer matches its consistent index.
    use super::*;
    use crate::backend::schema;

    #[test]
    #[should_panic(expected = "where the store applied")]
    fn a_replay_at_the_applied_index_must_be_the_applied_entry() {
        let mut a = open(&temp_tree());
        a.apply(&put(1)).unwrap();
        let mut other_term = put(1);
        other_term.log_id = openraft::LogId::new(CommittedLeaderId::new(2, 1), 1);
        let _ = a.apply(&other_term);
    }

    #[test]
    #[should_panic(expected = "requests of")]
    fn a_partly_applied_entry_is_finished_before_the_next() {
        let tree = temp_tree();
        put_then_first_two_of_entry_2(&tree, true);
        let mut a = open(&tree);
        let _ = a.apply(&put(3));
    }

    #[test]
    #[should_panic(expected = "would move from")]
    fn the_consistent_index_never_moves_back() {
        let mut a = open(&temp_tree());
        a.apply(&put(1)).unwrap();
        a.apply(&put(2)).unwrap();
        let back = crate::cindex::ConsistentIndex {
            applied: Some(log_id(1)),
            partial: None,
        };
        let _ = a.apply_request(None, None, 3, back);
    }

    /// Every key apply writes, for every kind of entry, is declared in the backend schema.
    #[test]
    fn every_key_apply_writes_is_in_the_schema() {
        use keel_proto::etcdserverpb::{CompactionRequest, DeleteRangeRequest, LeaseGrantRequest};
        use keel_proto::keelpb::MemberAttributes;
        let tree = temp_tree();
        let mut a = open(&tree);
        let normal = |index: u64, request: raft_request::Request| Entry {
            log_id: log_id(index),
            payload: EntryPayload::Normal(Request::new(RaftRequest {
                auth_header: None,
                id: index,
                request: Some(request),
            })),
        };
        let entries = [
            Entry {
                log_id: log_id(1),
                payload: EntryPayload::Membership(openraft::Membership::new(
                    vec![std::collections::BTreeSet::from([1u64])],
                    std::collections::BTreeMap::from([(
                        1u64,
                        crate::raft::types::MemberNode::default(),
                    )]),
                )),
            },
            normal(
                2,
                raft_request::Request::LeaseGrant(LeaseGrantRequest { ttl: 60, id: 7 }),
            ),
            normal(
                3,
                raft_request::Request::Put(PutRequest {
                    key: b"a".to_vec(),
                    value: b"1".to_vec(),
                    lease: 7,
                    ..Default::default()
                }),
            ),
            normal(
                4,
                raft_request::Request::DeleteRange(DeleteRangeRequest {
                    key: b"a".to_vec(),
                    ..Default::default()
                }),
            ),
            normal(
                5,
                raft_request::Request::MemberAttributes(MemberAttributes {
                    member_id: 1,
                    name: "m1".into(),
                    client_urls: vec!["http://127.0.0.1:2379".into()],
                    ..Default::default()
                }),
            ),
            normal(
                6,
                raft_request::Request::Compaction(CompactionRequest {
                    revision: 2,
                    physical: false,
                }),
            ),
            Entry {
                log_id: log_id(7),
                payload: EntryPayload::Blank,
            },
            normal(
                8,
                raft_request::Request::ClusterVersionSet(keel_proto::keelpb::ClusterVersionSet {
                    version: "0.2".into(),
                }),
            ),
            normal(
                9,
                raft_request::Request::Alarm(keel_proto::etcdserverpb::AlarmRequest {
                    action: 1,
                    member_id: 1,
                    alarm: 1,
                }),
            ),
        ];
        for e in &entries {
            a.apply(e).unwrap();
        }
        let mut owners = std::collections::BTreeSet::new();
        for kv in tree.iter() {
            let (key, _) = kv.unwrap();
            let owner = schema::owner(&key);
            assert!(
                owner.is_some(),
                "{} is not in the schema",
                key.escape_ascii()
            );
            owners.insert(format!("{owner:?}"));
        }
        // Each kind of state reached the tree (the check above saw every owner's keys).
        let want = [
            "Some(MvccRecord)",
            "Some(MvccMeta)",
            "Some(ConsistentIndex)",
            "Some(Lease)",
            "Some(RaftMembership)",
            "Some(MemberAttributes)",
            "Some(Alarm)",
            "Some(ClusterVersion)",
        ];
        assert_eq!(owners, want.iter().map(|s| s.to_string()).collect());
    }
}
