//! Auth on the apply path: changes land in the batch of their consistent index (a restart
//! reloads them and never applies them twice, etcd #11651); key, lease and compaction
//! entries are checked with their header; server-issued entries (no header) have root
//! authority (etcd #11689).

use std::sync::Arc;

use keel_proto::authpb::{Permission, permission::Type as PermType};
use keel_proto::etcdserverpb::{
    AuthEnableRequest, AuthRoleAddRequest, AuthRoleGrantPermissionRequest, AuthUserAddRequest,
    AuthUserGrantRoleRequest, CompactionRequest, DeleteRangeRequest, LeaseGrantRequest,
    LeaseRevokeRequest, PutRequest, RequestOp, TxnRequest, request_op,
};
use keel_proto::keelpb::{AuthHeader, RaftRequest, RaftResponse, raft_request, raft_response};
use openraft::{CommittedLeaderId, EntryPayload};

use super::Applier;
use crate::auth::password;
use crate::membership::Attributes;
use crate::mvcc::MvccStore;
use crate::mvcc::test_support::temp_tree;
use crate::raft::types::{Entry, Request};

use raft_request::Request as Rq;

fn open(tree: &sled::Tree) -> Applier {
    // Auth and QoS entries need cluster version 0.2 (version::gates).
    crate::version::store_for_test(tree, crate::version::Version::V0_2);
    let store = Arc::new(MvccStore::open(tree.clone()).expect("mvcc"));
    Applier::open(tree.clone(), store, Arc::new(Attributes::default())).expect("applier")
}

/// Who proposes: `None` = the server itself, `Some((user, auth revision))` a client.
type As<'a> = Option<(&'a str, u64)>;

fn entry(index: u64, who: As<'_>, request: Rq) -> Entry {
    Entry {
        log_id: openraft::LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(Request::new(RaftRequest {
            auth_header: who.map(|(u, r)| AuthHeader {
                username: u.into(),
                auth_revision: r,
            }),
            id: index,
            request: Some(request),
        })),
    }
}

/// Applies entries one after another from `next` on.
struct Log {
    a: Applier,
    next: u64,
}

impl Log {
    /// Applies `request` as `who`: the error text, or `ok`.
    fn apply(&mut self, who: As<'_>, request: Rq) -> String {
        let e = entry(self.next, who, request);
        self.next += 1;
        let RaftResponse { response, .. } = self.a.apply(&e).expect("apply").0;
        match response {
            Some(raft_response::Response::Error(e)) => e.message,
            _ => "ok".into(),
        }
    }

    fn revision(&self) -> u64 {
        self.a.auth().revision()
    }
}

fn user_add(name: &str) -> Rq {
    Rq::UserAdd(AuthUserAddRequest {
        name: name.into(),
        hashed_password: password::hash("pw", 4).unwrap(),
        ..Default::default()
    })
}

fn grant_role(user: &str, role: &str) -> Rq {
    Rq::UserGrantRole(AuthUserGrantRoleRequest {
        user: user.into(),
        role: role.into(),
    })
}

fn put(key: &str, lease: i64) -> Rq {
    Rq::Put(PutRequest {
        key: key.into(),
        value: b"v".to_vec(),
        lease,
        ..Default::default()
    })
}

/// The auth entries every test starts from: root, role `rw` (READWRITE on prefix `k/`)
/// held by `alice`, auth enabled. Returns the entries (for replay).
fn set_up() -> Vec<Rq> {
    vec![
        user_add("root"),
        grant_role("root", "root"),
        user_add("alice"),
        Rq::RoleAdd(AuthRoleAddRequest { name: "rw".into() }),
        Rq::RoleGrantPermission(AuthRoleGrantPermissionRequest {
            name: "rw".into(),
            perm: Some(Permission {
                perm_type: PermType::Readwrite as i32,
                key: b"k/".to_vec(),
                range_end: b"k0".to_vec(),
            }),
        }),
        grant_role("alice", "rw"),
        Rq::AuthEnable(AuthEnableRequest {}),
    ]
}

fn log_with_users(tree: &sled::Tree) -> Log {
    let mut log = Log {
        a: open(tree),
        next: 1,
    };
    for req in set_up() {
        assert_eq!(log.apply(Some(("", 0)), req), "ok");
    }
    log
}

#[test]
fn auth_changes_land_with_their_consistent_index_and_replay_changes_nothing() {
    let tree = temp_tree();
    let log = log_with_users(&tree);
    let revision = log.revision();
    assert_eq!(revision, 7, "six user/role changes from revision 1");
    let users = log.a.auth().read().users().clone();
    drop(log);

    // A restart reloads the same auth state from the tree...
    let mut again = open(&tree);
    assert_eq!(again.auth().revision(), revision);
    assert!(again.auth().is_enabled());
    assert_eq!(again.auth().read().users(), &users);
    // ...and the log replayed from the start changes nothing (the consistent index covers it).
    for (i, req) in set_up().into_iter().enumerate() {
        again
            .apply(&entry(i as u64 + 1, Some(("", 0)), req))
            .unwrap();
    }
    assert_eq!(again.auth().revision(), revision);
    let cache = again.auth().read().cache().clone();
    assert_eq!(
        crate::auth::AuthStore::load(&tree).unwrap().cache(),
        &cache,
        "the permission cache equals a rebuild from the stored records"
    );
}

#[test]
fn client_entries_are_checked_with_their_header_and_server_entries_run_as_root() {
    let tree = temp_tree();
    let mut log = log_with_users(&tree);
    let rev = log.revision();
    let alice = Some(("alice", rev));
    let store_rev = |log: &Log| log.a.store().current_revision();

    assert_eq!(log.apply(alice, put("k/1", 0)), "ok");
    let before = store_rev(&log);
    for (who, req, want) in [
        (alice, put("secret", 0), "etcdserver: permission denied"),
        (
            Some(("", 0)),
            put("k/2", 0),
            "etcdserver: user name is empty",
        ),
        (
            Some(("alice", rev - 1)),
            put("k/2", 0),
            "etcdserver: revision of auth store is old",
        ),
        (
            Some(("mallory", rev)),
            put("k/2", 0),
            "etcdserver: permission denied",
        ),
        (
            alice,
            Rq::DeleteRange(DeleteRangeRequest {
                key: b"secret".to_vec(),
                ..Default::default()
            }),
            "etcdserver: permission denied",
        ),
        (
            alice,
            Rq::Txn(TxnRequest {
                success: vec![RequestOp {
                    request: Some(request_op::Request::RequestTxn(TxnRequest {
                        success: vec![RequestOp {
                            request: Some(request_op::Request::RequestPut(PutRequest {
                                key: b"secret".to_vec(),
                                ..Default::default()
                            })),
                        }],
                        ..Default::default()
                    })),
                }],
                ..Default::default()
            }),
            "etcdserver: permission denied",
        ),
        (
            alice,
            Rq::Compaction(CompactionRequest {
                revision: 1,
                physical: false,
            }),
            "etcdserver: permission denied",
        ),
        (
            Some(("", 0)),
            Rq::LeaseGrant(LeaseGrantRequest { ttl: 60, id: 7 }),
            "etcdserver: user name is empty",
        ),
    ] {
        assert_eq!(log.apply(who, req), want);
        assert_eq!(store_rev(&log), before, "a refused entry changes nothing");
    }

    // The server's own entries carry no header: root authority.
    assert_eq!(log.apply(None, put("secret", 0)), "ok");
    assert_eq!(
        log.apply(alice, Rq::LeaseGrant(LeaseGrantRequest { ttl: 60, id: 7 })),
        "ok"
    );
    assert_eq!(log.apply(None, put("secret", 7)), "ok");
    // Revoking a lease needs WRITE on every attached key.
    let revoke = || Rq::LeaseRevoke(LeaseRevokeRequest { id: 7 });
    assert_eq!(log.apply(alice, revoke()), "etcdserver: permission denied");
    assert!(log.a.lessor().contains(7));
    assert_eq!(log.apply(Some(("root", rev)), revoke()), "ok");
    assert!(!log.a.lessor().contains(7));
}
