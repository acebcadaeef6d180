//! `--experimental-peer-dial-override` end to end: a 3-member cluster whose advertised peer
//! URLs point at ports nobody listens on, and which works only because every member dials the
//! real listen URLs through the override. Membership still shows the advertised URLs.

use std::time::{Duration, Instant};

use keel_proto::etcdserverpb::MemberListRequest;
use keel_testkit::ports::free_ports;
use keel_testkit::process::run_bounded;
use keel_testkit::schedule::exclusive;
use keel_testkit::spec::{initial_cluster, loopback_url};
use keel_testkit::{Member, MemberSpec, grpc};

use crate::keel_bin;

/// How long the cluster may take to elect a leader and serve linearizable reads.
const READY_TIMEOUT: Duration = Duration::from_secs(40);

#[test]
fn members_dial_peers_through_the_override() {
    let _alone = exclusive();
    let n = 3;
    // Per member: client port, listen (real) peer port, advertised (dead) peer port.
    let ports = free_ports(3 * n);
    let client = |i: usize| ports[3 * i];
    let listen = |i: usize| loopback_url(ports[3 * i + 1]);
    let advertised = |i: usize| loopback_url(ports[3 * i + 2]);
    let name = |i: usize| format!("m{i}");
    let initial = initial_cluster((0..n).map(|i| (name(i), advertised(i))));
    let overrides: Vec<(String, String)> = (0..n).map(|i| (advertised(i), listen(i))).collect();
    let mut members: Vec<Member> = (0..n)
        .map(|i| {
            let spec = MemberSpec::new()
                .name(&name(i))
                .client_url(&loopback_url(client(i)))
                .peer_urls(&listen(i), &advertised(i))
                .initial_cluster(&initial)
                .initial_cluster_token("dial-override-test")
                .peer_dial_override(overrides.iter().map(|(a, d)| (a, d)));
            Member::new(&keel_bin(), spec)
        })
        .collect();
    for m in &mut members {
        m.spawn();
    }

    let deadline = Instant::now() + READY_TIMEOUT;
    for m in &mut members {
        m.wait_ready_within(deadline.saturating_duration_since(Instant::now()));
    }

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut kv0 = grpc::kv(&members[0].endpoint()).await;
        let rev = grpc::put(&mut kv0, "k", "through-the-override").await;
        // A linearizable read on another member needs a ReadIndex round over the peer links.
        let mut kv2 = grpc::kv(&members[2].endpoint()).await;
        let got = grpc::range(&mut kv2, b"k", b"").await;
        assert_eq!(got.kvs.len(), 1);
        assert_eq!(got.kvs[0].value, b"through-the-override");
        assert_eq!(got.kvs[0].mod_revision, rev);

        let list = grpc::cluster(&members[1].endpoint())
            .await
            .member_list(MemberListRequest::default())
            .await
            .unwrap()
            .into_inner();
        let mut urls: Vec<String> = list
            .members
            .iter()
            .flat_map(|m| m.peer_ur_ls.clone())
            .collect();
        urls.sort();
        let mut want: Vec<String> = (0..n).map(advertised).collect();
        want.sort();
        assert_eq!(urls, want, "membership keeps the advertised peer URLs");
    });
}

#[test]
fn a_malformed_override_fails_the_start_with_a_flag_error() {
    let dir = tempfile::tempdir().unwrap();
    let spec = MemberSpec::new()
        .data_dir(dir.path().join("data"))
        .peer_dial_override_value("http://127.0.0.1:1");
    let out = run_bounded(&mut spec.command(&keel_bin()), "", Duration::from_secs(20));
    assert_eq!(out.code, Some(2), "{out:?}");
    let stderr = &out.stderr;
    assert!(
        stderr.contains(
            "invalid value \"http://127.0.0.1:1\" for flag --experimental-peer-dial-override: \
             \"http://127.0.0.1:1\" is not of the form ADVERTISED_PEER_URL=DIAL_URL"
        ),
        "{stderr}"
    );
    assert!(
        !dir.path().join("data").exists(),
        "nothing is created on a bad flag"
    );
}
