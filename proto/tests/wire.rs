//! Pins the wire encoding of etcd v3 API fields by field number, so a renumbered or retyped
//! field (which would silently break etcdctl and Go clientv3) fails the build's tests.
//!
//! Expected bytes are protobuf encodings worked out by hand from etcd 3.6's
//! api/etcdserverpb/rpc.proto and api/authpb/auth.proto: a field's tag byte is
//! `(field_number << 3) | wire_type` (0 = varint, 2 = length-delimited).

use keel_proto::authpb::{Permission, UserAddOptions, permission};
use keel_proto::etcdserverpb::{
    AlarmType, AuthStatusResponse, AuthUserAddRequest, Compare, HashKvResponse,
    LeaseTimeToLiveResponse, MemberAddRequest, PutRequest, RangeRequest, RequestOp, StatusResponse,
    TxnRequest, WatchCreateRequest, WatchRequest, WatchResponse, compare, range_request,
    request_op, watch_create_request, watch_request,
};
use keel_proto::mvccpb::{Event, KeyValue, event};
use prost::Message;

#[test]
fn range_request_count_only_is_field_9() {
    let req = RangeRequest {
        count_only: true,
        ..Default::default()
    };
    assert_eq!(req.encode_to_vec(), [0x48, 0x01]);
}

#[test]
fn range_request_revision_filters_are_fields_10_to_13() {
    let req = RangeRequest {
        min_mod_revision: 1,
        max_mod_revision: 2,
        min_create_revision: 3,
        max_create_revision: 4,
        ..Default::default()
    };
    assert_eq!(
        req.encode_to_vec(),
        [0x50, 0x01, 0x58, 0x02, 0x60, 0x03, 0x68, 0x04]
    );
}

#[test]
fn range_request_sort_enums_keep_etcd_values() {
    let req = RangeRequest {
        sort_order: range_request::SortOrder::Descend as i32,
        sort_target: range_request::SortTarget::Value as i32,
        ..Default::default()
    };
    // sort_order = field 5 value 2, sort_target = field 6 value 4.
    assert_eq!(req.encode_to_vec(), [0x28, 0x02, 0x30, 0x04]);
}

#[test]
fn put_request_prev_kv_ignore_value_ignore_lease_are_fields_4_5_6() {
    let req = PutRequest {
        prev_kv: true,
        ignore_value: true,
        ignore_lease: true,
        ..Default::default()
    };
    assert_eq!(req.encode_to_vec(), [0x20, 0x01, 0x28, 0x01, 0x30, 0x01]);
}

#[test]
fn watch_create_request_filters_prev_kv_watch_id_fragment() {
    let create = WatchCreateRequest {
        progress_notify: true,
        filters: vec![watch_create_request::FilterType::Nodelete as i32],
        prev_kv: true,
        watch_id: 7,
        fragment: true,
        ..Default::default()
    };
    // progress_notify = 4; filters = 5 (packed: len 1, value 1); prev_kv = 6;
    // watch_id = 7; fragment = 8.
    assert_eq!(
        create.encode_to_vec(),
        [
            0x20, 0x01, 0x2a, 0x01, 0x01, 0x30, 0x01, 0x38, 0x07, 0x40, 0x01
        ]
    );
}

#[test]
fn watch_request_progress_request_is_field_3() {
    let req = WatchRequest {
        request_union: Some(watch_request::RequestUnion::ProgressRequest(
            Default::default(),
        )),
    };
    assert_eq!(req.encode_to_vec(), [0x1a, 0x00]);
}

#[test]
fn watch_response_compact_revision_cancel_reason_fragment_events() {
    let resp = WatchResponse {
        compact_revision: 3,
        cancel_reason: "x".to_owned(),
        fragment: true,
        events: vec![Event::default()],
        ..Default::default()
    };
    // compact_revision = 5; cancel_reason = 6; fragment = 7; events = 11 (tag 0x5a).
    assert_eq!(
        resp.encode_to_vec(),
        [0x28, 0x03, 0x32, 0x01, b'x', 0x38, 0x01, 0x5a, 0x00]
    );
}

#[test]
fn status_response_3_4_and_3_6_fields() {
    let resp = StatusResponse {
        raft_applied_index: 9,
        errors: vec!["e".to_owned()],
        db_size_in_use: 1,
        is_learner: true,
        storage_version: "3.6.0".to_owned(),
        db_size_quota: 2,
        downgrade_info: Some(Default::default()),
        ..Default::default()
    };
    // raftAppliedIndex = 7; errors = 8; dbSizeInUse = 9; isLearner = 10;
    // storageVersion = 11; dbSizeQuota = 12; downgradeInfo = 13.
    let mut expected = vec![
        0x38, 0x09, 0x42, 0x01, b'e', 0x48, 0x01, 0x50, 0x01, 0x5a, 0x05,
    ];
    expected.extend_from_slice(b"3.6.0");
    expected.extend_from_slice(&[0x60, 0x02, 0x6a, 0x00]);
    assert_eq!(resp.encode_to_vec(), expected);
}

#[test]
fn hash_kv_response_hash_revision_is_field_4() {
    let resp = HashKvResponse {
        hash: 1,
        compact_revision: 2,
        hash_revision: 3,
        ..Default::default()
    };
    assert_eq!(resp.encode_to_vec(), [0x10, 0x01, 0x18, 0x02, 0x20, 0x03]);
}

#[test]
fn compare_lease_target_is_field_8_and_range_end_is_field_64() {
    let cmp = Compare {
        result: compare::CompareResult::NotEqual as i32,
        target: compare::CompareTarget::Lease as i32,
        target_union: Some(compare::TargetUnion::Lease(5)),
        range_end: b"b".to_vec(),
        ..Default::default()
    };
    // result = 1 (NOT_EQUAL = 3); target = 2 (LEASE = 4); lease = 8;
    // range_end = 64, whose tag 514 needs a two-byte varint.
    assert_eq!(
        cmp.encode_to_vec(),
        [0x08, 0x03, 0x10, 0x04, 0x40, 0x05, 0x82, 0x04, 0x01, b'b']
    );
}

#[test]
fn request_op_nested_txn_is_field_4() {
    let op = RequestOp {
        request: Some(request_op::Request::RequestTxn(TxnRequest::default())),
    };
    assert_eq!(op.encode_to_vec(), [0x22, 0x00]);
}

#[test]
fn lease_time_to_live_response_granted_ttl_and_keys() {
    let resp = LeaseTimeToLiveResponse {
        id: 1,
        ttl: 2,
        granted_ttl: 10,
        keys: vec![b"k".to_vec()],
        ..Default::default()
    };
    assert_eq!(
        resp.encode_to_vec(),
        [0x10, 0x01, 0x18, 0x02, 0x20, 0x0a, 0x2a, 0x01, b'k']
    );
}

#[test]
fn member_add_request_is_learner_is_field_2() {
    let req = MemberAddRequest {
        peer_ur_ls: vec![],
        is_learner: true,
    };
    assert_eq!(req.encode_to_vec(), [0x10, 0x01]);
}

#[test]
fn auth_user_add_options_and_auth_status() {
    let add = AuthUserAddRequest {
        options: Some(UserAddOptions { no_password: true }),
        ..Default::default()
    };
    assert_eq!(add.encode_to_vec(), [0x1a, 0x02, 0x08, 0x01]);

    let status = AuthStatusResponse {
        enabled: true,
        auth_revision: 2,
        ..Default::default()
    };
    assert_eq!(status.encode_to_vec(), [0x10, 0x01, 0x18, 0x02]);
}

#[test]
fn enum_values_match_etcd() {
    assert_eq!(AlarmType::Corrupt as i32, 2);
    assert_eq!(permission::Type::Readwrite as i32, 2);
    assert_eq!(event::EventType::Delete as i32, 1);
    let perm = Permission {
        perm_type: permission::Type::Write as i32,
        key: b"a".to_vec(),
        range_end: b"b".to_vec(),
    };
    assert_eq!(
        perm.encode_to_vec(),
        [0x08, 0x01, 0x12, 0x01, b'a', 0x1a, 0x01, b'b']
    );
}

#[test]
fn key_value_decodes_from_etcd_bytes() {
    // key "k" (1), create_revision 2 (2), mod_revision 3 (3), version 1 (4),
    // value "v" (5), lease 5 (6), as etcd encodes a KeyValue.
    let bytes = [
        0x0a, 0x01, b'k', 0x10, 0x02, 0x18, 0x03, 0x20, 0x01, 0x2a, 0x01, b'v', 0x30, 0x05,
    ];
    let kv = KeyValue::decode(&bytes[..]).expect("valid KeyValue encoding");
    assert_eq!(
        kv,
        KeyValue {
            key: b"k".to_vec(),
            create_revision: 2,
            mod_revision: 3,
            version: 1,
            value: b"v".to_vec(),
            lease: 5,
        }
    );
}

#[test]
fn range_stream_response_wraps_a_range_response_as_field_1() {
    // etcd 3.7 `RangeStreamResponse { RangeResponse range_response = 1; }`; count is
    // RangeResponse field 4.
    let resp = keel_proto::etcdserverpb::RangeStreamResponse {
        range_response: Some(keel_proto::etcdserverpb::RangeResponse {
            count: 1,
            ..Default::default()
        }),
    };
    assert_eq!(resp.encode_to_vec(), [0x0a, 0x02, 0x20, 0x01]);
}
