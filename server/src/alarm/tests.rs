use keel_proto::etcdserverpb::alarm_request::AlarmAction;
use keel_proto::etcdserverpb::request_op::Request as Op;
use keel_proto::etcdserverpb::{
    AlarmRequest, AlarmType, CompactionRequest, DeleteRangeRequest, LeaseGrantRequest,
    LeaseRevokeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};

use super::*;
use crate::backend::Backend;

fn req(action: AlarmAction, member_id: u64, alarm: AlarmType) -> AlarmRequest {
    AlarmRequest {
        action: action as i32,
        member_id,
        alarm: alarm as i32,
    }
}

fn ids(ms: &[AlarmMember]) -> Vec<(u64, i32)> {
    ms.iter().map(|m| (m.member_id, m.alarm)).collect()
}

#[test]
fn activate_get_deactivate_persist_through_the_batch() {
    let be = Backend::temporary().unwrap();
    let alarms = Alarms::load(be.tree()).unwrap();
    let mut b = Batch::default();
    let r = alarms.apply(&mut b, &req(AlarmAction::Activate, 7, AlarmType::Nospace));
    assert_eq!(ids(&r.alarms), [(7, 1)]);
    // Raising it again answers the raised alarm and stages nothing more.
    let n = b.len();
    let again = alarms.apply(&mut b, &req(AlarmAction::Activate, 7, AlarmType::Nospace));
    assert_eq!((ids(&again.alarms), b.len()), (vec![(7, 1)], n));
    alarms.apply(&mut b, &req(AlarmAction::Activate, 3, AlarmType::Corrupt));
    // NONE is not an alarm: ignored.
    let none = alarms.apply(&mut b, &req(AlarmAction::Activate, 9, AlarmType::None));
    assert!(none.alarms.is_empty());
    assert_eq!(ids(&alarms.get(AlarmType::None)), [(7, 1), (3, 2)]);
    assert_eq!(ids(&alarms.get(AlarmType::Corrupt)), [(3, 2)]);
    assert!(alarms.is_active(AlarmType::Nospace) && alarms.has(3, AlarmType::Corrupt));

    // Nothing is in the tree before the batch commits; afterwards a reload finds both.
    assert!(
        Alarms::load(be.tree())
            .unwrap()
            .get(AlarmType::None)
            .is_empty()
    );
    b.commit(be.tree()).unwrap();
    let reloaded = Alarms::load(be.tree()).unwrap();
    assert_eq!(ids(&reloaded.get(AlarmType::None)), [(7, 1), (3, 2)]);

    let mut b = Batch::default();
    // Member 0 is not a wildcard (etcd `Deactivate`).
    let miss = alarms.apply(&mut b, &req(AlarmAction::Deactivate, 0, AlarmType::Nospace));
    assert!(miss.alarms.is_empty() && b.is_empty());
    let hit = alarms.apply(&mut b, &req(AlarmAction::Deactivate, 7, AlarmType::Nospace));
    assert_eq!(ids(&hit.alarms), [(7, 1)]);
    b.commit(be.tree()).unwrap();
    reloaded.reload(be.tree()).unwrap();
    assert_eq!(ids(&reloaded.get(AlarmType::None)), [(3, 2)]);
    assert!(!reloaded.is_active(AlarmType::Nospace));
}

#[test]
fn a_bad_alarm_key_fails_the_load() {
    let be = Backend::temporary().unwrap();
    be.tree().insert(b"x/alarm/short", b"").unwrap();
    assert!(matches!(
        Alarms::load(be.tree()),
        Err(AlarmError::BadKey(_))
    ));
}

#[test]
fn refusals_follow_etcds_capped_and_corrupt_appliers() {
    let put = Rq::Put(PutRequest {
        key: b"k".to_vec(),
        ..Default::default()
    });
    let delete_only_txn = Rq::Txn(TxnRequest {
        success: vec![RequestOp {
            request: Some(Op::RequestDeleteRange(DeleteRangeRequest::default())),
        }],
        ..Default::default()
    });
    let nested_put_txn = Rq::Txn(TxnRequest {
        failure: vec![RequestOp {
            request: Some(Op::RequestTxn(TxnRequest {
                success: vec![RequestOp {
                    request: Some(Op::RequestPut(PutRequest::default())),
                }],
                ..Default::default()
            })),
        }],
        ..Default::default()
    });
    let range_txn = Rq::Txn(TxnRequest {
        success: vec![RequestOp {
            request: Some(Op::RequestRange(RangeRequest::default())),
        }],
        ..Default::default()
    });
    let cases: [(&str, Rq); 8] = [
        ("put", put),
        ("delete-only txn", delete_only_txn),
        ("nested-put txn", nested_put_txn),
        ("range txn", range_txn),
        ("delete", Rq::DeleteRange(DeleteRangeRequest::default())),
        ("compact", Rq::Compaction(CompactionRequest::default())),
        ("grant", Rq::LeaseGrant(LeaseGrantRequest::default())),
        ("revoke", Rq::LeaseRevoke(LeaseRevokeRequest::default())),
    ];
    let answers = |alarms: &Alarms| -> Vec<String> {
        cases
            .iter()
            .map(|(name, r)| match alarms.refusal(r) {
                Some(e) => format!("{name}: {e}"),
                None => format!("{name}: ok"),
            })
            .collect()
    };
    let alarms = Alarms::default();
    assert!(answers(&alarms).iter().all(|a| a.ends_with(": ok")));
    let mut b = Batch::default();
    alarms.apply(&mut b, &req(AlarmAction::Activate, 1, AlarmType::Nospace));
    let nospace = "etcdserver: mvcc: database space exceeded";
    assert_eq!(
        answers(&alarms),
        [
            format!("put: {nospace}"),
            "delete-only txn: ok".into(),
            format!("nested-put txn: {nospace}"),
            "range txn: ok".into(),
            "delete: ok".into(),
            "compact: ok".into(),
            format!("grant: {nospace}"),
            "revoke: ok".into(),
        ]
    );
    alarms.apply(&mut b, &req(AlarmAction::Activate, 2, AlarmType::Corrupt));
    assert!(
        answers(&alarms)
            .iter()
            .all(|a| a.ends_with(": etcdserver: corrupt cluster")),
        "{:?}",
        answers(&alarms)
    );
    assert_eq!(
        alarms.refusal(&Rq::Compaction(CompactionRequest::default())),
        Some(EtcdError::Corrupt)
    );
}

#[test]
fn status_lists_alarms_as_gogo_text() {
    let alarms = Alarms::default();
    let mut b = Batch::default();
    alarms.apply(
        &mut b,
        &req(
            AlarmAction::Activate,
            10276657743932975437,
            AlarmType::Nospace,
        ),
    );
    alarms.apply(&mut b, &req(AlarmAction::Activate, 5, AlarmType::Corrupt));
    assert_eq!(
        alarms.status_errors(),
        [
            "memberID:10276657743932975437 alarm:NOSPACE ",
            "memberID:5 alarm:CORRUPT "
        ]
    );
}

#[test]
fn quota_costs_are_etcds() {
    let put = PutRequest {
        key: b"abc".to_vec(),
        value: vec![0; 1000],
        ..Default::default()
    };
    assert_eq!(quota::cost_put(&put), 256 + 3 + 1000);
    let op = |p: &PutRequest| RequestOp {
        request: Some(Op::RequestPut(p.clone())),
    };
    let txn = TxnRequest {
        success: vec![op(&put)],
        failure: vec![op(&put), op(&PutRequest::default())],
        ..Default::default()
    };
    assert_eq!(quota::cost_txn(&txn), 1259 + 256, "the larger branch");
    assert_eq!(
        quota::cost(&Rq::LeaseGrant(LeaseGrantRequest::default())),
        64
    );
    assert_eq!(
        quota::cost(&Rq::DeleteRange(DeleteRangeRequest::default())),
        0
    );
    assert!(quota::fits(100, 99, 200));
    assert!(
        !quota::fits(100, 100, 200),
        "etcd needs size + cost < quota"
    );
}
