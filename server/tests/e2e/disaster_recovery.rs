//! Disaster recovery (issue 15 part 7): a 3-member cluster loses two members; the third
//! restarts with `--force-new-cluster` as a one-member cluster with every acknowledged write
//! (same revisions, leases kept), serves writes, stays one member after a restart without the
//! flag, and a new member added back catches up (from a snapshot) to the same HashKV.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use keel_proto::etcdserverpb::{LeaseGrantRequest, LeaseTimeToLiveRequest, PutRequest};
use keel_testkit::Cluster;
use keel_testkit::etcdctl::{self, etcdctl};
use keel_testkit::grpc;

use crate::cluster_membership::member_cmd;
use crate::{cluster, member};

/// Member IDs from `etcdctl member list`.
fn member_ids(endpoint: &str) -> Vec<u64> {
    let list = etcdctl(endpoint, &["member", "list", "-w", "json"]).json();
    list["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| m["ID"].as_u64().expect("ID"))
        .collect()
}

/// key → (value, mod revision, lease) of the keys under `prefix`, as served by `endpoint`
/// (linearizable).
pub(crate) async fn served(endpoint: &str, prefix: &str) -> BTreeMap<String, (String, i64, i64)> {
    let mut kv = grpc::kv(endpoint).await;
    let prefix = prefix.as_bytes();
    grpc::range(&mut kv, prefix, &grpc::prefix_end(prefix))
        .await
        .kvs
        .into_iter()
        .map(|kv| {
            (
                String::from_utf8(kv.key).unwrap(),
                (
                    String::from_utf8(kv.value).unwrap(),
                    kv.mod_revision,
                    kv.lease,
                ),
            )
        })
        .collect()
}

#[test]
fn force_new_cluster_recovers_a_member_whose_peers_are_gone() {
    // Snapshots and log purges happen during the writes, so the survivor's log starts after a
    // purge point and the member added back catches up from a snapshot.
    let (_alone, mut cluster) = cluster(
        3,
        &[
            "--snapshot-count=25",
            "--experimental-snapshot-catchup-entries=5",
        ],
    );
    let leader = cluster.leader(Duration::from_secs(15));
    let survivor = (leader + 1) % 3;
    let leader_ep = cluster.members[leader].endpoint();
    let rt = tokio::runtime::Runtime::new().unwrap();

    // Acknowledged writes, half of them attached to a lease.
    let (lease_id, written) = rt.block_on(async {
        let mut lease = grpc::lease(&leader_ep, Duration::from_secs(10)).await;
        let id = lease
            .lease_grant(LeaseGrantRequest { ttl: 600, id: 0 })
            .await
            .unwrap()
            .into_inner()
            .id;
        let mut kv = grpc::kv(&leader_ep).await;
        let mut written = BTreeMap::new();
        for i in 0..60 {
            let (key, value) = (format!("dr/{i:03}"), format!("v{i}"));
            let lease = if i % 2 == 0 { id } else { 0 };
            let rev = kv
                .put(PutRequest {
                    key: key.clone().into_bytes(),
                    value: value.clone().into_bytes(),
                    lease,
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner()
                .header
                .unwrap()
                .revision;
            written.insert(key, (value, rev, lease));
        }
        (id, written)
    });
    let before_ids = member_ids(&cluster.endpoints());
    assert_eq!(before_ids.len(), 3);
    let survivor_id = cluster.member_id(survivor).unwrap();

    // An acknowledged write is on a majority, not necessarily on the survivor: let it catch
    // up first (what it never received, force-new-cluster cannot bring back).
    let index = cluster.status(leader).unwrap().raft_index;
    cluster.wait_applied(index, Duration::from_secs(20));

    // Lose the other two members for good, then the survivor.
    for i in 0..3 {
        if i != survivor {
            cluster.members[i].kill9();
        }
    }
    cluster.members[survivor].kill9();
    let plain = cluster.members[survivor].spec().clone();
    cluster.members[survivor].set_spec(plain.clone().args(["--force-new-cluster"]));
    let started = Instant::now();
    cluster.members[survivor].restart();
    let recovered_in = started.elapsed();
    let ep = cluster.members[survivor].endpoint();
    let log = cluster.members[survivor].log();
    let forced = log
        .lines()
        .find(|l| l.contains("forcing restart member"))
        .unwrap_or_else(|| panic!("no 'forcing restart member' in\n{log}"));
    eprintln!("{forced}");
    assert!(forced.contains(&format!("{survivor_id:x}")), "{forced}");
    for gone in before_ids.iter().filter(|id| **id != survivor_id) {
        assert!(forced.contains(&format!("{gone:x}")), "{forced}");
    }

    // Leader alone, same member and every acknowledged key with its revisions and lease.
    let status = grpc::status(&ep).unwrap();
    assert_eq!(status.leader, survivor_id);
    assert_eq!(status.header.as_ref().unwrap().member_id, survivor_id);
    assert_eq!(member_ids(&ep), [survivor_id]);
    assert_eq!(rt.block_on(served(&ep, "dr/")), written);
    let ttl = rt.block_on(async {
        let mut lease = grpc::lease(&ep, Duration::from_secs(10)).await;
        lease
            .lease_time_to_live(LeaseTimeToLiveRequest {
                id: lease_id,
                keys: true,
            })
            .await
            .unwrap()
            .into_inner()
    });
    assert!(ttl.ttl > 0, "{ttl:?}");
    assert_eq!(ttl.keys.len(), 30);
    let last_rev = written.values().map(|v| v.1).max().unwrap();
    etcdctl(&ep, &["put", "dr/after", "alone"]).ok();
    assert_eq!(etcdctl::revision(&ep), last_rev + 1);
    eprintln!("force-new-cluster: ready {recovered_in:?} after the restart");

    // A restart without the flag keeps the one-member cluster.
    cluster.members[survivor].kill9();
    cluster.members[survivor].set_spec(plain);
    cluster.members[survivor].restart();
    assert_eq!(member_ids(&ep), [survivor_id]);
    assert_eq!(
        etcdctl(&ep, &["get", "dr/after", "--print-value-only"])
            .ok()
            .lines(),
        ["alone"]
    );

    // Re-add a member with a fresh data dir: it catches up to the same HashKV.
    let ports = Cluster::reserve_ports();
    let peer = format!("http://127.0.0.1:{}", ports.1);
    member_cmd(
        &ep,
        &["member", "add", "m4", &format!("--peer-urls={peer}")],
    )
    .ok();
    let m4 = cluster.join("m4", ports);
    cluster.wait_ready(&[m4]);
    etcdctl(&ep, &["put", "dr/after-add", "two"]).ok();
    let rev = etcdctl::revision(&ep);
    let index = cluster.status(survivor).unwrap().raft_index;
    cluster.wait_applied(index, Duration::from_secs(30));
    let m4_ep = cluster.members[m4].endpoint();
    assert!(
        cluster.members[m4].wait_for_log("installed a snapshot", Duration::from_secs(10)),
        "{}",
        cluster.members[m4].log_tail()
    );
    let hashes = etcdctl::hashkvs([ep.as_str(), m4_ep.as_str()], rev);
    assert_eq!(hashes[0], hashes[1], "HashKV at {rev}");
    assert_eq!(member_ids(&ep).len(), 2);
    let mut on_m4 = rt.block_on(served(&m4_ep, "dr/"));
    assert_eq!(on_m4.remove("dr/after").map(|v| v.0), Some("alone".into()));
    assert_eq!(
        on_m4.remove("dr/after-add").map(|v| v.0),
        Some("two".into())
    );
    assert_eq!(on_m4, written);
}

/// On a new data dir the flag changes nothing: the member bootstraps as usual (etcd applies it
/// only when a WAL exists).
#[test]
fn force_new_cluster_on_a_new_data_dir_bootstraps_as_usual() {
    let (_guard, keel) = member(&["--force-new-cluster"]);
    let ep = keel.endpoint();
    etcdctl(&ep, &["put", "k", "v"]).ok();
    assert_eq!(etcdctl::revision(&ep), 2);
    assert_eq!(member_ids(&ep).len(), 1);
    assert!(
        keel.log()
            .contains("--force-new-cluster: nothing to change")
    );
}
