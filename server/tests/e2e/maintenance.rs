//! Maintenance on 3 real members (issue 15 part 1): alarms travel through raft and survive a
//! restart; CORRUPT refuses every write on every member while reads go on; the NOSPACE
//! scenario (a 16 MiB quota filled with 512 KiB puts, then delete, compact, defrag, disarm)
//! ends with puts working again.

use std::time::{Duration, Instant};

use keel_proto::etcdserverpb::alarm_request::AlarmAction;
use keel_proto::etcdserverpb::{AlarmRequest, AlarmResponse, AlarmType, PutRequest};
use keel_testkit::etcdctl::etcdctl;
use keel_testkit::grpc;
use tonic::Code;

use crate::cluster;

const NOSPACE: &str = "etcdserver: mvcc: database space exceeded";
const CORRUPT: &str = "etcdserver: corrupt cluster";

fn alarm(endpoint: &str, action: AlarmAction, member_id: u64, alarm: AlarmType) -> AlarmResponse {
    let endpoint = endpoint.to_string();
    grpc::block_on_thread(async move {
        grpc::maintenance(&endpoint)
            .await
            .alarm(AlarmRequest {
                action: action as i32,
                member_id,
                alarm: alarm as i32,
            })
            .await
            .map(|r| r.into_inner())
    })
    .unwrap()
    .unwrap_or_else(|s| panic!("alarm {action:?} {alarm:?}: {s:?}"))
}

fn put(endpoint: &str, key: &str, value: Vec<u8>) -> Result<(), tonic::Status> {
    let endpoint = endpoint.to_string();
    let key = key.as_bytes().to_vec();
    grpc::block_on_thread(async move {
        grpc::kv(&endpoint)
            .await
            .put(PutRequest {
                key,
                value,
                ..Default::default()
            })
            .await
            .map(|_| ())
    })
    .unwrap()
}

#[test]
fn a_corrupt_alarm_refuses_writes_on_every_member_and_survives_a_restart() {
    let (_alone, mut cluster) = cluster(3, &[]);
    let eps: Vec<String> = cluster.members.iter().map(|m| m.endpoint()).collect();
    etcdctl(&eps[0], &["put", "a", "1"]).ok();
    let raised = alarm(&eps[1], AlarmAction::Activate, 42, AlarmType::Corrupt);
    assert_eq!(raised.alarms.len(), 1);
    assert!(
        raised.header.is_none(),
        "etcd 3.4 answers Alarm without a header"
    );

    for ep in &eps {
        // Writes fail with DataLoss everywhere; reads and Status still work.
        grpc::assert_fails_with(put(ep, "b", b"2".to_vec()), Code::DataLoss, CORRUPT);
        etcdctl(ep, &["del", "a"]).fails_with(&format!("Error: {CORRUPT}"));
        etcdctl(ep, &["compaction", "1"]).fails_with(&format!("Error: {CORRUPT}"));
        etcdctl(ep, &["lease", "grant", "10"])
            .fails_with(&format!("Error: failed to grant lease ({CORRUPT})"));
        let got = etcdctl(ep, &["get", "a", "--print-value-only"]);
        assert_eq!(got.ok().lines(), ["1"]);
        let status = grpc::status(ep).unwrap();
        assert_eq!(status.errors, ["memberID:42 alarm:CORRUPT "]);
        let listed = etcdctl(ep, &["alarm", "list"]);
        assert_eq!(listed.ok().lines(), ["memberID:42 alarm:CORRUPT "]);
    }

    // The alarm is in every member's store: it is still raised after a restart.
    cluster.members[2].terminate();
    cluster.members[2].restart();
    let status = grpc::status(&eps[2]).unwrap();
    assert_eq!(status.errors, ["memberID:42 alarm:CORRUPT "]);
    grpc::assert_fails_with(put(&eps[2], "b", b"2".to_vec()), Code::DataLoss, CORRUPT);

    // Disarm (etcdctl lists, then deactivates each) and writes work again.
    let disarmed = etcdctl(&eps[2], &["alarm", "disarm"]);
    assert_eq!(disarmed.ok().lines(), ["memberID:42 alarm:CORRUPT "]);
    for ep in &eps {
        put(ep, "b", b"2".to_vec()).unwrap();
        assert!(grpc::status(ep).unwrap().errors.is_empty());
    }
    assert!(etcdctl(&eps[0], &["alarm", "list"]).ok().lines().is_empty());

    // Maintenance.Hash: once every member applied the same revision, they agree.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let hashes: Vec<(i64, u32)> = eps.iter().map(|ep| backend_hash(ep)).collect();
        if hashes.windows(2).all(|w| w[0] == w[1]) {
            break;
        }
        assert!(Instant::now() < deadline, "members disagree: {hashes:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `Maintenance.Hash` of `endpoint`: (header revision, hash).
fn backend_hash(endpoint: &str) -> (i64, u32) {
    let endpoint = endpoint.to_string();
    let r = grpc::block_on_thread(async move {
        grpc::maintenance(&endpoint)
            .await
            .hash(keel_proto::etcdserverpb::HashRequest {})
            .await
            .map(|r| r.into_inner())
    })
    .unwrap()
    .unwrap();
    (r.header.unwrap().revision, r.hash)
}

#[test]
fn nospace_fill_then_delete_compact_defrag_and_disarm_brings_puts_back() {
    const QUOTA: i64 = 16 << 20;
    let quota = QUOTA.to_string();
    let (_alone, cluster) = cluster(3, &["--quota-backend-bytes", &quota]);
    let eps: Vec<String> = cluster.members.iter().map(|m| m.endpoint()).collect();
    let all = cluster.endpoints();
    let value = vec![b'v'; 512 << 10];

    // Fill through every member in turn until the quota refuses a put. The bytes in use are
    // current to the last apply (LiveTree::in_use), and each put waits until the member it
    // went to applied it, so puts stop at the line (before, the figure was refreshed once a
    // second and a burst could write several times the quota; fresh-user finding).
    let mut written = 0;
    let refused = loop {
        assert!(written < 128, "no NOSPACE after {written} puts of 512 KiB");
        match put(
            &eps[written % 3],
            &format!("fill/{written:03}"),
            value.clone(),
        ) {
            Ok(()) => written += 1,
            Err(status) => break status,
        }
    };
    assert_eq!(
        (refused.code(), refused.message()),
        (Code::ResourceExhausted, NOSPACE)
    );
    // 32 puts fill the quota; a member may not yet have applied the last put or two that
    // another member acknowledged (a put waits only for its own member's apply), so its
    // figure can lag by that much. The figure refreshed once a second let 73 through.
    assert!(
        (16..=34).contains(&written),
        "{written} puts of 512 KiB went into a 16 MiB quota"
    );
    let raiser = cluster.member_id(written % 3).unwrap();
    let expected = format!("memberID:{raiser} alarm:NOSPACE ");

    // The alarm is raised through raft: every member refuses data, even a small put and a
    // lease grant, and lists the alarm; reads, deletes and compaction still work.
    let deadline = Instant::now() + Duration::from_secs(10);
    for ep in &eps {
        // (Each member whose own check fails raises its own NOSPACE too, as in etcd.)
        while !grpc::status(ep).unwrap().errors.contains(&expected) {
            assert!(Instant::now() < deadline, "{ep} does not list {expected}");
            std::thread::sleep(Duration::from_millis(50));
        }
        grpc::assert_fails_with(
            put(ep, "small", b"x".to_vec()),
            Code::ResourceExhausted,
            NOSPACE,
        );
        etcdctl(ep, &["lease", "grant", "10"])
            .fails_with(&format!("Error: failed to grant lease ({NOSPACE})"));
        let count = etcdctl(
            ep,
            &["get", "fill/", "--prefix", "--keys-only", "-w", "json"],
        );
        assert_eq!(count.json()["count"].as_i64(), Some(written as i64));
    }
    // Every member's bytes in use hold every value written (followers once they applied the
    // last put). Not "every member is at the quota": the figures of members holding the same
    // data differ, and now and then one member's is 3-4 MiB above the others' (it raises the
    // alarm a few puts early, at 29 of 512 KiB instead of 31), which made this check fail in
    // about 1 run of 4 on a loaded box (docs/operations.md, "Alarms").
    let holds_all = written as i64 * value.len() as i64;
    for ep in &eps {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let in_use = grpc::status(ep).unwrap().db_size_in_use;
            if in_use >= holds_all {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{ep}: in use {in_use} with {written} values of 512 KiB written"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let deleted = etcdctl(&eps[1], &["del", "fill/", "--prefix"]);
    assert_eq!(deleted.ok().lines(), [written.to_string()]);
    let rev = keel_testkit::etcdctl::revision(&eps[1]);
    etcdctl(&eps[2], &["compaction", &rev.to_string(), "--physical"]).ok();
    etcdctl(&all, &["defrag"]).ok();

    // Defragment measures the bytes in use again: the space is back on every member.
    for ep in &eps {
        let in_use = grpc::status(ep).unwrap().db_size_in_use;
        assert!(
            in_use < QUOTA / 4,
            "{ep}: {in_use} bytes in use after compact + defrag"
        );
    }
    // Still refused until the alarm is disarmed.
    grpc::assert_fails_with(
        put(&eps[0], "small", b"x".to_vec()),
        Code::ResourceExhausted,
        NOSPACE,
    );
    let disarmed = etcdctl(&eps[0], &["alarm", "disarm"]);
    let lines = disarmed.ok().lines();
    assert!(lines.contains(&expected.as_str()), "{lines:?}");
    assert!(
        lines.iter().all(|l| l.ends_with(" alarm:NOSPACE ")),
        "{lines:?}"
    );
    for (i, ep) in eps.iter().enumerate() {
        put(ep, &format!("after/{i}"), value.clone()).unwrap();
        assert!(grpc::status(ep).unwrap().errors.is_empty());
    }
    let count = etcdctl(
        &all,
        &["get", "after/", "--prefix", "--keys-only", "-w", "json"],
    );
    assert_eq!(count.json()["count"].as_i64(), Some(3));
}
