//! The cluster version on the apply path (docs/upgrades.md): a `cluster_version_set` entry
//! lands with its consistent index, and gated entries are refused against the applied value,
//! alike on every member.

use std::sync::Arc;

use keel_proto::etcdserverpb::{AlarmRequest, AuthUserAddRequest, PutRequest};
use keel_proto::keelpb::{
    ClusterVersionSet, RaftRequest, RaftResponse, raft_request, raft_response,
};
use openraft::{CommittedLeaderId, EntryPayload};

use super::Applier;
use crate::membership::Attributes;
use crate::mvcc::MvccStore;
use crate::mvcc::test_support::temp_tree;
use crate::raft::types::{Entry, Request};
use crate::version::Version;

use raft_request::Request as Rq;

fn open(tree: &sled::Tree) -> Applier {
    let store = Arc::new(MvccStore::open(tree.clone()).expect("mvcc"));
    Applier::open(tree.clone(), store, Arc::new(Attributes::default())).expect("applier")
}

fn entry(index: u64, request: Rq) -> Entry {
    Entry {
        log_id: openraft::LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(Request::new(RaftRequest {
            auth_header: None,
            id: index,
            request: Some(request),
        })),
    }
}

fn user_add(name: &str) -> Rq {
    Rq::UserAdd(AuthUserAddRequest {
        name: name.into(),
        hashed_password: crate::auth::password::hash("pw", 4).unwrap(),
        ..Default::default()
    })
}

fn set(v: &str) -> Rq {
    Rq::ClusterVersionSet(ClusterVersionSet { version: v.into() })
}

/// The outcome of applying `request` at `index`: the error text or `ok`.
fn apply(a: &mut Applier, index: u64, request: Rq) -> String {
    let RaftResponse { response, .. } = a.apply(&entry(index, request)).expect("apply").0;
    match response {
        Some(raft_response::Response::Error(e)) => format!("{} {}", e.code, e.message),
        _ => "ok".into(),
    }
}

#[test]
fn gated_entries_wait_for_the_cluster_version_entry() {
    let tree = temp_tree();
    let mut a = open(&tree);
    assert_eq!(a.cluster_version().decided(), None);
    assert_eq!(a.cluster_version().get(), Version::MIN);
    let refused = "9 cluster version 0.1 is too low for auth requests (needs 0.2)";
    assert_eq!(apply(&mut a, 1, user_add("alice")), refused);
    assert!(
        a.auth().read().user("alice").is_none(),
        "nothing of it is written"
    );
    assert_eq!(
        apply(&mut a, 2, Rq::Alarm(AlarmRequest::default())),
        "9 cluster version 0.1 is too low for alarms (needs 0.2)"
    );
    // Base entries apply at 0.1, and the cluster version entry itself too.
    assert_eq!(
        apply(
            &mut a,
            3,
            Rq::Put(PutRequest {
                key: b"k".to_vec(),
                ..Default::default()
            })
        ),
        "ok"
    );
    assert_eq!(apply(&mut a, 4, set("0.1")), "ok");
    assert_eq!(a.cluster_version().decided(), Some(Version::MIN));
    assert_eq!(apply(&mut a, 5, user_add("alice")), refused);
    assert_eq!(apply(&mut a, 6, set("0.2")), "ok");
    assert_eq!(a.cluster_version().get(), Version::V0_2);
    assert_eq!(apply(&mut a, 7, user_add("alice")), "ok");
    assert!(a.auth().read().user("alice").is_some());
    // A garbled version changes nothing.
    assert_eq!(
        apply(&mut a, 8, set("zwei")),
        "3 invalid version \"zwei\": want major.minor or major.minor.patch"
    );
    assert_eq!(a.cluster_version().get(), Version::V0_2);
    // A lower value (a leader that decided on stale state) never lowers it.
    assert_eq!(apply(&mut a, 9, set("0.1")), "ok");
    assert_eq!(a.cluster_version().get(), Version::V0_2);
    // The value is stored with the consistent index: a restart keeps it.
    drop(a);
    let a = open(&tree);
    assert_eq!(a.cluster_version().decided(), Some(Version::V0_2));
    assert_eq!(a.last_applied().map(|l| l.index), Some(9));
}

/// An entry proposed while the version was still 0.1 but committed after the raise applies
/// on every member, and one committed before it is refused on every member: the log order
/// decides, never the member.
#[test]
fn every_member_decides_the_same_from_the_log() {
    let log = [user_add("early"), set("0.2"), user_add("late")];
    let mut outcomes = Vec::new();
    for _ in 0..2 {
        let tree = temp_tree();
        let mut a = open(&tree);
        let got: Vec<String> = log
            .iter()
            .enumerate()
            .map(|(i, r)| apply(&mut a, i as u64 + 1, r.clone()))
            .collect();
        let users = (
            a.auth().read().user("early").is_some(),
            a.auth().read().user("late").is_some(),
        );
        outcomes.push((got, users, a.store().hash_kv(0).unwrap().hash));
    }
    assert_eq!(outcomes[0], outcomes[1]);
    assert_eq!(
        outcomes[0].0,
        [
            "9 cluster version 0.1 is too low for auth requests (needs 0.2)",
            "ok",
            "ok"
        ]
    );
    assert_eq!(outcomes[0].1, (false, true));
}
