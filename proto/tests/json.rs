//! The generated serde of the etcd API speaks grpc-gateway's JSON, as etcd's gateway
//! (`jsonpb` with `OrigName`) writes and reads it.

use keel_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use keel_proto::etcdserverpb::{
    Compare, LeaseGrantRequest, PutRequest, RangeResponse, ResponseHeader,
};
use keel_proto::mvccpb::KeyValue;

#[test]
fn responses_use_proto_names_base64_and_string_integers() {
    let resp = RangeResponse {
        header: Some(ResponseHeader {
            cluster_id: 15118495548433857066,
            member_id: 1,
            revision: 2,
            raft_term: 0,
        }),
        kvs: vec![KeyValue {
            key: b"foo".to_vec(),
            create_revision: 2,
            mod_revision: 2,
            version: 1,
            value: b"bar".to_vec(),
            lease: 0,
        }],
        more: false,
        count: 1,
    };
    assert_eq!(
        serde_json::to_string(&resp).unwrap(),
        r#"{"header":{"cluster_id":"15118495548433857066","member_id":"1","revision":"2"},"kvs":[{"key":"Zm9v","create_revision":"2","mod_revision":"2","version":"1","value":"YmFy"}],"count":"1"}"#
    );
}

#[test]
fn requests_accept_numbers_strings_enum_names_and_unknown_fields() {
    let grant: LeaseGrantRequest = serde_json::from_str(r#"{"TTL": 60, "ID": "7"}"#).unwrap();
    assert_eq!((grant.ttl, grant.id), (60, 7));
    let put: PutRequest =
        serde_json::from_str(r#"{"key":"Zm9v","value":"YmFy","prev_kv":true,"nope":1}"#).unwrap();
    assert_eq!(put.key, b"foo");
    assert_eq!(put.value, b"bar");
    assert!(put.prev_kv);
    let cmp: Compare = serde_json::from_str(
        r#"{"key":"Zm9v","result":"EQUAL","target":"CREATE","create_revision":"0"}"#,
    )
    .unwrap();
    assert_eq!(cmp.result, CompareResult::Equal as i32);
    assert_eq!(cmp.target, CompareTarget::Create as i32);
    assert_eq!(cmp.target_union, Some(TargetUnion::CreateRevision(0)));
    assert!(serde_json::from_str::<Compare>(r#"{"target":"NOPE"}"#).is_err());
}
