//! Crash recovery: acknowledged writes survive SIGKILL of the member at random moments.
//!
//! [`acknowledged_writes_survive_repeated_sigkill`] runs [`WRITERS`] concurrent gRPC clients
//! (puts and all-or-nothing pair txns on unique keys) while the test SIGKILLs `keel`
//! [`CRASHES`] times at random moments and restarts it on the same data dir. The recovered store
//! is then checked against the client history (rules in `crash_recovery/check.rs`), killed and
//! recovered once more, and must come back identical. The same runs with a small
//! `--snapshot-count`, so members crash around snapshots and log purges and recover from a
//! snapshot plus the log after it. `KEEL_CRASH_SEED=<u64>` replays the kill schedule of an
//! earlier run (it is printed at the start).

// Shared with the graceful shutdown tests (`shutdown.rs`).
pub mod check;
pub mod history;
pub mod store;
pub mod writer;

use std::ops::Range;
use std::time::{Duration, Instant};

use keel_proto::etcdserverpb::{CompactionRequest, RangeRequest};
use keel_testkit::{Member, grpc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use store::Store;

use crate::member;

/// Concurrent writing clients.
const WRITERS: usize = 8;
/// SIGKILL + restart cycles.
const CRASHES: usize = 5;
/// Time the member runs under load before each kill (ms, drawn uniformly).
const RUN_BEFORE_KILL_MS: Range<u64> = 300..1500;
/// Time the member stays down before each restart (ms, drawn uniformly).
const DOWN_MS: Range<u64> = 0..300;
/// Writes that must be acknowledged after each (re)start before the next kill: proves the
/// restarted member serves writes again.
const MIN_ACKS_PER_LIFE: u64 = 20;
/// Bound on waiting for those writes.
const PROGRESS_TIMEOUT: Duration = Duration::from_secs(20);
/// Bound on the writers finishing after the stop flag (one in-flight RPC each).
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// Most violations printed in a failure message.
const SHOWN_VIOLATIONS: usize = 30;

/// `--snapshot-count` of the snapshot variant: a snapshot every few hundred applied entries.
const SMALL_SNAPSHOT_COUNT: &str = "200";

#[test]
fn acknowledged_writes_survive_repeated_sigkill() {
    crash_and_check(&[]);
}

#[test]
fn acknowledged_writes_survive_repeated_sigkill_around_snapshots() {
    crash_and_check(&["--snapshot-count", SMALL_SNAPSHOT_COUNT]);
}

/// The crash test (module docs) on a member started with `member_args`.
fn crash_and_check(member_args: &[&str]) {
    let seed = std::env::var("KEEL_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().r#gen::<u64>());
    eprintln!("crash schedule seed: KEEL_CRASH_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);

    let (_guard, mut keel) = member(member_args);
    let rt = grpc::runtime();
    let base = rt.block_on(Store::read(&keel.endpoint())).revision;
    let writers = writer::Writers::start(&rt, &keel.endpoint(), WRITERS);

    for crash in 1..=CRASHES {
        wait_for_acks(&writers, MIN_ACKS_PER_LIFE, &keel);
        std::thread::sleep(Duration::from_millis(rng.gen_range(RUN_BEFORE_KILL_MS)));
        let acked = writers.acked();
        keel.kill9();
        eprintln!("crash {crash}/{CRASHES}: SIGKILL after {acked} acknowledged writes");
        std::thread::sleep(Duration::from_millis(rng.gen_range(DOWN_MS)));
        let restarted = Instant::now();
        keel.restart();
        eprintln!(
            "crash {crash}/{CRASHES}: ready again after {:?}",
            restarted.elapsed()
        );
    }
    wait_for_acks(&writers, MIN_ACKS_PER_LIFE, &keel);
    let history = writers.stop(&rt, STOP_TIMEOUT);

    let store = rt.block_on(Store::read(&keel.endpoint()));
    eprintln!(
        "after {CRASHES} crashes: {}",
        check::summary(&history, &store)
    );
    assert_consistent(&history, &store, base, &keel);

    // Recovering the same data dir again yields the very same store: replay is idempotent.
    keel.kill9();
    keel.restart();
    let again = rt.block_on(Store::read(&keel.endpoint()));
    assert_eq!(
        again.revision, store.revision,
        "store revision changed by a restart without writes"
    );
    assert!(
        again.kvs == store.kvs,
        "store contents changed by a restart without writes"
    );
}

#[test]
fn compaction_and_revisions_survive_sigkill() {
    let (_guard, mut keel) = member(&[]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let endpoint = keel.endpoint();
    let r0 = rt.block_on(async {
        let mut kv = grpc::kv(&endpoint).await;
        let r0 = Store::read(&endpoint).await.revision;
        for value in ["v1", "v2", "v3"] {
            grpc::put(&mut kv, "foo", value).await;
        }
        kv.compact(CompactionRequest {
            revision: r0 + 2,
            physical: true,
        })
        .await
        .expect("compact");
        r0
    });

    keel.kill9();
    keel.restart();

    rt.block_on(async {
        let mut kv = grpc::kv(&endpoint).await;
        let at = |revision: i64| RangeRequest {
            key: b"foo".to_vec(),
            revision,
            ..Default::default()
        };
        // A revision below the compact revision is gone.
        grpc::assert_fails_with(
            kv.range(at(r0 + 1)).await,
            tonic::Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted",
        );
        let kept = kv
            .range(at(r0 + 2))
            .await
            .expect("compact revision itself is kept")
            .into_inner();
        assert_eq!(kept.kvs.len(), 1, "{kept:?}");
        assert_eq!(kept.kvs[0].value, b"v2", "{kept:?}");
        assert_eq!(kept.kvs[0].mod_revision, r0 + 2, "{kept:?}");
        let current = kv.range(at(0)).await.expect("current read").into_inner();
        assert_eq!(current.header.expect("header").revision, r0 + 3);
        assert_eq!(
            (current.kvs[0].version, current.kvs[0].create_revision),
            (3, r0 + 1)
        );
        // The next write continues the revision sequence.
        assert_eq!(grpc::put(&mut kv, "after", "restart").await, r0 + 4);
    });
}

/// Waits until `min` more writes are acknowledged; panics with the member log after
/// [`PROGRESS_TIMEOUT`].
fn wait_for_acks(writers: &writer::Writers, min: u64, keel: &Member) {
    let start = writers.acked();
    let deadline = Instant::now() + PROGRESS_TIMEOUT;
    while writers.acked() < start + min {
        if Instant::now() >= deadline {
            panic!(
                "only {} writes acknowledged within {PROGRESS_TIMEOUT:?} (want {min})\n{}",
                writers.acked() - start,
                keel.log_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn assert_consistent(history: &[history::Attempt], store: &Store, base: i64, keel: &Member) {
    let violations = check::check(history, store, base);
    if !violations.is_empty() {
        let shown: Vec<&String> = violations.iter().take(SHOWN_VIOLATIONS).collect();
        panic!(
            "{} violations after crash recovery ({}; data dir {}):\n{}",
            violations.len(),
            check::summary(history, store),
            keel.data_dir().display(),
            shown
                .iter()
                .map(|v| format!("  {v}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}
