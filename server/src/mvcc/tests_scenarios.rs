//! Scenario tests mirroring the etcd 3.4.23 conformance goldens
//! (`shared/conformance/cases/{kv,del,txn,compact,badinput,grpc-kv,grpc-maint,maint}`).
//! Revisions are written relative to the start revision `R0` (1 on a fresh store), as the
//! goldens normalize them; `r(n)` is `R0 + n`.

use keel_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use keel_proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use keel_proto::etcdserverpb::request_op::Request;
use keel_proto::etcdserverpb::response_op::Response;
use keel_proto::etcdserverpb::{
    Compare, DeleteRangeRequest, DeleteRangeResponse, PutRequest, PutResponse, RangeRequest,
    RangeResponse, RequestOp, TxnRequest, TxnResponse,
};
use keel_proto::mvccpb::KeyValue;
use keel_proto::mvccpb::event::EventType;

use super::{Committed, MvccStore};
use crate::error::EtcdError;

const R0: i64 = 1;
fn r(n: i64) -> i64 {
    R0 + n
}

pub(super) struct Fixture {
    pub db: sled::Db,
    pub store: MvccStore,
}

pub(super) fn fixture() -> Fixture {
    let db = sled::Config::new().temporary(true).open().unwrap();
    let store = MvccStore::open(db.open_tree("keel").unwrap()).unwrap();
    Fixture { db, store }
}

impl Fixture {
    pub fn reopen(self) -> Fixture {
        let Fixture { db, store } = self;
        drop(store);
        let store = MvccStore::open(db.open_tree("keel").unwrap()).unwrap();
        Fixture { db, store }
    }

    fn write<T>(
        &self,
        f: impl FnOnce(&mut super::WriteTxn<'_>) -> Result<T, EtcdError>,
    ) -> Result<(T, Committed), EtcdError> {
        let mut w = self.store.write();
        let out = f(&mut w)?;
        Ok((out, w.commit().unwrap()))
    }

    pub fn put(&self, key: &str, value: &str) -> i64 {
        self.put_req(PutRequest {
            key: key.into(),
            value: value.into(),
            ..Default::default()
        })
        .unwrap()
        .1
    }

    pub fn put_req(&self, req: PutRequest) -> Result<(PutResponse, i64), EtcdError> {
        self.write(|w| w.put(&req)).map(|(p, c)| (p, c.revision))
    }

    pub fn del(&self, key: &str, end: &str) -> (DeleteRangeResponse, i64) {
        let req = DeleteRangeRequest {
            key: key.into(),
            range_end: end.into(),
            prev_kv: false,
        };
        self.write(|w| w.delete_range(&req))
            .map(|(d, c)| (d, c.revision))
            .unwrap()
    }

    pub fn txn(&self, req: TxnRequest) -> Result<(TxnResponse, i64), EtcdError> {
        self.write(|w| w.txn(&req)).map(|(t, c)| (t, c.revision))
    }

    pub fn compact(&self, rev: i64) -> Result<i64, EtcdError> {
        self.write(|w| w.compact(rev))
            .map(|(resp, _)| resp.header.unwrap().revision)
    }

    pub fn get(&self, req: RangeRequest) -> Result<RangeResponse, EtcdError> {
        self.store.range(&req)
    }
}

fn rq(key: &str, end: &str) -> RangeRequest {
    RangeRequest {
        key: key.into(),
        range_end: end.into(),
        ..Default::default()
    }
}

/// `prefix` as etcdctl computes it (`clientv3.GetPrefixRangeEnd`).
fn prefix_end(p: &str) -> String {
    let mut b = p.as_bytes().to_vec();
    while let Some(last) = b.pop() {
        if last < 0xff {
            b.push(last + 1);
            return String::from_utf8(b).unwrap();
        }
    }
    "\0".into()
}

/// (key, create, mod, version, value, lease) with revisions relative to R0.
type Row = (&'static str, i64, i64, i64, &'static str, i64);

fn rows(kvs: &[KeyValue]) -> Vec<(String, i64, i64, i64, String, i64)> {
    kvs.iter()
        .map(|kv| {
            (
                String::from_utf8(kv.key.clone()).unwrap(),
                kv.create_revision - R0,
                kv.mod_revision - R0,
                kv.version,
                String::from_utf8(kv.value.clone()).unwrap(),
                kv.lease,
            )
        })
        .collect()
}

fn expect(kvs: &[Row]) -> Vec<(String, i64, i64, i64, String, i64)> {
    kvs.iter()
        .map(|&(k, c, m, v, val, l)| (k.into(), c, m, v, val.into(), l))
        .collect()
}

fn hdr(resp: &RangeResponse) -> i64 {
    resp.header.as_ref().unwrap().revision - R0
}

fn op_put(k: &str, v: &str) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestPut(PutRequest {
            key: k.into(),
            value: v.into(),
            ..Default::default()
        })),
    }
}
fn op_get(req: RangeRequest) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestRange(req)),
    }
}
fn op_del(k: &str, end: &str, prev_kv: bool) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestDeleteRange(DeleteRangeRequest {
            key: k.into(),
            range_end: end.into(),
            prev_kv,
        })),
    }
}
fn op_txn(t: TxnRequest) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestTxn(t)),
    }
}
fn cmp(
    key: &str,
    end: &str,
    target: CompareTarget,
    result: CompareResult,
    u: TargetUnion,
) -> Compare {
    Compare {
        result: result as i32,
        target: target as i32,
        key: key.into(),
        target_union: Some(u),
        range_end: end.into(),
    }
}
fn resp_header(op: &keel_proto::etcdserverpb::ResponseOp) -> i64 {
    match op.response.as_ref().unwrap() {
        Response::ResponseRange(x) => x.header.as_ref().unwrap().revision,
        Response::ResponsePut(x) => x.header.as_ref().unwrap().revision,
        Response::ResponseDeleteRange(x) => x.header.as_ref().unwrap().revision,
        Response::ResponseTxn(x) => x.header.as_ref().unwrap().revision,
    }
}

#[test]
fn fresh_store_is_at_revision_1_and_first_put_makes_2() {
    let f = fixture();
    assert_eq!(
        (f.store.current_revision(), f.store.compact_revision()),
        (1, 0)
    );
    assert_eq!(
        f.put_req(PutRequest::default()).unwrap_err(),
        EtcdError::EmptyKey
    );
    assert_eq!(f.put("a", "1"), 2);
    // kv/get_missing_key: header revision is the current one, no kvs, count 0.
    let resp = f.get(rq("nokey", "")).unwrap();
    assert_eq!(
        (hdr(&resp), resp.count, resp.kvs.len(), resp.more),
        (1, 0, 0, false)
    );
}

#[test]
fn kv_get_count_with_limit() {
    let f = fixture();
    for k in ["k0", "k1", "k2", "k3"] {
        f.put(k, "v");
    }
    let mut req = rq("k", &prefix_end("k"));
    req.limit = 1;
    req.keys_only = true;
    let resp = f.get(req.clone()).unwrap();
    assert_eq!(rows(&resp.kvs), expect(&[("k0", 1, 1, 1, "", 0)]));
    assert_eq!((resp.more, resp.count, hdr(&resp)), (true, 4, 4));
    req.keys_only = false;
    assert_eq!(
        rows(&f.get(req).unwrap().kvs),
        expect(&[("k0", 1, 1, 1, "v", 0)])
    );
    let resp = f.get(rq("zz", &prefix_end("zz"))).unwrap();
    assert_eq!((resp.count, resp.kvs.len(), hdr(&resp)), (0, 0, 4));
}

#[test]
fn kv_from_key_range_end_and_keys_only() {
    let f = fixture();
    for (k, v) in [("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")] {
        f.put(k, v);
    }
    let from_b = f.get(rq("b", "\0")).unwrap();
    assert_eq!(
        rows(&from_b.kvs)
            .iter()
            .map(|r| r.0.clone())
            .collect::<Vec<_>>(),
        ["b", "c", "d"]
    );
    let mut all = rq("\0", "\0");
    all.keys_only = true;
    assert_eq!(f.get(all).unwrap().count, 4);
    // etcdctl `get "" --from-key` sends key "\0"; an empty key reads from the start too.
    assert_eq!(f.get(rq("", "\0")).unwrap().count, 4);
    let resp = f.get(rq("a", "c")).unwrap();
    assert_eq!(
        rows(&resp.kvs),
        expect(&[("a", 1, 1, 1, "1", 0), ("b", 2, 2, 1, "2", 0)])
    );
    assert_eq!(resp.count, 2);
}

#[test]
fn kv_get_prefix_at_revision_with_delete() {
    let f = fixture();
    f.put("p1", "a");
    f.put("p2", "b");
    assert_eq!(f.del("p1", "").0.deleted, 1);
    f.put("p3", "c");
    let mut req = rq("p", &prefix_end("p"));
    req.revision = r(2);
    let resp = f.get(req.clone()).unwrap();
    assert_eq!(
        rows(&resp.kvs),
        expect(&[("p1", 1, 1, 1, "a", 0), ("p2", 2, 2, 1, "b", 0)])
    );
    assert_eq!((resp.count, hdr(&resp)), (2, 4));
    req.revision = r(3);
    assert_eq!(
        rows(&f.get(req).unwrap().kvs),
        expect(&[("p2", 2, 2, 1, "b", 0)])
    );
    let now = f.get(rq("p", &prefix_end("p"))).unwrap();
    assert_eq!(
        rows(&now.kvs),
        expect(&[("p2", 2, 2, 1, "b", 0), ("p3", 4, 4, 1, "c", 0)])
    );
}

#[test]
fn kv_sort_by_mod_create_value_version() {
    let f = fixture();
    for (k, v) in [("s1", "x"), ("s2", "x"), ("s3", "x"), ("s1", "y")] {
        f.put(k, v);
    }
    let sorted = |target: SortTarget, order: SortOrder, limit: i64| {
        let mut req = rq("s", &prefix_end("s"));
        req.sort_target = target as i32;
        req.sort_order = order as i32;
        req.limit = limit;
        let resp = f.get(req).unwrap();
        (
            resp.kvs
                .iter()
                .map(|kv| String::from_utf8(kv.key.clone()).unwrap())
                .collect::<Vec<_>>(),
            resp.more,
            resp.count,
        )
    };
    assert_eq!(
        sorted(SortTarget::Mod, SortOrder::Ascend, 0).0,
        ["s2", "s3", "s1"]
    );
    assert_eq!(
        sorted(SortTarget::Create, SortOrder::Descend, 0).0,
        ["s3", "s2", "s1"]
    );
    assert_eq!(
        sorted(SortTarget::Mod, SortOrder::Descend, 2),
        (vec!["s1".into(), "s3".into()], true, 3)
    );

    let f = fixture();
    for (k, v) in [
        ("s1", "c"),
        ("s2", "a"),
        ("s3", "b"),
        ("s3", "b2"),
        ("s3", "b3"),
        ("s2", "a2"),
    ] {
        f.put(k, v);
    }
    let mut req = rq("s", &prefix_end("s"));
    req.sort_target = SortTarget::Value as i32;
    req.sort_order = SortOrder::Ascend as i32;
    let vals: Vec<_> = f
        .get(req.clone())
        .unwrap()
        .kvs
        .iter()
        .map(|kv| kv.value.clone())
        .collect();
    assert_eq!(vals, [b"a2".to_vec(), b"b3".to_vec(), b"c".to_vec()]);
    req.sort_target = SortTarget::Version as i32;
    req.sort_order = SortOrder::Descend as i32;
    let keys: Vec<_> = f
        .get(req)
        .unwrap()
        .kvs
        .iter()
        .map(|kv| kv.key.clone())
        .collect();
    assert_eq!(keys, [b"s3".to_vec(), b"s2".to_vec(), b"s1".to_vec()]);
}

#[test]
fn kv_put_prev_kv_ignore_lease_versions() {
    let f = fixture();
    f.put("foo", "a");
    let (resp, _) = f
        .put_req(PutRequest {
            key: "foo".into(),
            value: "b".into(),
            prev_kv: true,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(
        rows(resp.prev_kv.as_slice()),
        expect(&[("foo", 1, 1, 1, "a", 0)])
    );
    let (resp, rev) = f
        .put_req(PutRequest {
            key: "new".into(),
            value: "x".into(),
            prev_kv: true,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(
        (resp.prev_kv, resp.header.unwrap().revision, rev),
        (None, r(3), r(3))
    );

    // kv/put_ignore_lease with lease L1 = 0x1234.
    let f = fixture();
    f.put_req(PutRequest {
        key: "foo".into(),
        value: "a".into(),
        lease: 0x1234,
        ..Default::default()
    })
    .unwrap();
    f.put_req(PutRequest {
        key: "foo".into(),
        value: "b".into(),
        ignore_lease: true,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        rows(&f.get(rq("foo", "")).unwrap().kvs),
        expect(&[("foo", 1, 2, 2, "b", 0x1234)])
    );
    f.put("nolease", "x");
    f.put_req(PutRequest {
        key: "nolease".into(),
        value: "y".into(),
        ignore_lease: true,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        rows(&f.get(rq("nolease", "")).unwrap().kvs),
        expect(&[("nolease", 3, 4, 2, "y", 0)])
    );
}

#[test]
fn grpc_kv_put_ignore_lease_and_ignore_value() {
    let f = fixture();
    let missing = PutRequest {
        key: "k".into(),
        value: "x".into(),
        ignore_lease: true,
        ..Default::default()
    };
    assert_eq!(f.put_req(missing).unwrap_err(), EtcdError::KeyNotFound);
    assert_eq!(
        f.store.current_revision(),
        R0,
        "a failed put writes nothing"
    );
    f.put_req(PutRequest {
        key: "k".into(),
        value: "v1".into(),
        lease: 77,
        ..Default::default()
    })
    .unwrap();
    let (resp, rev) = f
        .put_req(PutRequest {
            key: "k".into(),
            value: "v2".into(),
            ignore_lease: true,
            prev_kv: true,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(rev, r(2));
    assert_eq!(
        rows(resp.prev_kv.as_slice()),
        expect(&[("k", 1, 1, 1, "v1", 77)])
    );
    f.put_req(PutRequest {
        key: "k".into(),
        ignore_lease: true,
        ignore_value: true,
        ..Default::default()
    })
    .unwrap();
    let resp = f.get(rq("k", "")).unwrap();
    assert_eq!(rows(&resp.kvs), expect(&[("k", 1, 3, 3, "v2", 77)]));
    assert_eq!((resp.more, resp.count, hdr(&resp)), (false, 1, 3));
}

#[test]
fn del_single_range_prefix_from_key_and_recreate() {
    let f = fixture();
    f.put("foo", "bar");
    assert_eq!(f.del("foo", "").0.deleted, 1);
    let (resp, rev) = f.del("foo", "");
    assert_eq!(
        (resp.deleted, resp.header.unwrap().revision, rev),
        (0, r(2), r(2)),
        "no-op delete keeps the revision"
    );
    assert_eq!(f.get(rq("foo", "")).unwrap().count, 0);

    let f = fixture();
    for (k, v) in [("a", "1"), ("b", "2"), ("c", "3")] {
        f.put(k, v);
    }
    let (resp, rev) = f.del("a", "c");
    assert_eq!((resp.deleted, rev), (2, r(4)));
    assert_eq!(
        rows(&f.get(rq("\0", "\0")).unwrap().kvs),
        expect(&[("c", 3, 3, 1, "3", 0)])
    );

    let f = fixture();
    for (k, v) in [("a", "1"), ("b", "2"), ("c", "3")] {
        f.put(k, v);
    }
    assert_eq!(f.del("b", "\0").0.deleted, 2);
    assert_eq!(f.get(rq("\0", "\0")).unwrap().count, 1);

    let f = fixture();
    for (k, v) in [("a1", "1"), ("a2", "2"), ("b1", "3")] {
        f.put(k, v);
    }
    assert_eq!(f.del("a", &prefix_end("a")).0.deleted, 2);

    // del/del_then_recreate
    let f = fixture();
    f.put("foo", "a");
    f.put("foo", "b");
    f.del("foo", "");
    f.put("foo", "c");
    assert_eq!(
        rows(&f.get(rq("foo", "")).unwrap().kvs),
        expect(&[("foo", 4, 4, 1, "c", 0)])
    );
    let mut at = rq("foo", "");
    at.revision = r(2);
    assert_eq!(
        rows(&f.get(at).unwrap().kvs),
        expect(&[("foo", 1, 2, 2, "b", 0)])
    );
}

#[test]
fn del_prev_kv_and_events() {
    let f = fixture();
    f.put("a", "1");
    f.put("b", "2");
    let req = DeleteRangeRequest {
        key: "a".into(),
        range_end: "c".into(),
        prev_kv: true,
    };
    let mut w = f.store.write();
    let resp = w.delete_range(&req).unwrap();
    let committed = w.commit().unwrap();
    assert_eq!(
        rows(&resp.prev_kvs),
        expect(&[("a", 1, 1, 1, "1", 0), ("b", 2, 2, 1, "2", 0)])
    );
    assert_eq!(committed.revision, r(3));
    let ev: Vec<_> = committed
        .events
        .iter()
        .map(|e| (e.r#type, e.kv.clone().unwrap()))
        .collect();
    assert_eq!(ev.len(), 2);
    for (t, kv) in ev {
        assert_eq!(t, EventType::Delete as i32);
        assert_eq!(
            (kv.mod_revision, kv.create_revision, kv.version),
            (r(3), 0, 0)
        );
    }
}

#[test]
fn txn_compare_branches_and_headers() {
    // txn/compare_range_key_prefix
    let f = fixture();
    f.put("x", "1");
    let t = TxnRequest {
        compare: vec![cmp(
            "x",
            "",
            CompareTarget::Version,
            CompareResult::NotEqual,
            TargetUnion::Version(1),
        )],
        success: vec![op_put("r", "a")],
        failure: vec![op_get(rq("x", "")), op_del("x", "", false)],
    };
    let (resp, rev) = f.txn(t).unwrap();
    assert!(!resp.succeeded);
    assert_eq!(rev, r(2));
    match resp.responses[0].response.as_ref().unwrap() {
        Response::ResponseRange(g) => {
            assert_eq!(rows(&g.kvs), expect(&[("x", 1, 1, 1, "1", 0)]));
            assert_eq!(
                g.header.as_ref().unwrap().revision,
                r(1),
                "read before the delete"
            );
        }
        other => panic!("{other:?}"),
    }
    match resp.responses[1].response.as_ref().unwrap() {
        Response::ResponseDeleteRange(d) => assert_eq!(d.deleted, 1),
        other => panic!("{other:?}"),
    }
    assert_eq!(f.get(rq("x", "")).unwrap().count, 0);

    // txn/create_revision_compare and mod_revision_compare
    let f = fixture();
    f.put("foo", "1");
    f.put("foo", "2");
    let branch = |c: Compare, k: &str| TxnRequest {
        compare: vec![c],
        success: vec![op_put(k, "yes")],
        failure: vec![op_put(k, "no")],
    };
    let c = cmp(
        "foo",
        "",
        CompareTarget::Create,
        CompareResult::Equal,
        TargetUnion::CreateRevision(r(1)),
    );
    assert!(f.txn(branch(c, "r")).unwrap().0.succeeded);
    let c = cmp(
        "foo",
        "",
        CompareTarget::Create,
        CompareResult::Less,
        TargetUnion::CreateRevision(r(1)),
    );
    assert!(!f.txn(branch(c, "r2")).unwrap().0.succeeded);
    let c = cmp(
        "foo",
        "",
        CompareTarget::Mod,
        CompareResult::Greater,
        TargetUnion::ModRevision(r(1)),
    );
    let (resp, rev) = f.txn(branch(c, "r3")).unwrap();
    assert!(resp.succeeded);
    assert_eq!(
        (
            resp.header.as_ref().unwrap().revision,
            resp_header(&resp.responses[0]),
            rev
        ),
        (r(5), r(5), r(5))
    );

    // txn/multiple_compares_and
    let f = fixture();
    f.put("a", "1");
    f.put("b", "2");
    let both = |vb: &str| TxnRequest {
        compare: vec![
            cmp(
                "a",
                "",
                CompareTarget::Value,
                CompareResult::Equal,
                TargetUnion::Value(b"1".to_vec()),
            ),
            cmp(
                "b",
                "",
                CompareTarget::Value,
                CompareResult::Equal,
                TargetUnion::Value(vb.into()),
            ),
        ],
        success: vec![],
        failure: vec![],
    };
    assert!(!f.txn(both("3")).unwrap().0.succeeded);
    assert!(f.txn(both("2")).unwrap().0.succeeded);
    // Read-only txns do not move the revision.
    assert_eq!(f.store.current_revision(), r(2));
}

#[test]
fn txn_single_revision_for_all_ops_and_nested_ranges() {
    let f = fixture();
    let t = TxnRequest {
        compare: vec![],
        success: vec![op_put("a", "1"), op_put("b", "2"), op_put("c", "3")],
        failure: vec![],
    };
    let (resp, rev) = f.txn(t).unwrap();
    assert_eq!(rev, r(1));
    assert!(resp.responses.iter().all(|op| resp_header(op) == r(1)));
    let all = f.get(rq("\0", "\0")).unwrap();
    assert_eq!(
        rows(&all.kvs),
        expect(&[
            ("a", 1, 1, 1, "1", 0),
            ("b", 1, 1, 1, "2", 0),
            ("c", 1, 1, 1, "3", 0)
        ])
    );

    // txn/nested_range_ops
    let f = fixture();
    for (k, v) in [("a1", "1"), ("a2", "2"), ("a3", "3")] {
        f.put(k, v);
    }
    let mut limited = rq("a", &prefix_end("a"));
    limited.limit = 1;
    let mut keys_only = rq("a", &prefix_end("a"));
    keys_only.keys_only = true;
    let t = TxnRequest {
        compare: vec![],
        success: vec![
            op_get(rq("a", &prefix_end("a"))),
            op_get(limited),
            op_get(rq("a1", "a3")),
            op_get(keys_only),
        ],
        failure: vec![],
    };
    let (resp, rev) = f.txn(t).unwrap();
    assert_eq!(rev, r(3));
    let ranges: Vec<&RangeResponse> = resp
        .responses
        .iter()
        .map(|op| match op.response.as_ref().unwrap() {
            Response::ResponseRange(g) => g,
            other => panic!("{other:?}"),
        })
        .collect();
    assert!(
        ranges
            .iter()
            .all(|g| g.header.as_ref().unwrap().revision == r(3))
    );
    assert_eq!(
        (ranges[0].count, ranges[0].kvs.len(), ranges[0].more),
        (3, 3, false)
    );
    assert_eq!(
        (ranges[1].count, ranges[1].kvs.len(), ranges[1].more),
        (3, 1, true)
    );
    assert_eq!(
        rows(&ranges[2].kvs),
        expect(&[("a1", 1, 1, 1, "1", 0), ("a2", 2, 2, 1, "2", 0)])
    );
    assert_eq!(
        rows(&ranges[3].kvs)[2],
        ("a3".into(), 3, 3, 1, String::new(), 0)
    );
}

#[test]
fn txn_reads_see_earlier_writes_and_value_compares() {
    // txn/value_compare_failure + value_compare_success
    let f = fixture();
    f.put("foo", "bar");
    let t = |v: &str| TxnRequest {
        compare: vec![cmp(
            "foo",
            "",
            CompareTarget::Value,
            CompareResult::Equal,
            TargetUnion::Value(v.into()),
        )],
        success: vec![op_put("a", "1"), op_get(rq("foo", ""))],
        failure: vec![op_put("b", "2"), op_get(rq("foo", ""))],
    };
    let (resp, rev) = f.txn(t("baz")).unwrap();
    assert!(!resp.succeeded);
    assert_eq!(rev, r(2));
    assert_eq!(
        resp.responses.iter().map(resp_header).collect::<Vec<_>>(),
        [r(2), r(2)]
    );
    let (resp, _) = f.txn(t("bar")).unwrap();
    assert!(resp.succeeded);
    let keys: Vec<_> = f
        .get(rq("\0", "\0"))
        .unwrap()
        .kvs
        .iter()
        .map(|kv| kv.key.clone())
        .collect();
    assert_eq!(keys, [b"a".to_vec(), b"b".to_vec(), b"foo".to_vec()]);

    // A range after a put in one txn sees the put.
    let f = fixture();
    let t = TxnRequest {
        compare: vec![],
        success: vec![op_put("k", "v"), op_get(rq("k", ""))],
        failure: vec![],
    };
    let (resp, _) = f.txn(t).unwrap();
    match resp.responses[1].response.as_ref().unwrap() {
        Response::ResponseRange(g) => assert_eq!(rows(&g.kvs), expect(&[("k", 1, 1, 1, "v", 0)])),
        other => panic!("{other:?}"),
    }
}

#[test]
fn grpc_kv_txn_compare_range_end() {
    let f = fixture();
    for k in ["p/a", "p/b", "p/c"] {
        f.put(k, "1");
    }
    let all_v1 = |ok: &str| TxnRequest {
        compare: vec![cmp(
            "p/",
            "p0",
            CompareTarget::Version,
            CompareResult::Equal,
            TargetUnion::Version(1),
        )],
        success: vec![op_put("ok", ok)],
        failure: vec![op_get(RangeRequest {
            key: "p/".into(),
            range_end: "p0".into(),
            keys_only: true,
            ..Default::default()
        })],
    };
    let (resp, rev) = f.txn(all_v1("1")).unwrap();
    assert!(resp.succeeded);
    assert_eq!(rev, r(4));
    f.put("p/b", "2");
    let (resp, rev) = f.txn(all_v1("2")).unwrap();
    assert!(!resp.succeeded);
    assert_eq!(rev, r(5));
    match resp.responses[0].response.as_ref().unwrap() {
        Response::ResponseRange(g) => {
            assert_eq!(g.count, 3);
            assert_eq!(rows(&g.kvs)[1], ("p/b".into(), 2, 5, 2, String::new(), 0));
        }
        other => panic!("{other:?}"),
    }
    let less3 = TxnRequest {
        compare: vec![cmp(
            "p/",
            "p0",
            CompareTarget::Value,
            CompareResult::Less,
            TargetUnion::Value(b"3".to_vec()),
        )],
        success: vec![op_put("ok", "3")],
        failure: vec![],
    };
    assert_eq!(f.txn(less3).unwrap().1, r(6));
    let empty_v0 = TxnRequest {
        compare: vec![cmp(
            "x/",
            "x0",
            CompareTarget::Version,
            CompareResult::Equal,
            TargetUnion::Version(0),
        )],
        success: vec![op_put("ok", "4")],
        failure: vec![],
    };
    assert!(f.txn(empty_v0).unwrap().0.succeeded);
    let empty_value = TxnRequest {
        compare: vec![cmp(
            "x/",
            "x0",
            CompareTarget::Value,
            CompareResult::Equal,
            TargetUnion::Value(vec![]),
        )],
        success: vec![op_put("ok", "5")],
        failure: vec![],
    };
    let (resp, rev) = f.txn(empty_value).unwrap();
    assert!(!resp.succeeded, "a VALUE compare on no key is false");
    assert!(resp.responses.is_empty());
    assert_eq!(rev, r(7));
}

#[test]
fn grpc_kv_txn_nested() {
    let f = fixture();
    f.put("a", "1");
    let t = TxnRequest {
        compare: vec![cmp(
            "a",
            "",
            CompareTarget::Value,
            CompareResult::Equal,
            TargetUnion::Value(b"1".to_vec()),
        )],
        success: vec![
            op_put("b", "1"),
            op_txn(TxnRequest {
                compare: vec![cmp(
                    "b",
                    "",
                    CompareTarget::Version,
                    CompareResult::Equal,
                    TargetUnion::Version(0),
                )],
                success: vec![op_put("c", "inner-success")],
                failure: vec![op_put("c", "inner-failure"), op_get(rq("a", ""))],
            }),
        ],
        failure: vec![],
    };
    let (resp, rev) = f.txn(t).unwrap();
    assert_eq!(rev, r(2));
    assert!(resp.succeeded);
    assert_eq!(resp_header(&resp.responses[0]), r(2));
    match resp.responses[1].response.as_ref().unwrap() {
        Response::ResponseTxn(inner) => {
            // Nested compares see the state before the outer txn: b did not exist.
            assert!(inner.succeeded);
            assert_eq!(inner.header.as_ref().unwrap().revision, 0);
            assert_eq!(
                inner.responses.iter().map(resp_header).collect::<Vec<_>>(),
                [r(2)]
            );
        }
        other => panic!("{other:?}"),
    }
    let all = f.get(rq("a", "d")).unwrap();
    assert_eq!(
        rows(&all.kvs),
        expect(&[
            ("a", 1, 1, 1, "1", 0),
            ("b", 2, 2, 1, "1", 0),
            ("c", 2, 2, 1, "inner-success", 0)
        ])
    );

    let t = TxnRequest {
        compare: vec![],
        success: vec![
            op_txn(TxnRequest {
                compare: vec![cmp(
                    "a",
                    "",
                    CompareTarget::Version,
                    CompareResult::Equal,
                    TargetUnion::Version(99),
                )],
                success: vec![op_put("e", "1")],
                failure: vec![op_put("f", "1")],
            }),
            op_txn(TxnRequest {
                compare: vec![],
                success: vec![op_del("b", "", true)],
                failure: vec![],
            }),
        ],
        failure: vec![],
    };
    let (resp, rev) = f.txn(t).unwrap();
    assert_eq!(rev, r(3));
    match resp.responses[1].response.as_ref().unwrap() {
        Response::ResponseTxn(inner) => match inner.responses[0].response.as_ref().unwrap() {
            Response::ResponseDeleteRange(d) => {
                assert_eq!(d.header.as_ref().unwrap().revision, r(3));
                assert_eq!(rows(&d.prev_kvs), expect(&[("b", 2, 2, 1, "1", 0)]));
            }
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
    let mut keys_only = rq("a", "z");
    keys_only.keys_only = true;
    let keys: Vec<_> = rows(&f.get(keys_only).unwrap().kvs)
        .into_iter()
        .map(|r| (r.0, r.2))
        .collect();
    assert_eq!(keys, [("a".into(), 1), ("c".into(), 2), ("f".into(), 3)]);
}

#[test]
fn txn_failing_op_writes_nothing() {
    let f = fixture();
    f.put("k", "1");
    f.put("k", "2");
    f.put("k", "3");
    f.compact(r(2)).unwrap();
    let mut old = rq("k", "");
    old.revision = r(1);
    let t = TxnRequest {
        compare: vec![],
        success: vec![op_put("w", "1"), op_get(old)],
        failure: vec![],
    };
    assert_eq!(f.txn(t).unwrap_err(), EtcdError::Compacted);
    let mut future = rq("k", "");
    future.revision = r(4);
    let t = TxnRequest {
        compare: vec![],
        success: vec![op_put("w", "1"), op_get(future)],
        failure: vec![],
    };
    assert_eq!(f.txn(t).unwrap_err(), EtcdError::FutureRev);
    let ignore = RequestOp {
        request: Some(Request::RequestPut(PutRequest {
            key: "absent".into(),
            ignore_value: true,
            ..Default::default()
        })),
    };
    let t = TxnRequest {
        compare: vec![],
        success: vec![op_put("w", "1"), ignore],
        failure: vec![],
    };
    assert_eq!(f.txn(t).unwrap_err(), EtcdError::KeyNotFound);
    assert_eq!(f.get(rq("w", "")).unwrap().count, 0);
    assert_eq!(f.store.current_revision(), r(3));
    // Lease check hook.
    let leased = RequestOp {
        request: Some(Request::RequestPut(PutRequest {
            key: "l".into(),
            lease: 5,
            ..Default::default()
        })),
    };
    let t = TxnRequest {
        compare: vec![],
        success: vec![leased],
        failure: vec![],
    };
    let mut w = f.store.write();
    assert_eq!(
        w.txn_with_lease_check(&t, &|id| id == 6).unwrap_err(),
        EtcdError::LeaseNotFound
    );
    drop(w);
    let mut w = f.store.write();
    assert!(w.txn_with_lease_check(&t, &|id| id == 5).is_ok());
    assert_eq!(w.commit().unwrap().revision, r(4));
}

#[test]
fn compact_twice_future_and_reads() {
    let f = fixture();
    for v in ["1", "2", "3"] {
        f.put("a", v);
    }
    assert_eq!(
        f.compact(r(2)),
        Ok(r(3)),
        "response header carries the current revision"
    );
    assert_eq!(f.store.compact_revision(), r(2));
    assert_eq!(f.compact(r(2)), Err(EtcdError::Compacted));
    assert_eq!(f.compact(r(1)), Err(EtcdError::Compacted));
    assert_eq!(f.compact(r(50)), Err(EtcdError::FutureRev));
    let mut at = rq("a", "");
    at.revision = r(1);
    assert_eq!(f.get(at.clone()).unwrap_err(), EtcdError::Compacted);
    at.revision = r(2);
    assert_eq!(
        rows(&f.get(at.clone()).unwrap().kvs),
        expect(&[("a", 1, 2, 2, "2", 0)])
    );
    at.revision = r(50);
    assert_eq!(f.get(at).unwrap_err(), EtcdError::FutureRev);
    assert_eq!(f.compact(r(3)), Ok(r(3)));
    // Compaction keeps the revision and survives a reopen.
    let f = f.reopen();
    assert_eq!(
        (f.store.current_revision(), f.store.compact_revision()),
        (r(3), r(3))
    );
    assert_eq!(
        rows(&f.get(rq("a", "")).unwrap().kvs),
        expect(&[("a", 1, 3, 3, "3", 0)])
    );
}

#[test]
fn compaction_removes_superseded_records_from_sled() {
    let f = fixture();
    f.put("a", "1");
    f.put("a", "2");
    f.put("b", "1");
    f.del("b", "");
    let records = |f: &Fixture| f.db.open_tree("keel").unwrap().scan_prefix(b"k").count();
    assert_eq!(records(&f), 4);
    f.compact(r(4)).unwrap();
    // a@1 removed; a@2 kept; b@3 removed; the tombstone at exactly the compact revision kept.
    assert_eq!(records(&f), 2);
    f.put("c", "1");
    f.compact(r(5)).unwrap();
    assert_eq!(
        records(&f),
        2,
        "the old tombstone goes with the next compaction"
    );
    assert_eq!(f.store.index_stats().keys, 2);
}

#[test]
fn compaction_at_revision_zero_on_a_fresh_store_succeeds_once() {
    let f = fixture();
    assert!(f.compact(0).is_ok());
    assert_eq!(f.compact(0), Err(EtcdError::Compacted));
    assert_eq!(f.compact(-1), Err(EtcdError::Compacted));
}

#[test]
fn badinput_negative_limit_revision_and_inverted_range() {
    let f = fixture();
    f.put("a", "1");
    let mut req = rq("a", "");
    req.limit = -1;
    req.revision = -1;
    let resp = f.get(req).unwrap();
    assert_eq!((resp.kvs.len(), resp.more, resp.count), (1, false, 1));

    let f = fixture();
    for (k, v) in [("a", "1"), ("b", "2"), ("c", "3")] {
        f.put(k, v);
    }
    assert_eq!(f.get(rq("c", "a")).unwrap().count, 0);
    let (resp, rev) = f.del("c", "a");
    assert_eq!((resp.deleted, rev), (0, r(3)));
}

#[test]
fn badinput_compact_current_then_read() {
    let f = fixture();
    f.put("a", "1");
    f.put("a", "2");
    f.compact(r(1)).unwrap();
    let mut at = rq("a", "");
    at.revision = r(1);
    assert_eq!(
        rows(&f.get(at.clone()).unwrap().kvs),
        expect(&[("a", 1, 1, 1, "1", 0)])
    );
    at.revision = r(2);
    let resp = f.get(at).unwrap();
    assert_eq!(rows(&resp.kvs), expect(&[("a", 1, 2, 2, "2", 0)]));
    assert_eq!((resp.more, resp.count, hdr(&resp)), (false, 1, 2));
}

#[test]
fn grpc_kv_range_count_only_and_filters() {
    let f = fixture();
    for (k, v) in [("a1", "1"), ("a2", "2"), ("a3", "3"), ("b", "4")] {
        f.put(k, v);
    }
    let mut req = rq("a", "b");
    req.count_only = true;
    let resp = f.get(req.clone()).unwrap();
    assert_eq!((resp.kvs.len(), resp.more, resp.count), (0, false, 3));
    req.limit = 1;
    let resp = f.get(req).unwrap();
    assert_eq!((resp.kvs.len(), resp.more, resp.count), (0, false, 3));
    let mut none = rq("zzz", "");
    none.count_only = true;
    assert_eq!(f.get(none).unwrap().count, 0);

    // range_create_revision_filters
    let f = fixture();
    for (k, v) in [("a", "1"), ("b", "1"), ("a", "2"), ("c", "1")] {
        f.put(k, v);
    }
    let q = |min_c: i64, max_c: i64, limit: i64, rev: i64| {
        let mut req = rq("a", "d");
        req.min_create_revision = min_c;
        req.max_create_revision = max_c;
        req.limit = limit;
        req.revision = rev;
        let resp = f.get(req).unwrap();
        (
            resp.kvs
                .iter()
                .map(|kv| String::from_utf8(kv.key.clone()).unwrap())
                .collect::<Vec<_>>(),
            resp.more,
            resp.count,
        )
    };
    assert_eq!(q(r(2), 0, 0, 0), (vec!["b".into(), "c".into()], false, 3));
    assert_eq!(q(0, r(2), 0, 0), (vec!["a".into(), "b".into()], false, 3));
    assert_eq!(q(r(2), 0, 1, 0), (vec!["b".into()], true, 3));
    assert_eq!(q(0, r(1), 0, r(2)), (vec!["a".into()], false, 2));

    // range_mod_revision_filters: count is not reduced by the filters.
    let f = fixture();
    for (k, v) in [("a", "1"), ("b", "1"), ("c", "1"), ("a", "2")] {
        f.put(k, v);
    }
    let q = |min_m: i64, max_m: i64, limit: i64| {
        let mut req = rq("a", "d");
        req.min_mod_revision = min_m;
        req.max_mod_revision = max_m;
        req.limit = limit;
        let resp = f.get(req).unwrap();
        (
            resp.kvs
                .iter()
                .map(|kv| String::from_utf8(kv.key.clone()).unwrap())
                .collect::<Vec<_>>(),
            resp.more,
            resp.count,
        )
    };
    assert_eq!(q(r(2), r(3), 0), (vec!["b".into(), "c".into()], false, 3));
    assert_eq!(q(r(4), 0, 0), (vec!["a".into()], false, 3));
    assert_eq!(q(0, r(2), 1), (vec!["b".into()], false, 3));
}

#[test]
fn grpc_kv_range_limit_more_historical() {
    let f = fixture();
    for (k, v) in [("k1", "1"), ("k2", "2"), ("k3", "3")] {
        f.put(k, v);
    }
    f.del("k2", "");
    f.put("k4", "4");
    let q = |limit: i64, rev: i64| {
        let mut req = rq("k", "l");
        req.limit = limit;
        req.revision = rev;
        let resp = f.get(req).unwrap();
        (
            resp.kvs
                .iter()
                .map(|kv| String::from_utf8(kv.key.clone()).unwrap())
                .collect::<Vec<_>>(),
            resp.more,
            resp.count,
            hdr(&resp),
        )
    };
    assert_eq!(q(1, r(3)), (vec!["k1".into()], true, 3, 5));
    assert_eq!(
        q(3, r(3)),
        (vec!["k1".into(), "k2".into(), "k3".into()], false, 3, 5)
    );
    assert_eq!(q(2, 0), (vec!["k1".into(), "k3".into()], true, 3, 5));
    assert_eq!(
        q(3, 0),
        (vec!["k1".into(), "k3".into(), "k4".into()], false, 3, 5)
    );
}

#[test]
fn grpc_kv_range_sort_with_limit() {
    let f = fixture();
    for (k, v) in [("k1", "m"), ("k2", "a"), ("k3", "z"), ("k4", "b")] {
        f.put(k, v);
    }
    let q = |target: SortTarget, order: SortOrder, limit: i64, keys_only: bool| {
        let mut req = rq("k", "l");
        req.sort_target = target as i32;
        req.sort_order = order as i32;
        req.limit = limit;
        req.keys_only = keys_only;
        let resp = f.get(req).unwrap();
        (rows(&resp.kvs), resp.more, resp.count)
    };
    assert_eq!(
        q(SortTarget::Value, SortOrder::Ascend, 3, false),
        (
            expect(&[
                ("k2", 2, 2, 1, "a", 0),
                ("k4", 4, 4, 1, "b", 0),
                ("k1", 1, 1, 1, "m", 0)
            ]),
            true,
            4
        )
    );
    assert_eq!(
        q(SortTarget::Value, SortOrder::Descend, 1, false),
        (expect(&[("k3", 3, 3, 1, "z", 0)]), true, 4)
    );
    assert_eq!(
        q(SortTarget::Key, SortOrder::Descend, 2, true),
        (
            expect(&[("k4", 4, 4, 1, "", 0), ("k3", 3, 3, 1, "", 0)]),
            true,
            4
        )
    );
    assert_eq!(
        q(SortTarget::Value, SortOrder::Ascend, 1, true).0,
        expect(&[("k2", 2, 2, 1, "", 0)])
    );

    let f = fixture();
    for (k, v) in [
        ("x", "1"),
        ("y", "1"),
        ("y", "2"),
        ("z", "1"),
        ("z", "2"),
        ("z", "3"),
    ] {
        f.put(k, v);
    }
    let q = |order: SortOrder, limit: i64| {
        let mut req = rq("x", "{");
        req.sort_target = SortTarget::Version as i32;
        req.sort_order = order as i32;
        req.limit = limit;
        req.keys_only = true;
        let resp = f.get(req).unwrap();
        (
            resp.kvs
                .iter()
                .map(|kv| String::from_utf8(kv.key.clone()).unwrap())
                .collect::<Vec<_>>(),
            resp.more,
            resp.count,
        )
    };
    assert_eq!(
        q(SortOrder::Descend, 2),
        (vec!["z".into(), "y".into()], true, 3)
    );
    assert_eq!(
        q(SortOrder::Ascend, 2),
        (vec!["x".into(), "y".into()], true, 3)
    );
    assert_eq!(
        q(SortOrder::None, 0),
        (vec!["x".into(), "y".into(), "z".into()], false, 3)
    );
}

#[test]
fn sort_ties_keep_key_order_in_both_directions() {
    let f = fixture();
    for k in ["d", "a", "c", "b"] {
        f.put(k, "same");
    }
    for order in [SortOrder::Ascend, SortOrder::Descend] {
        for limit in [0, 2] {
            let mut req = rq("a", "z");
            req.sort_target = SortTarget::Value as i32;
            req.sort_order = order as i32;
            req.limit = limit;
            let keys: Vec<_> = f.get(req).unwrap().kvs.iter().map(|kv| kv.key[0]).collect();
            let want: &[u8] = if limit == 2 { b"ab" } else { b"abcd" };
            assert_eq!(keys, want, "{order:?} limit {limit}");
        }
    }
}

#[test]
fn hashkv_at_revision_is_stable_and_survives_compaction() {
    let f = fixture();
    f.put("a", "1");
    f.put("b", "1");
    let h1 = f.store.hash_kv(r(1)).unwrap();
    let h2 = f.store.hash_kv(r(2)).unwrap();
    assert_ne!(h1.hash, h2.hash);
    assert_eq!(
        (h2.hash_revision, h2.current_revision, h2.compact_revision),
        (r(2), r(2), 0)
    );
    f.put("c", "1");
    assert_eq!(f.store.hash_kv(r(1)).unwrap().hash, h1.hash);
    let h3 = f.store.hash_kv(0).unwrap();
    assert_eq!(h3.hash, f.store.hash_kv(r(3)).unwrap().hash);
    assert_eq!(h3.hash_revision, r(3));
    assert_eq!(f.store.hash_kv(r(9)).unwrap_err(), EtcdError::FutureRev);

    // maint/hashkv_after_delete
    let f = fixture();
    f.put("a", "1");
    let before = f.store.hash_kv(0).unwrap().hash;
    f.del("a", "");
    let after = f.store.hash_kv(0).unwrap().hash;
    assert_ne!(before, after);
    assert_eq!(after, f.store.hash_kv(0).unwrap().hash);

    // compact/hashkv_compact_revision + invariance under compaction at <= rev.
    let f = fixture();
    for v in ["1", "2", "3"] {
        f.put("a", v);
    }
    f.put("b", "x");
    f.del("b", "");
    let hashes: Vec<u32> = (1..=5)
        .map(|n| f.store.hash_kv(r(n)).unwrap().hash)
        .collect();
    f.compact(r(2)).unwrap();
    let h = f.store.hash_kv(0).unwrap();
    assert_eq!((h.compact_revision, h.current_revision), (r(2), r(5)));
    assert_eq!(f.store.hash_kv(r(1)).unwrap_err(), EtcdError::Compacted);
    for n in 2..=5 {
        assert_eq!(
            f.store.hash_kv(r(n)).unwrap().hash,
            hashes[n as usize - 1],
            "rev {n}"
        );
    }
    f.compact(r(5)).unwrap();
    assert_eq!(f.store.hash_kv(r(5)).unwrap().hash, hashes[4]);
}

#[test]
fn hashkv_matches_etcd_bytes_for_a_single_put() {
    // etcd HashKV: crc32c("key" + rev bytes + KeyValue bytes) over every record.
    let f = fixture();
    f.put("a", "1");
    let mut expected = b"key".to_vec();
    expected.extend_from_slice(&crate::mvcc::revision::etcd_rev_bytes(
        crate::mvcc::Revision::new(2, 0),
        false,
    ));
    let kv = KeyValue {
        key: b"a".to_vec(),
        create_revision: 2,
        mod_revision: 2,
        version: 1,
        value: b"1".to_vec(),
        lease: 0,
    };
    expected.extend_from_slice(&prost::Message::encode_to_vec(&kv));
    assert_eq!(f.store.hash_kv(0).unwrap().hash, super::crc32c(&expected));
}

#[test]
fn events_replay_history_in_revision_order() {
    let f = fixture();
    f.put("a", "1");
    f.put("b", "1");
    f.del("a", "");
    let t = TxnRequest {
        compare: vec![],
        success: vec![op_put("c", "1"), op_put("d", "1")],
        failure: vec![],
    };
    f.txn(t).unwrap();
    let all = f.store.events(r(1), i64::MAX, 0).unwrap();
    let summary: Vec<(i32, String, i64)> = all
        .events
        .iter()
        .map(|e| {
            let kv = e.kv.as_ref().unwrap();
            (
                e.r#type,
                String::from_utf8(kv.key.clone()).unwrap(),
                kv.mod_revision - R0,
            )
        })
        .collect();
    let (p, d) = (EventType::Put as i32, EventType::Delete as i32);
    assert_eq!(
        summary,
        [
            (p, "a".into(), 1),
            (p, "b".into(), 2),
            (d, "a".into(), 3),
            (p, "c".into(), 4),
            (p, "d".into(), 4)
        ]
    );
    assert_eq!(all.last_revision, r(4));
    // A limit never splits a revision.
    let part = f.store.events(r(1), r(4), 4).unwrap();
    assert_eq!((part.events.len(), part.last_revision), (5, r(4)));
    let part = f.store.events(r(1), r(4), 2).unwrap();
    assert_eq!((part.events.len(), part.last_revision), (2, r(2)));
    f.compact(r(3)).unwrap();
    assert_eq!(
        f.store.events(r(2), r(4), 0).unwrap_err(),
        EtcdError::Compacted
    );
    assert_eq!(
        f.store.events(r(3), r(4), 0).unwrap().events.len(),
        3,
        "the tombstone at the compact revision remains"
    );
}

#[test]
fn leased_keys_and_write_rollback() {
    let f = fixture();
    f.put_req(PutRequest {
        key: "l1".into(),
        value: "v".into(),
        lease: 9,
        ..Default::default()
    })
    .unwrap();
    f.put("plain", "v");
    f.put_req(PutRequest {
        key: "l2".into(),
        value: "v".into(),
        lease: 9,
        ..Default::default()
    })
    .unwrap();
    f.del("l2", "");
    assert_eq!(f.store.leased_keys(), vec![(b"l1".to_vec(), 9)]);
    // Dropping a WriteTxn writes nothing.
    let mut w = f.store.write();
    w.put(&PutRequest {
        key: "ghost".into(),
        value: "v".into(),
        ..Default::default()
    })
    .unwrap();
    w.batch_mut().insert(b"c/other", b"x".as_slice());
    drop(w);
    assert_eq!(f.get(rq("ghost", "")).unwrap().count, 0);
    assert_eq!(f.store.current_revision(), r(4));
    assert!(
        f.db.open_tree("keel")
            .unwrap()
            .get(b"c/other")
            .unwrap()
            .is_none()
    );
    // Extra writes commit with the entry even when no key changes.
    let mut w = f.store.write();
    w.batch_mut().insert(b"c/other", b"x".as_slice());
    assert_eq!(w.commit().unwrap().revision, r(4));
    assert!(
        f.db.open_tree("keel")
            .unwrap()
            .get(b"c/other")
            .unwrap()
            .is_some()
    );
}

#[test]
#[should_panic(expected = "one writer only")]
fn a_second_writer_is_refused() {
    let f = fixture();
    let _w1 = f.store.write();
    let _w2 = f.store.write();
}

#[test]
fn reopen_rebuilds_the_same_state() {
    let f = fixture();
    for i in 0..300 {
        f.put(&format!("key{:03}", i % 70), &format!("v{i}"));
        if i % 9 == 0 {
            f.del(&format!("key{:03}", (i * 7) % 70), "");
        }
    }
    f.compact(r(120)).unwrap();
    let ranges: Vec<RangeResponse> = (120..=f.store.current_revision() - R0)
        .step_by(13)
        .map(|n| {
            let mut req = rq("\0", "\0");
            req.revision = r(n);
            f.get(req).unwrap()
        })
        .collect();
    let hash = f.store.hash_kv(0).unwrap();
    let stats = f.store.index_stats();
    let rev = f.store.current_revision();
    let f = f.reopen();
    assert_eq!(
        (f.store.current_revision(), f.store.compact_revision()),
        (rev, r(120))
    );
    assert_eq!(f.store.hash_kv(0).unwrap(), hash);
    assert_eq!(f.store.index_stats().keys, stats.keys);
    for (i, want) in ranges.iter().enumerate() {
        let mut req = rq("\0", "\0");
        req.revision = r(120 + 13 * i as i64);
        assert_eq!(&f.get(req).unwrap(), want);
    }
}

fn record_count(f: &Fixture) -> usize {
    f.db.open_tree("keel").unwrap().scan_prefix(b"k").count()
}

#[test]
fn large_compactions_finish_in_the_background() {
    let f = fixture();
    f.store.set_inline_removals(10);
    for round in ["1", "2"] {
        for i in 0..50 {
            f.put(&format!("k{i:02}"), round);
        }
    }
    assert_eq!(record_count(&f), 100);
    let before = f.store.hash_kv(0).unwrap();
    f.compact(r(100)).unwrap();
    // Reads, hash and events follow the index at once, whatever sled still holds.
    let all = f.get(rq("k", "l")).unwrap();
    assert_eq!(all.count, 50);
    assert!(all.kvs.iter().all(|kv| kv.value == b"2" && kv.version == 2));
    assert_eq!(f.store.hash_kv(0).unwrap().hash, before.hash);
    assert!(
        f.store
            .wait_physical_compaction(r(100), std::time::Duration::from_secs(20))
    );
    assert_eq!(f.store.physical_compact_revision(), r(100));
    assert_eq!(record_count(&f), 50);
}

#[test]
fn small_compactions_are_physical_at_commit() {
    let f = fixture();
    f.put("a", "1");
    f.put("a", "2");
    f.compact(r(2)).unwrap();
    assert_eq!(f.store.physical_compact_revision(), r(2));
    assert_eq!(record_count(&f), 1);
}

#[test]
fn reopen_finishes_an_interrupted_compaction() {
    let f = fixture();
    // put/delete generations (a), overwrites (b), a delete at the compact revision (c).
    f.put("a", "1"); // 2
    f.del("a", ""); // 3
    f.put("b", "1"); // 4
    f.put("b", "2"); // 5
    f.put("c", "1"); // 6
    f.put("a", "2"); // 7
    f.del("c", ""); // 8
    f.put("d", "1"); // 9
    let tree = f.db.open_tree("keel").unwrap();
    let all: Vec<(sled::IVec, sled::IVec)> = tree.scan_prefix(b"k").map(|r| r.unwrap()).collect();
    f.compact(7).unwrap(); // absolute revisions in this test
    let kept: std::collections::HashSet<sled::IVec> =
        tree.scan_prefix(b"k").map(|r| r.unwrap().0).collect();
    let removed: Vec<_> = all
        .iter()
        .filter(|(k, _)| !kept.contains(k))
        .cloned()
        .collect();
    // a@2, a@3 (tombstone) and b@4 go; c@6 stays (its tombstone at 8 is after 7).
    assert_eq!(removed.len(), 3, "{removed:?}");
    let want_ranges: Vec<_> = (7..=9)
        .map(|n| {
            let mut q = rq("\0", "\0");
            q.revision = n;
            f.get(q).unwrap()
        })
        .collect();
    let want_hash = f.store.hash_kv(0).unwrap();
    let want_events = f.store.events(7, i64::MAX, 0).unwrap();
    // Crash after removing only the oldest record: the later ones come back.
    for (k, v) in &removed[1..] {
        tree.insert(k, v).unwrap();
    }
    let f = f.reopen();
    for (i, want) in want_ranges.iter().enumerate() {
        let mut q = rq("\0", "\0");
        q.revision = 7 + i as i64;
        assert_eq!(&f.get(q).unwrap(), want);
    }
    assert_eq!(f.store.hash_kv(0).unwrap(), want_hash);
    assert_eq!(f.store.events(7, i64::MAX, 0).unwrap(), want_events);
    assert!(
        f.store
            .wait_physical_compaction(7, std::time::Duration::from_secs(20))
    );
    assert_eq!(record_count(&f), all.len() - removed.len());
}

#[test]
fn a_missing_record_is_compacted_only_if_a_compaction_passed_the_read_revision() {
    use std::sync::atomic::Ordering;
    let f = fixture();
    f.put("a", "1"); // 2
    f.put("b", "1"); // 3
    f.put("a", "2"); // 4
    let tree = f.db.open_tree("keel").unwrap();
    // Simulate the record of b@3 vanishing under a reader.
    let rkey = crate::mvcc::revision::record_key(crate::mvcc::Revision::new(3, 0), false);
    let saved = tree.remove(&rkey).unwrap().unwrap();
    let read_b = rq("b", "");
    let internal = |e: EtcdError| matches!(e, EtcdError::Internal(_));
    assert!(internal(f.get(read_b.clone()).unwrap_err()));
    let mut keys_only = read_b.clone();
    keys_only.keys_only = true;
    assert_eq!(
        f.get(keys_only).unwrap().count,
        1,
        "keys_only reads no record"
    );
    assert!(internal(f.store.hash_kv(0).unwrap_err()), "dense path");
    assert!(internal(f.store.hash_kv(3).unwrap_err()));
    // A compaction past the read revision explains the missing record.
    f.store.compact_floor.store(10, Ordering::Release);
    assert_eq!(f.get(read_b).unwrap_err(), EtcdError::Compacted);
    assert_eq!(f.store.hash_kv(0).unwrap_err(), EtcdError::Compacted);
    f.store.compact_floor.store(-1, Ordering::Release);
    tree.insert(&rkey, saved).unwrap();
    assert_eq!(f.get(rq("b", "")).unwrap().kvs[0].value, b"1");
    // Sparse path: more history than visible revisions.
    for v in ["3", "4", "5", "6"] {
        f.put("a", v);
    }
    let a_rev = crate::mvcc::revision::record_key(crate::mvcc::Revision::new(8, 0), false);
    tree.remove(&a_rev).unwrap().unwrap();
    assert!(internal(f.store.hash_kv(0).unwrap_err()), "sparse path");
}

#[test]
fn store_is_shareable_and_write_txn_is_send() {
    fn shareable<T: Send + Sync>() {}
    fn sendable<T: Send>() {}
    shareable::<MvccStore>();
    shareable::<std::sync::Arc<MvccStore>>();
    sendable::<super::WriteTxn<'static>>();
}
