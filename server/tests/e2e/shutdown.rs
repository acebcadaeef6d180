//! Graceful shutdown: SIGTERM makes `keel` exit with code 0, keeping every acknowledged write,
//! also while writes are in flight; `keel --version` answers without starting a member.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use keel_proto::etcdserverpb::{Compare, PutRequest, RequestOp, TxnRequest, compare, request_op};
use keel_testkit::grpc;
use keel_testkit::process::run_bounded;

use crate::crash_recovery::store::Store;
use crate::crash_recovery::{check, writer};
use crate::{keel_bin, member};

/// Writes acknowledged before SIGTERM in the under-load test.
const ACKS_BEFORE_SIGTERM: u64 = 50;
/// Bound on waiting for them, and on the writers stopping.
const LOAD_TIMEOUT: Duration = Duration::from_secs(20);

#[test]
fn sigterm_exits_zero_and_keeps_every_write() {
    let (_guard, mut keel) = member(&[]);
    let endpoint = keel.endpoint();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (written, last) = rt.block_on(async {
        let mut kv = grpc::kv(&endpoint).await;
        let mut written = BTreeMap::new();
        for i in 0..50 {
            let key = format!("key{i:03}");
            let revision = grpc::put(&mut kv, &key, &format!("value{i}")).await;
            written.insert(key, revision);
        }
        let pair = |key: &str| RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: key.into(),
                value: b"pair".to_vec(),
                ..Default::default()
            })),
        };
        let txn = TxnRequest {
            compare: vec![Compare {
                result: compare::CompareResult::Equal as i32,
                target: compare::CompareTarget::Version as i32,
                key: b"pair-a".to_vec(),
                range_end: Vec::new(),
                target_union: Some(compare::TargetUnion::Version(0)),
            }],
            success: vec![pair("pair-a"), pair("pair-b")],
            failure: Vec::new(),
        };
        let response = kv.txn(txn).await.expect("txn").into_inner();
        assert!(response.succeeded, "{response:?}");
        let revision = response.header.expect("header").revision;
        written.insert("pair-a".to_string(), revision);
        written.insert("pair-b".to_string(), revision);
        (written, revision)
    });

    let status = keel.terminate();
    assert_eq!(
        status.code(),
        Some(0),
        "SIGTERM is a graceful shutdown: {status}\n{}",
        keel.log_tail()
    );
    keel.restart();

    rt.block_on(async {
        let mut kv = grpc::kv(&endpoint).await;
        let all = grpc::range(&mut kv, &[0], &[0]).await;
        assert_eq!(
            all.header.as_ref().expect("header").revision,
            last,
            "store revision after restart"
        );
        let stored: BTreeMap<String, i64> = all
            .kvs
            .iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(&kv.key).into_owned(),
                    kv.mod_revision,
                )
            })
            .collect();
        assert_eq!(stored, written, "every write with its revision");
        assert_eq!(
            grpc::put(&mut kv, "after", "restart").await,
            last + 1,
            "revisions continue"
        );
    });
}

#[test]
fn sigterm_under_load_exits_zero_and_keeps_acknowledged_writes() {
    let (_guard, mut keel) = member(&[]);
    let rt = grpc::runtime();
    let base = rt.block_on(Store::read(&keel.endpoint())).revision;
    let writers = writer::Writers::start(&rt, &keel.endpoint(), 4);

    let deadline = Instant::now() + LOAD_TIMEOUT;
    while writers.acked() < ACKS_BEFORE_SIGTERM {
        assert!(
            Instant::now() < deadline,
            "no write progress before SIGTERM\n{}",
            keel.log_tail()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let status = keel.terminate();
    assert_eq!(
        status.code(),
        Some(0),
        "SIGTERM under load: {status}\n{}",
        keel.log_tail()
    );
    // The writers stop once the member is down.
    let history = writers.stop(&rt, LOAD_TIMEOUT);

    keel.restart();
    let store = rt.block_on(Store::read(&keel.endpoint()));
    let violations = check::check(&history, &store, base);
    assert!(
        violations.is_empty(),
        "{} violations after SIGTERM ({}):\n{}",
        violations.len(),
        check::summary(&history, &store),
        violations
            .iter()
            .take(30)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn version_flag_prints_the_version_and_exits_zero() {
    let output = run_bounded(
        Command::new(keel_bin()).arg("--version"),
        "",
        Duration::from_secs(10),
    );
    assert_eq!(output.code, Some(0), "{output:?}");
    assert!(
        output.stdout.contains(env!("CARGO_PKG_VERSION")),
        "`keel --version` names the crate version {}: {:?}",
        env!("CARGO_PKG_VERSION"),
        output.stdout
    );
}

/// Client streams do not hold a stopping member up: on SIGTERM an open watch and an open
/// keepalive stream end with etcd's `etcdserver: server stopped` (`Unavailable`, which
/// clientv3 resumes on another endpoint), and the member exits. Before, its graceful
/// shutdown waited for such streams until its 5 s drain bound, and they ended with a broken
/// connection.
#[test]
fn sigterm_ends_open_watch_and_keepalive_streams_with_server_stopped() {
    use keel_proto::etcdserverpb::{
        LeaseGrantRequest, LeaseKeepAliveRequest, WatchCreateRequest, WatchRequest, watch_request,
    };
    use tokio_stream::wrappers::ReceiverStream;

    let (_guard, mut keel) = member(&[]);
    let endpoint = keel.endpoint();
    let rt = grpc::runtime();
    let (watch_tx, keepalive_tx, mut watch, mut keepalive) = rt.block_on(async {
        let (watch_tx, rx) = tokio::sync::mpsc::channel(1);
        watch_tx
            .send(WatchRequest {
                request_union: Some(watch_request::RequestUnion::CreateRequest(
                    WatchCreateRequest {
                        key: b"w".to_vec(),
                        ..Default::default()
                    },
                )),
            })
            .await
            .unwrap();
        let mut watch = grpc::watch(&endpoint)
            .await
            .watch(ReceiverStream::new(rx))
            .await
            .expect("watch")
            .into_inner();
        let created = watch.message().await.expect("created").expect("a response");
        assert!(created.created, "{created:?}");

        let mut lease = grpc::lease(&endpoint, Duration::from_secs(5)).await;
        let id = lease
            .lease_grant(LeaseGrantRequest { ttl: 60, id: 0 })
            .await
            .expect("grant")
            .into_inner()
            .id;
        let (keepalive_tx, rx) = tokio::sync::mpsc::channel(1);
        keepalive_tx
            .send(LeaseKeepAliveRequest { id })
            .await
            .unwrap();
        let mut keepalive = grpc::lease(&endpoint, Duration::from_secs(60))
            .await
            .lease_keep_alive(ReceiverStream::new(rx))
            .await
            .expect("keepalive")
            .into_inner();
        let renewed = keepalive
            .message()
            .await
            .expect("renewed")
            .expect("a response");
        assert_eq!(renewed.ttl, 60);
        (watch_tx, keepalive_tx, watch, keepalive)
    });
    let status = keel.terminate();
    assert!(status.success(), "{status}");
    rt.block_on(async {
        for (name, end) in [
            ("watch", watch.message().await.map(|_| ())),
            ("keepalive", keepalive.message().await.map(|_| ())),
        ] {
            let end = end.expect_err(name);
            assert_eq!(end.code(), tonic::Code::Unavailable, "{name}: {end:?}");
            assert_eq!(end.message(), "etcdserver: server stopped", "{name}");
        }
    });
    drop((watch_tx, keepalive_tx));
}
