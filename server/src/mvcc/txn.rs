//! `Txn`: compares, then one branch of operations, nested txns included (etcd 3.3+).
//!
//! Order of work (etcd `applierV3backend.Txn`, 3.4–3.6):
//! 1. Every compare of the txn **and of the nested txns in the chosen branches** is
//!    evaluated against the state before the txn (`compareToPath`), so a nested compare does
//!    not see the outer txn's writes.
//! 2. The chosen operations are checked against that same state, before anything is
//!    written: puts with `ignore_value`/`ignore_lease` need an existing key (`KeyNotFound`)
//!    and a non-zero lease must exist (`LeaseNotFound`); then range revisions
//!    (`FutureRev` above the current revision, `Compacted` below the compact revision; 0 is
//!    always fine).
//! 3. The operations run in order on the write view; all writes share one main revision
//!    with increasing sub revisions, and later operations see earlier writes.
//!
//! Compare rules (`applyCompare` / `compareKV`): the compare's key range is read at the
//! current revision; every key in it must satisfy the compare; an empty range compares a
//! zero `KeyValue` (version/create/mod/lease 0), except that a VALUE compare on no key is
//! false. A target union that does not match the target compares against 0 / empty; an
//! unknown result holds; an unknown target compares as equal.
//!
//! Response headers: the txn's is set to the revision after the txn; nested range/put/delete
//! responses carry the revision they saw or wrote; nested txn responses carry revision 0.
//!
//! Read-only txns ([`is_txn_read_only`]) are also evaluated outside apply, on one published
//! read view ([`read_only`]): the same steps 1, 2b and 3 with the same code, so the response
//! is the one apply would give at that revision (etcd `v3_server.go` `Txn`, which serves them
//! with `applyV3Base.Txn` on a read txn instead of proposing them).

use keel_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use keel_proto::etcdserverpb::request_op::Request;
use keel_proto::etcdserverpb::response_op::Response;
use keel_proto::etcdserverpb::{
    Compare, RequestOp, ResponseHeader, ResponseOp, TxnRequest, TxnResponse,
};
use keel_proto::mvccpb::KeyValue;

use super::index::KeyRange;
use super::range::ReadView;
use super::write_txn::{WriteTxn, header};
use crate::error::EtcdError;

/// The branch a txn takes and, in order, the paths of the nested txns in that branch.
#[derive(Debug, PartialEq, Eq)]
struct Path {
    succeeded: bool,
    nested: Vec<Path>,
}

fn branch(req: &TxnRequest, succeeded: bool) -> &[RequestOp] {
    if succeeded {
        &req.success
    } else {
        &req.failure
    }
}

/// Runs `req` on `w`. Nothing is written when an error is returned (the caller drops `w`).
pub(super) fn apply(
    w: &mut WriteTxn<'_>,
    req: &TxnRequest,
    lease_exists: &dyn Fn(i64) -> bool,
) -> Result<TxnResponse, EtcdError> {
    let path = {
        let view = w.read_view();
        let path = decide(&view, req);
        check_puts(&view, req, &path, lease_exists)?;
        check_ranges(&view, req, &path)?;
        path
    };
    let mut resp = run(
        &mut |op| match op {
            Request::RequestRange(r) => w.range(r).map(Response::ResponseRange),
            Request::RequestPut(p) => w.put(p).map(Response::ResponsePut),
            Request::RequestDeleteRange(d) => w.delete_range(d).map(Response::ResponseDeleteRange),
            Request::RequestTxn(_) => Err(nested_txn_leaf()),
        },
        req,
        &path,
    )?;
    resp.header = Some(header(w.view_rev()));
    Ok(resp)
}

/// Evaluates read-only txn `req` ([`is_txn_read_only`]) on `view`, as [`apply`] would on a
/// write view at the same revision: the compares, the range revision checks, then the
/// ranges, all at `view.rev`; the header carries `view.rev`.
///
/// Errors: `FutureRev` / `Compacted` (a range op at such a revision), `Internal` if `req`
/// holds a put or delete (the caller must propose those).
pub(super) fn read_only(view: &ReadView<'_>, req: &TxnRequest) -> Result<TxnResponse, EtcdError> {
    let path = decide(view, req);
    check_ranges(view, req, &path)?;
    let mut resp = run(
        &mut |op| match op {
            Request::RequestRange(r) => view.range(r).map(Response::ResponseRange),
            Request::RequestTxn(_) => Err(nested_txn_leaf()),
            Request::RequestPut(_) | Request::RequestDeleteRange(_) => Err(EtcdError::Internal(
                "mvcc: a write in a txn evaluated as read-only".into(),
            )),
        },
        req,
        &path,
    )?;
    resp.header = Some(header(view.rev));
    Ok(resp)
}

/// Every request of `req`'s ops, both branches (success first), with a nested txn's requests
/// in place of the nested txn, depth first; ops with no request are skipped.
pub fn txn_ops(req: &TxnRequest) -> impl Iterator<Item = &Request> {
    let mut stack = vec![req.success.iter().chain(&req.failure)];
    std::iter::from_fn(move || {
        loop {
            let op = stack.last_mut()?.next();
            match op.map(|op| op.request.as_ref()) {
                None => {
                    stack.pop();
                }
                Some(Some(Request::RequestTxn(t))) => {
                    stack.push(t.success.iter().chain(&t.failure))
                }
                Some(Some(r)) => return Some(r),
                Some(None) => {}
            }
        }
    })
}

/// Whether `req` only reads: every op of both branches is a Range or a nested txn that only
/// reads (etcd `isTxnReadonly`, which Keel extends to nested txns). An op with no request is
/// not read-only (validation refuses it before this is asked).
pub fn is_txn_read_only(req: &TxnRequest) -> bool {
    req.success
        .iter()
        .chain(&req.failure)
        .all(|op| match &op.request {
            Some(Request::RequestRange(_)) => true,
            Some(Request::RequestTxn(t)) => is_txn_read_only(t),
            _ => false,
        })
}

/// Whether read-only txn `req` may be served from local state without a read barrier: it
/// holds at least one Range and every Range in it, nested txns included, is
/// `serializable` (etcd `isTxnSerializable`; etcd also calls a txn with no Range at all
/// serializable, so its compares read possibly stale state; Keel gives those the read
/// barrier, docs/compat.md).
pub fn is_txn_serializable(req: &TxnRequest) -> bool {
    fn walk(req: &TxnRequest, ranges: &mut usize) -> bool {
        req.success
            .iter()
            .chain(&req.failure)
            .all(|op| match &op.request {
                Some(Request::RequestRange(r)) => {
                    *ranges += 1;
                    r.serializable
                }
                Some(Request::RequestTxn(t)) => walk(t, ranges),
                _ => false,
            })
    }
    let mut ranges = 0;
    walk(req, &mut ranges) && ranges > 0
}

/// `run` handles nested txns itself; its leaf executor never sees one.
fn nested_txn_leaf() -> EtcdError {
    EtcdError::Internal("mvcc: nested txn passed to a leaf op".into())
}

/// Step 1: evaluates the compares of `req` and of the nested txns in the chosen branch.
fn decide(view: &ReadView<'_>, req: &TxnRequest) -> Path {
    let succeeded = req.compare.iter().all(|c| compare_holds(view, c));
    let nested = branch(req, succeeded)
        .iter()
        .filter_map(|op| match &op.request {
            Some(Request::RequestTxn(t)) => Some(decide(view, t)),
            _ => None,
        })
        .collect();
    Path { succeeded, nested }
}

/// Step 2a: puts in the chosen branches.
fn check_puts(
    view: &ReadView<'_>,
    req: &TxnRequest,
    path: &Path,
    lease_exists: &dyn Fn(i64) -> bool,
) -> Result<(), EtcdError> {
    let mut nested = path.nested.iter();
    for op in branch(req, path.succeeded) {
        match &op.request {
            Some(Request::RequestTxn(t)) => {
                check_puts(view, t, next_path(&mut nested)?, lease_exists)?
            }
            Some(Request::RequestPut(p)) => {
                if p.ignore_value || p.ignore_lease {
                    let range = KeyRange::Single(&p.key);
                    if view.hits(&range, view.rev).next().is_none() {
                        return Err(EtcdError::KeyNotFound);
                    }
                }
                if p.lease != 0 && !lease_exists(p.lease) {
                    return Err(EtcdError::LeaseNotFound);
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Step 2b: range revisions in the chosen branches (etcd `checkRange`: a negative revision
/// is below any compact revision but -1, so it fails once the store was compacted).
fn check_ranges(view: &ReadView<'_>, req: &TxnRequest, path: &Path) -> Result<(), EtcdError> {
    let mut nested = path.nested.iter();
    for op in branch(req, path.succeeded) {
        match &op.request {
            Some(Request::RequestTxn(t)) => check_ranges(view, t, next_path(&mut nested)?)?,
            Some(Request::RequestRange(r)) if r.revision != 0 => {
                if r.revision > view.rev {
                    return Err(EtcdError::FutureRev);
                }
                if r.revision < view.compact_rev {
                    return Err(EtcdError::Compacted);
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn next_path<'p>(nested: &mut std::slice::Iter<'p, Path>) -> Result<&'p Path, EtcdError> {
    nested
        .next()
        .ok_or_else(|| EtcdError::Internal("mvcc: txn path does not match the request".into()))
}

/// Step 3: runs the chosen branch; `leaf` runs each Range, Put and DeleteRange (on the write
/// view in apply, on a read view for read-only txns), nested txns recurse here.
fn run(
    leaf: &mut dyn FnMut(&Request) -> Result<Response, EtcdError>,
    req: &TxnRequest,
    path: &Path,
) -> Result<TxnResponse, EtcdError> {
    let ops = branch(req, path.succeeded);
    let mut nested = path.nested.iter();
    let mut responses = Vec::with_capacity(ops.len());
    for op in ops {
        let response = match &op.request {
            Some(Request::RequestTxn(t)) => {
                let mut inner = run(leaf, t, next_path(&mut nested)?)?;
                inner.header = Some(ResponseHeader::default());
                Some(Response::ResponseTxn(inner))
            }
            Some(r) => Some(leaf(r)?),
            None => None,
        };
        responses.push(ResponseOp { response });
    }
    Ok(TxnResponse {
        header: None,
        succeeded: path.succeeded,
        responses,
    })
}

/// Whether compare `c` holds at the view's current revision.
fn compare_holds(view: &ReadView<'_>, c: &Compare) -> bool {
    let range = KeyRange::from_request(&c.key, &c.range_end);
    let is_value = c.target == CompareTarget::Value as i32;
    let mut any = false;
    for hit in view.hits(&range, view.rev) {
        any = true;
        let holds = if is_value {
            match view.read(&hit, view.rev) {
                Ok(kv) => compare_kv(c, &kv),
                // etcd: a failed read makes the compare false.
                Err(_) => false,
            }
        } else {
            compare_kv(c, &hit.kv_without_value())
        };
        if !holds {
            return false;
        }
    }
    if !any {
        // "nil == empty string in grpc; no way to represent missing value" (etcd).
        return !is_value && compare_kv(c, &KeyValue::default());
    }
    true
}

/// etcd `compareKV`.
fn compare_kv(c: &Compare, kv: &KeyValue) -> bool {
    let union = c.target_union.as_ref();
    let int = |f: fn(&TargetUnion) -> Option<i64>| union.and_then(f).unwrap_or(0);
    let ord = match CompareTarget::try_from(c.target) {
        Ok(CompareTarget::Value) => {
            let want: &[u8] = match union {
                Some(TargetUnion::Value(v)) => v,
                _ => &[],
            };
            kv.value.as_slice().cmp(want)
        }
        Ok(CompareTarget::Create) => kv.create_revision.cmp(&int(|u| match u {
            TargetUnion::CreateRevision(v) => Some(*v),
            _ => None,
        })),
        Ok(CompareTarget::Mod) => kv.mod_revision.cmp(&int(|u| match u {
            TargetUnion::ModRevision(v) => Some(*v),
            _ => None,
        })),
        Ok(CompareTarget::Version) => kv.version.cmp(&int(|u| match u {
            TargetUnion::Version(v) => Some(*v),
            _ => None,
        })),
        Ok(CompareTarget::Lease) => kv.lease.cmp(&int(|u| match u {
            TargetUnion::Lease(v) => Some(*v),
            _ => None,
        })),
        Err(_) => std::cmp::Ordering::Equal,
    };
    match CompareResult::try_from(c.result) {
        Ok(CompareResult::Equal) => ord.is_eq(),
        Ok(CompareResult::NotEqual) => ord.is_ne(),
        Ok(CompareResult::Greater) => ord.is_gt(),
        Ok(CompareResult::Less) => ord.is_lt(),
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmp(target: CompareTarget, result: CompareResult, union: Option<TargetUnion>) -> Compare {
        Compare {
            result: result as i32,
            target: target as i32,
            key: b"k".to_vec(),
            target_union: union,
            range_end: vec![],
        }
    }

    fn kv() -> KeyValue {
        KeyValue {
            key: b"k".to_vec(),
            create_revision: 3,
            mod_revision: 5,
            version: 2,
            value: b"m".to_vec(),
            lease: 7,
        }
    }

    #[test]
    fn compare_kv_covers_every_target_and_result() {
        use CompareResult::*;
        use CompareTarget::*;
        let k = kv();
        assert!(compare_kv(
            &cmp(Version, Equal, Some(TargetUnion::Version(2))),
            &k
        ));
        assert!(compare_kv(
            &cmp(Create, Less, Some(TargetUnion::CreateRevision(4))),
            &k
        ));
        assert!(compare_kv(
            &cmp(Mod, Greater, Some(TargetUnion::ModRevision(4))),
            &k
        ));
        assert!(compare_kv(
            &cmp(Lease, NotEqual, Some(TargetUnion::Lease(8))),
            &k
        ));
        assert!(compare_kv(
            &cmp(Value, Greater, Some(TargetUnion::Value(b"a".to_vec()))),
            &k
        ));
        assert!(!compare_kv(
            &cmp(Value, Less, Some(TargetUnion::Value(b"a".to_vec()))),
            &k
        ));
    }

    #[test]
    fn compare_kv_mismatched_union_compares_against_zero() {
        // target VERSION with a value union: etcd compares version against 0.
        let c = cmp(
            CompareTarget::Version,
            CompareResult::Greater,
            Some(TargetUnion::Value(b"x".to_vec())),
        );
        assert!(compare_kv(&c, &kv()));
        let c = cmp(CompareTarget::Value, CompareResult::Greater, None);
        assert!(compare_kv(&c, &kv()));
    }

    #[test]
    fn compare_kv_unknown_enums_follow_etcd() {
        let mut c = cmp(
            CompareTarget::Version,
            CompareResult::Less,
            Some(TargetUnion::Version(0)),
        );
        c.result = 42; // unknown result: holds
        assert!(compare_kv(&c, &kv()));
        let mut c = cmp(
            CompareTarget::Version,
            CompareResult::Equal,
            Some(TargetUnion::Version(99)),
        );
        c.target = 42; // unknown target: compares equal
        assert!(compare_kv(&c, &kv()));
    }
}
