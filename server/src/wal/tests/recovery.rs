//! Recovery rules on hand-damaged directories.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::{all_entries, append_each, data, files, opts};
use crate::wal::record::{self, Identity, Record};
use crate::wal::segment::{HEADER_LEN, SegmentHeader};
use crate::wal::{Wal, WalError, WalOptions};

/// One frame found by walking a segment: start offset, end without padding, the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Frame {
    pub start: u64,
    pub end: u64,
    pub padded_end: u64,
    pub kind: FrameKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FrameKind {
    Entry(u64),
    Meta,
    Truncate,
    Purge,
    SyncPoint(u64),
    Seal,
}

/// Walks the valid records of a segment file from its header; returns identity and frames.
pub(super) fn frames(path: &Path) -> (Identity, Vec<Frame>) {
    let bytes = std::fs::read(path).unwrap();
    let id = SegmentHeader::decode(&bytes).unwrap().identity();
    let mut out = Vec::new();
    let mut off = HEADER_LEN as usize;
    while off < bytes.len() {
        let Ok((rec, len)) = record::decode(id, &bytes[off..]) else {
            break;
        };
        let payload = u32::from_le_bytes(bytes[off..off + 4].try_into().unwrap()) as u64;
        let kind = match rec {
            Record::Entry { index, .. } => FrameKind::Entry(index),
            Record::SyncPoint { durable_through } => FrameKind::SyncPoint(durable_through),
            Record::Seal => FrameKind::Seal,
            Record::Meta { .. } => FrameKind::Meta,
            Record::Truncate { .. } => FrameKind::Truncate,
            Record::Purge { .. } => FrameKind::Purge,
        };
        out.push(Frame {
            start: off as u64,
            end: off as u64 + 12 + payload,
            padded_end: (off + len) as u64,
            kind,
        });
        off += len;
        if kind == FrameKind::Seal {
            break;
        }
    }
    (id, out)
}

pub(super) fn segment_paths(dir: &Path) -> Vec<PathBuf> {
    files(dir, ".wal")
        .into_iter()
        .map(|n| dir.join(n))
        .collect()
}

fn flip(path: &Path, offset: u64) {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, offset).unwrap();
    f.write_all_at(&[b[0] ^ 0x5a], offset).unwrap();
}

fn expect_corrupt(dir: &Path, o: WalOptions, path: &Path, offset: u64) -> String {
    match Wal::open(dir, o) {
        Err(WalError::Corrupt {
            segment,
            offset: at,
            reason,
        }) => {
            assert_eq!((segment.as_path(), at), (path, offset), "{reason}");
            reason
        }
        other => panic!(
            "expected Corrupt at {}:{offset}, got {other:?}",
            path.display()
        ),
    }
}

fn entry_frame(path: &Path, index: u64) -> Frame {
    frames(path)
        .1
        .into_iter()
        .find(|f| f.kind == FrameKind::Entry(index))
        .unwrap()
}

#[test]
fn torn_tail_is_cut_and_new_appends_never_resurrect_old_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), WalOptions::default()).unwrap();
    append_each(&wal, 1, 30, 100);
    drop(wal);
    let path = segment_paths(dir.path()).pop().unwrap();
    let f25 = entry_frame(&path, 25);
    // Power cut while entry 25 was half on disk: the file ends inside it.
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(f25.start + 30)
        .unwrap();
    let wal = Wal::open(dir.path(), WalOptions::default()).unwrap();
    assert_eq!((wal.first_index(), wal.last_index()), (Some(1), Some(24)));
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        64 << 20,
        "preallocated again"
    );
    let bytes = std::fs::read(&path).unwrap();
    assert!(
        bytes[f25.start as usize..].iter().all(|&b| b == 0),
        "tail zeroed"
    );
    wal.append(&[(25, b"short")]).unwrap();
    drop(wal);
    let wal = Wal::open(dir.path(), WalOptions::default()).unwrap();
    assert_eq!(wal.last_index(), Some(25));
    assert_eq!(wal.read(25).unwrap().as_deref(), Some(&b"short"[..]));
    assert_eq!(wal.read(24).unwrap(), Some(data(24, 100)));
}

/// Writes entries `1..=synced` (50 B each) and syncs, appends `synced + 1..=last` with no
/// sync point after them and closes the WAL; returns the path of its last segment.
fn synced_then_unsynced(dir: &Path, synced: u64, last: u64) -> PathBuf {
    let wal = Wal::open(dir, WalOptions::default()).unwrap();
    append_each(&wal, 1, synced, 50);
    wal.sync().unwrap();
    append_each(&wal, synced + 1, last, 50);
    drop(wal);
    segment_paths(dir).pop().unwrap()
}

#[test]
fn valid_records_after_a_hole_in_the_unsynced_tail_are_dropped() {
    // Writeback may persist pages out of order: record 12 lost, 13 and 14 on disk. None of
    // them was acknowledged (no sync point covers them), so the log ends at 11.
    let dir = tempfile::tempdir().unwrap();
    let path = synced_then_unsynced(dir.path(), 11, 14);
    let (_, fr) = frames(&path);
    let f12 = fr
        .iter()
        .find(|f| f.kind == FrameKind::Entry(12))
        .unwrap()
        .clone();
    let file = OpenOptions::new().write(true).open(&path).unwrap();
    file.write_all_at(&vec![0u8; (f12.padded_end - f12.start) as usize], f12.start)
        .unwrap();
    // Remove the sync points written after 12 (they were not durable in this scenario).
    for f in fr
        .iter()
        .filter(|f| matches!(f.kind, FrameKind::SyncPoint(_)) && f.start > f12.start)
    {
        file.write_all_at(&vec![0u8; (f.padded_end - f.start) as usize], f.start)
            .unwrap();
    }
    let wal = Wal::open(dir.path(), WalOptions::default()).unwrap();
    assert_eq!(wal.last_index(), Some(11));
    let bytes = std::fs::read(&path).unwrap();
    assert!(
        bytes[f12.start as usize..].iter().all(|&b| b == 0),
        "13 and 14 erased"
    );
}

#[test]
fn corruption_before_a_sync_point_is_an_error_with_path_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    let path = synced_then_unsynced(dir.path(), 10, 12);
    let f5 = entry_frame(&path, 5);
    flip(&path, f5.start + 15);
    let reason = expect_corrupt(dir.path(), WalOptions::default(), &path, f5.start);
    assert!(
        reason.contains("crc mismatch") && reason.contains("sync point"),
        "{reason}"
    );
}

#[test]
fn any_invalid_record_in_a_sealed_segment_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), opts(4096)).unwrap();
    append_each(&wal, 1, 100, 100);
    drop(wal);
    let paths = segment_paths(dir.path());
    assert!(paths.len() >= 3);
    let victim = &paths[1];
    let (_, fr) = frames(victim);
    let last_entry = fr
        .iter()
        .rev()
        .find(|f| matches!(f.kind, FrameKind::Entry(_)))
        .unwrap();
    flip(victim, last_entry.end - 1);
    let reason = expect_corrupt(dir.path(), opts(4096), victim, last_entry.start);
    assert!(reason.contains("before the seal"), "{reason}");
}

#[test]
fn a_sealed_segment_cut_short_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(
        dir.path(),
        WalOptions {
            preallocate: false,
            ..opts(4096)
        },
    )
    .unwrap();
    append_each(&wal, 1, 100, 100);
    drop(wal);
    let paths = segment_paths(dir.path());
    let (_, fr) = frames(&paths[0]);
    let seal = fr.last().unwrap();
    assert_eq!(seal.kind, FrameKind::Seal);
    OpenOptions::new()
        .write(true)
        .open(&paths[0])
        .unwrap()
        .set_len(seal.start)
        .unwrap();
    let reason = expect_corrupt(dir.path(), opts(4096), &paths[0], seal.start);
    assert!(reason.contains("file ends before the seal"), "{reason}");
}

#[test]
fn a_missing_segment_or_a_bad_header_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), opts(4096)).unwrap();
    append_each(&wal, 1, 100, 100);
    drop(wal);
    let paths = segment_paths(dir.path());
    let saved = std::fs::read(&paths[1]).unwrap();
    std::fs::remove_file(&paths[1]).unwrap();
    let reason = expect_corrupt(dir.path(), opts(4096), &paths[2], 0);
    assert!(reason.contains("sequence gap"), "{reason}");
    std::fs::write(&paths[1], &saved).unwrap();
    flip(&paths[1], 20);
    let reason = expect_corrupt(dir.path(), opts(4096), &paths[1], 0);
    assert!(reason.contains("header crc"), "{reason}");
}

#[test]
fn unfinished_temp_segments_are_removed_and_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), opts(4096)).unwrap();
    append_each(&wal, 1, 10, 10);
    drop(wal);
    // A next segment that was never named (its predecessor was not yet durable).
    let header = SegmentHeader {
        seq: 2,
        nonce: 5,
        first_index: 11,
    };
    let mut bytes = header.encode().to_vec();
    record::encode(
        header.identity(),
        &Record::Entry {
            index: 11,
            data: b"unacked",
        },
        &mut bytes,
    );
    let tmp = dir.path().join("0000000000000002.wal.tmp");
    std::fs::write(&tmp, &bytes).unwrap();
    let wal = Wal::open(dir.path(), opts(4096)).unwrap();
    assert_eq!(wal.last_index(), Some(10));
    assert!(!tmp.exists());
}

#[test]
fn a_sealed_last_segment_continues_in_a_new_segment() {
    // Crash right after a rollover: the old segment is sealed, the new one was never named.
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), opts(4096)).unwrap();
    wal.set_meta(1, b"vote").unwrap();
    append_each(&wal, 1, 60, 100);
    drop(wal);
    let mut paths = segment_paths(dir.path());
    let newest = paths.pop().unwrap();
    let (_, fr) = frames(paths.last().unwrap());
    let last_sealed_entry = fr.iter().rev().find_map(|f| match f.kind {
        FrameKind::Entry(i) => Some(i),
        _ => None,
    });
    std::fs::remove_file(&newest).unwrap();
    let wal = Wal::open(dir.path(), opts(4096)).unwrap();
    assert_eq!(wal.last_index(), last_sealed_entry);
    let next = last_sealed_entry.unwrap() + 1;
    wal.append(&[(next, b"after")]).unwrap();
    drop(wal);
    let wal = Wal::open(dir.path(), opts(4096)).unwrap();
    assert_eq!(wal.last_index(), Some(next));
    assert_eq!(wal.meta(1).as_deref(), Some(&b"vote"[..]));
    assert_eq!(wal.read(next).unwrap().as_deref(), Some(&b"after"[..]));
}

#[test]
fn stale_frames_in_a_recycled_segment_never_validate() {
    let dir = tempfile::tempdir().unwrap();
    let o = WalOptions {
        recycle_segments: 1,
        ..opts(4096)
    };
    let wal = Wal::open(dir.path(), o.clone()).unwrap();
    append_each(&wal, 1, 70, 100);
    wal.purge_to(34).unwrap();
    wal.sync().unwrap();
    let spare = dir.path().join(&files(dir.path(), ".spare")[0]);
    let (old_id, old_frames) = frames(&spare);
    assert!(old_frames.len() > 10, "the spare holds old records");
    // Fill the current segment so the next rollover reuses the spare, with a few entries only.
    let mut i = 71;
    while !files(dir.path(), ".spare").is_empty() {
        wal.append(&[(i, &data(i, 100))]).unwrap();
        i += 1;
        assert!(i < 1000, "spare never reused");
    }
    wal.sync().unwrap();
    drop(wal);
    let newest = segment_paths(dir.path()).pop().unwrap();
    let bytes = std::fs::read(&newest).unwrap();
    let new_id = SegmentHeader::decode(&bytes).unwrap().identity();
    assert!(new_id.seq > old_id.seq);
    assert_ne!(new_id.nonce, old_id.nonce);
    // Old frames past the new data are still there but invalid under the new identity.
    let (_, new_frames) = frames(&newest);
    let data_end = new_frames.last().unwrap().padded_end;
    let stale: Vec<_> = old_frames.iter().filter(|f| f.start >= data_end).collect();
    assert!(
        !stale.is_empty(),
        "test needs stale frames after the new data"
    );
    for f in &stale {
        let at = f.start as usize;
        assert!(
            record::decode(old_id, &bytes[at..]).is_ok(),
            "valid in its old life"
        );
        assert!(
            record::decode(new_id, &bytes[at..]).is_err(),
            "stale frame validated at {at}"
        );
    }
    let wal = Wal::open(dir.path(), o).unwrap();
    assert_eq!(wal.last_index(), Some(i - 1));
    assert_eq!(all_entries(&wal).len() as u64, i - 1 - 34);
}
