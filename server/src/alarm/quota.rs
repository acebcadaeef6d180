//! The backend quota (`--quota-backend-bytes`, etcd `server/storage/quota.go`): what a
//! request costs, and whether it still fits.
//!
//! etcd checks `size + cost < quota` before proposing a Put, a Txn or a LeaseGrant; when it
//! fails, the member raises NOSPACE and answers `etcdserver: mvcc: database space exceeded`.
//! Costs are etcd's estimates: a put is `256 + len(key) + len(value)`, a txn the larger of
//! its branches' put costs, a lease grant 64.

use keel_proto::etcdserverpb::request_op::Request as Op;
use keel_proto::etcdserverpb::{PutRequest, TxnRequest};
use keel_proto::keelpb::raft_request::Request as Rq;

/// etcd's `kvOverhead`: the estimated metadata cost of one stored key revision, in bytes.
pub const KV_OVERHEAD: i64 = 256;
/// etcd's `leaseOverhead`: the estimated cost of one lease, in bytes.
pub const LEASE_OVERHEAD: i64 = 64;

/// etcd `costPut`.
pub fn cost_put(r: &PutRequest) -> i64 {
    KV_OVERHEAD + r.key.len() as i64 + r.value.len() as i64
}

/// etcd `costTxn`: the larger of the success and failure branches' put costs. Unlike etcd
/// (which counts only top-level puts), puts in nested txns count too, so a nested put cannot
/// slip past a raised NOSPACE alarm.
pub fn cost_txn(t: &TxnRequest) -> i64 {
    let branch = |ops: &[keel_proto::etcdserverpb::RequestOp]| -> i64 {
        ops.iter()
            .map(|op| match &op.request {
                Some(Op::RequestPut(p)) => cost_put(p),
                Some(Op::RequestTxn(inner)) => cost_txn(inner),
                _ => 0,
            })
            .sum()
    };
    branch(&t.success).max(branch(&t.failure))
}

/// What `req` costs against the quota (0: it adds no data).
pub fn cost(req: &Rq) -> i64 {
    match req {
        Rq::Put(p) => cost_put(p),
        Rq::Txn(t) => cost_txn(t),
        Rq::LeaseGrant(_) => LEASE_OVERHEAD,
        _ => 0,
    }
}

/// Whether `req` adds data: what a NOSPACE alarm refuses (etcd `applierV3Capped`: Put, a Txn
/// whose cost is above 0, LeaseGrant).
pub fn adds_data(req: &Rq) -> bool {
    cost(req) > 0
}

/// etcd `backendQuota.Available`: whether `cost` more bytes fit when `size` bytes are in use.
pub fn fits(size: i64, cost: i64, quota: i64) -> bool {
    size.saturating_add(cost) < quota
}
