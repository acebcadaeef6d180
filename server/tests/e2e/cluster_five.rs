//! A 5-member cluster of real `keel` processes keeps serving writes and linearizable reads
//! with two members down (one of them the leader), and the two catch up when restarted;
//! MoveLeader there needs a follower besides the leader to waive its leader lease.

use std::time::Duration;

use keel_testkit::Member;
use keel_testkit::etcdctl::{self, etcdctl};

use crate::cluster;

#[test]
fn five_members_keep_serving_with_two_down_and_the_two_catch_up() {
    let (_alone, mut cluster) = cluster(5, &[]);
    etcdctl(&cluster.endpoints(), &["put", "before", "1"]).ok();

    // Take down the leader and one follower.
    let leader = cluster.leader(Duration::from_secs(15));
    let follower = (0..5).find(|i| *i != leader).unwrap();
    cluster.members[leader].kill9();
    cluster.members[follower].kill9();
    let survivors = cluster.running();
    assert_eq!(survivors.len(), 3);

    // Every survivor serves writes and linearizable reads.
    for (n, &i) in survivors.iter().enumerate() {
        let ep = cluster.members[i].endpoint();
        let out = etcdctl(
            &ep,
            &["put", &format!("down2/{n}"), cluster.members[i].name()],
        );
        out.ok();
    }
    for &i in &survivors {
        let out = etcdctl(
            &cluster.members[i].endpoint(),
            &["get", "down2/", "--prefix", "--print-value-only"],
        );
        assert_eq!(
            out.ok().lines().len(),
            3,
            "via {}: {out:?}",
            cluster.members[i].name()
        );
        let out = etcdctl(
            &cluster.members[i].endpoint(),
            &["get", "before", "--print-value-only"],
        );
        assert_eq!(out.ok().lines(), ["1"]);
    }
    // The membership is unchanged: five members, two of them down.
    let list = etcdctl(&cluster.endpoints(), &["member", "list", "-w", "json"]).json();
    assert_eq!(list["members"].as_array().map(Vec::len), Some(5));

    // The two come back and catch up.
    cluster.members[leader].spawn();
    cluster.members[follower].spawn();
    cluster.wait_ready(&[leader, follower]);
    let new_leader = cluster.leader(Duration::from_secs(15));
    let committed = cluster.status(new_leader).unwrap().raft_index;
    cluster.wait_applied(committed, Duration::from_secs(20));
    for i in [leader, follower] {
        let out = etcdctl(
            &cluster.members[i].endpoint(),
            &[
                "get",
                "down2/",
                "--prefix",
                "--print-value-only",
                "--consistency=s",
            ],
        );
        assert_eq!(
            out.ok().lines().len(),
            3,
            "{} caught up",
            cluster.members[i].name()
        );
    }
    let rev = etcdctl::revision(&cluster.endpoints());
    let hashes = etcdctl::hashkvs(cluster.members.iter().map(Member::endpoint), rev);
    assert!(hashes.iter().all(|h| *h == hashes[0]), "{hashes:?}");
}

/// In five members the target needs two votes besides its own, so the leader's own waiver is
/// not enough: at least one other follower must waive the leader lease it holds when asked
/// (`keelpb.Peer/WaiveLeaderLease`), and still does with one follower paused.
#[test]
fn move_leader_in_five_members_has_a_majority_waive_the_leader_lease() {
    let (_alone, mut cluster) = cluster(5, &[]);
    let all = cluster.endpoints();
    let leader = cluster.leader(Duration::from_secs(15));
    let followers: Vec<usize> = (0..5).filter(|i| *i != leader).collect();
    let (target, paused) = (followers[0], followers[1]);
    let target_id = cluster.member_id(target).unwrap();
    cluster.members[paused].pause();
    // Through the leader only: etcdctl asks every endpoint it is given for its status first.
    let leader_ep = cluster.members[leader].endpoint();
    let out = etcdctl(&leader_ep, &["move-leader", &format!("{target_id:x}")]);
    cluster.members[paused].resume();
    assert!(
        out.ok().stdout.contains(&format!("to {target_id:x}")),
        "{out:?}"
    );
    assert!(
        cluster.members[leader]
            .wait_for_log("a majority waived the leader lease", Duration::from_secs(5)),
        "{}",
        cluster.members[leader].log_tail()
    );
    assert!(
        followers[2..]
            .iter()
            .any(|i| cluster.members[*i].wait_for_log(
                "leadership transfer: leader lease waived",
                Duration::from_secs(2)
            )),
        "no follower reports a waiver"
    );
    assert_eq!(cluster.leader(Duration::from_secs(10)), target);
    etcdctl(&all, &["put", "after-the-move", "1"]).ok();
}
