//! A 3-member cluster of real `keel` processes driven by the real etcdctl: every member
//! serves writes (followers forward them), linearizable reads (ReadIndex from the leader) and
//! txns; response headers carry the cluster and member IDs; member list shows all three;
//! concurrent writes share log entries and AppendEntries RPCs.

use std::collections::BTreeSet;
use std::time::Duration;

use keel_proto::etcdserverpb::PutRequest;
use keel_testkit::etcdctl::{self, etcdctl, etcdctl_stdin};
use keel_testkit::{Member, grpc};

use crate::cluster;

#[test]
fn put_get_and_txn_work_through_every_member_and_member_list_shows_three() {
    let (_alone, cluster) = cluster(3, &[]);
    let all = cluster.endpoints();

    // Writes through each member, each read back (linearizably) through every member.
    for (i, m) in cluster.members.iter().enumerate() {
        etcdctl(
            &m.endpoint(),
            &["put", &format!("key{i}"), &format!("from-{}", m.name())],
        )
        .ok();
        for reader in &cluster.members {
            let out = etcdctl(
                &reader.endpoint(),
                &["get", &format!("key{i}"), "--print-value-only"],
            );
            assert_eq!(
                out.ok().lines(),
                vec![format!("from-{}", m.name())],
                "read via {}",
                reader.name()
            );
        }
    }
    let out = etcdctl(
        &cluster.members[2].endpoint(),
        &["get", "key", "--prefix", "--keys-only"],
    );
    assert_eq!(
        out.ok()
            .lines()
            .into_iter()
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>(),
        ["key0", "key1", "key2"]
    );

    // A txn through each member; compare and write are atomic on the leader.
    for (i, m) in cluster.members.iter().enumerate() {
        let script = format!(
            "value(\"key{i}\") = \"from-{}\"\n\nput txn{i} yes\n\nput txn{i} no\n\n",
            m.name()
        );
        let out = etcdctl_stdin(&m.endpoint(), &["txn"], &script);
        assert_eq!(
            out.ok().lines(),
            ["SUCCESS", "", "OK"],
            "txn via {}",
            m.name()
        );
    }
    let out = etcdctl(&all, &["get", "txn", "--prefix", "--print-value-only"]);
    assert_eq!(out.ok().lines(), ["yes", "yes", "yes"]);

    // member list: three started members with their names and URLs, no learners.
    let list = etcdctl(&all, &["member", "list", "-w", "json"]).json();
    let members = list["members"].as_array().expect("members");
    assert_eq!(members.len(), 3, "{list}");
    let names: BTreeSet<&str> = members
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, BTreeSet::from(["m1", "m2", "m3"]));
    for m in members {
        assert_eq!(m["clientURLs"].as_array().map(Vec::len), Some(1), "{m}");
        assert!(m.get("isLearner").is_none_or(|v| v == false), "{m}");
    }

    // Headers: one cluster ID everywhere, each member its own ID, the same term and revision.
    let mut member_ids = BTreeSet::new();
    let mut cluster_ids = BTreeSet::new();
    let mut revisions = BTreeSet::new();
    for m in &cluster.members {
        let h = etcdctl(&m.endpoint(), &["get", "key0", "-w", "json"]).json()["header"].clone();
        cluster_ids.insert(h["cluster_id"].as_u64().expect("cluster_id"));
        member_ids.insert(h["member_id"].as_u64().expect("member_id"));
        revisions.insert(h["revision"].as_i64().expect("revision"));
        assert!(h["raft_term"].as_u64().expect("raft_term") >= 1);
    }
    assert_eq!(cluster_ids.len(), 1);
    assert_eq!(member_ids.len(), 3);
    assert_eq!(
        revisions.len(),
        1,
        "linearizable reads see one revision: {revisions:?}"
    );
    let listed: BTreeSet<u64> = members.iter().map(|m| m["ID"].as_u64().unwrap()).collect();
    assert_eq!(listed, member_ids);

    // HashKV agrees at the same revision.
    let rev = *revisions.iter().next().unwrap();
    let hashes: BTreeSet<u64> = etcdctl::hashkvs(cluster.members.iter().map(Member::endpoint), rev)
        .into_iter()
        .collect();
    assert_eq!(hashes.len(), 1, "{hashes:?}");
}

#[test]
fn reads_on_followers_see_every_acknowledged_write() {
    let (_alone, cluster) = cluster(3, &[]);
    let leader = cluster.leader(Duration::from_secs(10));
    let followers: Vec<String> = (0..3)
        .filter(|i| *i != leader)
        .map(|i| cluster.members[i].endpoint())
        .collect();
    let leader_ep = cluster.members[leader].endpoint();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut writer = grpc::kv(&leader_ep).await;
        let mut readers = Vec::new();
        for f in &followers {
            readers.push(grpc::kv(f).await);
        }
        for i in 0..60 {
            let rev = grpc::put(&mut writer, "ryw", &i.to_string()).await;
            // Right after the ack, a linearizable read on a follower must return it.
            let n = readers.len();
            let r = &mut readers[i % n];
            let resp = grpc::range(r, b"ryw", b"").await;
            assert_eq!(resp.kvs.len(), 1);
            assert_eq!(
                resp.kvs[0].value,
                i.to_string().into_bytes(),
                "write {i} not visible on a follower"
            );
            assert!(resp.header.unwrap().revision >= rev);
        }
        // A write through a follower is visible on that follower at once, also to reads
        // that skip the read index (etcd waits for the local apply too).
        for i in 0..30 {
            let r = &mut readers[i % 2];
            let rev = grpc::put(r, "ryw-local", &i.to_string()).await;
            let resp = grpc::range_serializable(r, b"ryw-local", b"").await;
            assert_eq!(
                resp.kvs.first().map(|kv| kv.value.clone()),
                Some(i.to_string().into_bytes())
            );
            assert!(resp.header.unwrap().revision >= rev);
        }
        // Serializable reads are served locally and converge.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let resp = grpc::range_serializable(&mut readers[0], b"ryw", b"").await;
            if resp.kvs.first().map(|kv| kv.value.clone()) == Some(b"59".to_vec()) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "serializable read never caught up"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}

#[test]
fn concurrent_writes_share_append_entries_rpcs() {
    let (_alone, mut cluster) = cluster(3, &[]);
    let leader = cluster.leader(Duration::from_secs(10));
    let endpoint = cluster.members[leader].endpoint();
    const WRITERS: usize = 32;
    const PER_WRITER: usize = 20;
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut tasks = Vec::new();
        for w in 0..WRITERS {
            let endpoint = endpoint.clone();
            tasks.push(tokio::spawn(async move {
                let mut kv = grpc::kv(&endpoint).await;
                for i in 0..PER_WRITER {
                    kv.put(PutRequest {
                        key: format!("w{w}/{i}").into_bytes(),
                        value: b"x".to_vec(),
                        ..Default::default()
                    })
                    .await
                    .expect("put");
                }
            }));
        }
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(60), t)
                .await
                .expect("writers finish")
                .unwrap();
        }
    });
    // The leader logs its AppendEntries totals on a graceful shutdown.
    assert!(cluster.members[leader].terminate().success());
    let log = cluster.members[leader].log();
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("peer transport totals"))
        .expect("totals line");
    let line = strip_ansi(line);
    let field = |name: &str| -> u64 {
        let at = line
            .find(&format!("{name}="))
            .unwrap_or_else(|| panic!("{name} in {line}"))
            + name.len()
            + 1;
        line[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .unwrap()
    };
    let (rpcs, entries) = (field("append_rpcs"), field("appended_entries"));
    // Every write reaches both followers, but concurrent writes share log entries (the
    // proposer batches them) and entries share AppendEntries RPCs: far fewer than one RPC
    // per write and follower.
    let writes = (WRITERS * PER_WRITER) as u64;
    assert!(entries > 0 && rpcs > 0, "{line}");
    let writes_per_rpc = 2.0 * writes as f64 / rpcs as f64;
    eprintln!(
        "batching: {writes} writes to 2 followers in {entries} entries and {rpcs} AppendEntries RPCs ({writes_per_rpc:.1} writes per RPC)"
    );
    assert!(writes_per_rpc >= 2.0, "writes were not batched: {line}");
}

/// The log line without terminal colour codes (`ESC [ ... m`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A txn nested deeper than Keel's limit is refused before it reaches the raft log, by the
/// leader and by a follower alike (regression: a 49-level txn was accepted, and its log entry,
/// wrapped in Keel's own messages, exceeded prost's decode nesting limit, so every member
/// that read it stopped and could not restart). The deepest accepted txn commits, and the
/// leader restarts from its log.
#[test]
fn over_deep_txns_are_refused_and_accepted_ones_survive_a_restart() {
    use keel_proto::etcdserverpb::{RequestOp, TxnRequest, request_op};
    use keel_server::api::kv_validate::MAX_TXN_DEPTH;

    fn deep(depth: usize, key: &str) -> TxnRequest {
        let mut t = TxnRequest {
            success: vec![RequestOp {
                request: Some(request_op::Request::RequestPut(PutRequest {
                    key: key.into(),
                    value: format!("depth-{depth}").into(),
                    ..Default::default()
                })),
            }],
            ..Default::default()
        };
        for _ in 1..depth {
            t = TxnRequest {
                success: vec![RequestOp {
                    request: Some(request_op::Request::RequestTxn(t)),
                }],
                ..Default::default()
            };
        }
        t
    }

    let (_alone, mut cluster) = cluster(3, &[]);
    let leader = cluster.leader(Duration::from_secs(10));
    let follower = (leader + 1) % 3;
    let (leader_ep, follower_ep) = (
        cluster.members[leader].endpoint(),
        cluster.members[follower].endpoint(),
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        for ep in [&leader_ep, &follower_ep] {
            let mut kv = grpc::kv(ep).await;
            for depth in [MAX_TXN_DEPTH + 1, 49] {
                // An over-deep txn is refused.
                grpc::assert_fails_with(
                    kv.txn(deep(depth, "deep")).await,
                    tonic::Code::InvalidArgument,
                    "etcdserver: too many operations in txn request",
                );
            }
        }
        let mut kv = grpc::kv(&follower_ep).await;
        let resp = kv
            .txn(deep(MAX_TXN_DEPTH, "deep"))
            .await
            .expect("the deepest accepted txn commits")
            .into_inner();
        assert!(resp.succeeded);
    });
    // The leader's log holds the deepest accepted txn: it restarts and still serves it.
    cluster.members[leader].kill9();
    cluster.members[leader].spawn();
    cluster.wait_ready(&[leader]);
    rt.block_on(async {
        let mut kv = grpc::kv(&leader_ep).await;
        let resp = grpc::range(&mut kv, b"deep", b"").await;
        assert_eq!(resp.kvs.len(), 1);
        assert_eq!(
            resp.kvs[0].value,
            format!("depth-{MAX_TXN_DEPTH}").into_bytes()
        );
        grpc::put(&mut kv, "after", "restart").await;
    });
}

/// A peer RPC stamped with another cluster's ID is refused with etcd's "cluster ID mismatch";
/// one with this cluster's ID, or without the header (a joining member, a 0.1.0 member), is
/// served. Members of a 3-member cluster stamp their own RPCs, so the cluster works.
#[test]
fn peer_rpcs_from_another_cluster_are_refused() {
    use keel_proto::keelpb::ClusterInfoRequest;
    use keel_proto::keelpb::peer_client::PeerClient;

    let (_alone, c) = cluster(3, &[]);
    let member = &c.members[0];
    let cluster_id = grpc::status(&member.endpoint())
        .expect("status")
        .header
        .expect("header")
        .cluster_id;
    let rt = grpc::runtime();
    let ask = |stamp: Option<String>| {
        rt.block_on(async {
            let url = member.peer_url();
            let mut peer = PeerClient::connect(url)
                .await
                .expect("connect to the peer URL");
            let mut req = tonic::Request::new(ClusterInfoRequest {});
            if let Some(id) = stamp {
                req.metadata_mut()
                    .insert("x-etcd-cluster-id", id.parse().expect("metadata"));
            }
            peer.cluster_info(req)
                .await
                .map(|r| r.into_inner().cluster_id)
        })
    };
    assert_eq!(ask(None).expect("no header"), cluster_id);
    assert_eq!(
        ask(Some(format!("{cluster_id:x}"))).expect("same cluster"),
        cluster_id
    );
    let refused = ask(Some(format!("{:x}", cluster_id ^ 1))).unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert_eq!(refused.message(), "cluster ID mismatch");
    // The members' own RPCs carry the right ID: writes still commit on all three.
    let mut kv = rt.block_on(grpc::kv(&member.endpoint()));
    let rev = rt.block_on(grpc::put(&mut kv, "after-check", "v"));
    assert!(rev > 1, "the put committed at revision {rev}");
    let index = grpc::status(&member.endpoint()).expect("status").raft_index;
    c.wait_applied(index, Duration::from_secs(10));
}
