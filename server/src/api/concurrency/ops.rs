//! The Txn pieces the recipes are written in (clientv3's `Compare`, `OpPut`, `OpGet`,
//! `OpDelete`), and reading their answers back.

use keel_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use keel_proto::etcdserverpb::request_op::Request as Op;
use keel_proto::etcdserverpb::response_op::Response as OpResponse;
use keel_proto::etcdserverpb::{
    Compare, DeleteRangeRequest, PutRequest, RangeRequest, RangeResponse, RequestOp, TxnResponse,
};
use keel_proto::mvccpb::KeyValue;

/// `create_revision(key) == revision` (0: the key does not exist).
pub fn created_at(key: &[u8], revision: i64) -> Compare {
    Compare {
        result: CompareResult::Equal as i32,
        target: CompareTarget::Create as i32,
        key: key.to_vec(),
        target_union: Some(TargetUnion::CreateRevision(revision)),
        ..Default::default()
    }
}

/// Put `key = value` attached to `lease`.
pub fn put(key: &[u8], value: &[u8], lease: i64) -> RequestOp {
    RequestOp {
        request: Some(Op::RequestPut(PutRequest {
            key: key.to_vec(),
            value: value.to_vec(),
            lease,
            ..Default::default()
        })),
    }
}

/// Get with `req`.
pub fn get(req: RangeRequest) -> RequestOp {
    RequestOp {
        request: Some(Op::RequestRange(req)),
    }
}

/// Get the single `key`.
pub fn get_key(key: &[u8]) -> RequestOp {
    get(RangeRequest {
        key: key.to_vec(),
        ..Default::default()
    })
}

/// Delete the single `key`.
pub fn delete(key: &[u8]) -> RequestOp {
    RequestOp {
        request: Some(Op::RequestDeleteRange(DeleteRangeRequest {
            key: key.to_vec(),
            ..Default::default()
        })),
    }
}

/// The Range answer at position `i` of a Txn's responses.
pub fn range_at(resp: &TxnResponse, i: usize) -> Option<&RangeResponse> {
    match resp.responses.get(i)?.response.as_ref()? {
        OpResponse::ResponseRange(r) => Some(r),
        _ => None,
    }
}

/// The first key-value of the Range answer at position `i`.
pub fn first_kv(resp: &TxnResponse, i: usize) -> Option<&KeyValue> {
    range_at(resp, i)?.kvs.first()
}

/// The header revision of a Txn answer (0 if it has none, which the member's Txn never
/// answers).
pub fn revision_of(resp: &TxnResponse) -> i64 {
    resp.header.as_ref().map_or(0, |h| h.revision)
}
