//! Who must be durable before a put is acknowledged on 3 members (issue 20 part 2;
//! docs/raft.md "The leader's append does not block replication").
//!
//! Raft counts a write committed once a quorum holds it on stable storage, the leader
//! included or not (Raft thesis §10.2.1). With `wal_slow_fsync=sleep(ms)` on chosen members:
//! - a slow **leader** does not slow puts: its followers make the quorum while its own fsync
//!   still sleeps (openraft 0.9.25 unpatched waited for the leader's fsync before sending);
//! - two slow **followers** do slow every put: no quorum of 3 is durable without one of them,
//!   however fast the leader is, so nothing is acknowledged before a slow fsync ends;
//! - a leader killed (SIGKILL) right after acknowledging puts that its own slow fsync had not
//!   yet covered loses none of them: the survivors hold every one.

use keel_proto::etcdserverpb::MoveLeaderRequest;

use super::*;

/// The sleep before each fdatasync of the slow members.
const SLOW_FSYNC_MS: u64 = 400;
/// Every RPC to a member waits for its fsync, so the heartbeat interval (openraft's
/// AppendEntries timeout) must exceed the slow fsync, or a slow member never catches up.
const TIMING: [&str; 4] = ["--heartbeat-interval", "1000", "--election-timeout", "5000"];
/// Puts each test makes, one at a time.
const PUTS: usize = 5;
const LEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// Restarts member `i` of `c` with `wal_slow_fsync=sleep(SLOW_FSYNC_MS)` and waits until it
/// serves again.
fn make_slow(c: &mut Cluster, i: usize) {
    let m = &mut c.members[i];
    m.terminate();
    m.set_failpoints(Some(&format!("wal_slow_fsync=sleep({SLOW_FSYNC_MS})")));
    m.restart();
    c.wait_ready(&[i]);
}

/// Makes member `target` the leader (MoveLeader through the current leader) and returns once
/// every member agrees.
fn move_leader_to(c: &Cluster, target: usize) {
    let deadline = Instant::now() + LEADER_TIMEOUT;
    loop {
        let leader = c.leader(LEADER_TIMEOUT);
        if leader == target {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "could not move the leader to {}\n{}",
            c.members[target].name(),
            c.log_tails()
        );
        let target_id = c.member_id(target).expect("target member ID");
        let endpoint = c.members[leader].endpoint();
        let moved = grpc::block_on_thread(async move {
            let mut m = grpc::maintenance(&endpoint).await;
            m.move_leader(MoveLeaderRequest { target_id })
                .await
                .map_err(|e| e.to_string())
        });
        match moved {
            Ok(Ok(_)) => {}
            Ok(Err(e)) | Err(e) => {
                eprintln!("move leader: {e} (retrying)");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

/// Puts `key{i}` for i in 0..PUTS through `endpoint`, one at a time, and returns each put's
/// revision and latency.
fn timed_puts(endpoint: &str, key: &str) -> Vec<(i64, Duration)> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut kv = grpc::kv(endpoint).await;
        let mut out = Vec::new();
        for i in 0..PUTS {
            let started = Instant::now();
            let rev = grpc::put(&mut kv, &format!("{key}{i}"), format!("v{i}")).await;
            out.push((rev, started.elapsed()));
        }
        out
    })
}

/// The value of `key` that member `endpoint` serves from its own store (serializable).
fn local_value(endpoint: &str, key: &str) -> Option<Vec<u8>> {
    let endpoint = endpoint.to_string();
    let key = key.to_string();
    grpc::block_on_thread(async move {
        let mut kv = grpc::kv(&endpoint).await;
        grpc::range_serializable(&mut kv, key.as_bytes(), b"")
            .await
            .kvs
            .first()
            .map(|kv| kv.value.clone())
    })
    .expect("serializable get")
}

#[test]
fn a_slow_leader_fsync_does_not_delay_acknowledgement() {
    let mut c = Cluster::start(&keel_bin(), 3, &TIMING);
    make_slow(&mut c, 0);
    move_leader_to(&c, 0);

    let puts = timed_puts(&c.members[0].endpoint(), "lead");
    let slowest = puts.iter().map(|p| p.1).max().unwrap();
    // Each put needs the leader's fsync only if the leader waits for it before replicating;
    // with the patch the two fast followers commit it long before the 400 ms sleep ends.
    assert!(
        slowest < Duration::from_millis(SLOW_FSYNC_MS),
        "a put through the slow leader took {slowest:?}: {puts:?}"
    );
    assert_eq!(
        c.leader(LEADER_TIMEOUT),
        0,
        "the slow member must still lead"
    );

    // Kill the leader while its own fsyncs are still sleeping: every acknowledged put must be
    // on the survivors, which elect a new leader and serve it.
    c.members[0].kill9();
    let survivors = [1, 2];
    // Waits until the survivors agree on a new leader (panics otherwise).
    c.leader(LEADER_TIMEOUT);
    let last_rev = puts.last().unwrap().0;
    for i in survivors {
        let endpoint = c.members[i].endpoint();
        for (n, _) in puts.iter().enumerate() {
            let got = wait_for_value(&endpoint, &format!("lead{n}"));
            assert_eq!(
                got,
                format!("v{n}").into_bytes(),
                "{} lost lead{n}",
                c.members[i].name()
            );
        }
        let rev = grpc::status(&endpoint).unwrap().header.unwrap().revision;
        assert!(
            rev >= last_rev,
            "{} at revision {rev} < {last_rev}",
            c.members[i].name()
        );
    }

    // The old leader comes back without failpoints and catches up to the same state.
    c.members[0].set_failpoints(None);
    c.members[0].restart();
    c.wait_ready(&[0]);
    for (n, _) in puts.iter().enumerate() {
        assert_eq!(
            wait_for_value(&c.members[0].endpoint(), &format!("lead{n}")),
            format!("v{n}").into_bytes()
        );
    }
}

#[test]
fn slow_followers_delay_acknowledgement_even_with_a_fast_leader() {
    let mut c = Cluster::start(&keel_bin(), 3, &TIMING);
    let leader = c.leader(LEADER_TIMEOUT);
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    for &f in &followers {
        make_slow(&mut c, f);
    }
    // Whichever member leads now, every quorum of 3 holds a slow member.
    let leader = c.leader(LEADER_TIMEOUT);
    let puts = timed_puts(&c.members[leader].endpoint(), "quorum");
    for (i, (_, took)) in puts.iter().enumerate() {
        assert!(
            *took >= Duration::from_millis(SLOW_FSYNC_MS),
            "put #{i} was acknowledged after {took:?}, before any slow member's fsync ended: {puts:?}"
        );
    }
}

/// Polls `endpoint`'s own store for `key` for up to 10 s (a member applies what it holds
/// after the new leader's first commit).
fn wait_for_value(endpoint: &str, key: &str) -> Vec<u8> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = local_value(endpoint, key) {
            return v;
        }
        assert!(Instant::now() < deadline, "{endpoint} never served {key}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
