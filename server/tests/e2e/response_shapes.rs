//! Response shapes as etcd 3.4.23's, field by field: the same calls against a fresh etcd
//! (Debian's `/usr/bin/etcd`, skipped with a message when absent) and a fresh Keel member,
//! compared by which fields each response sets (its top-level field numbers, and those of
//! its `header`) or by the error's code and text. Values (IDs, sizes) differ between the two
//! servers; which fields carry one must not.

use std::time::Duration;

use keel_proto::etcdserverpb::auth_client::AuthClient;
use keel_proto::etcdserverpb::cluster_client::ClusterClient;
use keel_proto::etcdserverpb::kv_client::KvClient;
use keel_proto::etcdserverpb::lease_client::LeaseClient;
use keel_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use keel_proto::etcdserverpb::watch_client::WatchClient;
use keel_proto::etcdserverpb::watch_request::RequestUnion;
use keel_proto::etcdserverpb::*;
use keel_testkit::etcd::{Etcd, etcd_binary};
use keel_testkit::grpc::{self, runtime};
use keel_testkit::ports::free_port;
use prost::Message;
use tonic::Status;
use tonic::transport::Channel;

use crate::member;

/// The field numbers a message sets, read from its wire encoding (proto3 leaves out
/// default values), and for field 1 (every etcd response's `header`) the header's own.
fn shape(bytes: &[u8]) -> String {
    let fields = wire_fields(bytes);
    let mut top: Vec<u32> = fields.iter().map(|(n, _)| *n).collect();
    top.dedup();
    let header = fields
        .iter()
        .find(|(n, _)| *n == 1)
        .and_then(|(_, b)| b.as_ref())
        .map(|h| {
            let mut hf: Vec<u32> = wire_fields(h).iter().map(|(n, _)| *n).collect();
            hf.dedup();
            format!(" header{hf:?}")
        })
        .unwrap_or_default();
    format!("fields{top:?}{header}")
}

/// (field number, bytes of a length-delimited value) of each field of an encoded message.
fn wire_fields(mut b: &[u8]) -> Vec<(u32, Option<Vec<u8>>)> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let tag = prost::encoding::decode_varint(&mut b).expect("tag");
        let (num, wt) = ((tag >> 3) as u32, tag & 7);
        let value = match wt {
            0 => {
                prost::encoding::decode_varint(&mut b).expect("varint");
                None
            }
            1 => {
                b = &b[8..];
                None
            }
            2 => {
                let len = prost::encoding::decode_varint(&mut b).expect("len") as usize;
                let v = b[..len].to_vec();
                b = &b[len..];
                Some(v)
            }
            5 => {
                b = &b[4..];
                None
            }
            _ => panic!("wire type {wt}"),
        };
        out.push((num, value));
    }
    out
}

fn outcome<M: Message>(r: Result<tonic::Response<M>, Status>) -> String {
    match r {
        Ok(m) => shape(&m.into_inner().encode_to_vec()),
        Err(s) => format!("error {:?} {:?}", s.code(), s.message()),
    }
}

/// The [`outcome`] of a server stream's first message.
async fn first_message<M: Message + Default>(
    r: Result<tonic::Response<tonic::Streaming<M>>, Status>,
) -> String {
    let first = match r {
        Ok(r) => r.into_inner().message().await,
        Err(s) => Err(s),
    };
    outcome(first.map(|m| tonic::Response::new(m.expect("a first message"))))
}

/// Runs the same calls against `endpoint` and returns `(call, shape)` for each.
async fn shapes(endpoint: &str) -> Vec<(&'static str, String)> {
    let ch: Channel = grpc::channel(endpoint, Duration::from_secs(10))
        .await
        .unwrap();
    let mut kv = KvClient::new(ch.clone());
    let mut lease = LeaseClient::new(ch.clone());
    let mut cluster = ClusterClient::new(ch.clone());
    let mut maint = MaintenanceClient::new(ch.clone());
    let mut auth = AuthClient::new(ch.clone());
    let mut out = Vec::new();
    macro_rules! call {
        ($name:literal, $e:expr) => {
            out.push(($name, outcome($e.await)))
        };
    }
    let put = |k: &str| PutRequest {
        key: k.into(),
        value: b"v".to_vec(),
        ..Default::default()
    };
    call!("Put", kv.put(put("a")));
    call!(
        "Put prev_kv",
        kv.put(PutRequest {
            prev_kv: true,
            ..put("a")
        })
    );
    let range = |k: &str| RangeRequest {
        key: k.into(),
        ..Default::default()
    };
    call!("Range", kv.range(range("a")));
    call!("Range missing", kv.range(range("zz")));
    call!(
        "Txn",
        kv.txn(TxnRequest {
            success: vec![RequestOp {
                request: Some(request_op::Request::RequestRange(range("a"))),
            }],
            ..Default::default()
        })
    );
    call!(
        "DeleteRange",
        kv.delete_range(DeleteRangeRequest {
            key: b"a".to_vec(),
            ..Default::default()
        })
    );
    kv.put(put("b")).await.unwrap();
    call!(
        "Compact",
        kv.compact(CompactionRequest {
            revision: 2,
            ..Default::default()
        })
    );
    call!(
        "Compact again",
        kv.compact(CompactionRequest {
            revision: 2,
            ..Default::default()
        })
    );

    call!(
        "LeaseGrant",
        lease.lease_grant(LeaseGrantRequest { ttl: 60, id: 7 })
    );
    call!(
        "LeaseTimeToLive",
        lease.lease_time_to_live(LeaseTimeToLiveRequest { id: 7, keys: true })
    );
    call!("LeaseLeases", lease.lease_leases(LeaseLeasesRequest {}));
    let ka = lease
        .lease_keep_alive(futures::stream::iter([LeaseKeepAliveRequest { id: 7 }]))
        .await;
    out.push(("LeaseKeepAlive", first_message(ka).await));
    call!(
        "LeaseRevoke",
        lease.lease_revoke(LeaseRevokeRequest { id: 7 })
    );
    call!(
        "LeaseRevoke missing",
        lease.lease_revoke(LeaseRevokeRequest { id: 7 })
    );

    call!(
        "MemberList",
        cluster.member_list(MemberListRequest::default())
    );
    let peer = format!("http://127.0.0.1:{}", free_port());
    let added = cluster
        .member_add(MemberAddRequest {
            peer_ur_ls: vec![peer.clone()],
            is_learner: true,
        })
        .await;
    let learner = added
        .as_ref()
        .ok()
        .and_then(|r| r.get_ref().member.as_ref().map(|m| m.id));
    out.push(("MemberAdd learner", outcome(added)));
    if let Some(id) = learner {
        call!(
            "MemberUpdate",
            cluster.member_update(MemberUpdateRequest {
                id,
                peer_ur_ls: vec![peer]
            })
        );
        call!(
            "MemberPromote",
            cluster.member_promote(MemberPromoteRequest { id })
        );
        call!(
            "MemberRemove",
            cluster.member_remove(MemberRemoveRequest { id })
        );
    }

    call!("Status", maint.status(StatusRequest {}));
    call!("Alarm get", maint.alarm(AlarmRequest::default()));
    call!("Hash", maint.hash(HashRequest {}));
    call!("HashKV", maint.hash_kv(HashKvRequest { revision: 0 }));
    call!("Defragment", maint.defragment(DefragmentRequest {}));
    let me = maint
        .status(StatusRequest {})
        .await
        .unwrap()
        .into_inner()
        .header
        .unwrap()
        .member_id;
    call!(
        "MoveLeader self",
        maint.move_leader(MoveLeaderRequest { target_id: me })
    );
    call!(
        "MoveLeader unknown",
        maint.move_leader(MoveLeaderRequest { target_id: 12345 })
    );
    let snap = maint.snapshot(SnapshotRequest {}).await;
    out.push(("Snapshot first chunk", first_message(snap).await));

    let user = |n: &str| AuthUserAddRequest {
        name: n.into(),
        password: "pw".into(),
        ..Default::default()
    };
    call!("UserAdd", auth.user_add(user("u")));
    call!("UserAdd again", auth.user_add(user("u")));
    call!(
        "UserGet",
        auth.user_get(AuthUserGetRequest { name: "u".into() })
    );
    call!("UserList", auth.user_list(AuthUserListRequest {}));
    call!(
        "RoleAdd",
        auth.role_add(AuthRoleAddRequest { name: "r".into() })
    );
    call!(
        "RoleGrantPermission",
        auth.role_grant_permission(AuthRoleGrantPermissionRequest {
            name: "r".into(),
            perm: Some(keel_proto::authpb::Permission {
                perm_type: 0,
                key: b"k".to_vec(),
                range_end: vec![]
            }),
        })
    );
    call!(
        "RoleGet",
        auth.role_get(AuthRoleGetRequest { role: "r".into() })
    );
    call!("RoleList", auth.role_list(AuthRoleListRequest {}));
    call!(
        "UserGrantRole",
        auth.user_grant_role(AuthUserGrantRoleRequest {
            user: "u".into(),
            role: "r".into()
        })
    );
    call!(
        "UserRevokeRole",
        auth.user_revoke_role(AuthUserRevokeRoleRequest {
            name: "u".into(),
            role: "r".into()
        })
    );
    call!(
        "RoleRevokePermission",
        auth.role_revoke_permission(AuthRoleRevokePermissionRequest {
            role: "r".into(),
            key: b"k".to_vec(),
            range_end: vec![]
        })
    );
    call!(
        "UserChangePassword",
        auth.user_change_password(AuthUserChangePasswordRequest {
            name: "u".into(),
            password: "pw2".into(),
            ..Default::default()
        })
    );
    call!(
        "UserDelete",
        auth.user_delete(AuthUserDeleteRequest { name: "u".into() })
    );
    call!(
        "RoleDelete",
        auth.role_delete(AuthRoleDeleteRequest { role: "r".into() })
    );
    call!(
        "AuthEnable without root",
        auth.auth_enable(AuthEnableRequest {})
    );
    call!("AuthDisable", auth.auth_disable(AuthDisableRequest {}));
    call!(
        "Authenticate disabled",
        auth.authenticate(AuthenticateRequest {
            name: "u".into(),
            password: "pw".into()
        })
    );

    // Watch: created, an event, a progress answer, a cancel.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let send = |r: RequestUnion| WatchRequest {
        request_union: Some(r),
    };
    tx.send(send(RequestUnion::CreateRequest(WatchCreateRequest {
        key: b"w".to_vec(),
        ..Default::default()
    })))
    .await
    .unwrap();
    // etcd sends the response headers with the first message: create before waiting.
    let mut w = WatchClient::new(ch)
        .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let mut next = async || shape(&w.message().await.unwrap().unwrap().encode_to_vec());
    out.push(("Watch created", next().await));
    kv.put(put("w")).await.unwrap();
    out.push(("Watch event", next().await));
    tx.send(send(RequestUnion::ProgressRequest(WatchProgressRequest {})))
        .await
        .unwrap();
    out.push(("Watch progress", next().await));
    tx.send(send(RequestUnion::CancelRequest(WatchCancelRequest {
        watch_id: 0,
    })))
    .await
    .unwrap();
    out.push(("Watch canceled", next().await));
    out
}

/// Fields Keel sets on purpose where etcd 3.4 has none: both are etcd 3.6 fields and Keel
/// reports the etcd API version 3.6 (docs/compat.md). `(call, field number, name)`; each is
/// the last top-level field of its response.
const NEWER_FIELDS: &[(&str, u32, &str)] = &[
    ("Status", 12, "db_size_quota (3.6)"),
    ("HashKV", 4, "hash_revision (3.6)"),
];

/// `keel` without the [`NEWER_FIELDS`] of `call`, which must be there.
fn without_newer_fields(call: &str, keel: &str) -> String {
    let mut s = keel.to_string();
    for (c, field, name) in NEWER_FIELDS {
        if *c == call {
            let tail = format!(", {field}]");
            assert!(s.contains(&tail), "{call}: Keel sets {name}: {keel}");
            s = s.replacen(&tail, "]", 1);
        }
    }
    s
}

#[test]
fn every_rpc_answers_with_the_fields_etcd_3_4_sets() {
    let Some(bin) = etcd_binary("every_rpc_answers_with_the_fields_etcd_3_4_sets") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(&bin, &dir.path().join("etcd"), "default", free_port());
    let (_guard, keel) = member(&[]);
    runtime().block_on(async {
        let want = shapes(&etcd.endpoint).await;
        let got = shapes(&keel.endpoint()).await;
        let mut diffs = Vec::new();
        for ((name, w), (_, g)) in want.iter().zip(&got) {
            let g = without_newer_fields(name, g);
            if *w != g {
                diffs.push(format!("{name}: etcd {w}, keel {g}"));
            }
        }
        assert_eq!(want.len(), got.len());
        assert!(diffs.is_empty(), "shapes differ:\n{}", diffs.join("\n"));
    });
}
