//! Auth end to end (issue 12, docs/auth.md): etcdctl with simple and JWT tokens, etcd's
//! errors for bad input, Authenticate in parallel, permissions that agree on every member
//! through crashes, a learner that joins from a snapshot, and the public conformance cases
//! through a follower.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use keel_proto::etcdserverpb::auth_client::AuthClient;
use keel_proto::etcdserverpb::kv_client::KvClient;
use keel_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use keel_proto::etcdserverpb::{
    AuthStatusRequest, AuthUserAddRequest, AuthUserDeleteRequest, AuthUserGetRequest,
    AuthUserGrantRoleRequest, AuthUserListRequest, AuthenticateRequest, HashKvRequest, PutRequest,
    RangeRequest, RequestOp, StatusRequest, TxnRequest, request_op,
};
use keel_testkit::etcdctl::{CtlOutput, etcdctl};
use keel_testkit::{Cluster, grpc};
use tonic::Code;
use tonic::transport::Channel;

use crate::{cluster, member};

const ROOT: &str = "--user=root:rootpw";
/// Role `rw` gets READWRITE on prefix `k/`.
const GRANT_RW: [&str; 6] = [
    "role",
    "grant-permission",
    "rw",
    "readwrite",
    "k/",
    "--prefix",
];

/// Runs etcdctl against `endpoints`.
fn ctl(endpoints: &str, args: &[&str]) -> CtlOutput {
    etcdctl(endpoints, args)
}

#[track_caller]
fn assert_lines(out: &CtlOutput, expected: &[&str]) {
    out.ok();
    assert_eq!(out.lines(), expected, "etcdctl: {out:#?}");
}

/// Users and roles most tests start from, then auth enabled: `root:rootpw`; role `rw` with
/// READWRITE on prefix `k/`; role `ro` with READ on key `ro`; user `u:upw` holding both.
pub(crate) fn set_up_users(endpoints: &str) {
    let steps: [&[&str]; 8] = [
        &["user", "add", "root", "--new-user-password=rootpw"],
        &["role", "add", "rw"],
        &GRANT_RW,
        &["role", "add", "ro"],
        &["role", "grant-permission", "ro", "read", "ro"],
        &["user", "add", "u", "--new-user-password=upw"],
        &["user", "grant-role", "u", "rw"],
        &["user", "grant-role", "u", "ro"],
    ];
    for step in steps {
        ctl(endpoints, step).ok();
    }
    assert_lines(
        &ctl(endpoints, &["auth", "enable"]),
        &["Authentication Enabled"],
    );
}

/// A request carrying `token` in the gRPC metadata `token` (as clientv3 sends it).
pub(crate) fn authed<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("token", token.parse().expect("an ASCII token"));
    request
}

async fn channel(endpoint: &str) -> Channel {
    grpc::channel(endpoint, Duration::from_secs(10))
        .await
        .expect("connect")
}

pub(crate) async fn authenticate(
    endpoint: &str,
    name: &str,
    password: &str,
) -> Result<String, tonic::Status> {
    AuthClient::new(channel(endpoint).await)
        .authenticate(AuthenticateRequest {
            name: name.into(),
            password: password.into(),
        })
        .await
        .map(|r| r.into_inner().token)
}

async fn range(
    endpoint: &str,
    token: Option<&str>,
    key: &[u8],
    range_end: &[u8],
    serializable: bool,
) -> Result<keel_proto::etcdserverpb::RangeResponse, tonic::Status> {
    let req = RangeRequest {
        key: key.to_vec(),
        range_end: range_end.to_vec(),
        serializable,
        ..Default::default()
    };
    let request = match token {
        Some(t) => authed(req, t),
        None => tonic::Request::new(req),
    };
    KvClient::new(channel(endpoint).await)
        .range(request)
        .await
        .map(|r| r.into_inner())
}

// ---------------------------------------------------------------------------------- etcdctl

/// The etcdctl session every token kind must support: both `--user` forms, READ and WRITE
/// ranges, anonymous and denied requests with etcd's texts.
fn etcdctl_session(endpoint: &str) {
    set_up_users(endpoint);
    let user = "--user=u:upw";
    assert_lines(&ctl(endpoint, &[user, "put", "k/a", "1"]), &["OK"]);
    assert_lines(
        &ctl(endpoint, &["--user=u", "--password=upw", "get", "k/a"]),
        &["k/a", "1"],
    );
    assert_lines(
        &ctl(
            endpoint,
            &["--user", "u", "--password", "upw", "put", "k/b", "2"],
        ),
        &["OK"],
    );
    ctl(endpoint, &[user, "put", "ro", "x"]).fails_with("Error: etcdserver: permission denied");
    ctl(endpoint, &[user, "get", "other"]).fails_with("Error: etcdserver: permission denied");
    ctl(endpoint, &["get", "k/a"]).fails_with("Error: etcdserver: user name is empty");
    // etcdctl exits with 2 when it cannot authenticate (etcd's golden, conformance
    // auth/change_password).
    let out = ctl(endpoint, &["--user=u:wrong", "get", "k/a"]);
    assert_eq!(out.code, Some(2), "{out:#?}");
    assert_eq!(
        out.error_lines(),
        ["Error: etcdserver: authentication failed, invalid user ID or password"]
    );
    ctl(endpoint, &[user, "user", "list"]).fails_with("Error: etcdserver: permission denied");
    assert_lines(
        &ctl(endpoint, &[ROOT, "get", "k/", "--prefix", "--keys-only"]),
        &["k/a", "", "k/b", ""],
    );
    assert_lines(&ctl(endpoint, &[ROOT, "user", "list"]), &["root", "u"]);
    assert_lines(
        &ctl(endpoint, &[ROOT, "auth", "disable"]),
        &["Authentication Disabled"],
    );
    assert_lines(&ctl(endpoint, &["get", "k/a"]), &["k/a", "1"]);
}

#[test]
fn etcdctl_works_with_both_user_forms_and_simple_tokens() {
    let (_guard, keel) = member(&[]);
    etcdctl_session(&keel.endpoint());
}

/// A key pair made with openssl for `sign-method` `method` in `dir`: (private, public) paths.
fn jwt_keys(dir: &Path, method: &str) -> (PathBuf, PathBuf) {
    let (private, public) = (
        dir.join(format!("{method}.key")),
        dir.join(format!("{method}.pub")),
    );
    let gen_args: &[&str] = match method {
        "RS256" => &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
        "ES256" => &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
        other => panic!("no key recipe for {other}"),
    };
    let run = |args: &[&str]| {
        let status = std::process::Command::new("openssl")
            .args(args)
            .status()
            .expect("run openssl");
        assert!(status.success(), "openssl {args:?}: {status}");
    };
    let mut genpkey = vec!["genpkey"];
    genpkey.extend_from_slice(gen_args);
    genpkey.extend(["-out", private.to_str().unwrap()]);
    run(&genpkey);
    run(&[
        "pkey",
        "-in",
        private.to_str().unwrap(),
        "-pubout",
        "-out",
        public.to_str().unwrap(),
    ]);
    (private, public)
}

#[test]
fn etcdctl_works_with_both_user_forms_and_jwt_tokens() {
    let dir = tempfile::tempdir().unwrap();
    for method in ["RS256", "ES256"] {
        let (private, public) = jwt_keys(dir.path(), method);
        let option = format!(
            "jwt,pub-key={},priv-key={},sign-method={method},ttl=5m",
            public.display(),
            private.display()
        );
        let (_guard, keel) = member(&["--auth-token", &option]);
        etcdctl_session(&keel.endpoint());

        // A JWT whose signature was tampered with is refused.
        ctl(&keel.endpoint(), &[ROOT, "auth", "enable"]).ok();
        let rt = grpc::runtime();
        rt.block_on(async {
            let ep = keel.endpoint();
            let token = authenticate(&ep, "u", "upw").await.unwrap();
            assert_eq!(token.split('.').count(), 3, "a JWT: {token}");
            range(&ep, Some(&token), b"k/a", b"", false).await.unwrap();
            let mut forged = token.clone();
            let last = forged.pop().unwrap();
            forged.push(if last == 'A' { 'B' } else { 'A' });
            grpc::assert_fails_with(
                range(&ep, Some(&forged), b"k/a", b"", false).await,
                Code::Unauthenticated,
                "etcdserver: invalid auth token",
            );
        });
    }
}

// ---------------------------------------------------------------------------------- bad input

/// (auth revision, user list) as root sees them.
async fn auth_state(endpoint: &str, root: &str) -> (u64, Vec<String>) {
    let mut auth = AuthClient::new(channel(endpoint).await);
    let status = auth
        .auth_status(authed(AuthStatusRequest {}, root))
        .await
        .unwrap()
        .into_inner();
    let users = auth
        .user_list(authed(AuthUserListRequest {}, root))
        .await
        .unwrap()
        .into_inner()
        .users;
    (status.auth_revision, users)
}

#[test]
fn bad_input_answers_etcds_errors_and_changes_nothing() {
    let (_guard, keel) = member(&[]);
    let ep = keel.endpoint();
    set_up_users(&ep);
    grpc::runtime().block_on(async {
        let root = authenticate(&ep, "root", "rootpw").await.unwrap();
        let before = auth_state(&ep, &root).await;
        let mut auth = AuthClient::new(channel(&ep).await);
        let add = |name: &str| AuthUserAddRequest {
            name: name.into(),
            password: "pw".into(),
            ..Default::default()
        };
        grpc::assert_fails_with(
            auth.user_add(authed(add(""), &root)).await,
            Code::InvalidArgument,
            "etcdserver: user name is empty",
        );
        grpc::assert_fails_with(
            auth.user_add(authed(add("u"), &root)).await,
            Code::FailedPrecondition,
            "etcdserver: user name already exists",
        );
        grpc::assert_fails_with(
            auth.user_get(authed(
                AuthUserGetRequest {
                    name: "nobody".into(),
                },
                &root,
            ))
            .await,
            Code::FailedPrecondition,
            "etcdserver: user name not found",
        );
        grpc::assert_fails_with(
            auth.user_grant_role(authed(
                AuthUserGrantRoleRequest {
                    user: "u".into(),
                    role: "norole".into(),
                },
                &root,
            ))
            .await,
            Code::FailedPrecondition,
            "etcdserver: role name not found",
        );
        grpc::assert_fails_with(
            auth.user_delete(authed(
                AuthUserDeleteRequest {
                    name: "root".into(),
                },
                &root,
            ))
            .await,
            Code::InvalidArgument,
            "etcdserver: invalid auth management",
        );
        for (name, password) in [("u", "wrong"), ("nobody", "pw"), ("", "")] {
            grpc::assert_fails_with(
                authenticate(&ep, name, password).await,
                Code::InvalidArgument,
                "etcdserver: authentication failed, invalid user ID or password",
            );
        }
        // A forged simple token (its index is applied, its letters were never issued).
        grpc::assert_fails_with(
            range(&ep, Some("abcdefghijklmnop.3"), b"k/a", b"", false).await,
            Code::Unauthenticated,
            "etcdserver: invalid auth token",
        );
        // A non-admin managing users.
        let u = authenticate(&ep, "u", "upw").await.unwrap();
        grpc::assert_fails_with(
            auth.user_add(authed(add("v"), &u)).await,
            Code::PermissionDenied,
            "etcdserver: permission denied",
        );
        assert_eq!(
            auth_state(&ep, &root).await,
            before,
            "a refused request changed nothing"
        );
    });
}

#[test]
fn simple_tokens_expire_after_their_ttl_without_use() {
    let (_guard, keel) = member(&["--auth-token-ttl", "1"]);
    let ep = keel.endpoint();
    set_up_users(&ep);
    grpc::runtime().block_on(async {
        let token = authenticate(&ep, "u", "upw").await.unwrap();
        range(&ep, Some(&token), b"k/a", b"", false).await.unwrap();
        tokio::time::sleep(Duration::from_millis(2500)).await;
        grpc::assert_fails_with(
            range(&ep, Some(&token), b"k/a", b"", false).await,
            Code::Unauthenticated,
            "etcdserver: invalid auth token",
        );
        // A watch create with it is refused with that reason, so clients authenticate again
        // (etcd 3.6 `isWatchPermitted`, not `permission denied`).
        let ch = grpc::stream_channel(&ep).await;
        let (_tx, _responses, refused) =
            crate::auth_permissions::first_watch_answer(&ch, "k/a", Some(&token))
                .await
                .unwrap();
        assert!(refused.canceled, "{refused:?}");
        assert_eq!(
            refused.cancel_reason,
            "rpc error: code = Unauthenticated desc = etcdserver: invalid auth token"
        );
    });
}

// ---------------------------------------------------------------------------------- parallel

/// 16 Authenticates at once must overlap (bcrypt runs outside every lock, on the blocking
/// pool): on 2 free cores they take about 8 single ones; run one after another (or under one
/// lock) they would take 16.
///
/// Two checks. (1) Always: the calls run together, so the first of the 16 answers only late
/// in the run; under one lock it would answer after about 1/16 of it. This holds whatever
/// else the box runs. (2) When the box is not oversubscribed (1-minute load average at most
/// its core count), the wall time is under 12 single calls. Under heavy foreign load a
/// session's CPU share, not the server, bounds the parallel run, so (2) is then reported
/// and not asserted.
#[test]
fn parallel_authenticates_finish_well_under_sixteen_serial_ones() {
    let (_alone, cluster) = cluster(1, &[]);
    let ep = cluster.members[0].endpoint();
    set_up_users(&ep);
    let quiet = || {
        let load: f64 = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        (load <= cores, load)
    };
    grpc::runtime().block_on(async {
        authenticate(&ep, "u", "upw").await.unwrap(); // warm-up
        // Other work on the box only slows a round down: the best of three rounds is the
        // closest to what the server itself allows.
        let (mut best, mut best_first) = (f64::MAX, 0.0f64);
        for round in 0..3 {
            const SERIAL: u32 = 8;
            let start = Instant::now();
            for _ in 0..SERIAL {
                authenticate(&ep, "u", "upw").await.unwrap();
            }
            let one = start.elapsed() / SERIAL;
            let start = Instant::now();
            let tasks: Vec<_> = (0..16)
                .map(|_| {
                    let ep = ep.clone();
                    tokio::spawn(async move {
                        authenticate(&ep, "u", "upw").await.map(|_| start.elapsed())
                    })
                })
                .collect();
            let mut done = Vec::new();
            for t in tasks {
                done.push(t.await.unwrap().unwrap());
            }
            let sixteen = start.elapsed();
            let first = done.iter().min().unwrap().as_secs_f64() / sixteen.as_secs_f64();
            let ratio = sixteen.as_secs_f64() / one.as_secs_f64();
            eprintln!(
                "Authenticate round {round}: one {:.1} ms (mean of {SERIAL} serial), 16 in \
                 parallel {:.1} ms = {ratio:.1} x one, first answer at {:.0}% of the run, \
                 load average {:.1}",
                one.as_secs_f64() * 1e3,
                sixteen.as_secs_f64() * 1e3,
                first * 100.0,
                quiet().1
            );
            best = best.min(ratio);
            best_first = best_first.max(first);
            if best < 12.0 && best_first > 0.3 {
                break;
            }
        }
        assert!(
            best_first > 0.3,
            "the 16 Authenticates did not overlap: the first answered at {:.0}% of the run",
            best_first * 100.0
        );
        match quiet() {
            (true, _) => assert!(
                best < 12.0,
                "16 parallel Authenticates took {best:.1} x one serial one (best of 3 rounds)"
            ),
            (false, load) => eprintln!(
                "load average {load:.1}: the < 12 x bound ({best:.1} x measured) is not asserted"
            ),
        }
    });
}

// ---------------------------------------------------------------------------------- cluster

/// A txn that puts `key` (as clientv3 sends a `txn` with one success op).
fn put_txn(key: &str) -> TxnRequest {
    TxnRequest {
        success: vec![RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: key.as_bytes().to_vec(),
                value: b"v".to_vec(),
                ..Default::default()
            })),
        }],
        ..Default::default()
    }
}

/// What one writer saw: keys whose txn was acknowledged, keys whose txn was refused with
/// `permission denied`.
#[derive(Default)]
struct Outcomes {
    acked: BTreeSet<String>,
    refused: BTreeSet<String>,
}

/// Writes `count` txns as `user` through `endpoint`, re-authenticating when the token goes
/// stale and retrying a request refused for an old auth revision.
async fn write_txns(endpoint: String, user: &'static str, count: usize) -> Outcomes {
    let mut kv = KvClient::new(channel(&endpoint).await);
    let mut token = authenticate(&endpoint, user, "upw").await.unwrap();
    let mut out = Outcomes::default();
    for i in 0..count {
        let key = format!("k/{user}/{i:04}");
        for attempt in 0.. {
            assert!(attempt < 20, "{key}: too many retries");
            match kv.txn(authed(put_txn(&key), &token)).await {
                Ok(_) => {
                    out.acked.insert(key.clone());
                    break;
                }
                Err(s) if s.message() == "etcdserver: permission denied" => {
                    out.refused.insert(key.clone());
                    break;
                }
                Err(s) if s.message() == "etcdserver: revision of auth store is old" => {}
                Err(s) if s.message() == "etcdserver: invalid auth token" => {
                    token = authenticate(&endpoint, user, "upw").await.unwrap();
                }
                Err(s) => panic!("{key}: {s:?}"),
            }
        }
    }
    out
}

/// Every running member's keys under `k/` (serializable, as root), once all report the
/// same revision; and that revision.
fn keys_everywhere(cluster: &Cluster, root_pw: &str) -> (i64, Vec<BTreeSet<String>>) {
    grpc::runtime().block_on(async {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut revisions = BTreeSet::new();
            let mut keys = Vec::new();
            for i in cluster.running() {
                let ep = cluster.members[i].endpoint();
                let root = authenticate(&ep, "root", root_pw).await.unwrap();
                let resp = range(&ep, Some(&root), b"k/", b"k0", true).await.unwrap();
                revisions.insert(resp.header.unwrap().revision);
                keys.push(
                    resp.kvs
                        .iter()
                        .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
                        .collect(),
                );
            }
            if revisions.len() == 1 {
                return (*revisions.first().unwrap(), keys);
            }
            assert!(
                Instant::now() < deadline,
                "members never met: {revisions:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// HashKV of every running member at `revision`, as root.
fn hashes(cluster: &Cluster, revision: i64) -> Vec<u32> {
    grpc::runtime().block_on(async {
        let mut out = Vec::new();
        for i in cluster.running() {
            let ep = cluster.members[i].endpoint();
            let root = authenticate(&ep, "root", "rootpw").await.unwrap();
            let resp = MaintenanceClient::new(channel(&ep).await)
                .hash_kv(authed(HashKvRequest { revision }, &root))
                .await
                .unwrap()
                .into_inner();
            out.push(resp.hash);
        }
        out
    })
}

/// Every member holds the same keys, with every acknowledged write and no refused one, and
/// the same HashKV.
#[track_caller]
fn assert_members_agree(cluster: &Cluster, outcomes: &Outcomes) {
    let (revision, keys) = keys_everywhere(cluster, "rootpw");
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(k, &keys[0], "member {i} holds other keys than member 0");
    }
    assert!(
        outcomes.acked.is_subset(&keys[0]),
        "an acknowledged write is missing"
    );
    assert!(
        outcomes.refused.is_disjoint(&keys[0]),
        "a write refused to its client was applied"
    );
    let h = hashes(cluster, revision);
    assert!(h.iter().all(|x| *x == h[0]), "HashKV differs: {h:?}");
}

#[test]
fn members_agree_on_permissions_changed_under_txn_writers_through_kill9() {
    let (_alone, mut cluster) = cluster(3, &[]);
    let leader = cluster.leader(Duration::from_secs(15));
    let all = cluster.endpoints();
    set_up_users(&all);
    ctl(&all, &[ROOT, "user", "add", "w", "--new-user-password=upw"]).ok();
    ctl(&all, &[ROOT, "user", "grant-role", "w", "rw"]).ok();

    // Two users write txns (through different members) while root revokes and grants the
    // permission they write under.
    let rt = grpc::runtime();
    let writers: Vec<_> = [("u", 0), ("w", 1)]
        .into_iter()
        .map(|(user, m)| rt.spawn(write_txns(cluster.members[m].endpoint(), user, 150)))
        .collect();
    for _ in 0..4 {
        std::thread::sleep(Duration::from_millis(150));
        ctl(
            &all,
            &[ROOT, "role", "revoke-permission", "rw", "k/", "--prefix"],
        )
        .ok();
        std::thread::sleep(Duration::from_millis(150));
        ctl(&all, &[&[ROOT][..], &GRANT_RW].concat()).ok();
    }
    let mut outcomes = Outcomes::default();
    for w in writers {
        let o = rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(120), w).await })
            .expect("writers finish")
            .unwrap();
        outcomes.acked.extend(o.acked);
        outcomes.refused.extend(o.refused);
    }
    assert!(!outcomes.acked.is_empty(), "some writes were accepted");
    eprintln!(
        "writes: {} acknowledged, {} refused",
        outcomes.acked.len(),
        outcomes.refused.len()
    );
    assert_members_agree(&cluster, &outcomes);

    let follower = (0..3).find(|i| *i != leader).unwrap();
    cluster.members[follower].kill9();
    ctl(
        &cluster.endpoints(),
        &["--user=u:upw", "put", "k/after-follower-kill", "1"],
    )
    .ok();
    outcomes.acked.insert("k/after-follower-kill".into());
    cluster.members[follower].restart();
    assert_members_agree(&cluster, &outcomes);

    for m in &mut cluster.members {
        m.kill9();
    }
    for m in &mut cluster.members {
        m.spawn();
    }
    cluster.wait_ready(&[0, 1, 2]);
    assert_members_agree(&cluster, &outcomes);
    // Permissions survived the restart the same way on every member.
    for m in &cluster.members {
        ctl(
            &m.endpoint(),
            &["--user=u:upw", "get", "other", "--consistency=s"],
        )
        .fails_with("Error: etcdserver: permission denied");
        assert_lines(
            &ctl(
                &m.endpoint(),
                &[
                    "--user=u:upw",
                    "get",
                    "k/after-follower-kill",
                    "--consistency=s",
                ],
            ),
            &["k/after-follower-kill", "1"],
        );
    }
}

/// Maintenance.Status of `endpoint` as `token`.
async fn status(
    endpoint: &str,
    token: &str,
) -> Result<keel_proto::etcdserverpb::StatusResponse, tonic::Status> {
    MaintenanceClient::new(channel(endpoint).await)
        .status(authed(StatusRequest {}, token))
        .await
        .map(|r| r.into_inner())
}

#[test]
fn a_learner_that_joins_from_a_snapshot_enforces_the_same_permissions() {
    let (_alone, mut cluster) = cluster(
        1,
        &[
            "--snapshot-count",
            "40",
            "--experimental-snapshot-catchup-entries",
            "5",
        ],
    );
    let ep0 = cluster.members[0].endpoint();
    set_up_users(&ep0);
    let rt = grpc::runtime();
    rt.block_on(async {
        let root = authenticate(&ep0, "root", "rootpw").await.unwrap();
        let mut kv = KvClient::new(channel(&ep0).await);
        for i in 0..120 {
            let put = PutRequest {
                key: format!("k/{i:03}").into_bytes(),
                value: b"v".to_vec(),
                ..Default::default()
            };
            kv.put(authed(put, &root)).await.unwrap();
        }
    });
    let ports = Cluster::reserve_ports();
    let peer = format!("http://127.0.0.1:{}", ports.1);
    ctl(
        &ep0,
        &[
            ROOT,
            "member",
            "add",
            "m2",
            "--learner",
            &format!("--peer-urls={peer}"),
        ],
    )
    .ok();
    let m2 = cluster.join("m2", ports);
    let ep2 = cluster.members[m2].endpoint();
    rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            let root = authenticate(&ep0, "root", "rootpw").await.unwrap();
            let committed = status(&ep0, &root).await.unwrap().raft_index;
            // Tokens are issued by the voter; the learner accepts them once it applied their
            // entry (a learner refuses Authenticate, which needs a linearizable read).
            if status(&ep2, &root)
                .await
                .is_ok_and(|s| s.raft_applied_index >= committed)
            {
                break;
            }
            assert!(Instant::now() < deadline, "the learner did not catch up");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    assert!(
        cluster.members[m2].wait_for_log("installed a snapshot", Duration::from_secs(10)),
        "{}",
        cluster.members[m2].log_tail()
    );
    rt.block_on(async {
        let u = authenticate(&ep0, "u", "upw").await.unwrap();
        for ep in [&ep0, &ep2] {
            let got = range(ep, Some(&u), b"k/", b"k0", true).await.unwrap();
            assert_eq!(got.count, 120, "{ep}");
            grpc::assert_fails_with(
                range(ep, Some(&u), b"secret", b"", true).await,
                Code::PermissionDenied,
                "etcdserver: permission denied",
            );
            grpc::assert_fails_with(
                range(ep, None, b"k/001", b"", true).await,
                Code::InvalidArgument,
                "etcdserver: user name is empty",
            );
        }
    });
}

/// The shared conformance suite (`../shared/conformance` beside the repository).
fn conformance_runner() -> PathBuf {
    let shared = std::env::var_os("KEEL_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared"));
    let run = shared.join("conformance/run.py");
    assert!(run.exists(), "no conformance suite at {}", run.display());
    run
}

#[test]
fn conformance_auth_cases_pass_through_a_follower() {
    let (_alone, cluster) = cluster(3, &[]);
    let leader = cluster.leader(Duration::from_secs(15));
    let follower = (0..3).find(|i| *i != leader).unwrap();
    let out = std::process::Command::new("python3")
        .arg(conformance_runner())
        .args([
            "--endpoints",
            &cluster.members[follower].endpoint(),
            "--filter",
            "/auth/",
        ])
        .output()
        .expect("run the conformance suite");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        out.status.success() && last.ends_with(" 0 failed") && !last.starts_with("0 passed"),
        "conformance through a follower: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Lease expiry is issued by the leader without credentials and applies with root authority
/// (etcd #11689): a lease holding a key only root may write still expires and deletes it.
#[test]
fn leases_expire_with_root_authority_while_auth_is_enabled() {
    let (_guard, keel) = member(&[]);
    let ep = keel.endpoint();
    set_up_users(&ep);
    let lease = ctl(&ep, &[ROOT, "lease", "grant", "2"]);
    lease.ok();
    let id = lease.lines()[0]
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_string();
    assert_lines(
        &ctl(&ep, &[ROOT, "put", "secret", "x", &format!("--lease={id}")]),
        &["OK"],
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let got = ctl(&ep, &[ROOT, "get", "secret"]);
        if got.ok().lines().is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the lease never expired: {got:#?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}
