//! Snapshot export vs. compaction vs. install, on one state machine: the races the export
//! lock exists for (see `raft/export.rs`). Every wait is bounded, so a deadlock fails the test
//! instead of hanging it.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_proto::etcdserverpb::{CompactionRequest, PutRequest};
use keel_proto::keelpb::{RaftRequest, raft_request};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{CommittedLeaderId, EntryPayload, RaftSnapshotBuilder};
use tokio::io::AsyncWriteExt;

use super::state_machine::{SharedStore, StateMachine};
use super::types::{Entry, LogId, Request, TypeConfig};

/// Bound on any single step; a step that takes longer is a deadlock.
const STEP: Duration = Duration::from_secs(20);
/// How long a blocked step must stay blocked to count as waiting.
const STILL_BLOCKED: Duration = Duration::from_millis(300);

struct Member {
    _dir: tempfile::TempDir,
    sm: StateMachine,
    shared: Arc<SharedStore>,
    next_index: u64,
}

impl Member {
    fn new() -> Member {
        let dir = tempfile::tempdir().unwrap();
        let (sm, shared) = super::test_support::state_machine(dir.path());
        Member {
            _dir: dir,
            sm,
            shared,
            next_index: 1,
        }
    }

    fn entry(&mut self, request: raft_request::Request) -> Entry {
        let index = self.next_index;
        self.next_index += 1;
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Request(RaftRequest {
                id: index,
                request: Some(request),
            })),
        }
    }

    fn put(&mut self, key: &str, value: &str) -> Entry {
        self.entry(raft_request::Request::Put(PutRequest {
            key: key.into(),
            value: value.into(),
            ..Default::default()
        }))
    }

    fn compact(&mut self, revision: i64) -> Entry {
        self.entry(raft_request::Request::Compaction(CompactionRequest {
            revision,
            physical: true,
        }))
    }

    /// Writes `rounds` versions of `keys` keys.
    async fn load(&mut self, keys: usize, rounds: usize) {
        let mut entries = Vec::new();
        for r in 0..rounds {
            for k in 0..keys {
                entries.push(self.put(&format!("key-{k:04}"), &format!("v{r}")));
            }
        }
        self.sm.apply(entries).await.unwrap();
    }

    fn revision(&self) -> i64 {
        self.shared.get().current_revision()
    }

    fn hash(&self, revision: i64) -> u32 {
        self.shared.get().hash_kv(revision).unwrap().hash
    }
}

/// A hook that announces the export started, then holds it until released.
fn holding_hook() -> (
    super::export::ExportHook,
    mpsc::Receiver<()>,
    mpsc::Sender<()>,
) {
    let (started_tx, started_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let (started_tx, release_rx) = (Mutex::new(started_tx), Mutex::new(release_rx));
    let hook = Arc::new(move || {
        let _ = started_tx.lock().unwrap().send(());
        let _ = release_rx.lock().unwrap().recv_timeout(STEP);
    });
    (hook, started_rx, release_tx)
}

async fn wait_started(rx: mpsc::Receiver<()>) {
    tokio::task::spawn_blocking(move || rx.recv_timeout(STEP).expect("export started"))
        .await
        .unwrap();
}

/// Feeds `snap` to `sm` as if it came from the leader and installs it.
async fn install(sm: &mut StateMachine, snap: &mut Snapshot<TypeConfig>) {
    let mut data = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut snap.snapshot, &mut data)
        .await
        .unwrap();
    let mut receiving = sm.begin_receiving_snapshot().await.unwrap();
    receiving.write_all(&data).await.unwrap();
    sm.install_snapshot(&snap.meta, receiving).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_waits_for_a_running_export_and_the_export_stays_consistent() {
    let mut m = Member::new();
    m.load(50, 3).await;
    let rev = m.revision();
    let hash_at_rev = m.hash(rev);
    let hash_at_2 = m.hash(2);
    let (hook, started, release) = holding_hook();
    m.sm.set_export_hook(hook);

    let mut builder = m.sm.get_snapshot_builder().await;
    let export = tokio::spawn(async move { builder.build_snapshot().await });
    wait_started(started).await;

    // Apply goes on during the export; the compaction entry waits for it.
    let put = m.put("during-export", "x");
    let compact = m.compact(rev);
    let (put_done_tx, put_done_rx) = tokio::sync::oneshot::channel();
    let apply = tokio::spawn(async move {
        m.sm.apply(vec![put]).await.unwrap();
        let _ = put_done_tx.send(());
        m.sm.apply(vec![compact]).await.unwrap();
        m
    });
    tokio::time::timeout(STEP, put_done_rx)
        .await
        .expect("a put is not blocked by an export")
        .unwrap();
    tokio::time::sleep(STILL_BLOCKED).await;
    assert!(
        !apply.is_finished(),
        "compaction ran while an export needed the records"
    );
    assert!(!export.is_finished());

    release.send(()).unwrap();
    let mut snap = tokio::time::timeout(STEP, export)
        .await
        .expect("export finishes")
        .unwrap()
        .unwrap();
    let m = tokio::time::timeout(STEP, apply)
        .await
        .expect("compaction finishes")
        .unwrap();
    assert_eq!(m.shared.get().compact_revision(), rev);

    // The snapshot holds the state at `rev`, with the history the compaction removed later.
    let mut fresh = Member::new();
    install(&mut fresh.sm, &mut snap).await;
    assert_eq!(fresh.revision(), rev);
    assert_eq!(fresh.hash(rev), hash_at_rev);
    assert_eq!(
        fresh.hash(2),
        hash_at_2,
        "history the later compaction removed is in the snapshot"
    );
    assert!(
        m.shared.get().hash_kv(2).is_err(),
        "the source itself was compacted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_waits_for_a_running_export_without_deadlock() {
    let mut source = Member::new();
    source.load(40, 2).await;
    let source_rev = source.revision();
    let source_hash = source.hash(source_rev);
    let mut from_source = source
        .sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();

    let mut target = Member::new();
    target.load(10, 1).await;
    let target_rev = target.revision();
    let target_hash = target.hash(target_rev);
    let (hook, started, release) = holding_hook();
    target.sm.set_export_hook(hook);
    let mut builder = target.sm.get_snapshot_builder().await;
    let export = tokio::spawn(async move { builder.build_snapshot().await });
    wait_started(started).await;

    let installing = tokio::spawn(async move {
        install(&mut target.sm, &mut from_source).await;
        target
    });
    tokio::time::sleep(STILL_BLOCKED).await;
    assert!(
        !installing.is_finished(),
        "install replaced the tree under a running export"
    );

    release.send(()).unwrap();
    let mut own = tokio::time::timeout(STEP, export)
        .await
        .expect("export finishes")
        .unwrap()
        .unwrap();
    let target = tokio::time::timeout(STEP, installing)
        .await
        .expect("install finishes")
        .unwrap();
    assert_eq!(target.revision(), source_rev);
    assert_eq!(target.hash(source_rev), source_hash);

    // The export taken before the install is the target's old state.
    let mut check = Member::new();
    install(&mut check.sm, &mut own).await;
    assert_eq!(check.revision(), target_rev);
    assert_eq!(check.hash(target_rev), target_hash);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_compactions_and_installs_interleave_without_deadlock() {
    let mut donor = Member::new();
    donor.load(30, 2).await;
    let mut m = Member::new();
    for round in 0..12 {
        m.load(30, 1).await;
        let rev = m.revision();
        // An export in flight while a compaction and then an install arrive.
        let mut builder = m.sm.get_snapshot_builder().await;
        let export = tokio::spawn(async move { builder.build_snapshot().await });
        let compact = m.compact(rev - 1);
        let applied = tokio::time::timeout(STEP, m.sm.apply(vec![compact])).await;
        assert!(
            applied.is_ok_and(|r| r.is_ok()),
            "round {round}: compaction deadlocked or failed"
        );
        let mut snap = donor
            .sm
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        tokio::time::timeout(STEP, install(&mut m.sm, &mut snap))
            .await
            .unwrap_or_else(|_| panic!("round {round}: install deadlocked"));
        tokio::time::timeout(STEP, export)
            .await
            .unwrap_or_else(|_| panic!("round {round}: export deadlocked"))
            .unwrap()
            .unwrap();
        assert_eq!(
            m.hash(m.revision()),
            donor.hash(donor.revision()),
            "round {round}"
        );
        // Continue from the donor's log position.
        m.next_index = donor.next_index + 1 + round as u64 * 1000;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_snapshot_changes_nothing() {
    let mut source = Member::new();
    source.load(20, 1).await;
    let mut snap = source
        .sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    let mut data = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut snap.snapshot, &mut data)
        .await
        .unwrap();
    let mid = data.len() / 2;
    data[mid] ^= 0xff;

    let mut target = Member::new();
    target.load(5, 1).await;
    let (rev, hash) = (target.revision(), target.hash(target.revision()));
    let mut receiving = target.sm.begin_receiving_snapshot().await.unwrap();
    receiving.write_all(&data).await.unwrap();
    assert!(
        target
            .sm
            .install_snapshot(&snap.meta, receiving)
            .await
            .is_err()
    );
    assert_eq!((target.revision(), target.hash(rev)), (rev, hash));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_install_interrupted_by_a_crash_is_finished_at_start() {
    let mut source = Member::new();
    source.load(25, 2).await;
    let (rev, hash) = (source.revision(), source.hash(source.revision()));
    let snap = source
        .sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    let source_file = super::snapshot::file_name(&source._dir.path().join("snap"), &snap.meta);

    // The state a crash leaves: the snapshot file kept, the marker written, the tree half
    // replaced (here: holding unrelated data).
    let mut target = Member::new();
    target.load(3, 1).await;
    let snap_dir = target._dir.path().join("snap");
    let kept = snap_dir.join(source_file.file_name().unwrap());
    std::fs::copy(&source_file, &kept).unwrap();
    std::fs::write(
        snap_dir.join("INSTALLING"),
        kept.file_name().unwrap().to_str().unwrap(),
    )
    .unwrap();

    // openraft's first call at start-up finishes the install.
    let (applied, _) = target.sm.applied_state().await.unwrap();
    assert_eq!(applied, snap.meta.last_log_id);
    assert_eq!((target.revision(), target.hash(rev)), (rev, hash));
    assert!(!snap_dir.join("INSTALLING").exists());
}

#[test]
fn compactions_inside_batches_are_recognised() {
    use keel_proto::keelpb::RequestBatch;
    let mut m = Member::new();
    let put = m.put("k", "v");
    let compact = m.compact(1);
    let batch = |requests: Vec<RaftRequest>| Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), 99),
        payload: EntryPayload::Normal(Request(RaftRequest {
            id: 99,
            request: Some(raft_request::Request::Batch(RequestBatch { requests })),
        })),
    };
    let inner = |e: &Entry| match &e.payload {
        EntryPayload::Normal(r) => r.0.clone(),
        _ => unreachable!("test entries are normal"),
    };
    assert!(super::state_machine::is_compaction(&compact));
    assert!(!super::state_machine::is_compaction(&put));
    assert!(super::state_machine::is_compaction(&batch(vec![
        inner(&put),
        inner(&compact)
    ])));
    assert!(!super::state_machine::is_compaction(&batch(vec![inner(
        &put
    )])));
}

/// The race of the issue: a snapshot is installed while the member's background compaction
/// is still removing records. The install must neither deadlock nor lose records: the
/// removals left over belong to a compaction the (later) snapshot includes too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installing_a_snapshot_while_a_background_compaction_runs() {
    const KEYS: usize = 4000;
    let mut donor = Member::new();
    let mut member = Member::new();
    // The shared log: two versions of every key, then a compaction that supersedes KEYS
    // records (more than the 1000 removed inline, so the rest runs in the background), then
    // more writes only the donor applies before it snapshots.
    let mut history = Vec::new();
    for round in 0..2 {
        for k in 0..KEYS {
            history.push(donor.put(&format!("key-{k:05}"), &format!("v{round}")));
        }
    }
    donor.sm.apply(history.clone()).await.unwrap();
    member.sm.apply(history).await.unwrap();
    member.next_index = donor.next_index;
    let rev = donor.revision();
    let compaction = donor.compact(rev);
    member.next_index = donor.next_index;
    donor.sm.apply(vec![compaction.clone()]).await.unwrap();
    let later: Vec<Entry> = (0..50)
        .map(|i| donor.put(&format!("later-{i}"), "x"))
        .collect();
    donor.sm.apply(later).await.unwrap();
    assert!(donor.shared.get().wait_physical_compaction(rev, STEP));
    let donor_hash = donor.hash(donor.revision());
    let mut snap = donor
        .sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();

    member.sm.apply(vec![compaction]).await.unwrap();
    let running = member.shared.get().physical_compact_revision() < rev;
    tokio::time::timeout(STEP, install(&mut member.sm, &mut snap))
        .await
        .expect("install during a background compaction deadlocked");
    assert_eq!(member.revision(), donor.revision());
    assert_eq!(member.hash(member.revision()), donor_hash);
    // Whatever the old compactor still removes afterwards must not change the state.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(member.hash(member.revision()), donor_hash);
    eprintln!("background compaction still running when the install began: {running}");
}

/// An export taken while an earlier compaction's records are still being removed in the
/// background: whichever of those records it catches, the installed copy equals the source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_during_a_background_compaction_is_consistent() {
    let mut m = Member::new();
    m.load(4000, 2).await;
    let rev = m.revision();
    let compaction = m.compact(rev);
    m.sm.apply(vec![compaction]).await.unwrap();
    let running = m.shared.get().physical_compact_revision() < rev;
    let mut snap =
        m.sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
    assert!(m.shared.get().wait_physical_compaction(rev, STEP));
    let mut copy = Member::new();
    install(&mut copy.sm, &mut snap).await;
    assert_eq!(copy.revision(), rev);
    assert_eq!(copy.hash(rev), m.hash(rev));
    assert_eq!(copy.shared.get().compact_revision(), rev);
    eprintln!("background compaction still running when the export began: {running}");
}
