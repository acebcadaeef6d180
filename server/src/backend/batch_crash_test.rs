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
use std::process::{Child, Command, Stdio};
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
    (b.is_multiple_of(5) && b > 7).then(|| b - 7)
}

/// The writes of batch `b` in order (`None`: a removal): its records (value: the batch
/// number and the record's index), the removals, and the marker.
fn writes(b: u64) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
    let mut w: Vec<(Vec<u8>, Option<Vec<u8>>)> = (0..records_of(b))
        .map(|sub| {
            (
                record(b, sub),
                Some([b.to_be_bytes(), sub.to_be_bytes()].concat()),
            )
        })
        .collect();
    if let Some(old) = removes(b) {
        w.extend((0..records_of(old)).map(|sub| (record(old, sub), None)));
    }
    w.push((MARKER.to_vec(), Some(b.to_be_bytes().to_vec())));
    w
}

fn batch(b: u64) -> Batch {
    let mut batch = Batch::default();
    for (k, v) in writes(b) {
        match v {
            Some(v) => batch.insert(k, v),
            None => batch.remove(k),
        }
    }
    batch
}

/// What the tree holds after batches 1 to `last`.
fn model(last: u64) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut m = BTreeMap::new();
    m.insert(b"xafter".to_vec(), b"x".to_vec());
    apply(&mut m, (1..=last).flat_map(writes));
    m
}

fn apply(
    m: &mut BTreeMap<Vec<u8>, Vec<u8>>,
    writes: impl IntoIterator<Item = (Vec<u8>, Option<Vec<u8>>)>,
) {
    for (k, v) in writes {
        match v {
            Some(v) => m.insert(k, v),
            None => m.remove(&k),
        };
    }
}

/// Every pair in `tree`, in key order.
fn contents(tree: &sled::Tree) -> BTreeMap<Vec<u8>, Vec<u8>> {
    tree.iter()
        .map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())).unwrap())
        .collect()
}

/// The writer, SIGKILLed and reaped when dropped (also when an assertion fails first).
struct Writer(Child);

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = self.0.kill(); // SIGKILL
        let _ = self.0.wait();
    }
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
    // When to kill: once sled's log file holds `logged` bytes (0: once the database
    // exists), `after_ms` later. Early kills see a small tree; later ones split index nodes
    // and roll sled's log buffers, and must find batches on disk.
    for (logged, after_ms) in [(0u64, 5u64), (0, 60), (256 << 10, 20), (4 << 20, 100)] {
        let dir = tempfile::tempdir().unwrap();
        let writer = Writer(
            Command::new(&exe)
                .args([TEST_NAME, "--exact", "--test-threads=1", "--nocapture"])
                .env(CHILD_ENV, dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        // The database exists once sled has written its config file; its log is `db`.
        let deadline = Instant::now() + Duration::from_secs(60);
        let log_bytes = |dir: &Path| std::fs::metadata(dir.join("db")).map_or(0, |m| m.len());
        while !dir.path().join("conf").exists() || (logged > 0 && log_bytes(dir.path()) < logged) {
            assert!(
                Instant::now() < deadline,
                "the child never wrote {logged} bytes to its log"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(after_ms));
        drop(writer);

        let db = sled::Config::new().path(dir.path()).open().unwrap();
        let tree = db.open_tree("keel").unwrap();
        let last = tree
            .get(MARKER)
            .unwrap()
            .map_or(0, |v| u64::from_be_bytes(v.as_ref().try_into().unwrap()));
        let got = contents(&tree);
        if last == 0 {
            // Nothing of any batch: at most the key written before them.
            assert!(
                got.len() <= 1,
                "killed {after_ms} ms after {logged} log bytes: {} keys, no batch",
                got.len()
            );
        } else {
            let want = model(last);
            assert_eq!(
                got.len(),
                want.len(),
                "killed {after_ms} ms after {logged} log bytes, last batch {last}"
            );
            assert!(
                got == want,
                "killed {after_ms} ms after {logged} log bytes: the tree is not batches 1..={last}"
            );
        }
        if logged > 0 {
            assert!(
                last > 0,
                "no batch survived, with {logged} bytes in the log"
            );
        }
        // A batch on the reopened tree goes in after what survived (which, when nothing of
        // any batch did, may or may not hold the key written before them).
        batch(last + 1).commit(&tree).unwrap();
        let mut want = got;
        apply(&mut want, writes(last + 1));
        assert!(
            contents(&tree) == want,
            "killed {after_ms} ms after {logged} log bytes: batch {} after the reopen",
            last + 1
        );
    }
}
