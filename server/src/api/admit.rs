//! QoS admission in the API layer (issue 17, docs/qos.md "Wiring"): every KV, lease and
//! watch RPC asks [`crate::qos::Admission`] before it proposes or reads, on the member that
//! receives it, and a refusal answers etcd's `ResourceExhausted`
//! `etcdserver: too many requests` at once (nothing is proposed, the request costs the
//! match loop and a token-bucket check). The [`Permit`] is held until the answer is built,
//! so `max_in_flight` counts requests being served.
//!
//! What each request looks like to QoS ([`RequestInfo`]): its method; its key range (a
//! `Txn` covers the lowest key to the highest end of its compares and operations, nested
//! txns included); for a `Range`, its estimated cost when some rule asks for it; the
//! authenticated user ([`user`]).

use keel_proto::etcdserverpb::{
    Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest, request_op,
};
use keel_proto::rpctypes::RpcError;
use tonic::Status;

use crate::auth::AuthInfo;
use crate::node::Node;
use crate::qos::{Method, Permit, RangeCost, Refused, RequestInfo};

/// The authenticated user of a request, for user-scoped rules (`match.user`): the user
/// its credentials resolved to (`api::credentials`: token first, else the TLS client
/// certificate's common name), `None` without credentials or with auth disabled.
pub fn user(ai: &AuthInfo) -> Option<&str> {
    (!ai.username.is_empty()).then_some(ai.username.as_str())
}

/// Admits `info` on this member or answers `etcdserver: too many requests`. A refusal by a
/// rule's limits is answered after `--qos-refusal-delay` (a timer, no CPU), so a client that
/// resends at once does not turn its refused requests into a CPU load of their own;
/// overload refusals are answered at once, as in etcd.
pub async fn admit(node: &Node, info: &RequestInfo<'_>) -> Result<Permit, Status> {
    match node.qos.check(info) {
        Ok(permit) => Ok(permit),
        Err(refused) => {
            let delay = node.config.qos_refusal_delay.0;
            if matches!(refused, Refused::Limit(_)) && !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            Err(RpcError::from(refused).status())
        }
    }
}

/// Admits a `Range`, with its estimated cost when a rule looks at costs (only then is the
/// range counted in the key index first).
pub async fn range(node: &Node, req: &RangeRequest, user: Option<&str>) -> Result<Permit, Status> {
    let mut info = RequestInfo::new(Method::Range)
        .keys(&req.key, &req.range_end)
        .user(user);
    if node.qos.needs_range_cost() {
        info = info.range_cost(range_cost(node, req));
    }
    admit(node, &info).await
}

/// The answer size of `req`: `min(limit, keys in the range)` keys times the store's mean
/// bytes per key (its size on disk over its live keys: history makes it an over-estimate,
/// which errs on the side of the expensive-read rule).
fn range_cost(node: &Node, req: &RangeRequest) -> RangeCost {
    let store = node.store.get();
    let count = RangeRequest {
        key: req.key.clone(),
        range_end: req.range_end.clone(),
        revision: req.revision,
        count_only: true,
        ..Default::default()
    };
    let keys = store.range(&count).map_or(0, |r| r.count.max(0) as u64);
    let live = store.index_stats().live_keys.max(1) as u64;
    let per_kv = (node.db_size().max(0) as u64) / live;
    RangeCost::estimate(req.limit, keys, req.count_only, per_kv)
}

/// Admits a `Put`.
pub async fn put(node: &Node, req: &PutRequest, user: Option<&str>) -> Result<Permit, Status> {
    let info = RequestInfo::new(Method::Put).keys(&req.key, b"").user(user);
    admit(node, &info).await
}

/// Admits a `DeleteRange`.
pub async fn delete_range(
    node: &Node,
    req: &DeleteRangeRequest,
    user: Option<&str>,
) -> Result<Permit, Status> {
    let info = RequestInfo::new(Method::DeleteRange)
        .keys(&req.key, &req.range_end)
        .user(user);
    admit(node, &info).await
}

/// Admits a `Txn` as one range covering every key it compares or touches.
pub async fn txn(node: &Node, req: &TxnRequest, user: Option<&str>) -> Result<Permit, Status> {
    let cover = TxnCover::of(req);
    let (key, end) = cover.bounds();
    let info = RequestInfo::new(Method::Txn).keys(key, &end).user(user);
    admit(node, &info).await
}

/// Admits a request without keys (`Compact`, lease RPCs).
pub async fn keyless(node: &Node, method: Method, user: Option<&str>) -> Result<Permit, Status> {
    admit(node, &RequestInfo::new(method).user(user)).await
}

/// The smallest key range holding every key a txn compares or touches.
#[derive(Default)]
struct TxnCover<'a> {
    /// The lowest key.
    low: Option<&'a [u8]>,
    /// The highest end: `Unbounded` for `"\0"`, else the largest exclusive end.
    high: Option<End<'a>>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum End<'a> {
    /// Up to and including this key.
    Through(&'a [u8]),
    /// Up to this exclusive end.
    Before(&'a [u8]),
    /// Every key from the lowest on.
    Unbounded,
}

impl End<'_> {
    /// Whether `self` ends at or after `other`.
    fn covers(&self, other: &End<'_>) -> bool {
        match (self, other) {
            (End::Unbounded, _) => true,
            (_, End::Unbounded) => false,
            // `Through(k)` ends just after k, i.e. before k + "\0".
            (End::Through(a), End::Through(b)) | (End::Before(a), End::Before(b)) => a >= b,
            (End::Through(a), End::Before(b)) => *a >= *b || successor_eq(a, b),
            (End::Before(a), End::Through(b)) => *a > *b,
        }
    }
}

/// Whether `b` is `a` + "\0" (the exclusive end just after `a`).
fn successor_eq(a: &[u8], b: &[u8]) -> bool {
    b.len() == a.len() + 1 && b.starts_with(a) && b[a.len()] == 0
}

impl<'a> TxnCover<'a> {
    fn of(req: &'a TxnRequest) -> TxnCover<'a> {
        let mut cover = TxnCover::default();
        cover.add_txn(req);
        cover
    }

    fn add_txn(&mut self, req: &'a TxnRequest) {
        for Compare { key, range_end, .. } in &req.compare {
            self.add(key, range_end);
        }
        for RequestOp { request } in req.success.iter().chain(&req.failure) {
            match request {
                Some(request_op::Request::RequestRange(r)) => self.add(&r.key, &r.range_end),
                Some(request_op::Request::RequestPut(p)) => self.add(&p.key, b""),
                Some(request_op::Request::RequestDeleteRange(d)) => self.add(&d.key, &d.range_end),
                Some(request_op::Request::RequestTxn(t)) => self.add_txn(t),
                None => {}
            }
        }
    }

    fn add(&mut self, key: &'a [u8], range_end: &'a [u8]) {
        if self.low.is_none_or(|l| key < l) {
            self.low = Some(key);
        }
        let end = match range_end {
            b"" => End::Through(key),
            b"\0" => End::Unbounded,
            e if e <= key => End::Through(key),
            e => End::Before(e),
        };
        if self.high.is_none_or(|h| !h.covers(&end)) {
            self.high = Some(end);
        }
    }

    /// `(key, range_end)` in etcd's convention (empty end = the single key `key`).
    fn bounds(&self) -> (&'a [u8], Vec<u8>) {
        let low = self.low.unwrap_or(b"");
        let end = match self.high {
            None => Vec::new(),
            Some(End::Unbounded) => b"\0".to_vec(),
            Some(End::Before(e)) => e.to_vec(),
            Some(End::Through(k)) if k == low => Vec::new(),
            Some(End::Through(k)) => {
                let mut e = k.to_vec();
                e.push(0);
                e
            }
        };
        (low, end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_proto::etcdserverpb::RangeRequest;

    fn put_op(key: &[u8]) -> RequestOp {
        RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: key.to_vec(),
                ..Default::default()
            })),
        }
    }

    fn range_op(key: &[u8], end: &[u8]) -> RequestOp {
        RequestOp {
            request: Some(request_op::Request::RequestRange(RangeRequest {
                key: key.to_vec(),
                range_end: end.to_vec(),
                ..Default::default()
            })),
        }
    }

    fn cover(req: &TxnRequest) -> (Vec<u8>, Vec<u8>) {
        let c = TxnCover::of(req);
        let (k, e) = c.bounds();
        (k.to_vec(), e)
    }

    #[test]
    fn a_txn_covers_its_compares_and_ops() {
        // One key, compared and put: that key alone.
        let one = TxnRequest {
            compare: vec![Compare {
                key: b"/noisy/a".to_vec(),
                ..Default::default()
            }],
            success: vec![put_op(b"/noisy/a")],
            ..Default::default()
        };
        assert_eq!(cover(&one), (b"/noisy/a".to_vec(), vec![]));
        // Two keys: from the lower through the higher.
        let two = TxnRequest {
            success: vec![put_op(b"/noisy/b")],
            failure: vec![put_op(b"/noisy/a")],
            ..Default::default()
        };
        assert_eq!(cover(&two), (b"/noisy/a".to_vec(), b"/noisy/b\0".to_vec()));
        // A nested txn's range end and an unbounded range.
        let nested = TxnRequest {
            success: vec![RequestOp {
                request: Some(request_op::Request::RequestTxn(TxnRequest {
                    success: vec![range_op(b"/a/", b"/a0")],
                    ..Default::default()
                })),
            }],
            failure: vec![put_op(b"/a/x")],
            ..Default::default()
        };
        assert_eq!(cover(&nested), (b"/a/".to_vec(), b"/a0".to_vec()));
        let all = TxnRequest {
            success: vec![range_op(b"/b", b"\0"), put_op(b"/a")],
            ..Default::default()
        };
        assert_eq!(cover(&all), (b"/a".to_vec(), b"\0".to_vec()));
        // An end just after a key (k + "\0") and that key through: the same end.
        let adjacent = TxnRequest {
            success: vec![range_op(b"/a", b"/b\0"), put_op(b"/b")],
            ..Default::default()
        };
        assert_eq!(cover(&adjacent), (b"/a".to_vec(), b"/b\0".to_vec()));
        // An empty txn has no keys.
        assert_eq!(cover(&TxnRequest::default()), (vec![], vec![]));
    }
}
