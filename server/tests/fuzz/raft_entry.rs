//! Raft log entries as the WAL stores them (bincode `openraft::Entry` around the protobuf
//! `keelpb.RaftRequest`, `raft::types`): every request encodes and decodes back to itself,
//! and damaged or random bytes decode to an error, never a panic or a huge allocation.

use std::collections::{BTreeMap, BTreeSet};

use arbitrary::{Arbitrary, Unstructured};
use keel_proto::etcdserverpb::{PutRequest, RequestOp, request_op};
use keel_proto::keelpb::{RaftRequest, raft_request};
use keel_server::raft::types::{Entry, MemberNode, Request};
use openraft::{CommittedLeaderId, EntryPayload, LogId, Membership};
use proptest::prelude::*;
use prost::Message;

use crate::{alloc, budget, mutate};

/// How deep `txn` requests nest inside `request` (0: not a txn).
fn txn_depth(request: &RaftRequest) -> usize {
    fn ops(list: &[RequestOp]) -> usize {
        list.iter()
            .map(|op| match &op.request {
                Some(request_op::Request::RequestTxn(t)) => {
                    1 + ops(&t.success).max(ops(&t.failure))
                }
                _ => 0,
            })
            .max()
            .unwrap_or(0)
    }
    match &request.request {
        Some(raft_request::Request::Txn(t)) => 1 + ops(&t.success).max(ops(&t.failure)),
        _ => 0,
    }
}

fn entry(index: u64, payload: EntryPayload<keel_server::raft::types::TypeConfig>) -> Entry {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(2, 1), index),
        payload,
    }
}

/// Encoded entries of each payload kind, the seeds of the byte-level target.
fn seeds() -> Vec<Vec<u8>> {
    let put = RaftRequest {
        auth_header: None,
        id: 9,
        request: Some(raft_request::Request::Put(PutRequest {
            key: b"/registry/pods/default/web-1".to_vec(),
            value: vec![7; 64],
            lease: 0x1234,
            ..Default::default()
        })),
    };
    let membership = Membership::new(
        vec![BTreeSet::from([1, 2, 3])],
        BTreeMap::from([
            (
                1,
                MemberNode {
                    name: "m1".into(),
                    peer_urls: vec!["http://127.0.0.1:2380".into()],
                },
            ),
            (2, MemberNode::default()),
            (3, MemberNode::default()),
        ]),
    );
    [
        entry(5, EntryPayload::Blank),
        entry(6, EntryPayload::Normal(Request::new(put))),
        entry(7, EntryPayload::Membership(membership)),
    ]
    .iter()
    .map(|e| bincode::serialize(e).expect("encode seed"))
    .collect()
}

#[test]
fn every_request_round_trips_through_a_log_entry() {
    let strategy = prop::collection::vec(any::<u8>(), 0..4096);
    budget::fuzz("raft entry round trip", strategy, |bytes| {
        let mut u = Unstructured::new(&bytes);
        let Ok(request) = RaftRequest::arbitrary(&mut u) else {
            return Ok(());
        };
        // Deeper txns than prost's decode limit are refused by the API (`check_txn`), so
        // they never reach the log; see the regression test below.
        prop_assume!(txn_depth(&request) <= 32);
        let e = entry(42, EntryPayload::Normal(Request::new(request.clone())));
        let encoded = bincode::serialize(&e).expect("encode");
        let decoded: Entry = alloc::bounded("decode", || bincode::deserialize(&encoded))?
            .map_err(|err| TestCaseError::fail(format!("decode of an encoded entry: {err}")))?;
        let EntryPayload::Normal(back) = decoded.payload else {
            return Err(TestCaseError::fail("payload kind changed"));
        };
        prop_assert_eq!(decoded.log_id, e.log_id);
        prop_assert_eq!(back.message(), &request);
        Ok(())
    });
}

#[test]
fn damaged_entries_decode_to_errors() {
    let seeds = seeds();
    let strategy = (0..seeds.len()).prop_flat_map(move |i| mutate::mutated(seeds[i].clone()));
    budget::fuzz("raft entry decode", strategy, |bytes| {
        let _ = alloc::bounded("Entry", || bincode::deserialize::<Entry>(&bytes))?;
        let _ = alloc::bounded("RaftRequest", || RaftRequest::decode(bytes.as_slice()))?;
        Ok(())
    });
}

/// A txn nested deeper than prost's recursion limit (100) encodes but cannot be decoded;
/// the API refuses such requests before they are proposed (docs/compat.md, "txn nesting
/// depth"), because an undecodable entry would stop every member that reads it.
#[test]
fn a_txn_deeper_than_the_decode_limit_is_refused_by_the_api() {
    use keel_proto::etcdserverpb::TxnRequest;
    let mut txn = TxnRequest::default();
    for _ in 0..120 {
        txn = TxnRequest {
            success: vec![RequestOp {
                request: Some(request_op::Request::RequestTxn(txn)),
            }],
            ..Default::default()
        };
    }
    assert!(keel_server::api::kv_validate::check_txn(&txn, 128).is_err());
    let request = RaftRequest {
        auth_header: None,
        id: 1,
        request: Some(raft_request::Request::Txn(txn)),
    };
    assert!(RaftRequest::decode(request.encode_to_vec().as_slice()).is_err());
}
