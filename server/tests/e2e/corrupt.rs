//! Corruption checks (issue 15 part 5) on 3 real members, one of whose stores is altered
//! while it is stopped (one record's value rewritten in place, revisions untouched): the
//! initial check refuses to start it (etcd's "found data inconsistency with peers"), and the
//! leader's periodic check raises CORRUPT naming it, after which every member refuses writes
//! with `etcdserver: corrupt cluster` and still serves reads.

use std::time::{Duration, Instant};

use keel_testkit::etcdctl::etcdctl;
use keel_testkit::{Member, grpc};
use prost::Message;

use crate::cluster;

/// Rewrites the value of every record of `key` in the stopped member's store (also used by
/// the compact-hash check's test, `autocompact.rs`).
pub(crate) fn corrupt_value(member: &Member, key: &[u8]) {
    let backend =
        keel_server::backend::Backend::open(&member.data_dir().join("member/db")).unwrap();
    let tree = backend.tree();
    let mut changed = 0;
    for kv in tree.scan_prefix(b"k") {
        let (rkey, value) = kv.unwrap();
        let Ok(mut record) = keel_proto::mvccpb::KeyValue::decode(value.as_ref()) else {
            continue;
        };
        if record.key == key && !record.value.is_empty() {
            record.value = b"bit rot".to_vec();
            tree.insert(rkey, record.encode_to_vec()).unwrap();
            changed += 1;
        }
    }
    assert!(changed > 0, "no record of {key:?} to corrupt");
    backend.flush().unwrap();
}

/// A member other than the leader.
fn a_follower(c: &keel_testkit::Cluster) -> usize {
    let leader = c.leader(Duration::from_secs(10));
    (leader + 1) % c.members.len()
}

#[test]
fn a_member_with_altered_data_is_refused_at_start_and_raised_corrupt_by_the_leader() {
    // The initial check (on by default): the altered member does not start.
    {
        let (_alone, mut c) = cluster(3, &[]);
        etcdctl(&c.endpoints(), &["put", "a", "1"]).ok();
        etcdctl(&c.endpoints(), &["put", "b", "2"]).ok();
        let f = a_follower(&c);
        // Every member has applied both puts before the copy is altered.
        std::thread::sleep(Duration::from_millis(500));
        c.members[f].terminate();
        corrupt_value(&c.members[f], b"a");
        c.members[f].spawn();
        let exit = c.members[f].wait_exit(Duration::from_secs(30));
        assert!(
            exit.is_some_and(|s| !s.success()),
            "the altered member must not start: {exit:?}"
        );
        let log = std::fs::read_to_string(c.members[f].log_path()).unwrap();
        assert!(
            log.contains("found data inconsistency with peers"),
            "{}",
            c.log_tails()
        );
    }
    // The periodic check: the leader raises CORRUPT for the altered member.
    let (_alone, mut c) = cluster(
        3,
        &[
            "--experimental-initial-corrupt-check=false",
            "--experimental-corrupt-check-time=1s",
        ],
    );
    etcdctl(&c.endpoints(), &["put", "a", "1"]).ok();
    let f = a_follower(&c);
    std::thread::sleep(Duration::from_millis(500));
    c.members[f].terminate();
    corrupt_value(&c.members[f], b"a");
    c.members[f].restart();
    assert_corrupt_everywhere(&c, f);
}

/// Waits (20 s at most) until every member of `c` lists CORRUPT for member `f` and refuses
/// writes with `etcdserver: corrupt cluster` while still serving reads; then checks that this
/// is the only alarm. Also used by the compact-hash check's test (`autocompact.rs`).
pub(crate) fn assert_corrupt_everywhere(c: &keel_testkit::Cluster, f: usize) {
    let id = c.member_id(f).unwrap();
    let expected = format!("memberID:{id} alarm:CORRUPT ");
    let deadline = Instant::now() + Duration::from_secs(20);
    for m in &c.members {
        let ep = m.endpoint();
        while !grpc::status(&ep).unwrap().errors.contains(&expected) {
            assert!(
                Instant::now() < deadline,
                "{ep} does not list {expected}: {:?}\n{}",
                grpc::status(&ep).unwrap().errors,
                c.log_tails()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        etcdctl(&ep, &["put", "x", "y"]).fails_with("Error: etcdserver: corrupt cluster");
        let got = etcdctl(&ep, &["get", "a", "--print-value-only", "--consistency=s"]);
        assert_eq!(got.ok().lines().len(), 1, "reads still work");
    }
    let alarms = etcdctl(&c.endpoints(), &["alarm", "list"]);
    assert_eq!(alarms.ok().lines(), [expected.as_str()], "only that member");
}
