//! The permission table of docs/auth.md, row by row, over a running member: every RPC of the
//! issue is called without credentials, as user `u` (READWRITE on `k/`, READ on `ro`) and as
//! `root`, and each answer is compared with the table ([`TABLE`]; etcd 3.6.14 after the 2026
//! CVE fixes, ETCD-FACTS §1c).

use std::time::Duration;

use keel_proto::etcdserverpb::auth_client::AuthClient;
use keel_proto::etcdserverpb::cluster_client::ClusterClient;
use keel_proto::etcdserverpb::kv_client::KvClient;
use keel_proto::etcdserverpb::lease_client::LeaseClient;
use keel_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use keel_proto::etcdserverpb::watch_client::WatchClient;
use keel_proto::etcdserverpb::{
    AuthRoleGetRequest, AuthRoleListRequest, AuthStatusRequest, AuthUserGetRequest,
    AuthUserListRequest, AuthenticateRequest, CompactionRequest, Compare, DefragmentRequest,
    DeleteRangeRequest, HashKvRequest, LeaseGrantRequest, LeaseKeepAliveRequest,
    LeaseLeasesRequest, LeaseRevokeRequest, LeaseTimeToLiveRequest, MemberAddRequest,
    MemberListRequest, MemberPromoteRequest, MemberRemoveRequest, MemberUpdateRequest,
    MoveLeaderRequest, PutRequest, RangeRequest, RequestOp, StatusRequest, TxnRequest,
    WatchCreateRequest, WatchRequest, WatchResponse, compare, request_op, watch_request,
};
use keel_testkit::grpc;
use tonic::Status;
use tonic::transport::Channel;

use crate::member;

/// Allowed.
const OK: &str = "ok";
const EMPTY: &str = "etcdserver: user name is empty";
const DENIED: &str = "etcdserver: permission denied";
/// A refused watch create's cancel reason: the Go text of the gRPC status (etcd 3.6
/// `isWatchPermitted`, checked on etcd 3.4.23 for no token).
const WATCH_DENIED: &str =
    "rpc error: code = PermissionDenied desc = etcdserver: permission denied";
const WATCH_EMPTY: &str = "rpc error: code = InvalidArgument desc = etcdserver: user name is empty";
/// Past the permission check: the RPC's own answer (an unknown member, a bad URL...).
const PASSED: &str = "passed";

/// `rpc`, then the answer without credentials, as `u`, as `root`.
const TABLE: &[(&str, &str, &str, &str)] = &[
    ("range k/a", EMPTY, OK, OK),
    ("range ro", EMPTY, OK, OK),
    ("range secret", EMPTY, DENIED, OK),
    ("range k/ prefix serializable", EMPTY, OK, OK),
    ("put k/a", EMPTY, OK, OK),
    ("put ro", EMPTY, DENIED, OK),
    ("put k/a prev_kv", EMPTY, OK, OK),
    ("put k/b lease-on-secret", EMPTY, DENIED, OK),
    ("delete k/a", EMPTY, OK, OK),
    ("delete ro prev_kv", EMPTY, DENIED, OK),
    ("txn compare secret", EMPTY, DENIED, OK),
    ("txn nested put secret", EMPTY, DENIED, OK),
    ("txn put k/c", EMPTY, OK, OK),
    // Read-only txns are served without raft (api/kv.rs), with the same checks.
    ("txn read-only compare secret", EMPTY, DENIED, OK),
    ("txn read-only range k/a", EMPTY, OK, OK),
    (
        "txn read-only nested range secret serializable",
        EMPTY,
        DENIED,
        OK,
    ),
    ("watch k/a", WATCH_EMPTY, OK, OK),
    ("watch secret", WATCH_EMPTY, WATCH_DENIED, OK),
    ("lease-grant", EMPTY, OK, OK),
    ("lease-revoke on-secret", EMPTY, DENIED, OK),
    ("lease-revoke on-k", EMPTY, OK, OK),
    ("lease-keepalive on-secret", EMPTY, DENIED, OK),
    ("lease-ttl on-secret", EMPTY, OK, OK),
    ("lease-ttl on-secret keys", EMPTY, DENIED, OK),
    ("lease-leases", EMPTY, DENIED, OK),
    ("compact", EMPTY, DENIED, OK),
    ("member-list", EMPTY, OK, OK),
    ("member-add", EMPTY, DENIED, PASSED),
    ("member-remove", EMPTY, DENIED, PASSED),
    ("member-update", EMPTY, DENIED, PASSED),
    ("member-promote", EMPTY, DENIED, PASSED),
    ("status", EMPTY, OK, OK),
    ("hash-kv", EMPTY, DENIED, OK),
    ("defragment", EMPTY, DENIED, OK),
    ("move-leader", EMPTY, DENIED, PASSED),
    ("auth-status", EMPTY, DENIED, OK),
    ("user-list", EMPTY, DENIED, OK),
    ("user-get u", EMPTY, OK, OK),
    ("user-get root", EMPTY, DENIED, OK),
    ("role-list", EMPTY, DENIED, OK),
    ("role-get rw", EMPTY, OK, OK),
    (
        "role-get other",
        EMPTY,
        DENIED,
        "etcdserver: role name not found",
    ),
    ("authenticate", OK, OK, OK),
];

fn authed<T>(message: T, token: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(t) = token {
        request
            .metadata_mut()
            .insert("token", t.parse().expect("an ASCII token"));
    }
    request
}

fn put(key: &str, lease: i64, prev_kv: bool) -> PutRequest {
    PutRequest {
        key: key.into(),
        value: b"v".to_vec(),
        lease,
        prev_kv,
        ..Default::default()
    }
}

/// A read-only txn: `version(compare_key) == 0 ? range k/a`.
fn read_only_txn(compare_key: &[u8]) -> TxnRequest {
    TxnRequest {
        compare: vec![Compare {
            key: compare_key.to_vec(),
            target: compare::CompareTarget::Version as i32,
            target_union: Some(compare::TargetUnion::Version(0)),
            ..Default::default()
        }],
        success: vec![op(request_op::Request::RequestRange(RangeRequest {
            key: b"k/a".to_vec(),
            ..Default::default()
        }))],
        ..Default::default()
    }
}

fn op(r: request_op::Request) -> RequestOp {
    RequestOp { request: Some(r) }
}

/// The setup a lease row needs, made as root: a fresh lease with `key` attached.
async fn lease_on(ch: &Channel, root: &str, key: &str) -> i64 {
    let id = LeaseClient::new(ch.clone())
        .lease_grant(authed(LeaseGrantRequest { ttl: 60, id: 0 }, Some(root)))
        .await
        .unwrap()
        .into_inner()
        .id;
    KvClient::new(ch.clone())
        .put(authed(put(key, id, false), Some(root)))
        .await
        .unwrap();
    id
}

/// Calls `rpc` (a row name of [`TABLE`]) as `token`; `Ok` or the error.
async fn call(ch: &Channel, root: &str, rpc: &str, token: Option<&str>) -> Result<(), Status> {
    let mut kv = KvClient::new(ch.clone());
    let mut lease = LeaseClient::new(ch.clone());
    let mut cluster = ClusterClient::new(ch.clone());
    let mut maint = MaintenanceClient::new(ch.clone());
    let mut auth = AuthClient::new(ch.clone());
    let range = |key: &str, range_end: &[u8], serializable: bool| RangeRequest {
        key: key.into(),
        range_end: range_end.to_vec(),
        serializable,
        ..Default::default()
    };
    let unknown_member = 0x1234_5678;
    match rpc {
        "range k/a" => kv
            .range(authed(range("k/a", b"", false), token))
            .await
            .map(drop),
        "range ro" => kv
            .range(authed(range("ro", b"", false), token))
            .await
            .map(drop),
        "range secret" => kv
            .range(authed(range("secret", b"", false), token))
            .await
            .map(drop),
        "range k/ prefix serializable" => kv
            .range(authed(range("k/", b"k0", true), token))
            .await
            .map(drop),
        "put k/a" => kv.put(authed(put("k/a", 0, false), token)).await.map(drop),
        "put ro" => kv.put(authed(put("ro", 0, false), token)).await.map(drop),
        "put k/a prev_kv" => kv.put(authed(put("k/a", 0, true), token)).await.map(drop),
        "put k/b lease-on-secret" => {
            let id = lease_on(ch, root, "secret").await;
            kv.put(authed(put("k/b", id, false), token)).await.map(drop)
        }
        "delete k/a" => {
            let req = DeleteRangeRequest {
                key: b"k/a".to_vec(),
                ..Default::default()
            };
            kv.delete_range(authed(req, token)).await.map(drop)
        }
        "delete ro prev_kv" => {
            let req = DeleteRangeRequest {
                key: b"ro".to_vec(),
                prev_kv: true,
                ..Default::default()
            };
            kv.delete_range(authed(req, token)).await.map(drop)
        }
        "txn compare secret" => {
            let req = TxnRequest {
                compare: vec![Compare {
                    key: b"secret".to_vec(),
                    target: compare::CompareTarget::Version as i32,
                    target_union: Some(compare::TargetUnion::Version(0)),
                    ..Default::default()
                }],
                success: vec![op(request_op::Request::RequestPut(put("k/c", 0, false)))],
                ..Default::default()
            };
            kv.txn(authed(req, token)).await.map(drop)
        }
        "txn nested put secret" => {
            let inner = TxnRequest {
                success: vec![op(request_op::Request::RequestPut(put("secret", 0, false)))],
                ..Default::default()
            };
            let req = TxnRequest {
                success: vec![op(request_op::Request::RequestTxn(inner))],
                ..Default::default()
            };
            kv.txn(authed(req, token)).await.map(drop)
        }
        "txn read-only compare secret" => kv
            .txn(authed(read_only_txn(b"secret"), token))
            .await
            .map(drop),
        "txn read-only range k/a" => kv.txn(authed(read_only_txn(b"k/a"), token)).await.map(drop),
        "txn read-only nested range secret serializable" => {
            let inner = TxnRequest {
                failure: vec![op(request_op::Request::RequestRange(RangeRequest {
                    key: b"secret".to_vec(),
                    serializable: true,
                    ..Default::default()
                }))],
                ..Default::default()
            };
            let req = TxnRequest {
                success: vec![op(request_op::Request::RequestTxn(inner))],
                ..Default::default()
            };
            kv.txn(authed(req, token)).await.map(drop)
        }
        "txn put k/c" => {
            let req = TxnRequest {
                success: vec![op(request_op::Request::RequestPut(put("k/c", 0, false)))],
                ..Default::default()
            };
            kv.txn(authed(req, token)).await.map(drop)
        }
        "watch k/a" => watch_create(ch, "k/a", token).await,
        "watch secret" => watch_create(ch, "secret", token).await,
        "lease-grant" => lease
            .lease_grant(authed(LeaseGrantRequest { ttl: 60, id: 0 }, token))
            .await
            .map(drop),
        "lease-revoke on-secret" | "lease-revoke on-k" => {
            let key = if rpc.ends_with("secret") {
                "secret"
            } else {
                "k/leased"
            };
            let id = lease_on(ch, root, key).await;
            lease
                .lease_revoke(authed(LeaseRevokeRequest { id }, token))
                .await
                .map(drop)
        }
        "lease-keepalive on-secret" => {
            let id = lease_on(ch, root, "secret").await;
            let requests = tokio_stream::iter([LeaseKeepAliveRequest { id }]);
            let mut replies = lease
                .lease_keep_alive(authed(requests, token))
                .await?
                .into_inner();
            match replies.message().await? {
                Some(r) if r.ttl > 0 => Ok(()),
                other => panic!("keepalive of {id} answered {other:?}"),
            }
        }
        "lease-ttl on-secret" | "lease-ttl on-secret keys" => {
            let id = lease_on(ch, root, "secret").await;
            let keys = rpc.ends_with("keys");
            lease
                .lease_time_to_live(authed(LeaseTimeToLiveRequest { id, keys }, token))
                .await
                .map(drop)
        }
        "lease-leases" => {
            lease_on(ch, root, "secret").await;
            lease
                .lease_leases(authed(LeaseLeasesRequest {}, token))
                .await
                .map(drop)
        }
        "compact" => {
            let revision = kv
                .range(authed(range("k/a", b"", false), Some(root)))
                .await?
                .into_inner()
                .header
                .unwrap()
                .revision;
            let req = CompactionRequest {
                revision,
                physical: false,
            };
            kv.compact(authed(req, token)).await.map(drop)
        }
        "member-list" => cluster
            .member_list(authed(
                MemberListRequest {
                    linearizable: false,
                },
                token,
            ))
            .await
            .map(drop),
        "member-add" => {
            let req = MemberAddRequest {
                peer_ur_ls: vec!["not a url".into()],
                is_learner: false,
            };
            cluster.member_add(authed(req, token)).await.map(drop)
        }
        "member-remove" => {
            let req = MemberRemoveRequest { id: unknown_member };
            cluster.member_remove(authed(req, token)).await.map(drop)
        }
        "member-update" => {
            let req = MemberUpdateRequest {
                id: unknown_member,
                peer_ur_ls: vec!["http://127.0.0.1:1".into()],
            };
            cluster.member_update(authed(req, token)).await.map(drop)
        }
        "member-promote" => {
            let req = MemberPromoteRequest { id: unknown_member };
            cluster.member_promote(authed(req, token)).await.map(drop)
        }
        "status" => maint
            .status(authed(StatusRequest {}, token))
            .await
            .map(drop),
        "hash-kv" => maint
            .hash_kv(authed(HashKvRequest { revision: 0 }, token))
            .await
            .map(drop),
        "defragment" => maint
            .defragment(authed(DefragmentRequest {}, token))
            .await
            .map(drop),
        "move-leader" => maint
            .move_leader(authed(
                MoveLeaderRequest {
                    target_id: unknown_member,
                },
                token,
            ))
            .await
            .map(drop),
        "auth-status" => auth
            .auth_status(authed(AuthStatusRequest {}, token))
            .await
            .map(drop),
        "user-list" => auth
            .user_list(authed(AuthUserListRequest {}, token))
            .await
            .map(drop),
        "user-get u" | "user-get root" => {
            let name = rpc.trim_start_matches("user-get ").to_string();
            auth.user_get(authed(AuthUserGetRequest { name }, token))
                .await
                .map(drop)
        }
        "role-list" => auth
            .role_list(authed(AuthRoleListRequest {}, token))
            .await
            .map(drop),
        "role-get rw" | "role-get other" => {
            let role = rpc.trim_start_matches("role-get ").to_string();
            auth.role_get(authed(AuthRoleGetRequest { role }, token))
                .await
                .map(drop)
        }
        "authenticate" => auth
            .authenticate(AuthenticateRequest {
                name: "u".into(),
                password: "upw".into(),
            })
            .await
            .map(drop),
        other => panic!("no call for row {other:?}"),
    }
}

/// Creates a watch on `key`: `Ok` when created, the cancel reason as an error when refused.
/// A refused create leaves the stream open: a second create of a key everyone may read
/// (`k/a` for `u`) is then answered on the same stream.
async fn watch_create(ch: &Channel, key: &str, token: Option<&str>) -> Result<(), Status> {
    let (tx, mut responses, first) = first_watch_answer(ch, key, token).await?;
    if !first.canceled {
        return Ok(());
    }
    if token.is_some() {
        tx.send(create_request("k/a")).await.unwrap();
        let second = tokio::time::timeout(Duration::from_secs(10), responses.message())
            .await
            .expect("the stream stayed open")?
            .expect("a second response");
        assert!(second.created && !second.canceled, "{second:?}");
    }
    Err(Status::permission_denied(first.cancel_reason))
}

fn create_request(key: &str) -> WatchRequest {
    WatchRequest {
        request_union: Some(watch_request::RequestUnion::CreateRequest(
            WatchCreateRequest {
                key: key.into(),
                ..Default::default()
            },
        )),
    }
}

/// Opens a watch stream as `token`'s user, sends a create of `key` and returns the stream's
/// request sender, its responses and its first response (which must say `created`).
pub(crate) async fn first_watch_answer(
    ch: &Channel,
    key: &str,
    token: Option<&str>,
) -> Result<
    (
        tokio::sync::mpsc::Sender<WatchRequest>,
        tonic::Streaming<WatchResponse>,
        WatchResponse,
    ),
    Status,
> {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(create_request(key)).await.unwrap();
    let mut responses = WatchClient::new(ch.clone())
        .watch(authed(
            tokio_stream::wrappers::ReceiverStream::new(rx),
            token,
        ))
        .await?
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(10), responses.message())
        .await
        .expect("watch answered")?
        .expect("a created response");
    assert!(first.created, "{first:?}");
    Ok((tx, responses, first))
}

/// The table's word for an answer.
fn outcome(result: Result<(), Status>) -> String {
    match result {
        Ok(()) => OK.to_string(),
        Err(s) => s.message().to_string(),
    }
}

#[test]
fn every_rpc_needs_what_the_permission_table_says() {
    let (_guard, keel) = member(&[]);
    let ep = keel.endpoint();
    crate::auth::set_up_users(&ep);
    grpc::runtime().block_on(async {
        let ch = grpc::channel(&ep, Duration::from_secs(10)).await.unwrap();
        let token = |name: &str, password: &str| {
            let mut auth = AuthClient::new(ch.clone());
            let req = AuthenticateRequest {
                name: name.into(),
                password: password.into(),
            };
            async move { auth.authenticate(req).await.unwrap().into_inner().token }
        };
        let root = token("root", "rootpw").await;
        let u = token("u", "upw").await;
        let mut wrong = Vec::new();
        for &(rpc, anonymous, as_u, as_root) in TABLE {
            for (who, t, want) in [
                ("anonymous", None, anonymous),
                ("u", Some(&u), as_u),
                ("root", Some(&root), as_root),
            ] {
                let got = outcome(call(&ch, &root, rpc, t.map(String::as_str)).await);
                let matches = if want == PASSED {
                    got != DENIED && got != EMPTY
                } else {
                    got == want
                };
                if !matches {
                    wrong.push(format!("{rpc} as {who}: want {want:?}, got {got:?}"));
                }
            }
        }
        assert!(wrong.is_empty(), "rows that differ:\n{}", wrong.join("\n"));
    });
}
