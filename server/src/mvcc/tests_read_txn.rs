//! Read-only txns: the local path ([`MvccStore::txn_read_only`]) against the apply path
//! ([`WriteTxn::txn`]) on the same store and revision: same result, byte for byte (a
//! property test over random histories and random read-only txns, nested ones included),
//! and the detection rules over nested shapes.

use keel_proto::etcdserverpb::compare::TargetUnion;
use keel_proto::etcdserverpb::request_op::Request;
use keel_proto::etcdserverpb::{
    Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};
use proptest::prelude::*;
use prost::Message;

use super::test_support::txn_of as txn;
use super::tests_scenarios::fixture;
use super::{MvccStore, is_txn_read_only, is_txn_serializable, txn_ops};

const KEYS: &[&str] = &["a", "a/1", "a/2", "b", "c", "d"];

fn key(i: usize) -> Vec<u8> {
    KEYS[i % KEYS.len()].as_bytes().to_vec()
}

/// A range end for key `i`: none, the key's prefix end, a later key, or "from key".
fn end(i: usize, shape: u8) -> Vec<u8> {
    match shape % 4 {
        0 => vec![],
        1 => {
            let mut e = key(i);
            *e.last_mut().expect("keys are not empty") += 1;
            e
        }
        2 => key(i + 2),
        _ => vec![0],
    }
}

fn range_op(r: RangeRequest) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestRange(r)),
    }
}

fn txn_op(t: TxnRequest) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestTxn(t)),
    }
}

fn compare_strategy() -> impl Strategy<Value = Compare> {
    (0..KEYS.len(), 0u8..4, 0i32..5, 0i32..4, 0i64..12, 0u8..3).prop_map(
        |(k, shape, target, result, n, value)| {
            let union = match target {
                0 => TargetUnion::Version(n % 4),
                1 => TargetUnion::CreateRevision(n),
                2 => TargetUnion::ModRevision(n),
                3 => TargetUnion::Value(vec![b'0' + value]),
                _ => TargetUnion::Lease(if n % 2 == 0 { 0 } else { 7 }),
            };
            Compare {
                result,
                target,
                key: key(k),
                range_end: end(k, shape),
                target_union: Some(union),
            }
        },
    )
}

fn range_strategy() -> impl Strategy<Value = RangeRequest> {
    (
        (0..KEYS.len(), 0u8..4, -1i64..14, 0i64..3),
        (
            0i32..5,
            0i32..3,
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
        ),
        (0i64..6, 0i64..8),
    )
        .prop_map(
            |(
                (k, shape, revision, limit),
                (st, so, keys_only, count_only, ser),
                (min_mod, max_create),
            )| {
                RangeRequest {
                    key: key(k),
                    range_end: end(k, shape),
                    revision,
                    limit,
                    sort_target: st,
                    sort_order: so,
                    keys_only,
                    count_only,
                    serializable: ser,
                    min_mod_revision: min_mod,
                    max_create_revision: max_create,
                    ..Default::default()
                }
            },
        )
}

/// Read-only txns up to two levels deep.
fn txn_strategy() -> impl Strategy<Value = TxnRequest> {
    let flat = (
        proptest::collection::vec(compare_strategy(), 0..3),
        proptest::collection::vec(range_strategy().prop_map(range_op), 0..3),
        proptest::collection::vec(range_strategy().prop_map(range_op), 0..3),
    )
        .prop_map(|(compare, success, failure)| TxnRequest {
            compare,
            success,
            failure,
        });
    flat.prop_recursive(2, 12, 3, |inner| {
        (
            proptest::collection::vec(compare_strategy(), 0..3),
            proptest::collection::vec(
                prop_oneof![
                    range_strategy().prop_map(range_op),
                    inner.clone().prop_map(txn_op)
                ],
                0..3,
            ),
            proptest::collection::vec(
                prop_oneof![range_strategy().prop_map(range_op), inner.prop_map(txn_op)],
                0..3,
            ),
        )
            .prop_map(|(compare, success, failure)| TxnRequest {
                compare,
                success,
                failure,
            })
    })
}

/// One write entry: puts (`Some(value)`, lease 7 on odd values) or deletes of keys.
fn history_strategy() -> impl Strategy<Value = Vec<Vec<(usize, Option<u8>)>>> {
    proptest::collection::vec(
        proptest::collection::vec((0..KEYS.len(), proptest::option::of(0u8..3)), 1..3),
        0..10,
    )
}

fn load(store: &MvccStore, history: &[Vec<(usize, Option<u8>)>], compact_at: i64) {
    for entry in history {
        let mut w = store.write();
        for &(k, value) in entry {
            match value {
                Some(v) => {
                    w.put(&PutRequest {
                        key: key(k),
                        value: vec![b'0' + v],
                        lease: if v % 2 == 1 { 7 } else { 0 },
                        ..Default::default()
                    })
                    .unwrap();
                }
                None => {
                    w.delete_range(&DeleteRangeRequest {
                        key: key(k),
                        ..Default::default()
                    })
                    .unwrap();
                }
            }
        }
        w.commit().unwrap();
    }
    if compact_at > 1 && compact_at <= store.current_revision() {
        let mut w = store.write();
        w.compact(compact_at).unwrap();
        w.commit().unwrap();
    }
}

/// The apply path's answer: the txn on a write view that is then dropped (it wrote nothing).
fn applied(store: &MvccStore, req: &TxnRequest) -> Result<Vec<u8>, crate::error::EtcdError> {
    let mut w = store.write();
    let resp = w.txn(req).map(|r| r.encode_to_vec());
    drop(w);
    resp
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn read_only_path_answers_as_apply(
        history in history_strategy(),
        compact_at in 0i64..8,
        txns in proptest::collection::vec(txn_strategy(), 1..6),
    ) {
        let f = fixture();
        load(&f.store, &history, compact_at);
        let rev = f.store.current_revision();
        for t in &txns {
            prop_assert!(is_txn_read_only(t));
            let local = f.store.txn_read_only(t).map(|r| r.encode_to_vec());
            prop_assert_eq!(&local, &applied(&f.store, t), "txn {:?}", t);
            if let Ok(bytes) = &local {
                let resp = keel_proto::etcdserverpb::TxnResponse::decode(bytes.as_slice()).unwrap();
                prop_assert_eq!(resp.header.map(|h| h.revision), Some(rev));
            }
            // Neither path changed the store.
            prop_assert_eq!(f.store.current_revision(), rev);
        }
    }
}

fn range(serializable: bool) -> RequestOp {
    range_op(RangeRequest {
        key: b"a".to_vec(),
        serializable,
        ..Default::default()
    })
}

fn put() -> RequestOp {
    RequestOp {
        request: Some(Request::RequestPut(PutRequest {
            key: b"a".to_vec(),
            ..Default::default()
        })),
    }
}

#[test]
fn detection_follows_nested_shapes() {
    // (txn, read-only, serializable)
    let cases = [
        (txn(vec![], vec![]), true, false),
        (txn(vec![range(false)], vec![]), true, false),
        (txn(vec![range(true)], vec![range(true)]), true, true),
        (txn(vec![range(true)], vec![range(false)]), true, false),
        (txn(vec![range(true), put()], vec![]), false, false),
        (txn(vec![], vec![put()]), false, false),
        (
            txn(
                vec![txn_op(txn(vec![range(true)], vec![range(true)]))],
                vec![range(true)],
            ),
            true,
            true,
        ),
        (
            txn(
                vec![range(true)],
                vec![txn_op(txn(vec![], vec![range(false)]))],
            ),
            true,
            false,
        ),
        (
            txn(
                vec![txn_op(txn(vec![txn_op(txn(vec![put()], vec![]))], vec![]))],
                vec![],
            ),
            false,
            false,
        ),
        // A nested txn with no range adds none: the outer ranges decide.
        (
            txn(vec![txn_op(txn(vec![], vec![])), range(true)], vec![]),
            true,
            true,
        ),
        (txn(vec![txn_op(txn(vec![], vec![]))], vec![]), true, false),
        (txn(vec![RequestOp { request: None }], vec![]), false, false),
    ];
    for (i, (t, read_only, serializable)) in cases.iter().enumerate() {
        assert_eq!(is_txn_read_only(t), *read_only, "case {i}: read-only");
        if *read_only {
            assert_eq!(
                is_txn_serializable(t),
                *serializable,
                "case {i}: serializable"
            );
        }
    }
}

#[test]
fn read_only_path_refuses_a_write() {
    let f = fixture();
    let err = f
        .store
        .txn_read_only(&txn(vec![put()], vec![]))
        .unwrap_err();
    assert!(
        matches!(err, crate::error::EtcdError::Internal(_)),
        "{err:?}"
    );
    assert_eq!(f.store.current_revision(), 1);
}

/// `txn_ops` walks both branches, success first, nested txns in place and depth first, and
/// skips ops with no request.
#[test]
fn txn_ops_walks_every_request_of_both_branches_and_nested_txns() {
    let op = |r: Request| RequestOp { request: Some(r) };
    let range = |k: &str| {
        op(Request::RequestRange(RangeRequest {
            key: k.into(),
            ..Default::default()
        }))
    };
    let nested = txn(
        vec![range("n1")],
        vec![range("n2"), RequestOp { request: None }],
    );
    let outer = txn(
        vec![range("s1"), op(Request::RequestTxn(nested)), range("s2")],
        vec![op(Request::RequestDeleteRange(DeleteRangeRequest {
            key: b"f1".to_vec(),
            ..Default::default()
        }))],
    );
    let keys: Vec<&[u8]> = txn_ops(&outer)
        .map(|r| match r {
            Request::RequestRange(r) => r.key.as_slice(),
            Request::RequestDeleteRange(d) => d.key.as_slice(),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(keys, [&b"s1"[..], b"n1", b"n2", b"s2", b"f1"]);
    assert_eq!(txn_ops(&txn(vec![], vec![])).count(), 0);
}
