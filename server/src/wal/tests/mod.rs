//! Tests of the WAL: framing, behaviour, recovery, group commit, property tests against a
//! model, and an `#[ignore]`d throughput measurement.

mod basic;
mod bench;
mod durability;
mod framing;
mod model;
mod recovery;

use std::path::Path;

use crate::wal::{Lsn, Wal, WalOptions};

/// Options with small segments so tests cross many rollovers.
pub(super) fn opts(segment_bytes: u64) -> WalOptions {
    WalOptions {
        segment_bytes,
        preallocate: true,
        recycle_segments: 2,
    }
}

/// Deterministic entry bytes for `index`, `len` bytes long.
pub(super) fn data(index: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (index as usize).wrapping_mul(31).wrapping_add(i) as u8)
        .collect()
}

/// The WAL's first, last and purged index, in that order.
pub(super) fn bounds(wal: &Wal) -> (Option<u64>, Option<u64>, Option<u64>) {
    (wal.first_index(), wal.last_index(), wal.purged_index())
}

/// Appends entries `from..=to` one call each; returns the last Lsn.
pub(super) fn append_each(wal: &Wal, from: u64, to: u64, len: usize) -> Lsn {
    let mut lsn = 0;
    for i in from..=to {
        lsn = wal.append(&[(i, &data(i, len))]).expect("append");
    }
    lsn
}

/// Names of files in `dir` ending with `suffix`, sorted.
pub(super) fn files(dir: &Path, suffix: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
        .filter(|n| n.ends_with(suffix))
        .collect();
    names.sort();
    names
}

/// Reads every entry `first_index..=last_index` with single reads.
pub(super) fn all_entries(wal: &Wal) -> Vec<(u64, Vec<u8>)> {
    match (wal.first_index(), wal.last_index()) {
        (Some(first), Some(last)) => (first..=last)
            .map(|i| (i, wal.read(i).expect("read").expect("entry present")))
            .collect(),
        _ => Vec::new(),
    }
}
