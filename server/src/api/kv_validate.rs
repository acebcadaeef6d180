//! Validation of KV requests before they are proposed (etcd
//! `server/etcdserver/api/v3rpc/key.go`: `checkRangeRequest`, `checkPutRequest`,
//! `checkDeleteRequest`, `checkTxnRequest`, `checkIntervals`, unchanged 3.4 → 3.6).
//!
//! These are pure functions of the request. What etcd checks only while applying (revisions
//! against the store, key existence for `ignore_value`/`ignore_lease`, lease existence) is
//! done by `mvcc` and the applier.
//!
//! Deliberately etcd-identical quirks:
//! - a negative `limit` or `revision` in a Range is accepted (no limit / current revision);
//! - the duplicate-key rule treats a delete range as `[key, range_end)` with plain byte
//!   order, so a "from key" delete (`range_end = "\0"`) conflicts with no put.

use std::collections::{BTreeMap, HashSet};

use keel_proto::etcdserverpb::request_op::Request;
use keel_proto::etcdserverpb::{
    CompactionRequest, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};

use crate::error::EtcdError;

/// etcd's default `--max-txn-ops`: the most compares, or success ops, or failure ops, one
/// txn may carry.
pub const DEFAULT_MAX_TXN_OPS: usize = 128;

/// etcd `checkRangeRequest`.
///
/// Errors: `EmptyKey` when `key` is empty.
pub fn check_range(r: &RangeRequest) -> Result<(), EtcdError> {
    if r.key.is_empty() {
        return Err(EtcdError::EmptyKey);
    }
    Ok(())
}

/// etcd `checkPutRequest`.
///
/// Errors: `EmptyKey`; `ValueProvided` when `ignore_value` is set with a non-empty value;
/// `LeaseProvided` when `ignore_lease` is set with a non-zero lease.
pub fn check_put(r: &PutRequest) -> Result<(), EtcdError> {
    if r.key.is_empty() {
        return Err(EtcdError::EmptyKey);
    }
    if r.ignore_value && !r.value.is_empty() {
        return Err(EtcdError::ValueProvided);
    }
    if r.ignore_lease && r.lease != 0 {
        return Err(EtcdError::LeaseProvided);
    }
    Ok(())
}

/// etcd `checkDeleteRequest`.
///
/// Errors: `EmptyKey` when `key` is empty.
pub fn check_delete_range(r: &DeleteRangeRequest) -> Result<(), EtcdError> {
    if r.key.is_empty() {
        return Err(EtcdError::EmptyKey);
    }
    Ok(())
}

/// Checks a compaction request before proposing it. etcd has no such check; this only
/// rejects early what applying would reject anyway: a negative revision is at or below
/// every compact revision (etcd's starts at -1), so it always fails with `Compacted`.
pub fn check_compaction(r: &CompactionRequest) -> Result<(), EtcdError> {
    if r.revision < 0 {
        return Err(EtcdError::Compacted);
    }
    Ok(())
}

/// Deepest txn nesting Keel accepts (a txn whose ops hold a txn is depth 2). prost refuses to
/// decode messages nested more than 100 levels (each txn level is two: `TxnRequest` and
/// `RequestOp`), and a raft entry wraps the client's txn in further messages
/// (`RaftRequest`, `RequestBatch`, the forward RPC), so a txn near that limit would be
/// accepted from the client but could never be read back from the log. etcd has no separate
/// depth limit: its ops budget (`--max-txn-ops`, shared down the nesting) stops nesting at
/// about 128 levels, with the same `TooManyOps` error (docs/compat.md).
pub const MAX_TXN_DEPTH: usize = 32;

/// etcd `kvServer.Txn` validation: `checkTxnRequest` (sizes, keys, nested ops) and then the
/// duplicate-key rule (`checkIntervals`) on the success and the failure branch.
///
/// `max_txn_ops` bounds `max(len(compare), len(success), len(failure))` of the top-level
/// txn; a nested txn gets what its parent left (`max_txn_ops - parent's count`), as in etcd.
///
/// Errors: `TooManyOps` (also for nesting deeper than [`MAX_TXN_DEPTH`]); `EmptyKey` (a compare or an op with an empty key); `ValueProvided` /
/// `LeaseProvided` (a put, as [`check_put`]); `KeyNotFound` for an op with no request set
/// (etcd's answer to an empty `RequestOp`); `DuplicateKey` when two puts, or a put and a
/// delete, of one txn (nested txns included) touch the same key.
pub fn check_txn(r: &TxnRequest, max_txn_ops: usize) -> Result<(), EtcdError> {
    check_txn_request(r, i64::try_from(max_txn_ops).unwrap_or(i64::MAX), 1)?;
    check_intervals(&r.success)?;
    check_intervals(&r.failure)?;
    Ok(())
}

fn check_txn_request(r: &TxnRequest, max_txn_ops: i64, depth: usize) -> Result<(), EtcdError> {
    let opc = r.compare.len().max(r.success.len()).max(r.failure.len()) as i64;
    if opc > max_txn_ops || depth > MAX_TXN_DEPTH {
        return Err(EtcdError::TooManyOps);
    }
    if r.compare.iter().any(|c| c.key.is_empty()) {
        return Err(EtcdError::EmptyKey);
    }
    for op in r.success.iter().chain(&r.failure) {
        check_request_op(op, max_txn_ops - opc, depth)?;
    }
    Ok(())
}

fn check_request_op(op: &RequestOp, max_txn_ops: i64, depth: usize) -> Result<(), EtcdError> {
    match &op.request {
        Some(Request::RequestRange(r)) => check_range(r),
        Some(Request::RequestPut(p)) => check_put(p),
        Some(Request::RequestDeleteRange(d)) => check_delete_range(d),
        Some(Request::RequestTxn(t)) => check_txn_request(t, max_txn_ops, depth + 1),
        None => Err(EtcdError::KeyNotFound),
    }
}

/// The keys a list of ops deletes: a union of disjoint half-open byte ranges
/// (start → end), with etcd's affine interval semantics for points `[k, k + "\0")`.
#[derive(Default)]
struct DeleteSet {
    ranges: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl DeleteSet {
    /// Adds `[start, end)`; an empty or inverted range adds nothing.
    fn insert(&mut self, mut start: Vec<u8>, mut end: Vec<u8>) {
        if end <= start {
            return;
        }
        // Absorb the range that begins at or before `start` if it reaches `start`.
        if let Some((s, e)) = self
            .ranges
            .range(..=start.clone())
            .next_back()
            .filter(|(_, e)| **e >= start)
        {
            end = end.max(e.clone());
            start = s.clone();
        }
        // Absorb every range that begins inside [start, end].
        let inside: Vec<Vec<u8>> = self
            .ranges
            .range(start.clone()..=end.clone())
            .map(|(s, _)| s.clone())
            .collect();
        for s in inside {
            if let Some(e) = self.ranges.remove(&s) {
                end = end.max(e);
            }
        }
        self.ranges.insert(start, end);
    }

    fn insert_op(&mut self, key: &[u8], range_end: &[u8]) {
        let end = if range_end.is_empty() {
            point_end(key)
        } else {
            range_end.to_vec()
        };
        self.insert(key.to_vec(), end);
    }

    fn union(&mut self, other: DeleteSet) {
        for (s, e) in other.ranges {
            self.insert(s, e);
        }
    }

    /// Whether `key` is inside some range.
    fn contains(&self, key: &[u8]) -> bool {
        self.ranges
            .range::<[u8], _>((std::ops::Bound::Unbounded, std::ops::Bound::Included(key)))
            .next_back()
            .is_some_and(|(_, e)| key < e.as_slice())
    }
}

fn point_end(key: &[u8]) -> Vec<u8> {
    let mut e = key.to_vec();
    e.push(0);
    e
}

/// etcd `checkIntervals`: returns the puts and deletes of `reqs` (nested txns included) or
/// `DuplicateKey` when they overlap. Within one list, deletes of this level and of earlier
/// nested txns must not cover a later nested txn's put, and this level's puts must not
/// repeat a nested put or fall in any delete; a nested txn's success and failure branches
/// may put the same key (only one runs).
fn check_intervals(reqs: &[RequestOp]) -> Result<(HashSet<&[u8]>, DeleteSet), EtcdError> {
    let mut dels = DeleteSet::default();
    for op in reqs {
        if let Some(Request::RequestDeleteRange(d)) = &op.request {
            dels.insert_op(&d.key, &d.range_end);
        }
    }
    let mut puts: HashSet<&[u8]> = HashSet::new();
    for op in reqs {
        let Some(Request::RequestTxn(t)) = &op.request else {
            continue;
        };
        let (puts_then, dels_then) = check_intervals(&t.success)?;
        let (puts_else, dels_else) = check_intervals(&t.failure)?;
        for k in &puts_then {
            if puts.contains(k) || dels.contains(k) {
                return Err(EtcdError::DuplicateKey);
            }
            puts.insert(k);
        }
        for k in &puts_else {
            if (puts.contains(k) && !puts_then.contains(k)) || dels.contains(k) {
                return Err(EtcdError::DuplicateKey);
            }
            puts.insert(k);
        }
        dels.union(dels_then);
        dels.union(dels_else);
    }
    for op in reqs {
        let Some(Request::RequestPut(p)) = &op.request else {
            continue;
        };
        let k = p.key.as_slice();
        if puts.contains(k) || dels.contains(k) {
            return Err(EtcdError::DuplicateKey);
        }
        puts.insert(k);
    }
    Ok((puts, dels))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::test_support::txn_of as txn;
    use keel_proto::etcdserverpb::Compare;

    fn put(k: &str) -> RequestOp {
        RequestOp {
            request: Some(Request::RequestPut(PutRequest {
                key: k.into(),
                value: b"v".to_vec(),
                ..Default::default()
            })),
        }
    }
    fn del(k: &str, end: &str) -> RequestOp {
        RequestOp {
            request: Some(Request::RequestDeleteRange(DeleteRangeRequest {
                key: k.into(),
                range_end: end.into(),
                prev_kv: false,
            })),
        }
    }
    fn get(k: &str) -> RequestOp {
        RequestOp {
            request: Some(Request::RequestRange(RangeRequest {
                key: k.into(),
                ..Default::default()
            })),
        }
    }
    fn nested(t: TxnRequest) -> RequestOp {
        RequestOp {
            request: Some(Request::RequestTxn(t)),
        }
    }
    fn check(t: &TxnRequest) -> Result<(), EtcdError> {
        check_txn(t, DEFAULT_MAX_TXN_OPS)
    }

    #[test]
    fn single_requests_follow_etcd() {
        assert_eq!(
            check_range(&RangeRequest::default()),
            Err(EtcdError::EmptyKey)
        );
        let neg = RangeRequest {
            key: b"a".to_vec(),
            limit: -1,
            revision: -1,
            ..Default::default()
        };
        assert_eq!(check_range(&neg), Ok(()));
        assert_eq!(check_put(&PutRequest::default()), Err(EtcdError::EmptyKey));
        let p = PutRequest {
            key: b"k".to_vec(),
            value: b"x".to_vec(),
            ignore_value: true,
            ..Default::default()
        };
        assert_eq!(check_put(&p), Err(EtcdError::ValueProvided));
        let p = PutRequest {
            key: b"k".to_vec(),
            lease: 5,
            ignore_lease: true,
            ..Default::default()
        };
        assert_eq!(check_put(&p), Err(EtcdError::LeaseProvided));
        assert_eq!(
            check_delete_range(&DeleteRangeRequest::default()),
            Err(EtcdError::EmptyKey)
        );
        assert_eq!(
            check_compaction(&CompactionRequest {
                revision: -1,
                physical: false
            }),
            Err(EtcdError::Compacted)
        );
        assert_eq!(
            check_compaction(&CompactionRequest {
                revision: 0,
                physical: true
            }),
            Ok(())
        );
    }

    /// A txn nested `depth` levels deep (depth 1 = a plain txn) around one put.
    fn deep(depth: usize) -> TxnRequest {
        let mut t = txn(vec![put("n")], vec![]);
        for _ in 1..depth {
            t = txn(vec![nested(t)], vec![]);
        }
        t
    }

    #[test]
    fn nesting_is_bounded_so_every_accepted_txn_decodes_from_the_log() {
        use keel_proto::keelpb::{RaftRequest, RequestBatch, raft_request};
        use prost::Message;
        assert_eq!(check(&deep(MAX_TXN_DEPTH)), Ok(()));
        assert_eq!(check(&deep(MAX_TXN_DEPTH + 1)), Err(EtcdError::TooManyOps));
        // The deepest accepted txn, as a batch entry of the raft log (and once more wrapped,
        // as the forward RPC carries it), still decodes: prost stops at 100 nesting levels.
        let entry = RaftRequest {
            auth_header: None,
            id: 1,
            request: Some(raft_request::Request::Batch(RequestBatch {
                requests: vec![RaftRequest {
                    auth_header: None,
                    id: 2,
                    request: Some(raft_request::Request::Txn(deep(MAX_TXN_DEPTH))),
                }],
            })),
        };
        let wrapped = RaftRequest {
            auth_header: None,
            id: 3,
            request: Some(raft_request::Request::Batch(RequestBatch {
                requests: vec![entry],
            })),
        };
        let bytes = wrapped.encode_to_vec();
        assert_eq!(RaftRequest::decode(bytes.as_slice()).unwrap(), wrapped);
        // And the limit is real: at etcd's reach (its ops budget allows ~128 levels) the
        // client's message itself no longer decodes.
        let too_deep = deep(60).encode_to_vec();
        assert!(TxnRequest::decode(too_deep.as_slice()).is_err());
    }

    #[test]
    fn too_many_ops_counts_the_largest_list() {
        let ops = |n: usize| (0..n).map(|i| put(&format!("k{i}"))).collect::<Vec<_>>();
        assert_eq!(check(&txn(ops(128), vec![])), Ok(()));
        assert_eq!(check(&txn(ops(129), vec![])), Err(EtcdError::TooManyOps));
        assert_eq!(check(&txn(vec![], ops(129))), Err(EtcdError::TooManyOps));
        let mut t = txn(vec![], vec![]);
        t.compare = (0..129)
            .map(|i| Compare {
                key: format!("c{i}").into_bytes(),
                ..Default::default()
            })
            .collect();
        assert_eq!(check(&t), Err(EtcdError::TooManyOps));
        assert_eq!(
            check_txn(&txn(ops(3), vec![]), 2),
            Err(EtcdError::TooManyOps)
        );
    }

    #[test]
    fn nested_txns_get_the_remaining_budget() {
        // Outer uses 100 of 128; the nested txn may use 28.
        let mut outer: Vec<RequestOp> = (0..99).map(|i| get(&format!("g{i}"))).collect();
        let inner_ok = txn((0..28).map(|i| put(&format!("p{i}"))).collect(), vec![]);
        outer.push(nested(inner_ok));
        assert_eq!(check(&txn(outer.clone(), vec![])), Ok(()));
        outer.pop();
        outer.push(nested(txn(
            (0..29).map(|i| put(&format!("p{i}"))).collect(),
            vec![],
        )));
        assert_eq!(check(&txn(outer, vec![])), Err(EtcdError::TooManyOps));
    }

    #[test]
    fn empty_keys_and_empty_ops_are_rejected() {
        let mut t = txn(vec![put("a")], vec![]);
        t.compare.push(Compare::default());
        assert_eq!(check(&t), Err(EtcdError::EmptyKey));
        assert_eq!(check(&txn(vec![get("")], vec![])), Err(EtcdError::EmptyKey));
        assert_eq!(
            check(&txn(vec![], vec![del("", "")])),
            Err(EtcdError::EmptyKey)
        );
        assert_eq!(
            check(&txn(vec![RequestOp { request: None }], vec![])),
            Err(EtcdError::KeyNotFound)
        );
        assert_eq!(
            check(&txn(vec![nested(txn(vec![put("")], vec![]))], vec![])),
            Err(EtcdError::EmptyKey)
        );
    }

    #[test]
    fn duplicate_puts_and_put_delete_overlaps_are_rejected() {
        assert_eq!(
            check(&txn(vec![put("a"), put("a")], vec![])),
            Err(EtcdError::DuplicateKey)
        );
        assert_eq!(
            check(&txn(vec![put("a"), del("a", "")], vec![])),
            Err(EtcdError::DuplicateKey)
        );
        assert_eq!(
            check(&txn(vec![del("a", "c"), put("b")], vec![])),
            Err(EtcdError::DuplicateKey)
        );
        assert_eq!(check(&txn(vec![del("a", "c"), put("c")], vec![])), Ok(()));
        // Success and failure are separate lists.
        assert_eq!(check(&txn(vec![put("a")], vec![put("a")])), Ok(()));
        // Reads never conflict; two deletes never conflict.
        assert_eq!(
            check(&txn(
                vec![get("a"), put("a"), del("b", ""), del("b", "")],
                vec![]
            )),
            Ok(())
        );
    }

    #[test]
    fn from_key_and_inverted_deletes_conflict_with_nothing_like_etcd() {
        assert_eq!(check(&txn(vec![del("a", "\0"), put("b")], vec![])), Ok(()));
        assert_eq!(check(&txn(vec![del("c", "a"), put("b")], vec![])), Ok(()));
    }

    #[test]
    fn nested_txns_follow_check_intervals() {
        // golden grpc-kv/txn_nested: put d outside, put d inside -> duplicate.
        let t = txn(vec![put("d"), nested(txn(vec![put("d")], vec![]))], vec![]);
        assert_eq!(check(&t), Err(EtcdError::DuplicateKey));
        // Nested then/else may put the same key.
        let t = txn(vec![nested(txn(vec![put("e")], vec![put("e")]))], vec![]);
        assert_eq!(check(&t), Ok(()));
        // Two nested txns putting one key conflict.
        let t = txn(
            vec![
                nested(txn(vec![put("e")], vec![])),
                nested(txn(vec![], vec![put("e")])),
            ],
            vec![],
        );
        assert_eq!(check(&t), Err(EtcdError::DuplicateKey));
        // A delete at this level covers a nested put.
        let t = txn(
            vec![del("a", "z"), nested(txn(vec![put("m")], vec![]))],
            vec![],
        );
        assert_eq!(check(&t), Err(EtcdError::DuplicateKey));
        // A nested delete covers this level's put.
        let t = txn(
            vec![put("m"), nested(txn(vec![], vec![del("m", "")]))],
            vec![],
        );
        assert_eq!(check(&t), Err(EtcdError::DuplicateKey));
        // etcd order quirk: an earlier nested txn's put is not checked against a later nested
        // txn's delete.
        let t = txn(
            vec![
                nested(txn(vec![put("m")], vec![])),
                nested(txn(vec![del("m", "")], vec![])),
            ],
            vec![],
        );
        assert_eq!(check(&t), Ok(()));
        // ... but a later nested put is checked against an earlier nested delete.
        let t = txn(
            vec![
                nested(txn(vec![del("m", "")], vec![])),
                nested(txn(vec![put("m")], vec![])),
            ],
            vec![],
        );
        assert_eq!(check(&t), Err(EtcdError::DuplicateKey));
        // golden grpc-kv/txn_nested last txn: nested puts e/f and a nested delete of b.
        let t = txn(
            vec![
                nested(txn(vec![put("e")], vec![put("f")])),
                nested(txn(vec![del("b", "")], vec![])),
            ],
            vec![],
        );
        assert_eq!(check(&t), Ok(()));
    }

    #[test]
    fn delete_set_merges_ranges() {
        let mut d = DeleteSet::default();
        d.insert(b"b".to_vec(), b"d".to_vec());
        d.insert(b"f".to_vec(), b"h".to_vec());
        d.insert(b"c".to_vec(), b"g".to_vec());
        assert_eq!(d.ranges.len(), 1);
        for (k, inside) in [
            ("a", false),
            ("b", true),
            ("e", true),
            ("gz", true),
            ("h", false),
        ] {
            assert_eq!(d.contains(k.as_bytes()), inside, "{k}");
        }
        d.insert_op(b"x", b"");
        assert!(d.contains(b"x") && !d.contains(b"x\0") && !d.contains(b"w"));
    }
}
