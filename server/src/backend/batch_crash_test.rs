//! A sled batch is atomic across a crash (docs/backend.md, "One sled batch per group"):
//! after a SIGKILL in the middle of a stream of batches, a reopened tree holds every batch
//! up to some batch whole and nothing of any later one. The vendored sled writes a run of
//! appended records into one leaf as one node replacement (`Tree::keel_set_run`,
//! docs/third_party.md), so the batches here are shaped like Keel's: record keys in
//! revision order, meta keys after them, and removals of old records as compaction makes.
//!
//! The writer is a child process: this test binary run again with [`CHILD_ENV`] set to the
//! database directory. It writes until it is killed.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::Batch;

/// Set in the child: the directory of the database it writes.
const CHILD_ENV: &str = "KEEL_SLED_CRASH_CHILD";
/// This test's name, for the child's command line.
const TEST_NAME: &str = "backend::batch_crash_test::a_batch_is_whole_or_absent_after_a_sigkill";
/// The meta key that names the last batch (written by every batch).
const MARKER: &[u8] = b"mbatch";

fn record(main: u64, sub: u64) -> Vec<u8> {
    let mut k = vec![b'k'];
    k.extend_from_slice(&main.to_be_bytes());
    k.extend_from_slice(&sub.to_be_bytes());
    k
}

/// How many records batch `b` (from 1) appends: 1 to 300, varied so that runs start and
/// end anywhere in a leaf.
fn records_of(b: u64) -> u64 {
    1 + (b.wrapping_mul(2_654_435_761) >> 7) % 300
}

/// Batch `b` also removes every record of batch `b - 7` when `b` is a multiple of 5 (a
/// compaction of old revisions).
fn removes(b: u64) -> Option<u64> {
    (b % 5 == 0 && b > 7).then(|| b - 7)
}

/// The writes of batch `b`: its records (value: the batch number and the record's index),
/// the removals, and the marker.
fn batch(b: u64) -> Batch {
    let mut batch = Batch::default();
    for sub in 0..records_of(b) {
        batch.insert(
            record(b, sub),
            [b.to_be_bytes(), sub.to_be_bytes()].concat(),
        );
    }
    if let Some(old) = removes(b) {
        for sub in 0..records_of(old) {
            batch.remove(record(old, sub));
        }
    }
    batch.insert(MARKER.to_vec(), b.to_be_bytes().to_vec());
    batch
}

/// What the tree holds after batches 1 to `last`.
fn model(last: u64) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut m = BTreeMap::new();
    m.insert(b"xafter".to_vec(), b"x".to_vec());
    for b in 1..=last {
        for sub in 0..records_of(b) {
            m.insert(
                record(b, sub),
                [b.to_be_bytes(), sub.to_be_bytes()].concat(),
            );
        }
        if let Some(old) = removes(b) {
            for sub in 0..records_of(old) {
                m.remove(&record(old, sub));
            }
        }
        m.insert(MARKER.to_vec(), b.to_be_bytes().to_vec());
    }
    m
}

/// The child: writes batches 1, 2, ... until killed.
fn write_until_killed(dir: &Path) -> ! {
    let db = sled::Config::new().path(dir).open().unwrap();
    let tree = db.open_tree("keel").unwrap();
    tree.insert(b"xafter", b"x".as_slice()).unwrap();
    for b in 1.. {
        batch(b).commit(&tree).unwrap();
    }
    unreachable!()
}

#[test]
fn a_batch_is_whole_or_absent_after_a_sigkill() {
    if let Some(dir) = std::env::var_os(CHILD_ENV) {
        write_until_killed(Path::new(&dir));
    }
    let exe = std::env::current_exe().unwrap();
    // Kill times in ms after the child's first batch reached the disk: early (small tree),
    // later (index nodes split, sled's log rolls segments).
    for kill_after_ms in [5u64, 60, 250, 700] {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(&exe)
            .args([TEST_NAME, "--exact", "--test-threads=1", "--nocapture"])
            .env(CHILD_ENV, dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // The database exists once sled has written its config file.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !dir.path().join("conf").exists() {
            assert!(
                Instant::now() < deadline,
                "the child never opened its database"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(kill_after_ms));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();

        let db = sled::Config::new().path(dir.path()).open().unwrap();
        let tree = db.open_tree("keel").unwrap();
        let last = tree
            .get(MARKER)
            .unwrap()
            .map_or(0, |v| u64::from_be_bytes(v.as_ref().try_into().unwrap()));
        let got: BTreeMap<Vec<u8>, Vec<u8>> = tree
            .iter()
            .map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())).unwrap())
            .collect();
        if last == 0 {
            // Nothing of any batch: at most the key written before them.
            assert!(
                got.len() <= 1,
                "killed after {kill_after_ms} ms: {} keys, no batch",
                got.len()
            );
        } else {
            let want = model(last);
            assert_eq!(
                got.len(),
                want.len(),
                "killed after {kill_after_ms} ms, last batch {last}"
            );
            assert!(
                got == want,
                "killed after {kill_after_ms} ms: the tree is not batches 1..={last}"
            );
        }
        if kill_after_ms >= 700 {
            // sled's flusher (every 500 ms) has written batches by now.
            assert!(last > 0, "nothing survived {kill_after_ms} ms of writing");
        }
        // A batch on the reopened tree goes in after what survived.
        batch(last + 1).commit(&tree).unwrap();
        assert_eq!(tree.len(), model(last + 1).len());
    }
}
