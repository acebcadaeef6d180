//! Leases with the real `etcdctl` against the real `keel` binary: `lease grant / revoke /
//! keep-alive / timetolive / list` and `put --lease`. Expected texts are etcd 3.4's (see
//! `../shared/conformance/cases/lease/`).

use std::process::Stdio;
use std::time::{Duration, Instant};

use keel_testkit::etcdctl::{self, CtlOutput, etcdctl};
use keel_testkit::process::KillOnDrop;
use keel_testkit::{Member, b64};
use serde_json::Value;

use crate::member;

const LEASE_NOT_FOUND: &str = "Error: etcdserver: requested lease not found";

fn ctl(keel: &Member, args: &[&str]) -> CtlOutput {
    etcdctl(&keel.endpoint(), args)
}

/// `lease grant <ttl> -w json` → (ID, TTL).
fn grant(keel: &Member, ttl: i64) -> (i64, i64) {
    let out = ctl(keel, &["lease", "grant", &ttl.to_string(), "-w", "json"]).json();
    (
        out["ID"].as_i64().expect("ID"),
        out["TTL"].as_i64().expect("TTL"),
    )
}

/// `lease timetolive <id> --keys -w json`.
fn time_to_live(keel: &Member, id: i64) -> Value {
    ctl(
        keel,
        &["lease", "timetolive", &hex(id), "--keys", "-w", "json"],
    )
    .json()
}

fn hex(id: i64) -> String {
    format!("{id:016x}")
}

fn keys(keel: &Member) -> Vec<String> {
    let out = ctl(keel, &["get", "", "--from-key", "--keys-only"]);
    out.ok();
    out.lines()
        .into_iter()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// Polls `cond` every 100 ms for up to `limit`; returns how long it took, or `None`.
fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

#[test]
fn grant_attach_timetolive_list_and_revoke() {
    let (_guard, keel) = member(&[]);
    lease_body(&keel);
}

/// The body of [`grant_attach_timetolive_list_and_revoke`] on any ready single member (also run over TLS by `tls.rs`).
pub(crate) fn lease_body(keel: &Member) {
    let (id, ttl) = grant(keel, 60);
    assert_eq!(ttl, 60);
    assert!(id > 0, "a generated lease ID is positive: {id}");
    let lease_flag = format!("--lease={}", hex(id));
    ctl(keel, &["put", "a", "1", &lease_flag]).ok();
    ctl(keel, &["put", "b", "2", &lease_flag]).ok();
    ctl(keel, &["put", "c", "3"]).ok();

    let t = time_to_live(keel, id);
    assert_eq!(t["granted-ttl"], 60, "{t}");
    let left = t["ttl"].as_i64().unwrap();
    assert!((57..=60).contains(&left), "remaining TTL {left}");
    assert_eq!(
        t["keys"],
        serde_json::json!([b64::encode("a"), b64::encode("b")]),
        "{t}"
    );

    let list = ctl(keel, &["lease", "list"]);
    assert_eq!(
        list.ok().lines(),
        vec!["found 1 leases".to_string(), hex(id)]
    );

    let before = etcdctl::revision(&keel.endpoint());
    let out = ctl(keel, &["lease", "revoke", &hex(id)]);
    assert_eq!(out.ok().lines(), vec![format!("lease {} revoked", hex(id))]);
    assert_eq!(
        etcdctl::revision(&keel.endpoint()),
        before + 1,
        "both keys go in one revision"
    );
    assert_eq!(keys(keel), vec!["c"]);
    let gone = ctl(keel, &["lease", "timetolive", &hex(id)]);
    assert_eq!(
        gone.ok().lines(),
        vec![format!("lease {} already expired", hex(id))]
    );
    ctl(keel, &["lease", "revoke", &hex(id)])
        .fails_with("Error: failed to revoke lease (etcdserver: requested lease not found)");
}

#[test]
fn grant_ttl_is_raised_to_the_minimum_and_capped_at_the_maximum() {
    let (_guard, keel) = member(&[]);
    // etcd's minimum with the default 100 ms heartbeat and 1000 ms election timeout: 2 s.
    assert_eq!(grant(&keel, 1).1, 2);
    let out = ctl(&keel, &["lease", "grant", "9000000001"]);
    assert_eq!(out.code, Some(1), "{out:#?}");
    assert!(
        out.stderr.contains("etcdserver: too large lease TTL"),
        "{out:#?}"
    );
}

#[test]
fn put_with_an_unknown_lease_fails_and_writes_nothing() {
    let (_guard, keel) = member(&[]);
    let before = etcdctl::revision(&keel.endpoint());
    ctl(&keel, &["put", "k", "v", "--lease=1234abcd"]).fails_with(LEASE_NOT_FOUND);
    assert_eq!(etcdctl::revision(&keel.endpoint()), before);
    assert!(keys(&keel).is_empty());
}

#[test]
fn keepalive_keeps_keys_and_expiry_deletes_them() {
    let (_guard, keel) = member(&[]);
    let (id, _) = grant(&keel, 3);
    ctl(
        &keel,
        &["put", "session", "x", &format!("--lease={}", hex(id))],
    )
    .ok();
    let once = ctl(&keel, &["lease", "keep-alive", "--once", &hex(id)]);
    assert_eq!(
        once.ok().lines(),
        vec![format!("lease {} keepalived with TTL(3)", hex(id))]
    );

    // A streaming keep-alive (etcdctl renews every TTL/3) keeps the key well past its TTL.
    let keeper = etcdctl::command(&keel.endpoint(), &["lease", "keep-alive", &hex(id)])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn etcdctl lease keep-alive");
    let keeper = KillOnDrop(keeper);
    std::thread::sleep(Duration::from_secs(6));
    let alive = keys(&keel);
    drop(keeper);
    assert_eq!(alive, vec!["session"], "the kept-alive lease expired");

    // Without keepalives the lease expires 3 s after the last one; its key goes with it.
    let stopped = Instant::now();
    let took = wait_until(Duration::from_secs(10), || keys(&keel).is_empty())
        .expect("expired lease kept its key");
    assert!(
        stopped.elapsed() >= Duration::from_secs(1),
        "expired too early ({took:?})"
    );
    let out = ctl(&keel, &["lease", "keep-alive", "--once", &hex(id)]);
    assert_eq!(out.code, Some(2), "{out:#?}");
    assert_eq!(out.error_lines(), vec![LEASE_NOT_FOUND]);
    assert_eq!(
        ctl(&keel, &["lease", "list"]).ok().lines(),
        vec!["found 0 leases"]
    );
}

#[test]
fn leases_and_attachments_survive_a_restart() {
    let (_guard, mut keel) = member(&[]);
    let (long, _) = grant(&keel, 600);
    let (short, _) = grant(&keel, 4);
    ctl(
        &keel,
        &["put", "long", "1", &format!("--lease={}", hex(long))],
    )
    .ok();
    ctl(
        &keel,
        &["put", "short", "2", &format!("--lease={}", hex(short))],
    )
    .ok();
    let status = keel.terminate();
    assert!(status.success(), "keel exited with {status}");
    keel.restart();

    let t = time_to_live(&keel, long);
    assert_eq!(t["granted-ttl"], 600, "{t}");
    assert_eq!(t["keys"], serde_json::json!([b64::encode("long")]), "{t}");
    // The short lease still expires after the restart (its TTL restarts on election).
    wait_until(Duration::from_secs(15), || keys(&keel) == vec!["long"])
        .expect("the short lease did not expire after a restart");
    ctl(&keel, &["lease", "revoke", &hex(long)]).ok();
    assert!(keys(&keel).is_empty());
}
