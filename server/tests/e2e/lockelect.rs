//! The Lock and Election services (v3lockpb, v3electionpb) end to end, through the
//! generated gRPC clients and the real `etcdctl lock` / `etcdctl elect` (docs/lock-election.md).
//!
//! What is pinned: mutual exclusion among 16 contenders (each holder's write is fenced by a
//! Txn on its lock key, and no two hold at once), wake-up in queue order, a holder's lease
//! expiry handing the lock on, the re-check after waiting (a waiter whose key vanished gets
//! `mutex: session is expired`, never the lock: etcd-io/etcd#11456), Observe's order, the
//! election errors with etcd's texts, the auth checks of the KV path.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use keel_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use keel_proto::etcdserverpb::kv_client::KvClient;
use keel_proto::etcdserverpb::lease_client::LeaseClient;
use keel_proto::etcdserverpb::request_op::Request as Op;
use keel_proto::etcdserverpb::{
    Compare, DeleteRangeRequest, LeaseGrantRequest, LeaseRevokeRequest, PutRequest, RangeRequest,
    RequestOp, TxnRequest,
};
use keel_proto::v3electionpb::election_client::ElectionClient;
use keel_proto::v3electionpb::{
    CampaignRequest, CampaignResponse, LeaderKey, LeaderRequest, ProclaimRequest, ResignRequest,
};
use keel_proto::v3lockpb::lock_client::LockClient;
use keel_proto::v3lockpb::{LockRequest, LockResponse, UnlockRequest};
use keel_testkit::etcdctl::{self, etcdctl};
use keel_testkit::grpc::{self, runtime};
use keel_testkit::process::KillOnDrop;
use tonic::Code;
use tonic::transport::Channel;

use crate::auth::{authed, authenticate, set_up_users};
use crate::{cluster, member};

/// etcd 3.5's `concurrency.ErrSessionExpired`, Keel's answer when a waiter's key vanished.
const SESSION_EXPIRED: &str = "mutex: session is expired";
/// Bound of every single wait in these tests.
const WAIT: Duration = Duration::from_secs(15);

async fn kv(endpoint: &str) -> KvClient<Channel> {
    KvClient::new(grpc::stream_channel(endpoint).await)
}

async fn grant(endpoint: &str, ttl: i64) -> i64 {
    grpc::lease(endpoint, grpc::RPC_TIMEOUT)
        .await
        .lease_grant(LeaseGrantRequest { ttl, id: 0 })
        .await
        .expect("lease grant")
        .into_inner()
        .id
}

async fn revoke(endpoint: &str, id: i64) {
    LeaseClient::new(grpc::stream_channel(endpoint).await)
        .lease_revoke(LeaseRevokeRequest { id })
        .await
        .expect("lease revoke");
}

fn lock_request(name: &str, lease: i64) -> LockRequest {
    LockRequest {
        name: name.into(),
        lease,
    }
}

async fn lock(client: &mut LockClient<Channel>, name: &str, lease: i64) -> LockResponse {
    tokio::time::timeout(WAIT, client.lock(lock_request(name, lease)))
        .await
        .unwrap_or_else(|_| panic!("lock {name} took more than {WAIT:?}"))
        .unwrap_or_else(|s| panic!("lock {name}: {s:?}"))
        .into_inner()
}

async fn unlock(client: &mut LockClient<Channel>, key: &[u8]) {
    client
        .unlock(UnlockRequest { key: key.to_vec() })
        .await
        .expect("unlock");
}

/// Keys under `prefix`, oldest first (by create revision).
async fn queue(endpoint: &str, prefix: &str) -> Vec<(String, i64)> {
    let mut kvs = kv(endpoint)
        .await
        .range(RangeRequest {
            key: prefix.into(),
            range_end: grpc::prefix_end(prefix.as_bytes()),
            ..Default::default()
        })
        .await
        .expect("range")
        .into_inner()
        .kvs;
    kvs.sort_by_key(|kv| kv.create_revision);
    kvs.into_iter()
        .map(|kv| (String::from_utf8(kv.key).unwrap(), kv.create_revision))
        .collect()
}

/// Polls until `prefix` holds `n` keys.
async fn wait_queue_len(endpoint: &str, prefix: &str, n: usize) {
    let start = Instant::now();
    while queue(endpoint, prefix).await.len() != n {
        assert!(start.elapsed() < WAIT, "{prefix} never held {n} keys");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn key_of(prefix: &str, lease: i64) -> Vec<u8> {
    format!("{prefix}{lease:x}").into_bytes()
}

/// The Txn a holder fences its write with: the counter moves from `seen` (its mod revision)
/// to `value` only while `lock_key` still has create revision `fence`.
fn fenced_increment(lock_key: &[u8], fence: i64, seen: i64, value: i64) -> TxnRequest {
    TxnRequest {
        compare: vec![
            Compare {
                result: CompareResult::Equal as i32,
                target: CompareTarget::Create as i32,
                key: lock_key.to_vec(),
                target_union: Some(TargetUnion::CreateRevision(fence)),
                ..Default::default()
            },
            Compare {
                result: CompareResult::Equal as i32,
                target: CompareTarget::Mod as i32,
                key: b"counter".to_vec(),
                target_union: Some(TargetUnion::ModRevision(seen)),
                ..Default::default()
            },
        ],
        success: vec![RequestOp {
            request: Some(Op::RequestPut(PutRequest {
                key: b"counter".to_vec(),
                value: value.to_string().into_bytes(),
                ..Default::default()
            })),
        }],
        failure: vec![],
    }
}

/// 16 contenders on `endpoints` (round robin), `rounds` acquisitions each: every holder
/// reads the counter and writes counter + 1 fenced by its lock key; no two hold at once.
/// Returns the lock keys' create revisions in acquisition order.
async fn contend(endpoints: &[String], rounds: usize) -> Vec<i64> {
    const CONTENDERS: usize = 16;
    let holding = Arc::new(AtomicBool::new(false));
    let fences = Arc::new(std::sync::Mutex::new(Vec::new()));
    let acquisitions = Arc::new(AtomicI64::new(0));
    let mut tasks = Vec::new();
    for c in 0..CONTENDERS {
        let endpoint = endpoints[c % endpoints.len()].clone();
        let (holding, fences, acquisitions) =
            (holding.clone(), fences.clone(), acquisitions.clone());
        tasks.push(tokio::spawn(async move {
            let lease = grant(&endpoint, 60).await;
            let mut locks = grpc::lock(&endpoint).await;
            let mut kv = kv(&endpoint).await;
            for _ in 0..rounds {
                let held = lock(&mut locks, "mx", lease).await;
                assert_eq!(held.key, key_of("mx/", lease));
                assert!(
                    !holding.swap(true, Ordering::SeqCst),
                    "two contenders hold the lock at once"
                );
                let counter = kv
                    .range(RangeRequest {
                        key: b"counter".to_vec(),
                        ..Default::default()
                    })
                    .await
                    .expect("range counter")
                    .into_inner();
                let (seen, value) = counter.kvs.first().map_or((0, 0), |kv| {
                    let v = std::str::from_utf8(&kv.value).unwrap().parse().unwrap();
                    (kv.mod_revision, v)
                });
                let fence = queue(&endpoint, "mx/").await[0].1;
                let txn = kv
                    .txn(fenced_increment(&held.key, fence, seen, value + 1))
                    .await
                    .expect("fenced txn")
                    .into_inner();
                assert!(txn.succeeded, "the holder's fenced write failed");
                fences.lock().unwrap().push(fence);
                acquisitions.fetch_add(1, Ordering::SeqCst);
                holding.store(false, Ordering::SeqCst);
                unlock(&mut locks, &held.key).await;
            }
        }));
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(120), task)
            .await
            .expect("contenders finish within 120 s")
            .expect("a contender panicked");
    }
    let counter = kv(&endpoints[0])
        .await
        .range(RangeRequest {
            key: b"counter".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let total: i64 = std::str::from_utf8(&counter.kvs[0].value)
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(total, acquisitions.load(Ordering::SeqCst));
    assert_eq!(total, (CONTENDERS * rounds) as i64);
    fences.lock().unwrap().clone()
}

#[test]
fn lock_mutual_exclusion_16_contenders() {
    let (_guard, keel) = member(&[]);
    runtime().block_on(async {
        let fences = contend(&[keel.endpoint()], 4).await;
        assert_eq!(fences.len(), 64);
        // Fencing tokens (create revisions) grow with every acquisition.
        assert!(
            fences.windows(2).all(|w| w[0] < w[1]),
            "fences not increasing: {fences:?}"
        );
        assert!(queue(&keel.endpoint(), "mx/").await.is_empty());
    });
}

#[test]
fn lock_mutual_exclusion_across_members() {
    let (_alone, cluster) = cluster(3, &[]);
    let endpoints: Vec<String> = cluster.endpoints().split(',').map(str::to_string).collect();
    runtime().block_on(async {
        let fences = contend(&endpoints, 2).await;
        assert_eq!(fences.len(), 32);
        assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    });
}

#[test]
fn lock_wakes_waiters_in_queue_order() {
    let (_guard, keel) = member(&[]);
    let endpoint = keel.endpoint();
    runtime().block_on(async {
        let holder_lease = grant(&endpoint, 60).await;
        let mut holder = grpc::lock(&endpoint).await;
        let held = lock(&mut holder, "q", holder_lease).await;
        let (tx, mut woken) = tokio::sync::mpsc::unbounded_channel();
        let mut leases = Vec::new();
        for w in 0..4 {
            let lease = grant(&endpoint, 60).await;
            leases.push(lease);
            let (ep, tx) = (endpoint.clone(), tx.clone());
            tokio::spawn(async move {
                let mut client = grpc::lock(&ep).await;
                let got = lock(&mut client, "q", lease).await;
                tx.send((w, got.key.clone())).unwrap();
                unlock(&mut client, &got.key).await;
            });
            // Queued (its key exists) before the next one starts.
            wait_queue_len(&endpoint, "q/", w + 2).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            woken.try_recv().is_err(),
            "a waiter got the lock while it was held"
        );
        unlock(&mut holder, &held.key).await;
        for (w, lease) in leases.iter().enumerate() {
            let (got, key) = tokio::time::timeout(WAIT, woken.recv())
                .await
                .expect("next waiter woken")
                .unwrap();
            assert_eq!((got, key), (w, key_of("q/", *lease)));
        }
    });
}

#[test]
fn lock_released_when_the_holders_lease_expires() {
    let (_guard, keel) = member(&[]);
    let endpoint = keel.endpoint();
    runtime().block_on(async {
        let short = grant(&endpoint, 3).await;
        let long = grant(&endpoint, 60).await;
        let mut client = grpc::lock(&endpoint).await;
        let held = lock(&mut client, "exp", short).await;
        let start = Instant::now();
        let got = lock(&mut client, "exp", long).await;
        let waited = start.elapsed();
        assert_eq!(got.key, key_of("exp/", long));
        assert!(
            waited >= Duration::from_millis(1500) && waited < Duration::from_secs(10),
            "the lock passed on after {waited:?} (TTL 3 s, never kept alive)"
        );
        let left = queue(&endpoint, "exp/").await;
        assert_eq!(left.len(), 1, "{left:?}");
        assert_eq!(left[0].0.as_bytes(), got.key.as_slice());
        assert_ne!(held.key, got.key);
    });
}

#[test]
fn lock_waiter_whose_lease_is_revoked_gets_an_error() {
    let (_guard, keel) = member(&[]);
    let endpoint = keel.endpoint();
    runtime().block_on(async {
        let holder_lease = grant(&endpoint, 60).await;
        let waiter_lease = grant(&endpoint, 60).await;
        let mut holder = grpc::lock(&endpoint).await;
        let held = lock(&mut holder, "rc", holder_lease).await;
        let ep = endpoint.clone();
        let waiter = tokio::spawn(async move {
            let mut client = grpc::lock(&ep).await;
            client.lock(lock_request("rc", waiter_lease)).await
        });
        wait_queue_len(&endpoint, "rc/", 2).await;
        revoke(&endpoint, waiter_lease).await;
        let answer = tokio::time::timeout(WAIT, waiter)
            .await
            .expect("the waiter answers once its key is gone")
            .unwrap();
        let status = answer.expect_err("a waiter without a key must not get the lock");
        assert_eq!(
            (status.code(), status.message()),
            (Code::Unknown, SESSION_EXPIRED)
        );
        // The holder still holds it, alone.
        let left = queue(&endpoint, "rc/").await;
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].0.as_bytes(), held.key.as_slice());
    });
}

/// The case etcd 3.4 answers with success (#11456): the waiter's key and the holder's go in
/// the same revision, so the wait ends because the holder went. Keel's re-check sees the
/// waiter's key gone.
#[test]
fn lock_recheck_after_wait_when_both_keys_go_at_once() {
    let (_guard, keel) = member(&[]);
    let endpoint = keel.endpoint();
    runtime().block_on(async {
        let holder_lease = grant(&endpoint, 60).await;
        let waiter_lease = grant(&endpoint, 60).await;
        let mut holder = grpc::lock(&endpoint).await;
        let held = lock(&mut holder, "both", holder_lease).await;
        let ep = endpoint.clone();
        let waiter = tokio::spawn(async move {
            grpc::lock(&ep)
                .await
                .lock(lock_request("both", waiter_lease))
                .await
        });
        wait_queue_len(&endpoint, "both/", 2).await;
        let delete = |key: Vec<u8>| RequestOp {
            request: Some(Op::RequestDeleteRange(DeleteRangeRequest {
                key,
                ..Default::default()
            })),
        };
        let txn = kv(&endpoint)
            .await
            .txn(TxnRequest {
                success: vec![
                    delete(held.key.clone()),
                    delete(key_of("both/", waiter_lease)),
                ],
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(txn.succeeded);
        let status = tokio::time::timeout(WAIT, waiter)
            .await
            .expect("the waiter answers")
            .unwrap()
            .expect_err("the waiter's key is gone: no lock");
        assert_eq!(
            (status.code(), status.message()),
            (Code::Unknown, SESSION_EXPIRED)
        );
        assert!(queue(&endpoint, "both/").await.is_empty());
    });
}

#[test]
fn lock_without_lease_gets_a_60s_session_lease_and_unlock_deletes() {
    let (_guard, keel) = member(&[]);
    let endpoint = keel.endpoint();
    runtime().block_on(async {
        let mut client = grpc::lock(&endpoint).await;
        let held = lock(&mut client, "s", 0).await;
        let key = String::from_utf8(held.key.clone()).unwrap();
        let lease = i64::from_str_radix(key.strip_prefix("s/").unwrap(), 16).unwrap();
        let ttl = grpc::lease(&endpoint, grpc::RPC_TIMEOUT)
            .await
            .lease_time_to_live(keel_proto::etcdserverpb::LeaseTimeToLiveRequest {
                id: lease,
                keys: true,
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(ttl.granted_ttl, 60);
        assert!(ttl.ttl > 55 && ttl.ttl <= 60, "{}", ttl.ttl);
        assert_eq!(ttl.keys, vec![held.key.clone()]);
        // Locking again with the same lease is the same acquisition.
        let again = lock(&mut client, "s", lease).await;
        assert_eq!(again.key, held.key);
        assert_eq!(queue(&endpoint, "s/").await.len(), 1);
        unlock(&mut client, &held.key).await;
        assert!(queue(&endpoint, "s/").await.is_empty());
        // A lease that does not exist: the Txn's put fails with etcd's error, with code
        // Unknown as etcd 3.4.23's Lock answers it (a Put answers NotFound).
        let status = client
            .lock(lock_request("s", 0x1234))
            .await
            .expect_err("unknown lease");
        assert_eq!(
            (status.code(), status.message()),
            (Code::Unknown, "etcdserver: requested lease not found")
        );
    });
}

#[test]
fn lock_abandoned_by_the_client_removes_its_key() {
    let (_guard, keel) = member(&[]);
    let endpoint = keel.endpoint();
    runtime().block_on(async {
        let mut holder = grpc::lock(&endpoint).await;
        let lease = grant(&endpoint, 60).await;
        lock(&mut holder, "ab", lease).await;
        let waiter_lease = grant(&endpoint, 60).await;
        let mut waiter = grpc::lock(&endpoint).await;
        let mut request = tonic::Request::new(lock_request("ab", waiter_lease));
        request.set_timeout(Duration::from_millis(800));
        let status = waiter.lock(request).await.expect_err("deadline");
        // The member answers etcd's DeadlineExceeded just before the deadline (api/deadline.rs);
        // tonic's client, ending the call at the deadline itself, may get there first.
        assert!(
            matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled),
            "{status:?}"
        );
        wait_queue_len(&endpoint, "ab/", 1).await;
    });
}

async fn campaign(
    client: &mut ElectionClient<Channel>,
    name: &str,
    lease: i64,
    value: &str,
) -> CampaignResponse {
    tokio::time::timeout(
        WAIT,
        client.campaign(CampaignRequest {
            name: name.into(),
            lease,
            value: value.into(),
        }),
    )
    .await
    .expect("campaign in time")
    .unwrap_or_else(|s| panic!("campaign: {s:?}"))
    .into_inner()
}

#[test]
fn election_observe_streams_leaders_in_order() {
    let (_guard, keel) = member(&[]);
    let endpoint = keel.endpoint();
    runtime().block_on(async {
        let mut client = grpc::election(&endpoint).await;
        let leader = client
            .leader(LeaderRequest { name: "E".into() })
            .await
            .expect_err("no candidate yet");
        assert_eq!(
            (leader.code(), leader.message()),
            (Code::Unknown, "election: no leader")
        );
        // Observe before anyone campaigns: it waits for the first candidate.
        let mut observe = client
            .observe(LeaderRequest { name: "E".into() })
            .await
            .unwrap()
            .into_inner();
        let (l1, l2) = (grant(&endpoint, 60).await, grant(&endpoint, 60).await);
        let first = campaign(&mut client, "E", l1, "v1").await;
        let lk1 = first.leader.clone().unwrap();
        assert_eq!(
            (lk1.name.as_slice(), lk1.key.clone(), lk1.lease),
            (&b"E"[..], key_of("E/", l1), l1)
        );
        assert_eq!(lk1.rev, first.header.as_ref().unwrap().revision);
        client
            .proclaim(ProclaimRequest {
                leader: Some(lk1.clone()),
                value: b"v1b".to_vec(),
            })
            .await
            .unwrap();
        let ep = endpoint.clone();
        let second =
            tokio::spawn(
                async move { campaign(&mut grpc::election(&ep).await, "E", l2, "v2").await },
            );
        wait_queue_len(&endpoint, "E/", 2).await;
        client
            .resign(ResignRequest {
                leader: Some(lk1.clone()),
            })
            .await
            .unwrap();
        let lk2 = second.await.unwrap().leader.unwrap();
        assert_eq!(lk2.key, key_of("E/", l2));
        let mut seen = Vec::new();
        let mut revisions = Vec::new();
        while seen.len() < 3 {
            let resp = tokio::time::timeout(WAIT, observe.message())
                .await
                .expect("observe in time")
                .unwrap()
                .expect("stream open");
            let kv = resp.kv.unwrap();
            revisions.push(resp.header.unwrap().revision);
            seen.push((
                String::from_utf8(kv.key).unwrap(),
                String::from_utf8(kv.value).unwrap(),
            ));
        }
        let k1 = format!("E/{l1:x}");
        let k2 = format!("E/{l2:x}");
        assert_eq!(
            seen,
            [
                (k1.clone(), "v1".into()),
                (k1, "v1b".into()),
                (k2, "v2".into())
            ]
        );
        assert!(revisions.windows(2).all(|w| w[0] < w[1]), "{revisions:?}");
        let now = client
            .leader(LeaderRequest { name: "E".into() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(now.kv.unwrap().value, b"v2");
        // The resigned leader can no longer proclaim.
        let stale = client
            .proclaim(ProclaimRequest {
                leader: Some(lk1),
                value: b"late".to_vec(),
            })
            .await
            .expect_err("resigned");
        assert_eq!(
            (stale.code(), stale.message()),
            (Code::Unknown, "election: not leader")
        );
        let missing = client
            .resign(ResignRequest { leader: None })
            .await
            .expect_err("no leader field");
        assert_eq!(missing.message(), "\"leader\" field must be provided");
        client
            .resign(ResignRequest { leader: Some(lk2) })
            .await
            .unwrap();
        assert!(queue(&endpoint, "E/").await.is_empty());
    });
}

#[test]
fn campaign_waiter_whose_lease_is_revoked_gets_an_error() {
    let (_guard, keel) = member(&[]);
    let endpoint = keel.endpoint();
    runtime().block_on(async {
        let (l1, l2) = (grant(&endpoint, 60).await, grant(&endpoint, 60).await);
        let mut client = grpc::election(&endpoint).await;
        let first = campaign(&mut client, "C", l1, "a").await;
        let ep = endpoint.clone();
        let second = tokio::spawn(async move {
            grpc::election(&ep)
                .await
                .campaign(CampaignRequest {
                    name: "C".into(),
                    lease: l2,
                    value: b"b".to_vec(),
                })
                .await
        });
        wait_queue_len(&endpoint, "C/", 2).await;
        revoke(&endpoint, l2).await;
        let status = tokio::time::timeout(WAIT, second)
            .await
            .expect("the candidate answers")
            .unwrap()
            .expect_err("a candidate without a key is no leader");
        assert_eq!(
            (status.code(), status.message()),
            (Code::Unknown, SESSION_EXPIRED)
        );
        let leader = client
            .leader(LeaderRequest { name: "C".into() })
            .await
            .unwrap()
            .into_inner()
            .kv
            .unwrap();
        assert_eq!(leader.key, first.leader.unwrap().key);
        // Campaigning again with a key that exists proclaims the new value.
        let again = campaign(&mut client, "C", l1, "a2").await;
        let LeaderKey { rev, .. } = again.leader.unwrap();
        assert_eq!(rev, leader.create_revision);
        let value = queue(&endpoint, "C/").await;
        assert_eq!(value.len(), 1);
    });
}

/// With auth on, Lock runs the KV checks as the caller: READWRITE on `k/` lets user `u`
/// lock `k/l`, not `other`.
#[test]
fn lock_goes_through_kv_permissions() {
    let (_guard, keel) = member(&[]);
    let endpoint = keel.endpoint();
    set_up_users(&endpoint);
    runtime().block_on(async {
        let token = authenticate(&endpoint, "u", "upw").await.unwrap();
        let mut client = grpc::lock(&endpoint).await;
        let held = client
            .lock(authed(lock_request("k/l", 0), &token))
            .await
            .expect("u may lock under k/")
            .into_inner();
        assert!(held.key.starts_with(b"k/l/"));
        client
            .unlock(authed(UnlockRequest { key: held.key }, &token))
            .await
            .expect("u may unlock under k/");
        let denied = client
            .lock(authed(lock_request("other", 0), &token))
            .await
            .expect_err("no permission on other/");
        // etcd 3.4.23 answers code Unknown here (its gateway: 500, `"code":2`), where a Put
        // outside the user's permissions answers PermissionDenied.
        assert_eq!(
            (denied.code(), denied.message()),
            (Code::Unknown, "etcdserver: permission denied")
        );
        let anonymous = client
            .lock(lock_request("k/l", 0))
            .await
            .expect_err("no credentials");
        assert_eq!(
            (anonymous.code(), anonymous.message()),
            (Code::Unknown, "etcdserver: user name is empty")
        );
    });
}

/// `etcdctl lock` and `etcdctl elect` (etcd 3.4.23's client-side recipes) against Keel.
#[test]
fn etcdctl_lock_and_elect() {
    let (_guard, keel) = member(&[]);
    let endpoint = keel.endpoint();
    let out = etcdctl(&endpoint, &["lock", "ctl", "echo", "inside"]);
    out.ok();
    assert_eq!(out.lines(), ["inside"]);
    assert!(queue_blocking(&endpoint, "ctl/").is_empty());
    // A campaigner stays leader until killed; `elect -l` prints the leader's key and value.
    let mut child = KillOnDrop(
        etcdctl::command(&endpoint, &["elect", "ctlE", "p1"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("etcdctl elect"),
    );
    let stdout = child.stdout.take().unwrap();
    let first_line = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .unwrap();
        line
    });
    let line = first_line.join().unwrap();
    assert!(line.starts_with("ctlE/"), "{line:?}");
    let mut observer = KillOnDrop(
        etcdctl::command(&endpoint, &["elect", "-l", "ctlE"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stdout = observer.stdout.take().unwrap();
    let lines = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut reader = std::io::BufReader::new(stdout);
        let mut lines = Vec::new();
        for _ in 0..2 {
            let mut l = String::new();
            reader.read_line(&mut l).unwrap();
            lines.push(l.trim_end().to_string());
        }
        lines
    })
    .join()
    .unwrap();
    assert_eq!(lines, [line.trim_end().to_string(), "p1".to_string()]);
}

fn queue_blocking(endpoint: &str, prefix: &str) -> Vec<(String, i64)> {
    runtime().block_on(queue(endpoint, prefix))
}

/// The server-side Lock through one member of a cluster while the holder is on another.
#[test]
fn lock_waits_on_a_follower_for_a_holder_on_another_member() {
    let (_alone, cluster) = cluster(3, &[]);
    let endpoints: Vec<String> = cluster.endpoints().split(',').map(str::to_string).collect();
    runtime().block_on(async {
        let mut a = grpc::lock(&endpoints[0]).await;
        let mut b = grpc::lock(&endpoints[1]).await;
        let la = grant(&endpoints[0], 60).await;
        let lb = grant(&endpoints[1], 60).await;
        let held = lock(&mut a, "f", la).await;
        let waiter = tokio::spawn(async move { lock(&mut b, "f", lb).await });
        wait_queue_len(&endpoints[2], "f/", 2).await;
        unlock(&mut a, &held.key).await;
        let got = tokio::time::timeout(WAIT, waiter).await.unwrap().unwrap();
        assert_eq!(got.key, key_of("f/", lb));
        assert!(got.header.unwrap().revision > held.header.unwrap().revision);
    });
}
