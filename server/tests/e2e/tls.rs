//! TLS end to end (docs/security.md): certificates generated in the test (keel-testkit's
//! `TestCa`), real members, the real etcdctl.
//!
//! - client certificate auth admits the CA's clients and refuses a client without a
//!   certificate, with one of another CA, or speaking plaintext, applying nothing;
//! - `--auto-tls` serves `https://` beside `http://`;
//! - a renewed server certificate is served to new connections; an expired renewal is logged
//!   and the old certificate keeps serving;
//! - three members on `https://` peer URLs with `--peer-client-cert-auth` elect and
//!   replicate; a member whose peer certificate comes from another CA cannot join and says why;
//! - the KV, watch and lease basics of `etcdctl.rs`, `watch.rs` and `lease_etcdctl.rs` run
//!   over TLS (their bodies, unchanged: the test kit speaks TLS to a TLS member).

use std::process::Command;
use std::time::{Duration, Instant};

use keel_proto::etcdserverpb::RangeRequest;
use keel_proto::etcdserverpb::kv_client::KvClient;
use keel_testkit::etcdctl::{CtlOutput, PROCESS_TIMEOUT, etcdctl, etcdctl_path};
use keel_testkit::grpc;
use keel_testkit::ports::free_ports;
use keel_testkit::process::run_bounded;
use keel_testkit::schedule::{exclusive, shared};
use keel_testkit::tls::{ClientTls, ServerTls, TestCa};
use keel_testkit::{Cluster, Member, MemberSpec};

use crate::keel_bin;

/// etcdctl on `url` with exactly `tls` flags (no registry lookup: each test says what the
/// client presents), 2 s to dial, 3 s per command.
fn ctl_raw(url: &str, tls: &[String], args: &[&str]) -> CtlOutput {
    let mut cmd = Command::new(etcdctl_path());
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("ETCDCTL_") {
            cmd.env_remove(&key);
        }
    }
    cmd.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={url}"))
        .args(tls)
        .args(["--dial-timeout=2s", "--command-timeout=3s"])
        .args(args);
    run_bounded(&mut cmd, "", PROCESS_TIMEOUT).into()
}

/// A ready single member serving clients on `https://` with a certificate of `ca`, trusting
/// `ca` and requiring client certificates (`--client-cert-auth`).
fn tls_member(ca: &TestCa) -> Member {
    let ports = free_ports(2);
    let spec =
        MemberSpec::single("default", ports[0], ports[1]).client_tls(ca.server("server", "server"));
    let mut member = Member::new(&keel_bin(), spec);
    member.restart();
    member
}

/// `header.revision` as the client `tls` sees it.
fn revision_as(url: &str, tls: &[String]) -> i64 {
    let out = ctl_raw(url, tls, &["get", "probe", "-w", "json"]).json();
    out["header"]["revision"].as_i64().expect("header.revision")
}

/// One linearizable Range on a new TLS connection to `endpoint` as `client`.
fn probe(endpoint: &str, client: &ClientTls) -> Result<(), String> {
    let endpoint = endpoint.to_string();
    let client = client.clone();
    grpc::block_on_thread(async move {
        let channel = grpc::endpoint_with_tls(&endpoint, &client)?
            .timeout(Duration::from_secs(2))
            .connect()
            .await
            .map_err(|e| format!("connect: {e:?}"))?;
        KvClient::new(channel)
            .range(RangeRequest {
                key: b"probe".to_vec(),
                ..Default::default()
            })
            .await
            .map(|_| ())
            .map_err(|s| format!("range: {s:?}"))
    })?
}

/// Waits up to `limit` for `done`; false if it never held.
fn eventually(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    done()
}

#[test]
fn client_cert_auth_admits_the_cas_clients_and_refuses_the_rest() {
    let _guard = shared();
    let certs = tempfile::tempdir().unwrap();
    let ca = TestCa::new(certs.path(), "ca");
    let other = TestCa::new(certs.path(), "other");
    let keel = tls_member(&ca);
    let url = keel.client_url();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");

    let good = ca.client(Some(ca.issue("alice", "alice"))).etcdctl_flags();
    ctl_raw(&url, &good, &["put", "foo", "bar"]).ok();
    let rev = revision_as(&url, &good);

    let foreign = ClientTls {
        ca: ca.ca_file(),
        // Same CN as the good client: only the issuer differs.
        identity: Some(other.issue("mallory", "alice")),
    };
    let plaintext = url.replacen("https://", "http://", 1);
    let refused = [
        (
            "no certificate",
            &url,
            ca.client(None).etcdctl_flags(),
            "peer sent no certificates",
        ),
        (
            "another CA's certificate",
            &url,
            foreign.etcdctl_flags(),
            "invalid peer certificate: UnknownIssuer",
        ),
        (
            "plaintext",
            &plaintext,
            Vec::new(),
            "received corrupt message",
        ),
    ];
    for (what, url, flags, logged) in refused {
        let out = ctl_raw(url, &flags, &["put", "foo", what]);
        assert_eq!(out.code, Some(1), "{what}: {out:#?}");
        assert_eq!(
            out.error_lines(),
            ["Error: context deadline exceeded"],
            "{what}: {out:#?}"
        );
        let log = keel.log();
        assert!(
            log.contains("rejected client connection from 127.0.0.1:") && log.contains(logged),
            "{what}: the member logs why ({logged:?})\n{}",
            keel.log_tail()
        );
    }

    // Nothing was applied: same revision, same value.
    assert_eq!(revision_as(&url, &good), rev);
    let out = ctl_raw(&url, &good, &["get", "foo", "--print-value-only"]);
    assert_eq!(out.ok().stdout, "bar\n");
    // The gRPC client of the test kit without a certificate is refused too.
    assert!(probe(&keel.endpoint(), &ca.client(None)).is_err());
    assert!(probe(&keel.endpoint(), &ca.client(Some(ca.issue("bob", "bob")))).is_ok());
}

#[test]
fn auto_tls_serves_https_beside_http() {
    let _guard = shared();
    let ports = free_ports(3);
    let https = format!("https://127.0.0.1:{}", ports[2]);
    let http = format!("http://127.0.0.1:{}", ports[0]);
    let spec = MemberSpec::single("default", ports[0], ports[1])
        .listen_client_urls(&format!("{https},{http}"))
        .args(["--auto-tls"]);
    let mut keel = Member::new(&keel_bin(), spec);
    keel.restart();

    // etcdctl 3.4 skips verification only with both flags.
    let skip = [
        "--insecure-skip-tls-verify".to_string(),
        "--insecure-transport=false".to_string(),
    ];
    ctl_raw(&https, &skip, &["put", "k", "over-tls"]).ok();
    let out = ctl_raw(&http, &[], &["get", "k", "--print-value-only"]);
    assert_eq!(
        out.ok().stdout,
        "over-tls\n",
        "both listeners serve one store"
    );
    let fixtures = keel.data_dir().join("fixtures/client");
    assert!(fixtures.join("cert.pem").is_file() && fixtures.join("key.pem").is_file());
    // Without skipping verification the self-signed certificate is not trusted.
    let out = ctl_raw(&https, &[], &["get", "k"]);
    assert_eq!(out.code, Some(1), "{out:#?}");
}

#[test]
fn renewed_server_certificates_are_served_to_new_connections() {
    let _guard = shared();
    let certs = tempfile::tempdir().unwrap();
    let old_ca = TestCa::new(certs.path(), "old");
    let new_ca = TestCa::new(certs.path(), "new");
    let keel = tls_member(&old_ca);
    let ep = keel.endpoint();
    let identity = old_ca.issue("client", "client");
    let trusting = |ca: &TestCa| ClientTls {
        ca: ca.ca_file(),
        identity: Some(identity.clone()),
    };
    probe(&ep, &trusting(&old_ca)).unwrap();
    assert!(probe(&ep, &trusting(&new_ca)).is_err());

    // Renewal: the same files now hold a certificate of the new CA.
    new_ca.issue("server", "server");
    assert!(
        eventually(Duration::from_secs(10), || probe(&ep, &trusting(&new_ca))
            .is_ok()),
        "new connections get the renewed certificate\n{}",
        keel.log_tail()
    );
    assert!(probe(&ep, &trusting(&old_ca)).is_err());
    assert!(
        keel.wait_for_log("reloaded certificate", Duration::from_secs(10)),
        "{}",
        keel.log_tail()
    );

    // An expired renewal is refused: the previous certificate keeps serving.
    new_ca.issue_expired("server", "server");
    // Reloads happen at handshakes: each probe is a new connection.
    assert!(
        eventually(Duration::from_secs(10), || {
            let _ = probe(&ep, &trusting(&new_ca));
            keel.log().contains("expired at")
        }),
        "the member logs the expired certificate\n{}",
        keel.log_tail()
    );
    probe(&ep, &trusting(&new_ca)).unwrap();
    assert!(keel.log().contains("the previous one keeps serving"));
}

#[test]
fn three_members_on_https_peer_urls_elect_replicate_and_refuse_a_foreign_peer() {
    let _alone = exclusive();
    let certs = tempfile::tempdir().unwrap();
    let ca = TestCa::new(certs.path(), "peer-ca");
    let rogue = TestCa::new(certs.path(), "rogue-ca");
    let template = MemberSpec::new().peer_tls(ca.server("peer", "peer"));
    let mut cluster = Cluster::start_with(&keel_bin(), 3, template, None);
    let leader = cluster.leader(Duration::from_secs(10));

    let list = etcdctl(&cluster.endpoints(), &["member", "list", "-w", "json"]).json();
    let peer_urls: Vec<&str> = list["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| m["peerURLs"][0].as_str().expect("a peer URL"))
        .collect();
    assert_eq!(peer_urls.len(), 3);
    assert!(
        peer_urls.iter().all(|u| u.starts_with("https://")),
        "{peer_urls:?}"
    );

    etcdctl(
        &cluster.members[leader].endpoint(),
        &["put", "replicated", "yes"],
    )
    .ok();
    for m in &cluster.members {
        let ep = m.endpoint();
        assert!(
            eventually(Duration::from_secs(10), || {
                etcdctl(
                    &ep,
                    &["get", "replicated", "--consistency=s", "--print-value-only"],
                )
                .stdout
                    == "yes\n"
            }),
            "{} did not apply the write\n{}",
            m.name(),
            cluster.log_tails()
        );
    }

    // A member whose peer certificate another CA issued cannot join.
    let ports = Cluster::reserve_ports();
    let peer_url = format!("https://127.0.0.1:{}", ports.1);
    crate::cluster_membership::member_cmd(
        &cluster.endpoints(),
        &["member", "add", "m4", &format!("--peer-urls={peer_url}")],
    )
    .ok();
    let foreign = MemberSpec::new().peer_tls(ServerTls {
        files: rogue.issue("rogue", "peer"),
        ca: ca.ca_file(),
        client_cert_auth: true,
    });
    let joiner = cluster.join_with("m4", ports, foreign);
    let exited = cluster.members[joiner].wait_exit(Duration::from_secs(40));
    let log = cluster.members[joiner].log();
    assert!(
        exited.is_some_and(|s| !s.success()),
        "m4 must fail to join: {exited:?}\n{}",
        cluster.members[joiner].log_tail()
    );
    assert!(
        log.contains("cannot join the cluster") && log.contains("UnknownCA"),
        "m4 says why\n{log}"
    );
    let refused = cluster.members[..3]
        .iter()
        .any(|m| m.log().contains("rejected peer connection") && m.log().contains("UnknownIssuer"));
    assert!(
        refused,
        "the members log the refusal\n{}",
        cluster.log_tails()
    );
    // The three keep serving.
    etcdctl(&cluster.members[leader].endpoint(), &["put", "after", "ok"]).ok();
}

/// Runs an existing e2e test body on a fresh member with client TLS and client cert auth.
fn over_tls(body: fn(&Member)) {
    let _guard = shared();
    let certs = tempfile::tempdir().unwrap();
    let keel = tls_member(&TestCa::new(certs.path(), "ca"));
    body(&keel);
}

#[test]
fn kv_basics_run_over_tls() {
    over_tls(crate::etcdctl::put_and_get_body);
}

#[test]
fn watch_basics_run_over_tls() {
    over_tls(crate::watch::grpc_watch_body);
}

#[test]
fn lease_basics_run_over_tls() {
    over_tls(crate::lease_etcdctl::lease_body);
}

/// With auth on and no token, the verified client certificate's CN is the user (etcd
/// `AuthInfoFromTLS`): CN `alice` writes in her prefix and is denied outside it; a token,
/// when sent, wins over the CN; CN `root` has root's rights.
#[test]
fn a_client_certificates_common_name_is_the_user_when_no_token_is_sent() {
    let _guard = shared();
    let certs = tempfile::tempdir().unwrap();
    let ca = TestCa::new(certs.path(), "ca");
    let keel = tls_member(&ca);
    let url = keel.client_url();
    let root = ca.client(Some(ca.issue("root", "root"))).etcdctl_flags();
    let alice = ca.client(Some(ca.issue("alice", "alice"))).etcdctl_flags();
    let steps: [&[&str]; 6] = [
        &["user", "add", "root", "--new-user-password=rootpw"],
        &["role", "add", "alice-rw"],
        &[
            "role",
            "grant-permission",
            "alice-rw",
            "readwrite",
            "alice/",
            "--prefix",
        ],
        &["user", "add", "alice", "--new-user-password=alicepw"],
        &["user", "grant-role", "alice", "alice-rw"],
        &["auth", "enable"],
    ];
    for step in steps {
        ctl_raw(&url, &root, step).ok();
    }
    let before = revision_as(&url, &root);
    // CN alice, no token: alice's permissions.
    assert_eq!(
        ctl_raw(&url, &alice, &["put", "alice/k", "v"]).ok().lines(),
        ["OK"]
    );
    let denied = ctl_raw(&url, &alice, &["put", "other", "v"]);
    assert_eq!(denied.code, Some(1), "{denied:#?}");
    assert_eq!(
        denied.error_lines(),
        ["Error: etcdserver: permission denied"]
    );
    // Only alice's put was applied.
    assert_eq!(revision_as(&url, &root), before + 1);
    // A token wins over the CN: alice's connection authenticated as root may write anywhere.
    let mut as_root = alice.clone();
    as_root.push("--user=root:rootpw".into());
    assert_eq!(
        ctl_raw(&url, &as_root, &["put", "other", "v"]).ok().lines(),
        ["OK"]
    );
    // CN root is root: user management works without a password.
    assert_eq!(
        ctl_raw(&url, &root, &["user", "list"]).ok().lines(),
        ["alice", "root"]
    );
}
