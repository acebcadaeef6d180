//! Disk faults (issue 18 parts 1–2; docs/wal.md, "Disk full and I/O errors"): a WAL write or
//! fdatasync that fails with EIO or ENOSPC fences the member (it exits with status 1 and
//! acknowledges nothing after the failure); a restart recovers every acknowledged write from
//! the WAL. ENOSPC also raises NOSPACE through the leader, which refuses puts until the
//! operator disarms it. One test fills a real (tmpfs) filesystem.

use std::process::Command;

use keel_proto::etcdserverpb::alarm_request::AlarmAction;
use keel_proto::etcdserverpb::{AlarmMember, AlarmRequest, AlarmType};
use keel_testkit::spec::MemberSpec;

use super::*;

/// Asserts that the member fenced itself at `failpoint`: it exited with status 1 (not a
/// signal) after the failpoint injected its error and the member logged why it stopped.
fn assert_fenced_at(keel: &mut Member, failpoint: &str) {
    let status = keel
        .wait_exit(CRASH_TIMEOUT)
        .unwrap_or_else(|| panic!("keel did not stop after {failpoint}\n{}", keel.log_tail()));
    assert_eq!(status.code(), Some(1), "{status}\n{}", keel.log_tail());
    let log = keel.log();
    assert!(
        log.contains(&format!(
            "keel: failpoint {failpoint} fired: injecting os error"
        )),
        "{}",
        keel.log_tail()
    );
    assert!(
        log.contains("stopping after a disk failure"),
        "{}",
        keel.log_tail()
    );
}

/// Arms `failpoint` to fire at its 21st pass, writes until the member fences itself, then
/// restarts it without failpoints and checks that every acknowledged put is there once.
fn fence_and_recover(failpoint: &str) {
    let mut keel = start_with_failpoints(&format!("{failpoint}=20*off->return"));
    let acked = write_until_crash(&keel.endpoint());
    assert_fenced_at(&mut keel, failpoint);
    assert!(
        !acked.is_empty(),
        "no write was acknowledged before the fault"
    );
    keel.set_failpoints(None);
    let before_restart = keel.log().len();
    keel.restart();
    if failpoint.starts_with("wal_write_") {
        // The injected short write left half a batch: recovery cut it.
        assert!(
            keel.log()[before_restart..].contains("cutting torn or unacknowledged WAL tail"),
            "{}",
            keel.log_tail()
        );
    }
    check_sequential_history(&keel.endpoint(), &acked);
}

#[test]
fn wal_write_eio_fences_the_member_and_recovers_every_acknowledged_write() {
    fence_and_recover("wal_write_eio");
}

#[test]
fn wal_fsync_eio_is_never_retried_and_recovers_every_acknowledged_write() {
    fence_and_recover("wal_fsync_eio");
}

#[test]
fn wal_write_enospc_leaves_a_tail_that_recovery_cuts() {
    fence_and_recover("wal_write_enospc");
}

#[test]
fn wal_fsync_enospc_fences_the_member_and_recovers_every_acknowledged_write() {
    fence_and_recover("wal_fsync_enospc");
}

/// A commit of apply groups to sled that fails part way (`backend_commit_partial`: the
/// first half of the batch's keys, its newest consistent index among them, reach the tree):
/// the member marks its tree damaged and stops; the next start rebuilds the tree (`how`:
/// `FromEmpty` or `FromSnapshot`, raft/rebuild.rs) and re-applies the log, so every
/// acknowledged put is there exactly once. Without the rebuild the restart trusts the newer
/// consistent index and puts of the batch are lost.
fn partial_commit_is_rebuilt(extra: &[&str], commits_before: u32, how: &str) {
    let mut keel = Member::start_with(&keel_bin(), extra);
    keel.terminate();
    keel.set_failpoints(Some(&format!(
        "backend_commit_partial={commits_before}*off->return"
    )));
    keel.restart();
    let acked = write_until_crash(&keel.endpoint());
    assert_fenced_at(&mut keel, "backend_commit_partial");
    assert!(
        keel.log()
            .contains("a failed commit marked the member tree damaged"),
        "{}",
        keel.log_tail()
    );
    assert!(
        acked.len() > 50,
        "only {} puts before the fault",
        acked.len()
    );
    keel.set_failpoints(None);
    let before_restart = keel.log().len();
    keel.restart();
    let restart_log = keel.log()[before_restart..].to_string();
    assert!(
        restart_log.contains("the member tree is rebuilt") && restart_log.contains(how),
        "{}",
        keel.log_tail()
    );
    check_sequential_history(&keel.endpoint(), &acked);
    // The mark was cleared: the next start trusts the tree.
    keel.terminate();
    keel.restart();
    let again = keel.log().len();
    keel.terminate();
    assert!(
        !keel.log()[again..].contains("rebuilding it"),
        "{}",
        keel.log_tail()
    );
}

#[test]
fn a_partial_commit_is_rebuilt_from_an_empty_tree_and_the_log() {
    partial_commit_is_rebuilt(&[], 5, "FromEmpty");
}

#[test]
fn a_partial_commit_is_rebuilt_from_the_latest_snapshot_and_the_log() {
    partial_commit_is_rebuilt(&["--snapshot-count", "100"], 20, "FromSnapshot");
}

/// The alarms the member at `endpoint` reports.
async fn alarms(endpoint: &str) -> Vec<AlarmMember> {
    let mut m = grpc::maintenance(endpoint).await;
    m.alarm(AlarmRequest {
        action: AlarmAction::Get as i32,
        member_id: 0,
        alarm: AlarmType::None as i32,
    })
    .await
    .unwrap()
    .into_inner()
    .alarms
}

#[test]
fn a_full_follower_wal_raises_nospace_and_the_cluster_resumes_after_disarm() {
    let mut c = Cluster::start(&keel_bin(), 3, &[]);
    let leader = c.leader(CRASH_TIMEOUT);
    let f = (leader + 1) % 3;
    let follower_id = c.member_id(f).unwrap();
    c.members[f].terminate();
    c.members[f].set_failpoints(Some("wal_fsync_enospc=20*off->return"));
    c.members[f].restart();
    let endpoint = c.members[leader].endpoint();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Writes through the leader; the follower's 21st fdatasync fails.
    let acked = rt.block_on(async {
        let mut kv = grpc::kv(&endpoint).await;
        let deadline = Instant::now() + CRASH_TIMEOUT;
        let mut acked = 0;
        while c.members[f].is_running() && Instant::now() < deadline {
            let put = PutRequest {
                key: KEY.into(),
                value: format!("v{acked}").into(),
                ..Default::default()
            };
            match kv.put(put).await {
                Ok(_) => acked += 1,
                // The fencing follower raised NOSPACE: the leader refuses puts from now on.
                Err(s) => {
                    assert_eq!(s.message(), "etcdserver: mvcc: database space exceeded");
                    break;
                }
            }
        }
        acked
    });
    assert_fenced_at(&mut c.members[f], "wal_fsync_enospc");
    assert!(
        c.members[f]
            .log()
            .contains("raised the NOSPACE alarm through the leader"),
        "{}",
        c.members[f].log_tail()
    );
    rt.block_on(async {
        assert_eq!(
            alarms(&endpoint).await,
            [AlarmMember {
                member_id: follower_id,
                alarm: AlarmType::Nospace as i32
            }]
        );
        let mut kv = grpc::kv(&endpoint).await;
        let refused = kv
            .put(PutRequest {
                key: KEY.into(),
                value: "refused".into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(
            refused.message(),
            "etcdserver: mvcc: database space exceeded"
        );
        // Reads go on; the last acknowledged put is the current value.
        let now = grpc::range(&mut kv, KEY.as_bytes(), b"").await;
        assert_eq!(now.kvs[0].value, format!("v{}", acked - 1).into_bytes());
    });
    // Space is back: the member restarts, recovers its WAL and catches up; the operator
    // disarms the alarm (etcd's procedure) and puts are accepted again.
    c.members[f].set_failpoints(None);
    c.members[f].restart();
    rt.block_on(async {
        let mut m = grpc::maintenance(&endpoint).await;
        m.alarm(AlarmRequest {
            action: AlarmAction::Deactivate as i32,
            member_id: follower_id,
            alarm: AlarmType::Nospace as i32,
        })
        .await
        .unwrap();
        assert!(alarms(&endpoint).await.is_empty());
        let mut kv = grpc::kv(&endpoint).await;
        grpc::put(&mut kv, KEY, "after-disarm").await;
        let mut on_follower = grpc::kv(&c.members[f].endpoint()).await;
        let deadline = Instant::now() + CRASH_TIMEOUT;
        loop {
            let got = grpc::range_serializable(&mut on_follower, KEY.as_bytes(), b"").await;
            if got
                .kvs
                .first()
                .is_some_and(|kv| kv.value == b"after-disarm")
            {
                assert_eq!(
                    got.kvs[0].version,
                    acked as i64 + 1,
                    "a put was lost or doubled"
                );
                break;
            }
            assert!(Instant::now() < deadline, "the follower did not catch up");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
}

/// A tmpfs of `mib` MiB mounted on a new temp dir, unmounted on drop; `None` (with the reason
/// printed) where mounting is not permitted.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(mib: u64) -> Option<SmallDisk> {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir.path())
            .output();
        match out {
            Ok(o) if o.status.success() => Some(SmallDisk { dir }),
            Ok(o) => {
                eprintln!(
                    "SKIPPED: cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("SKIPPED: cannot run mount: {e}");
                None
            }
        }
    }

    /// Changes the size limit (space comes back).
    fn resize(&self, mib: u64) {
        let ok = Command::new("mount")
            .args(["-o", &format!("remount,size={mib}m")])
            .arg(self.dir.path())
            .status()
            .unwrap()
            .success();
        assert!(ok, "remount {}", self.dir.path().display());
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

#[test]
fn a_full_filesystem_fences_the_member_and_space_coming_back_recovers_it() {
    // The first WAL segment (64 MiB, preallocated) and the store fit; the next segment does not.
    let Some(disk) = SmallDisk::mount(100) else {
        return;
    };
    let ports = keel_testkit::ports::free_ports(2);
    let spec =
        MemberSpec::single("default", ports[0], ports[1]).data_dir(disk.dir.path().join("data"));
    let mut keel = Member::new(&keel_bin(), spec);
    keel.restart();
    let endpoint = keel.endpoint();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let value = vec![b'x'; 64 * 1024];
    let acked = rt.block_on(async {
        let mut kv = grpc::kv(&endpoint).await;
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut acked = 0usize;
        while Instant::now() < deadline {
            let put = PutRequest {
                key: format!("big{acked:05}").into(),
                value: value.clone(),
                ..Default::default()
            };
            if kv.put(put).await.is_err() {
                break;
            }
            acked += 1;
        }
        acked
    });
    let status = keel
        .wait_exit(CRASH_TIMEOUT)
        .unwrap_or_else(|| panic!("keel did not stop on a full disk\n{}", keel.log_tail()));
    assert_eq!(status.code(), Some(1), "{status}\n{}", keel.log_tail());
    let log = keel.log();
    assert!(
        log.contains("stopping after a disk failure") && log.contains("No space left on device"),
        "{}",
        keel.log_tail()
    );
    assert!(acked > 100, "only {acked} puts fit");
    eprintln!("{acked} puts of 64 KiB were acknowledged on the 100 MiB tmpfs before it filled");
    // A sled commit that failed part way marks the tree damaged (the WAL may fill first).
    let damaged = log.contains("a failed commit marked the member tree damaged");
    disk.resize(400);
    let before_restart = keel.log().len();
    keel.restart();
    assert_eq!(
        keel.log()[before_restart..].contains("the member tree is rebuilt"),
        damaged,
        "{}",
        keel.log_tail()
    );
    rt.block_on(async {
        let mut kv = grpc::kv(&endpoint).await;
        let all = kv
            .range(RangeRequest {
                key: b"big".to_vec(),
                range_end: grpc::prefix_end(b"big"),
                keys_only: true,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        // Every acknowledged put, and at most the one in flight.
        let n = all.kvs.len();
        assert!(
            n == acked || n == acked + 1,
            "{n} keys after {acked} acknowledged puts"
        );
        for (i, kv_) in all.kvs.iter().enumerate() {
            assert_eq!(kv_.key, format!("big{i:05}").into_bytes());
        }
        grpc::put(&mut kv, "after", "space").await;
    });
    keel.terminate();
}
