//! Read-only txns (compares and Range ops only) are served as reads, not proposed (etcd
//! `v3_server.go` `Txn`): on a follower a linearizable one sees a write the leader acknowledged
//! just before (ReadIndex); none of them adds raft log entries; a serializable one is answered
//! by a member that has no leader.

use std::time::Duration;

use keel_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use keel_proto::etcdserverpb::request_op::Request;
use keel_proto::etcdserverpb::response_op::Response;
use keel_proto::etcdserverpb::{
    Compare, PutRequest, RangeRequest, RequestOp, TxnRequest, TxnResponse,
};
use keel_testkit::grpc;
use tonic::transport::Channel;

use crate::cluster;

type Kv = keel_proto::etcdserverpb::kv_client::KvClient<Channel>;

/// `value(key) == value ? range key : range key` with ranges `serializable` or not.
fn read_txn(key: &str, value: &str, serializable: bool) -> TxnRequest {
    let range = || RequestOp {
        request: Some(Request::RequestRange(RangeRequest {
            key: key.into(),
            serializable,
            ..Default::default()
        })),
    };
    TxnRequest {
        compare: vec![Compare {
            result: CompareResult::Equal as i32,
            target: CompareTarget::Value as i32,
            key: key.into(),
            range_end: vec![],
            target_union: Some(TargetUnion::Value(value.into())),
        }],
        success: vec![range()],
        failure: vec![range()],
    }
}

/// The value the txn's single range op returned.
fn ranged_value(resp: &TxnResponse) -> Option<Vec<u8>> {
    match resp.responses.first().and_then(|r| r.response.as_ref()) {
        Some(Response::ResponseRange(r)) => r.kvs.first().map(|kv| kv.value.clone()),
        other => panic!("expected a range response, got {other:?}"),
    }
}

async fn txn(kv: &mut Kv, req: TxnRequest) -> Result<TxnResponse, tonic::Status> {
    kv.txn(req).await.map(tonic::Response::into_inner)
}

#[test]
fn read_only_txns_on_a_follower_are_linearizable_and_add_no_log_entries() {
    let (_alone, cluster) = cluster(3, &[]);
    let leader = cluster.leader(Duration::from_secs(10));
    let follower = (leader + 1) % 3;
    let rt = grpc::runtime();
    rt.block_on(async {
        let mut writer = grpc::kv(&cluster.members[leader].endpoint()).await;
        let mut reader = grpc::kv(&cluster.members[follower].endpoint()).await;
        for i in 0..40 {
            let value = i.to_string();
            let rev = grpc::put(&mut writer, "rot", &value).await;
            // Right after the leader's ack, the follower's txn compares and reads it.
            let resp = txn(&mut reader, read_txn("rot", &value, false))
                .await
                .expect("read-only txn");
            assert!(resp.succeeded, "write {i}: compare saw a stale value");
            assert_eq!(ranged_value(&resp), Some(value.into_bytes()), "write {i}");
            let header = resp.header.expect("header");
            assert_eq!(header.revision, rev, "write {i}: header revision");
            assert_ne!(header.member_id, 0);
        }
    });

    // 50 read-only txns, linearizable and serializable, add no log entries; 5 txns that
    // write add at least one each (they are sequential).
    let index = || cluster.status(leader).unwrap().raft_index;
    let before = index();
    rt.block_on(async {
        let mut reader = grpc::kv(&cluster.members[follower].endpoint()).await;
        for i in 0..50 {
            let resp = txn(&mut reader, read_txn("rot", "39", i % 2 == 0))
                .await
                .expect("read-only txn");
            assert!(resp.succeeded);
        }
    });
    let after_reads = index();
    rt.block_on(async {
        let mut reader = grpc::kv(&cluster.members[follower].endpoint()).await;
        for i in 0..5 {
            let mut t = read_txn("rot", "39", false);
            t.success.push(RequestOp {
                request: Some(Request::RequestPut(PutRequest {
                    key: format!("rot-w{i}").into_bytes(),
                    value: b"x".to_vec(),
                    ..Default::default()
                })),
            });
            assert!(txn(&mut reader, t).await.expect("write txn").succeeded);
        }
    });
    let after_writes = index();
    eprintln!(
        "raft index: {before} -> {after_reads} (50 read-only txns) -> {after_writes} (5 write txns)"
    );
    // Room for one server-issued entry (e.g. a lease checkpoint), none per txn.
    assert!(
        after_reads <= before + 1,
        "read-only txns went through the log: {before} -> {after_reads}"
    );
    assert!(
        after_writes >= after_reads + 5,
        "{after_reads} -> {after_writes}"
    );
}

#[test]
fn serializable_read_only_txns_are_answered_without_a_leader() {
    let (_alone, mut cluster) = cluster(3, &[]);
    let leader = cluster.leader(Duration::from_secs(10));
    let survivor = (leader + 1) % 3;
    let rt = grpc::runtime();
    rt.block_on(async {
        let mut kv = grpc::kv(&cluster.members[leader].endpoint()).await;
        grpc::put(&mut kv, "alone", "here").await;
        // Applied on the survivor: a linearizable read there waits for it.
        let mut kv = grpc::kv(&cluster.members[survivor].endpoint()).await;
        assert_eq!(grpc::range(&mut kv, b"alone", b"").await.kvs.len(), 1);
    });
    for i in 0..3 {
        if i != survivor {
            cluster.members[i].kill9();
        }
    }
    rt.block_on(async {
        let mut kv = grpc::kv(&cluster.members[survivor].endpoint()).await;
        let resp = tokio::time::timeout(
            Duration::from_secs(5),
            txn(&mut kv, read_txn("alone", "here", true)),
        )
        .await
        .expect("a serializable txn does not wait for a leader")
        .expect("serializable read-only txn");
        assert!(resp.succeeded);
        assert_eq!(ranged_value(&resp), Some(b"here".to_vec()));
        // A linearizable one needs the leader's read index: it fails.
        let linearizable = tokio::time::timeout(
            Duration::from_secs(30),
            txn(&mut kv, read_txn("alone", "here", false)),
        )
        .await
        .expect("the linearizable txn ends within the request timeout");
        assert!(linearizable.is_err(), "{linearizable:?}");
    });
}
