//! QoS (issue 17, docs/qos.md) against real `keel` processes: a rule of `--qos-config`
//! refuses over-rate puts with etcd's `ResourceExhausted` `etcdserver: too many requests`
//! and nothing refused is applied; rules changed at run time through `keelpb.Qos` take
//! effect on every member of 3 and survive restarts; a malformed rule file stops the member
//! and a malformed rule request is refused, both naming the field; with auth on, a
//! user-scoped rule governs that user's requests only, and only root may change rules.

use std::time::{Duration, Instant};

use keel_proto::etcdserverpb::PutRequest;
use keel_proto::keelpb::qos_client::QosClient;
use keel_proto::keelpb::{
    QosRuleAddRequest, QosRuleListRequest, QosRuleRemoveRequest, QosRuleUpdateRequest,
};
use keel_testkit::MemberSpec;
use keel_testkit::grpc::{self, assert_fails_with};
use keel_testkit::ports::free_port;
use keel_testkit::process::run_bounded;
use keel_testkit::schedule::shared;
use keel_testkit::spec::{initial_cluster, loopback_url};
use tonic::Code;
use tonic::transport::Channel;

use crate::{cluster, keel_bin, member};

const TOO_MANY: &str = "etcdserver: too many requests";

async fn qos_client(endpoint: &str) -> QosClient<Channel> {
    QosClient::new(
        grpc::channel(endpoint, Duration::from_secs(10))
            .await
            .unwrap(),
    )
}

/// Polls `endpoint`'s rule list until its version is `version`; returns the rules text.
async fn wait_version(endpoint: &str, version: u64) -> String {
    let mut client = qos_client(endpoint).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let list = client
            .rule_list(QosRuleListRequest {})
            .await
            .unwrap()
            .into_inner();
        if list.version == version {
            return list.rules;
        }
        assert!(
            Instant::now() < deadline,
            "{endpoint}: rules stayed at version {} (want {version}): {}",
            list.version,
            list.rules
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends `n` puts of `prefix<i>` back to back; returns (accepted, refused) and asserts
/// every failure is etcd's `ResourceExhausted` `too many requests`.
async fn burst(endpoint: &str, prefix: &str, n: usize) -> (usize, usize) {
    let mut kv = grpc::kv(endpoint).await;
    let (mut ok, mut refused) = (0, 0);
    for i in 0..n {
        let r = kv
            .put(PutRequest {
                key: format!("{prefix}{i}").into_bytes(),
                value: b"v".to_vec(),
                ..Default::default()
            })
            .await;
        match r {
            Ok(_) => ok += 1,
            Err(s) => {
                assert_eq!((s.code(), s.message()), (Code::ResourceExhausted, TOO_MANY));
                refused += 1;
            }
        }
    }
    (ok, refused)
}

async fn count(endpoint: &str, prefix: &str) -> i64 {
    let mut kv = grpc::kv(endpoint).await;
    let end = grpc::prefix_end(prefix.as_bytes());
    grpc::range(&mut kv, prefix.as_bytes(), &end).await.count
}

#[test]
fn a_rule_file_refuses_over_rate_puts_with_etcds_error_and_applies_nothing_refused() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("qos.yaml");
    std::fs::write(
        &rules,
        "rules:\n  - name: noisy-writers\n    match:\n      methods: [Put, Txn, DeleteRange]\n      key_prefix: /noisy/\n    rate: 2\n    burst: 5\n    priority: low\n",
    )
    .unwrap();
    let (_guard, keel) = member(&["--qos-config", rules.to_str().unwrap()]);
    let endpoint = keel.endpoint();
    grpc::runtime().block_on(async {
        // The file's rules are put in force through raft once the member has a leader.
        let text = wait_version(&endpoint, 1).await;
        assert!(text.contains("noisy-writers"), "{text}");

        let started = Instant::now();
        let (ok, refused) = burst(&endpoint, "/noisy/", 30).await;
        let elapsed = started.elapsed().as_secs_f64();
        // The burst of 5, plus 2 tokens a second while the loop ran.
        let most = 5 + (2.0 * elapsed).ceil() as usize;
        assert!(ok >= 5 && ok <= most, "accepted {ok} in {elapsed:.2}s");
        assert_eq!(ok + refused, 30);
        // Each refusal is answered after --qos-refusal-delay (100 ms by default).
        assert!(
            elapsed >= 0.1 * refused as f64,
            "{refused} refusals in {elapsed:.2}s"
        );
        // Nothing refused was proposed: only the accepted keys exist.
        assert_eq!(count(&endpoint, "/noisy/").await, ok as i64);
        // Other keys are not governed by the rule.
        assert_eq!(burst(&endpoint, "/good/", 30).await, (30, 0));
    });
}

#[test]
fn runtime_rule_changes_reach_every_member_and_survive_restarts() {
    let (_alone, mut cluster) = cluster(3, &[]);
    let endpoints: Vec<String> = cluster.members.iter().map(|m| m.endpoint()).collect();
    let rt = grpc::runtime();
    rt.block_on(async {
        let mut admin = qos_client(&endpoints[1]).await;
        // Malformed rules are refused naming the field; nothing changes.
        let bad = admin
            .rule_add(QosRuleAddRequest {
                rule: "{name: r, rate: 0, match: {key_prefix: /r/}}".into(),
                before: String::new(),
            })
            .await;
        assert_fails_with(bad, Code::InvalidArgument, "rule.rate: must be > 0");
        let bad = admin
            .rule_add(QosRuleAddRequest {
                rule: "{name: r, rate: 1, match: {key_prefx: /r/}}".into(),
                before: String::new(),
            })
            .await
            .unwrap_err();
        assert_eq!(bad.code(), Code::InvalidArgument);
        assert!(
            bad.message()
                .starts_with("match: unknown field `key_prefx`"),
            "{bad:?}"
        );
        let missing = admin
            .rule_remove(QosRuleRemoveRequest { name: "x".into() })
            .await;
        assert_fails_with(missing, Code::InvalidArgument, "name: no rule named \"x\"");

        // Added: one request per second under /r/ on each member that receives them.
        let added = admin
            .rule_add(QosRuleAddRequest {
                rule: "{name: r, rate: 1, burst: 1, match: {key_prefix: /r/}}".into(),
                before: String::new(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(added.version, 1);
        for (i, e) in endpoints.iter().enumerate() {
            let text = wait_version(e, 1).await;
            assert!(text.contains("name: r"), "{text}");
            assert_eq!(burst(e, &format!("/r/{i}/"), 3).await, (1, 2), "via {e}");
        }

        // Changed: a rate high enough for the same puts.
        let updated = admin
            .rule_update(QosRuleUpdateRequest {
                rule: "{name: r, rate: 100000, match: {key_prefix: /r/}}".into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(updated.version, 2);
        for (i, e) in endpoints.iter().enumerate() {
            wait_version(e, 2).await;
            assert_eq!(burst(e, &format!("/r/u{i}/"), 3).await, (3, 0), "via {e}");
        }
        // Back to a tight rate, which must survive the restarts below.
        admin
            .rule_update(QosRuleUpdateRequest {
                rule: "{name: r, rate: 1, burst: 1, match: {key_prefix: /r/}}".into(),
            })
            .await
            .unwrap();
    });

    // Every member restarts, one at a time (the other two keep a quorum).
    for m in &mut cluster.members {
        m.terminate();
        m.restart();
    }
    rt.block_on(async {
        for (i, e) in endpoints.iter().enumerate() {
            let text = wait_version(e, 3).await;
            assert!(text.contains("rate: 1\n"), "{text}");
            assert_eq!(burst(e, &format!("/r/s{i}/"), 3).await, (1, 2), "via {e}");
        }
        // Removed: nothing governs /r/ any more, on any member.
        let mut admin = qos_client(&endpoints[0]).await;
        let removed = admin
            .rule_remove(QosRuleRemoveRequest { name: "r".into() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(removed.version, 4);
        for (i, e) in endpoints.iter().enumerate() {
            assert_eq!(wait_version(e, 4).await, "rules: []\n");
            assert_eq!(burst(e, &format!("/r/d{i}/"), 3).await, (3, 0), "via {e}");
        }
    });
}

#[test]
fn a_malformed_rule_file_stops_the_member_naming_the_field() {
    let _guard = shared();
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("qos.yaml");
    std::fs::write(
        &rules,
        "rules:\n  - {name: a, rate: 5}\n  - {name: b, rate: 0}\n",
    )
    .unwrap();
    let peer = loopback_url(free_port());
    let data = dir.path().join("d");
    let spec = MemberSpec::new()
        .data_dir(&data)
        .client_url(&loopback_url(free_port()))
        .peer_url(&peer)
        .initial_cluster(&initial_cluster([("default", &peer)]))
        .args(["--qos-config", rules.to_str().unwrap()]);
    let out = run_bounded(&mut spec.command(&keel_bin()), "", Duration::from_secs(20));
    assert_ne!(out.code, Some(0), "{}", out.dump());
    assert!(
        out.stderr.contains(&format!(
            "invalid --qos-config {}: rules[1].rate: must be > 0",
            rules.display()
        )),
        "{}",
        out.dump()
    );
    assert!(!data.exists(), "no data dir after a refused start");
}

#[test]
fn a_member_that_installs_a_snapshot_gets_the_rules_in_it() {
    // Small snapshots and a short log tail, so a member that was down catches up from a
    // snapshot rather than from the log.
    let (_alone, mut cluster) = cluster(
        3,
        &[
            "--snapshot-count",
            "20",
            "--experimental-snapshot-catchup-entries",
            "5",
        ],
    );
    let endpoints: Vec<String> = cluster.members.iter().map(|m| m.endpoint()).collect();
    // Rule changes need cluster version 0.2, which the leader decides only once every member
    // published its version: stopping member 2 before it did would leave the cluster at 0.1.
    assert!(
        cluster.members[2].wait_for_log("published member attributes", Duration::from_secs(20)),
        "member 2 never published its version"
    );
    cluster.members[2].terminate();
    let rt = grpc::runtime();
    rt.block_on(async {
        let mut admin = qos_client(&endpoints[0]).await;
        admin
            .rule_add(QosRuleAddRequest {
                rule: "{name: snap, rate: 1, burst: 1, match: {key_prefix: /s/}}".into(),
                before: String::new(),
            })
            .await
            .unwrap();
        assert_eq!(burst(&endpoints[0], "/filler/", 200).await, (200, 0));
    });
    // The leader drops log entries only while no replication to member 2 is in flight, and
    // one is in flight while that member's replication backs off (200 ms at most between
    // tries): wait for both running members to compact their raft logs past index 100, far
    // past member 2's last entry (it stopped before the rule and the 200 puts).
    for m in &cluster.members[..2] {
        assert!(
            m.wait_for_raft_log_compaction(100, Duration::from_secs(10)),
            "{} did not compact its raft log past index 100\n{}",
            m.name(),
            m.log_tail()
        );
    }
    cluster.members[2].restart();
    rt.block_on(async {
        let text = wait_version(&endpoints[2], 1).await;
        assert!(text.contains("name: snap"), "{text}");
        assert_eq!(burst(&endpoints[2], "/s/", 3).await, (1, 2));
    });
    // The rules are served once the store is replaced; the line follows the directory sync.
    assert!(
        cluster.members[2].wait_for_log("installed a snapshot", Duration::from_secs(10)),
        "the member caught up from the log, not a snapshot\n{}",
        cluster.members[2].log_tail()
    );
}

/// Puts `prefix<i>` for i < n back to back as the holder of `token`; returns (accepted,
/// refused), asserting every failure is etcd's `too many requests`.
async fn burst_as(endpoint: &str, token: &str, prefix: &str, n: usize) -> (usize, usize) {
    let mut kv = grpc::kv(endpoint).await;
    let (mut ok, mut refused) = (0, 0);
    for i in 0..n {
        let put = PutRequest {
            key: format!("{prefix}{i}").into_bytes(),
            value: b"v".to_vec(),
            ..Default::default()
        };
        match kv.put(crate::auth::authed(put, token)).await {
            Ok(_) => ok += 1,
            Err(s) => {
                assert_eq!((s.code(), s.message()), (Code::ResourceExhausted, TOO_MANY));
                refused += 1;
            }
        }
    }
    (ok, refused)
}

/// With auth on, `match.user` keys on the user the request's token resolves to: user `u`
/// is held to the rule's burst and rate, root writing the same prefix is not governed, and
/// the admin service refuses a non-root caller with etcd's `permission denied`.
#[test]
fn a_user_rule_governs_only_that_users_requests_with_auth_on() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("qos.yaml");
    std::fs::write(
        &rules,
        "rules:\n  - name: slow-u\n    match:\n      methods: [Put]\n      user: u\n    rate: 1\n    burst: 3\n",
    )
    .unwrap();
    let (_guard, keel) = member(&["--qos-config", rules.to_str().unwrap()]);
    let endpoint = keel.endpoint();
    grpc::runtime().block_on(async {
        wait_version(&endpoint, 1).await;
    });
    crate::auth::set_up_users(&endpoint);
    grpc::runtime().block_on(async {
        let u = crate::auth::authenticate(&endpoint, "u", "upw")
            .await
            .unwrap();
        let root = crate::auth::authenticate(&endpoint, "root", "rootpw")
            .await
            .unwrap();
        let started = Instant::now();
        let (ok, refused) = burst_as(&endpoint, &u, "k/u", 12).await;
        let elapsed = started.elapsed().as_secs_f64();
        let most = 3 + elapsed.ceil() as usize;
        assert!(ok >= 3 && ok <= most, "u: accepted {ok} in {elapsed:.2}s");
        assert_eq!(ok + refused, 12);
        // Root writes the same prefix at full speed: the rule names user u only.
        assert_eq!(burst_as(&endpoint, &root, "k/root", 12).await, (12, 0));
        // Only root may list or change the rules.
        let mut admin = qos_client(&endpoint).await;
        let denied = admin
            .rule_list(crate::auth::authed(QosRuleListRequest {}, &u))
            .await
            .unwrap_err();
        assert_eq!(
            (denied.code(), denied.message()),
            (Code::PermissionDenied, "etcdserver: permission denied")
        );
        let anonymous = admin.rule_list(QosRuleListRequest {}).await.unwrap_err();
        assert_eq!(anonymous.message(), "etcdserver: user name is empty");
        let removed = admin
            .rule_remove(crate::auth::authed(
                QosRuleRemoveRequest {
                    name: "slow-u".into(),
                },
                &root,
            ))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(removed.version, 2);
        // Without the rule, u writes at full speed.
        assert_eq!(burst_as(&endpoint, &u, "k/again", 12).await, (12, 0));
    });
}
