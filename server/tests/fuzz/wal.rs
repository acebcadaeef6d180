//! WAL recovery on damaged segments: `Wal::open` either refuses (`WalError`) or recovers
//! the state after some prefix of the writes (wal module invariant "Prefix": never a hole,
//! never garbage), and a recovered WAL takes new writes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use keel_server::wal::{Wal, WalOptions};
use proptest::prelude::*;
use proptest::sample::Index;

use crate::{alloc, budget, mutate};

/// The metadata key the writes use.
const META: u8 = 7;

fn opts() -> WalOptions {
    // Small segments: the seed spans several, sealed and open.
    WalOptions {
        segment_bytes: 1024,
        preallocate: false,
        recycle_segments: 2,
    }
}

/// The state the WAL holds after some writes: entries by index, the metadata value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct State {
    entries: BTreeMap<u64, Vec<u8>>,
    meta: Option<Vec<u8>>,
}

fn payload(index: u64, round: u8) -> Vec<u8> {
    let len = 20 + (index as usize * 37) % 150;
    (0..len)
        .map(|i| (i as u8) ^ (index as u8) ^ round)
        .collect()
}

/// Writes the seed WAL into `dir` (each write durable before the next) and returns the
/// state after every prefix of the writes, the empty one first.
fn write_seed(dir: &Path) -> Vec<State> {
    let wal = Wal::open(dir, opts()).expect("open seed WAL");
    let mut state = State::default();
    let mut states = vec![state.clone()];
    let mut record = |wal: &Wal, lsn, state: &State| {
        wal.wait_durable(lsn).expect("durable");
        states.push(state.clone());
    };
    for index in 1..=30 {
        let p = payload(index, 0);
        let lsn = wal.append(&[(index, &p)]).expect("append");
        state.entries.insert(index, p);
        record(&wal, lsn, &state);
    }
    let lsn = wal.set_meta(META, b"vote term 3").expect("meta");
    state.meta = Some(b"vote term 3".to_vec());
    record(&wal, lsn, &state);
    let lsn = wal.truncate_from(25).expect("truncate");
    state.entries.retain(|i, _| *i < 25);
    record(&wal, lsn, &state);
    for index in 25..=35 {
        let p = payload(index, 1);
        let lsn = wal.append(&[(index, &p)]).expect("append");
        state.entries.insert(index, p);
        record(&wal, lsn, &state);
    }
    states
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read WAL dir")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .collect();
    files.sort();
    files
}

fn copy_dir(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).expect("read seed dir") {
        let e = e.expect("dir entry");
        std::fs::copy(e.path(), to.join(e.file_name())).expect("copy");
    }
}

/// What an opened WAL holds, read back entry by entry.
fn recovered(wal: &Wal) -> Result<State, String> {
    let mut state = State {
        meta: wal.meta(META),
        ..State::default()
    };
    if let (Some(first), Some(last)) = (wal.first_index(), wal.last_index()) {
        for index in first..=last {
            match wal.read(index) {
                Ok(Some(p)) => {
                    state.entries.insert(index, p);
                }
                Ok(None) => return Err(format!("hole at {index} in {first}..={last}")),
                Err(e) => return Err(format!("read {index}: {e}")),
            }
        }
    }
    Ok(state)
}

#[test]
fn damaged_segments_are_refused_or_recover_a_prefix() {
    let seed = tempfile::tempdir().expect("tempdir");
    let states = write_seed(seed.path());
    let files = segments(seed.path());
    assert!(files.len() >= 4, "the seed spans segments: {files:?}");
    let strategy = (any::<Index>(), mutate::edits());
    budget::fuzz("wal recovery", strategy, |(which, edits)| {
        let dir = tempfile::tempdir().expect("tempdir");
        copy_dir(seed.path(), dir.path());
        let victim = dir
            .path()
            .join(which.get(&files).file_name().expect("name"));
        let bytes = std::fs::read(&victim).expect("read segment");
        std::fs::write(&victim, mutate::apply(&bytes, &edits)).expect("write segment");
        let opened = alloc::bounded("Wal::open", || Wal::open(dir.path(), opts()))?;
        let Ok(wal) = opened else {
            return Ok(()); // refused: the member does not start on a corrupt WAL
        };
        let state = recovered(&wal).map_err(TestCaseError::fail)?;
        prop_assert!(
            states.contains(&state),
            "recovered a state that no prefix of the writes produced: {:?} entries {:?}",
            state.meta,
            state.entries.keys().collect::<Vec<_>>()
        );
        // The recovered log continues: the next index appends and survives a reopen.
        let next = wal.last_index().map_or(1, |l| l + 1);
        let lsn = wal
            .append(&[(next, b"after recovery")])
            .map_err(|e| TestCaseError::fail(format!("append after recovery: {e}")))?;
        wal.wait_durable(lsn)
            .map_err(|e| TestCaseError::fail(format!("sync after recovery: {e}")))?;
        drop(wal);
        let again = Wal::open(dir.path(), opts())
            .map_err(|e| TestCaseError::fail(format!("reopen after recovery: {e}")))?;
        prop_assert_eq!(
            again.read(next).ok().flatten(),
            Some(b"after recovery".to_vec())
        );
        Ok(())
    });
}
