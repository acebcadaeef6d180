//! Graceful shutdown: SIGTERM makes `keel` exit with code 0, keeping every acknowledged write,
//! also while writes are in flight; `keel --version` answers without starting a member.

mod support;

#[path = "crash_recovery/check.rs"]
mod check;
#[path = "crash_recovery/history.rs"]
mod history;
#[path = "crash_recovery/store.rs"]
mod store;
#[path = "crash_recovery/writer.rs"]
mod writer;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use keel_proto::etcdserverpb::{Compare, PutRequest, RequestOp, TxnRequest, compare, request_op};
use store::Store;
use support::grpc;
use support::process::{Keel, member_binary};

/// Writes acknowledged before SIGTERM in the under-load test.
const ACKS_BEFORE_SIGTERM: u64 = 50;
/// Bound on waiting for them, and on the writers stopping.
const LOAD_TIMEOUT: Duration = Duration::from_secs(20);

#[test]
fn sigterm_exits_zero_and_keeps_every_write() {
    let mut keel = Keel::start();
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
    let mut keel = Keel::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let base = rt.block_on(Store::read(&keel.endpoint())).revision;
    let control = Arc::new(writer::Control {
        endpoint: keel.endpoint(),
        stop: AtomicBool::new(false),
        acked: AtomicU64::new(0),
    });
    let writers: Vec<_> = (0..4)
        .map(|id| rt.spawn(writer::run(id, Arc::clone(&control))))
        .collect();

    let deadline = Instant::now() + LOAD_TIMEOUT;
    while control.acked.load(Ordering::SeqCst) < ACKS_BEFORE_SIGTERM {
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
    control.stop.store(true, Ordering::SeqCst);
    let history: Vec<history::Attempt> = rt.block_on(async {
        let joined = tokio::time::timeout(LOAD_TIMEOUT, futures::future::join_all(writers))
            .await
            .expect("writers stop once the member is down");
        joined
            .into_iter()
            .flat_map(|r| r.expect("writer task panicked"))
            .collect()
    });

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
    let mut child = Command::new(member_binary())
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn keel --version");
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("keel --version did not exit within 10 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let output = child
        .wait_with_output()
        .expect("collect keel --version output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert!(
        stdout.contains(env!("CARGO_PKG_VERSION")),
        "`keel --version` names the crate version {}: {stdout:?}",
        env!("CARGO_PKG_VERSION")
    );
}
