//! Versions end to end (issue 16, docs/upgrades.md): a new cluster reaches cluster version 0.2
//! (0.2-only requests work right after start), `Maintenance.Downgrade` answers with etcd's
//! errors, and ENABLE lowers the cluster version so that 0.2-only requests are refused with the
//! reason until CANCEL. The rolling upgrade and downgrade against Keel 0.1.0 is keel-chaos's
//! `upgrade` scenario (scripts/test.sh).

use std::time::{Duration, Instant};

use keel_proto::etcdserverpb::auth_client::AuthClient;
use keel_proto::etcdserverpb::downgrade_request::DowngradeAction;
use keel_proto::etcdserverpb::{AuthStatusRequest, DowngradeRequest, DowngradeResponse};
use keel_testkit::etcdctl::etcdctl;
use keel_testkit::grpc;
use tonic::Code;

use crate::member;

fn downgrade(
    endpoint: &str,
    action: DowngradeAction,
    version: &str,
) -> Result<DowngradeResponse, tonic::Status> {
    let (endpoint, version) = (endpoint.to_string(), version.to_string());
    grpc::block_on_thread(async move {
        grpc::maintenance(&endpoint)
            .await
            .downgrade(DowngradeRequest {
                action: action as i32,
                version,
            })
            .await
            .map(|r| r.into_inner())
    })
    .unwrap()
}

/// `Auth.AuthStatus` (proposed through raft, so gated): `ok enabled=<bool>` or the error text.
fn auth_status(endpoint: &str) -> String {
    let endpoint = endpoint.to_string();
    grpc::block_on_thread(async move {
        let ch = grpc::channel(&endpoint, Duration::from_secs(5)).await?;
        AuthClient::new(ch)
            .auth_status(AuthStatusRequest {})
            .await
            .map(|r| format!("ok enabled={}", r.into_inner().enabled))
            .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
    })
    .unwrap()
    .unwrap_or_else(|e| e)
}

/// Polls [`auth_status`] until `done(answer)` or 15 s; returns the last answer.
fn wait_auth_status(endpoint: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let answer = auth_status(endpoint);
        if done(&answer) || Instant::now() > deadline {
            return answer;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn downgrade_answers_etcds_errors_and_enable_lowers_the_cluster_version() {
    let (_guard, keel) = member(&[]);
    let ep = keel.endpoint();
    // A new cluster decides 0.2 at once: a 0.2-only request works right after start.
    etcdctl(&ep, &["user", "add", "early", "--new-user-password=pw"]).ok();
    etcdctl(&ep, &["user", "delete", "early"]).ok();

    use DowngradeAction::{Cancel, Enable, Validate};
    let invalid = "etcdserver: invalid downgrade target version";
    grpc::assert_fails_with(
        downgrade(&ep, Validate, "zero"),
        Code::InvalidArgument,
        "etcdserver: wrong downgrade target version format",
    );
    grpc::assert_fails_with(
        downgrade(&ep, Validate, "0.2"),
        Code::InvalidArgument,
        invalid,
    );
    grpc::assert_fails_with(
        downgrade(&ep, Validate, "0.0"),
        Code::InvalidArgument,
        invalid,
    );
    grpc::assert_fails_with(
        downgrade(&ep, Cancel, ""),
        Code::FailedPrecondition,
        "etcdserver: no inflight downgrade job",
    );
    assert_eq!(downgrade(&ep, Validate, "0.1").unwrap().version, "0.2.0");

    // 0.2-only state in use refuses ENABLE, naming it.
    etcdctl(&ep, &["user", "add", "u", "--new-user-password=pw"]).ok();
    grpc::assert_fails_with(
        downgrade(&ep, Enable, "0.1"),
        Code::FailedPrecondition,
        "cannot downgrade to 0.1: auth (users, roles or auth enabled) in use needs the newer release",
    );
    etcdctl(&ep, &["user", "delete", "u"]).ok();

    downgrade(&ep, Enable, "0.1").unwrap();
    grpc::assert_fails_with(
        downgrade(&ep, Enable, "0.1"),
        Code::FailedPrecondition,
        "etcdserver: cluster has a downgrade job in progress",
    );
    let refused = wait_auth_status(&ep, |t| t.contains("too low"));
    assert!(
        refused
            == "FailedPrecondition: cluster version 0.1 is too low for auth requests (needs 0.2)",
        "{refused}"
    );
    let add = etcdctl(&ep, &["user", "add", "late", "--new-user-password=pw"]);
    // etcdctl prints an error outside etcd's catalogue as the Go status text.
    add.fails_with(
        "Error: rpc error: code = FailedPrecondition desc = cluster version 0.1 is too low for \
         auth requests (needs 0.2)",
    );
    // Survives a restart (the job and the version are replicated state).
    drop(add);
    let mut keel = keel;
    keel.terminate();
    keel.restart();
    assert!(wait_auth_status(&ep, |t| t.contains("too low")).contains("too low"));

    // CANCEL: the version rises again (every member runs 0.2).
    downgrade(&ep, Cancel, "").unwrap();
    let open = wait_auth_status(&ep, |t| t.starts_with("ok"));
    assert_eq!(open, "ok enabled=false");
    etcdctl(&ep, &["user", "list"]).ok();
    assert!(
        etcdctl(&ep, &["user", "list"]).ok().lines().is_empty(),
        "the refused add changed nothing"
    );
}
