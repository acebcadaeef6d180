//! keel-client against a real single-member `keel` process (keel-testkit's [`Member`]).
//!
//! The binary is `$KEEL_BIN` if set, else `keel` in this test's profile directory of the
//! target dir (`target/<profile>/keel`). `cargo test --workspace` builds it (keel-server's own
//! end-to-end tests need it); alone, run `cargo build -p keel-server` (add `--release` for
//! release tests) first.

use std::time::Duration;

use keel_client::etcdserverpb::{Compare, RequestOp, TxnRequest, compare, request_op};
use keel_client::{Client, ClientError, ClientOptions, Consistency, RetryPolicy};
use keel_testkit::Member;
use keel_testkit::ports::free_port;

/// A fresh single-member cluster, ready to serve (it blocks the test's runtime meanwhile,
/// which has nothing else to run yet), and its endpoint.
fn start_keel() -> (Member, String) {
    let keel = Member::start(&keel_testkit::keel_binary!());
    let endpoint = keel.endpoint();
    (keel, endpoint)
}

#[tokio::test]
async fn typed_calls_round_trip() {
    let (_keel, endpoint) = start_keel();
    let c = Client::connect(
        &[&endpoint],
        ClientOptions {
            conns: 3,
            ..Default::default()
        },
    )
    .await
    .expect("connect");
    assert_eq!(c.conns(), 3);

    let p1 = c.put("k", "v1").await.expect("put");
    let p2 = c.put("k", "v2").await.expect("put");
    let rev2 = p2.header.expect("header").revision;
    assert_eq!(rev2, p1.header.expect("header").revision + 1);

    for consistency in [Consistency::Linearizable, Consistency::Serializable] {
        let r = c.get("k", consistency).await.expect("get");
        assert_eq!(r.kvs.len(), 1);
        assert_eq!(r.kvs[0].value, b"v2");
        assert_eq!(r.kvs[0].mod_revision, rev2);
        assert_eq!(r.kvs[0].version, 2);
    }

    let txn = TxnRequest {
        compare: vec![Compare {
            key: b"k".to_vec(),
            result: compare::CompareResult::Equal as i32,
            target: compare::CompareTarget::Value as i32,
            target_union: Some(compare::TargetUnion::Value(b"v2".to_vec())),
            ..Default::default()
        }],
        success: vec![RequestOp {
            request: Some(request_op::Request::RequestPut(
                keel_client::etcdserverpb::PutRequest {
                    key: b"k".to_vec(),
                    value: b"v3".to_vec(),
                    ..Default::default()
                },
            )),
        }],
        failure: vec![],
    };
    assert!(c.txn(txn.clone()).await.expect("txn").succeeded);
    assert!(!c.txn(txn).await.expect("txn").succeeded, "value is v3 now");

    assert_eq!(c.delete("k").await.expect("delete").deleted, 1);
    assert_eq!(c.delete("k").await.expect("delete").deleted, 0);

    c.compact(rev2, false).await.expect("compact");
    let again = c.compact(rev2, false).await.expect_err("compacted twice");
    assert_eq!(again.kind(), "compacted");
    assert!(!again.may_have_applied());

    let bad = c.put("", "v").await.expect_err("empty key");
    assert_eq!(bad.kind(), "rejected_invalid_argument");
    assert!(!bad.may_have_applied());
}

#[tokio::test]
async fn watch_and_lease_streams() {
    let (_keel, endpoint) = start_keel();
    let c = Client::connect(&[&endpoint], ClientOptions::default())
        .await
        .expect("connect");
    let mut w = c.watch_key("w", "", 0).await.expect("watch");
    let put = c.put("w", "x").await.expect("put");
    let events = tokio::time::timeout(Duration::from_secs(10), w.next())
        .await
        .expect("event within 10 s")
        .expect("stream")
        .expect("response");
    assert_eq!(events.events.len(), 1);
    let kv = events.events[0].kv.as_ref().expect("kv");
    assert_eq!(kv.key, b"w");
    assert_eq!(kv.mod_revision, put.header.expect("header").revision);

    let grant = c.lease_grant(30).await.expect("grant");
    assert_eq!(grant.ttl, 30);
    let mut ka = c.lease_keep_alive(grant.id).await.expect("keep-alive");
    let r = ka.keep_alive_once().await.expect("renew");
    assert_eq!(r.id, grant.id);
    assert!(r.ttl > 0 && r.ttl <= 30, "ttl {}", r.ttl);
    c.lease_revoke(grant.id).await.expect("revoke");
    let r = ka.keep_alive_once().await.expect("renew revoked");
    assert_eq!(r.ttl, 0, "a revoked lease renews with ttl 0");
}

#[tokio::test]
async fn a_dead_endpoint_is_skipped_by_retries() {
    let (_keel, endpoint) = start_keel();
    // Nothing listens on `dead` (bound, then released).
    let dead = format!("127.0.0.1:{}", free_port());
    let c = Client::connect(
        &[dead.as_str(), endpoint.as_str()],
        ClientOptions {
            conns: 2,
            connect_timeout: Duration::from_millis(500),
            ..Default::default()
        },
    )
    .await
    .expect("one endpoint is up");
    // Round robin sends every other first attempt to the dead member: a connect failure
    // proves the request was not sent, so reads and writes alike move on to the live one.
    for i in 0..6 {
        c.put(format!("r{i}"), "v").await.expect("put retried");
        c.get(format!("r{i}"), Consistency::Linearizable)
            .await
            .expect("get retried");
    }

    let dead_only = c.on_member(0).expect("member 0");
    assert_eq!(dead_only.endpoints(), std::slice::from_ref(&dead));
    let err = dead_only.put("x", "v").await.expect_err("dead member");
    assert!(
        matches!(&err, ClientError::NotSent { endpoint, .. } if *endpoint == dead),
        "{err:?}"
    );
    assert!(!err.may_have_applied());
    assert!(c.on_member(2).is_none());

    let no_retry = Client::connect(
        &[dead.as_str(), endpoint.as_str()],
        ClientOptions {
            conns: 2,
            retry: RetryPolicy::none(),
            ..Default::default()
        },
    )
    .await
    .expect("connect");
    let mut not_sent = 0;
    for _ in 0..4 {
        if let Err(e) = no_retry.get("x", Consistency::Serializable).await {
            assert_eq!(e.kind(), "not_sent");
            not_sent += 1;
        }
    }
    assert_eq!(not_sent, 2, "half of the round robin hits the dead member");

    let err = Client::connect(&[dead.as_str()], ClientOptions::default())
        .await
        .err()
        .expect("nothing to connect to");
    assert_eq!(err.kind(), "not_sent");
}

#[tokio::test]
async fn tls_files_connect_to_a_member_with_client_cert_auth() {
    use keel_client::TlsFiles;
    use keel_testkit::tls::TestCa;
    let certs = tempfile::tempdir().expect("temp dir");
    let ca = TestCa::new(certs.path(), "ca");
    let ports = keel_testkit::ports::free_ports(2);
    let spec = keel_testkit::MemberSpec::single("default", ports[0], ports[1])
        .client_tls(ca.server("server", "server"));
    let mut keel = Member::new(&keel_testkit::keel_binary!(), spec);
    keel.restart();
    let url = keel.client_url();
    let client_cert = ca.issue("client", "client");
    let tls = |cert: bool| TlsFiles {
        ca: ca.ca_file(),
        cert: cert.then(|| client_cert.cert.clone()),
        key: cert.then(|| client_cert.key.clone()),
    };
    let options = |tls: Option<TlsFiles>| ClientOptions {
        retry: RetryPolicy::none(),
        connect_timeout: Duration::from_secs(2),
        tls,
        ..Default::default()
    };

    let c = Client::connect(&[&url], options(Some(tls(true))))
        .await
        .expect("connect with --cacert --cert --key");
    let put = c.put("k", "over-tls").await.expect("put over TLS");
    let r = c.get("k", Consistency::Linearizable).await.expect("get");
    assert_eq!(r.kvs[0].value, b"over-tls");

    // No client certificate: refused, nothing applied.
    let refused = match Client::connect(&[&url], options(Some(tls(false)))).await {
        Err(e) => e,
        Ok(c) => c
            .put("k", "no-cert")
            .await
            .expect_err("a client without a certificate is refused"),
    };
    assert!(!refused.to_string().is_empty());
    // An https endpoint without TLS files is a usage error.
    match Client::connect(&[&url], options(None)).await {
        Err(ClientError::Rejected { message, .. }) => {
            assert!(message.contains("needs TLS files"), "{message}")
        }
        other => panic!("expected a rejection, got {:?}", other.err()),
    }
    let r = c.get("k", Consistency::Linearizable).await.expect("get");
    assert_eq!(r.kvs[0].value, b"over-tls");
    assert_eq!(
        r.header.expect("header").revision,
        put.header.expect("header").revision
    );
}

#[tokio::test]
async fn range_stream_merges_to_what_range_returns() {
    use keel_client::etcdserverpb::RangeRequest;
    use keel_client::etcdserverpb::range_request::SortOrder;
    let (_keel, endpoint) = start_keel();
    let c = Client::connect(&[&endpoint], ClientOptions::default())
        .await
        .expect("connect");
    for i in 0..300 {
        c.put(format!("rs/{i:04}"), vec![b'v'; 200])
            .await
            .expect("put");
    }
    let all = RangeRequest {
        key: b"rs/".to_vec(),
        range_end: b"rs0".to_vec(),
        ..Default::default()
    };
    let streamed = c.range_stream(all.clone()).await.expect("range_stream");
    assert_eq!(streamed.kvs.len(), 300);
    assert_eq!(streamed, c.range(all.clone()).await.expect("range"));
    let limited = RangeRequest {
        limit: 42,
        ..all.clone()
    };
    let streamed = c.range_stream(limited.clone()).await.expect("range_stream");
    assert_eq!(
        (streamed.kvs.len(), streamed.more, streamed.count),
        (42, true, 300)
    );
    assert_eq!(streamed, c.range(limited).await.expect("range"));
    // RangeStream refuses a custom order (Unimplemented): the client falls back to Range.
    let descending = RangeRequest {
        sort_order: SortOrder::Descend as i32,
        ..all
    };
    let got = c.range_stream(descending.clone()).await.expect("fallback");
    assert_eq!(got.kvs[0].key, b"rs/0299");
    assert_eq!(got, c.range(descending).await.expect("range"));
}
