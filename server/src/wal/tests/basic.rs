//! Behaviour of the public API: append, read, meta, truncate, purge, rollover, reopen.

use super::{all_entries, append_each, bounds, data, files, opts};
use crate::wal::record::{self, Record};
use crate::wal::segment::{HEADER_LEN, SegmentHeader};
use crate::wal::{Lsn, MAX_VALUE_BYTES, Wal, WalError, WalOptions};

#[test]
fn new_wal_is_empty_with_one_named_segment() {
    let dir = tempfile::tempdir().unwrap();
    let wal_dir = dir.path().join("member/wal");
    let wal = Wal::open(&wal_dir, WalOptions::default()).unwrap();
    assert_eq!(bounds(&wal), (None, None, None));
    assert_eq!(wal.meta(1), None);
    assert_eq!(wal.read(1).unwrap(), None);
    assert_eq!(
        files(&wal_dir, ".wal"),
        vec!["0000000000000001-0000000000000000.wal"]
    );
    let len = std::fs::metadata(wal_dir.join("0000000000000001-0000000000000000.wal"))
        .unwrap()
        .len();
    assert_eq!(len, 64 << 20, "preallocated to segment_bytes");
}

#[test]
fn appended_entries_are_readable_at_once_and_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), WalOptions::default()).unwrap();
    let lsn = wal.append(&[(1, b"a"), (2, b"bb"), (3, b"")]).unwrap();
    assert_eq!(wal.read(2).unwrap().as_deref(), Some(&b"bb"[..]));
    assert_eq!(wal.read(3).unwrap().as_deref(), Some(&b""[..]));
    assert_eq!(wal.read(4).unwrap(), None);
    assert_eq!(wal.read(0).unwrap(), None);
    assert_eq!(lsn, 1);
    assert_eq!(wal.append(&[(4, b"dddd")]).unwrap(), 2);
    wal.wait_durable(2).unwrap();
    drop(wal);

    let wal = Wal::open(dir.path(), WalOptions::default()).unwrap();
    assert_eq!((wal.first_index(), wal.last_index()), (Some(1), Some(4)));
    assert_eq!(
        all_entries(&wal),
        vec![
            (1, b"a".to_vec()),
            (2, b"bb".to_vec()),
            (3, vec![]),
            (4, b"dddd".to_vec())
        ]
    );
    assert_eq!(wal.lsns(), (0, 0), "Lsns restart at open");
}

/// Asserts that an append was refused with `NotContiguous { expected, got }`.
#[track_caller]
fn assert_not_contiguous(result: Result<Lsn, WalError>, expected: u64, got: u64) {
    match result {
        Err(WalError::NotContiguous {
            expected: e,
            got: g,
        }) if (e, g) == (expected, got) => {}
        other => panic!("want NotContiguous {{ expected: {expected}, got: {got} }}: {other:?}"),
    }
}

#[test]
fn append_enforces_contiguous_indexes() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), WalOptions::default()).unwrap();
    wal.append(&[(10, b"x"), (11, b"y")]).unwrap();
    assert_not_contiguous(wal.append(&[(13, b"z")]), 12, 13);
    assert_not_contiguous(wal.append(&[(12, b"z"), (14, b"w")]), 13, 14);
    assert_not_contiguous(wal.append(&[(11, b"again")]), 12, 11);
    assert_eq!(wal.last_index(), Some(11), "rejected appends wrote nothing");
    let (written, _) = wal.lsns();
    assert_eq!(
        wal.append(&[]).unwrap(),
        written,
        "empty append returns the current Lsn"
    );
}

#[test]
fn oversized_values_are_rejected_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), WalOptions::default()).unwrap();
    let big = vec![0u8; MAX_VALUE_BYTES + 1];
    assert!(matches!(
        wal.append(&[(1, &big)]),
        Err(WalError::TooLarge { .. })
    ));
    assert!(matches!(
        wal.set_meta(1, &big),
        Err(WalError::TooLarge { .. })
    ));
    assert_eq!(wal.lsns().0, 0);
}

#[test]
fn meta_keeps_the_latest_value_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), WalOptions::default()).unwrap();
    wal.set_meta(1, b"term 1 vote 2").unwrap();
    wal.set_meta(2, b"committed 5").unwrap();
    let lsn = wal.set_meta(1, b"term 2 vote 3").unwrap();
    assert_eq!(wal.meta(1).as_deref(), Some(&b"term 2 vote 3"[..]));
    wal.wait_durable(lsn).unwrap();
    drop(wal);
    let wal = Wal::open(dir.path(), WalOptions::default()).unwrap();
    assert_eq!(wal.meta(1).as_deref(), Some(&b"term 2 vote 3"[..]));
    assert_eq!(wal.meta(2).as_deref(), Some(&b"committed 5"[..]));
    assert_eq!(wal.meta(3), None);
}

#[test]
fn truncate_then_append_replays_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), WalOptions::default()).unwrap();
    append_each(&wal, 1, 10, 8);
    let (written, _) = wal.lsns();
    assert_eq!(
        wal.truncate_from(11).unwrap(),
        written,
        "nothing at or above 11: no record"
    );
    wal.truncate_from(6).unwrap();
    assert_eq!(wal.last_index(), Some(5));
    assert_eq!(wal.read(6).unwrap(), None);
    wal.append(&[(6, b"new six"), (7, b"new seven")]).unwrap();
    wal.truncate_from(7).unwrap();
    wal.sync().unwrap();
    drop(wal);
    let wal = Wal::open(dir.path(), WalOptions::default()).unwrap();
    assert_eq!(wal.last_index(), Some(6));
    assert_eq!(wal.read(6).unwrap().as_deref(), Some(&b"new six"[..]));
    assert_eq!(wal.read(5).unwrap(), Some(data(5, 8)));
    wal.truncate_from(1).unwrap();
    assert_eq!((wal.first_index(), wal.last_index()), (None, None));
    wal.append(&[(1, b"restart")]).unwrap();
    assert_eq!(wal.read(1).unwrap().as_deref(), Some(&b"restart"[..]));
}

#[test]
fn rollover_seals_the_old_segment_and_starts_with_a_meta_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), opts(4096)).unwrap();
    wal.set_meta(1, b"vote").unwrap();
    wal.set_meta(2, b"committed").unwrap();
    append_each(&wal, 1, 100, 100);
    wal.purge_to(3).unwrap();
    append_each(&wal, 101, 140, 100);
    wal.sync().unwrap();
    let names = files(dir.path(), ".wal");
    assert!(names.len() >= 3, "{names:?}");
    for (i, name) in names.iter().enumerate() {
        let bytes = std::fs::read(dir.path().join(name)).unwrap();
        let header = SegmentHeader::decode(&bytes).unwrap();
        assert_eq!(
            name,
            &format!("{:016x}-{:016x}.wal", header.seq, header.first_index)
        );
        assert_eq!(bytes.len(), 4096, "preallocated");
        // Walk the records: non-last segments end with a Seal; every segment after the first
        // opens with the metadata values.
        let mut off = HEADER_LEN as usize;
        let mut kinds = Vec::new();
        while let Ok((rec, len)) = record::decode(header.identity(), &bytes[off..]) {
            kinds.push(rec);
            off += len;
            if rec == Record::Seal {
                break;
            }
        }
        if i + 1 < names.len() {
            assert_eq!(kinds.last(), Some(&Record::Seal), "{name}");
        }
        if i > 0 {
            assert_eq!(
                kinds[0],
                Record::Meta {
                    key: 1,
                    value: b"vote"
                },
                "{name}"
            );
            assert_eq!(
                kinds[1],
                Record::Meta {
                    key: 2,
                    value: b"committed"
                },
                "{name}"
            );
            let first_entry = kinds.iter().find_map(|r| match r {
                Record::Entry { index, .. } => Some(*index),
                _ => None,
            });
            if let Some(first_entry) = first_entry {
                assert_eq!(
                    first_entry, header.first_index,
                    "{name}: name carries the first index"
                );
            }
        }
    }
    drop(wal);
    let wal = Wal::open(dir.path(), opts(4096)).unwrap();
    assert_eq!((wal.first_index(), wal.last_index()), (Some(4), Some(140)));
    for i in [4, 50, 100, 101, 140] {
        assert_eq!(wal.read(i).unwrap(), Some(data(i, 100)), "entry {i}");
    }
}

#[test]
fn purge_hides_entries_and_deletes_whole_segments_but_keeps_meta() {
    let dir = tempfile::tempdir().unwrap();
    let o = WalOptions {
        recycle_segments: 0,
        ..opts(4096)
    };
    let wal = Wal::open(dir.path(), o.clone()).unwrap();
    wal.set_meta(1, b"vote-a").unwrap();
    append_each(&wal, 1, 200, 100);
    wal.sync().unwrap();
    let before = files(dir.path(), ".wal");
    wal.purge_to(150).unwrap();
    assert_eq!(wal.read(150).unwrap(), None);
    assert_eq!(wal.read(151).unwrap(), Some(data(151, 100)));
    assert_eq!(bounds(&wal), (Some(151), Some(200), Some(150)));
    wal.sync().unwrap();
    let after = files(dir.path(), ".wal");
    assert!(
        after.len() < before.len(),
        "before {before:?} after {after:?}"
    );
    assert_eq!(
        after,
        before[before.len() - after.len()..].to_vec(),
        "a prefix was deleted"
    );
    // The first remaining segment still holds an entry <= 150 or is the one 151 lives in.
    let first_kept = u64::from_str_radix(&after[0][17..33], 16).unwrap();
    assert!(first_kept <= 151, "{after:?}");
    assert!(files(dir.path(), ".spare").is_empty(), "recycling disabled");
    drop(wal);
    let wal = Wal::open(dir.path(), o).unwrap();
    assert_eq!(bounds(&wal), (Some(151), Some(200), Some(150)));
    assert_eq!(wal.meta(1).as_deref(), Some(&b"vote-a"[..]));
}

/// `segments()` lists each live segment's highest index; purging to one of them removes that
/// segment and every older one (what `--max-wals` relies on, raft/retention.rs).
#[test]
fn segments_report_their_highest_index_and_a_purge_to_one_drops_that_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let o = WalOptions {
        recycle_segments: 0,
        ..opts(4096)
    };
    let wal = Wal::open(dir.path(), o).unwrap();
    append_each(&wal, 1, 200, 100);
    wal.sync().unwrap();
    let segs = wal.segments();
    assert_eq!(segs.len(), files(dir.path(), ".wal").len());
    assert!(segs.len() >= 4, "{segs:?}");
    assert_eq!(*segs.last().unwrap(), Some(200));
    let maxes: Vec<u64> = segs.iter().flatten().copied().collect();
    assert!(maxes.windows(2).all(|w| w[0] < w[1]), "{segs:?}");
    let cut = segs[1].expect("the second segment holds entries");
    wal.purge_to(cut).unwrap();
    wal.sync().unwrap();
    assert_eq!(wal.segments(), segs[2..].to_vec());
    assert_eq!(files(dir.path(), ".wal").len(), segs.len() - 2);
    assert_eq!(wal.read(cut + 1).unwrap(), Some(data(cut + 1, 100)));
}

#[test]
fn purge_past_the_end_empties_the_log_and_appends_resume_above_it() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), opts(4096)).unwrap();
    append_each(&wal, 1, 30, 200);
    wal.purge_to(1000).unwrap();
    assert_eq!(bounds(&wal), (None, None, Some(1000)));
    match wal.append(&[(1000, b"x")]) {
        Err(WalError::BelowPurged {
            index: 1000,
            purged: 1000,
        }) => {}
        other => panic!("{other:?}"),
    }
    wal.append(&[(1001, b"after snapshot")]).unwrap();
    wal.purge_to(5).unwrap();
    assert_eq!(wal.purged_index(), Some(1000), "a lower purge is a no-op");
    wal.sync().unwrap();
    drop(wal);
    let wal = Wal::open(dir.path(), opts(4096)).unwrap();
    assert_eq!(bounds(&wal), (Some(1001), Some(1001), Some(1000)));
    assert_eq!(
        files(dir.path(), ".wal").len(),
        1,
        "every older segment was obsolete"
    );
}

#[test]
fn purged_segments_are_recycled_with_a_new_identity() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), opts(4096)).unwrap();
    append_each(&wal, 1, 120, 100);
    wal.purge_to(100).unwrap();
    wal.sync().unwrap();
    let spares = files(dir.path(), ".spare");
    assert_eq!(spares.len(), 2, "kept up to recycle_segments spares");
    let old = std::fs::read(dir.path().join(&spares[1])).unwrap();
    let old_header = SegmentHeader::decode(&old).unwrap();
    // Writing more reuses the spares: they become live segments with fresh identities.
    append_each(&wal, 121, 200, 100);
    wal.sync().unwrap();
    assert!(files(dir.path(), ".spare").len() < 2);
    for name in files(dir.path(), ".wal") {
        let h = SegmentHeader::decode(&std::fs::read(dir.path().join(&name)).unwrap()).unwrap();
        assert_ne!(h.nonce, old_header.nonce, "{name}");
    }
    drop(wal);
    let wal = Wal::open(dir.path(), opts(4096)).unwrap();
    assert_eq!(
        (wal.first_index(), wal.last_index()),
        (Some(101), Some(200))
    );
    assert_eq!(
        all_entries(&wal),
        (101..=200).map(|i| (i, data(i, 100))).collect::<Vec<_>>()
    );
}

#[test]
fn read_range_returns_existing_entries_in_order_across_segments() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), opts(8192)).unwrap();
    for i in 1..=300u64 {
        // Mixed sizes; some batches; sync points end up between records.
        let e = data(i, (i % 7 * 50) as usize);
        wal.append(&[(i, &e)]).unwrap();
        if i % 40 == 0 {
            wal.sync().unwrap();
        }
    }
    wal.purge_to(20).unwrap();
    let got = wal.read_range(0, 1000).unwrap();
    assert_eq!(
        got,
        (21..=300)
            .map(|i| (i, data(i, (i % 7 * 50) as usize)))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        wal.read_range(50, 53)
            .unwrap()
            .iter()
            .map(|e| e.0)
            .collect::<Vec<_>>(),
        vec![50, 51, 52]
    );
    assert!(wal.read_range(53, 50).unwrap().is_empty());
    assert!(wal.read_range(301, 400).unwrap().is_empty());
}

#[test]
fn a_second_handle_on_the_same_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), WalOptions::default()).unwrap();
    match Wal::open(dir.path(), WalOptions::default()) {
        Err(WalError::Locked { dir: d }) => assert_eq!(d, dir.path()),
        other => panic!("{other:?}"),
    }
    drop(wal);
    Wal::open(dir.path(), WalOptions::default()).unwrap();
}

#[test]
fn without_preallocation_files_grow_with_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let o = WalOptions {
        preallocate: false,
        ..opts(4096)
    };
    let wal = Wal::open(dir.path(), o.clone()).unwrap();
    append_each(&wal, 1, 5, 10);
    wal.sync().unwrap();
    let name = &files(dir.path(), ".wal")[0];
    let len = std::fs::metadata(dir.path().join(name)).unwrap().len();
    assert!(len < 4096 && len > HEADER_LEN, "{len}");
    drop(wal);
    let wal = Wal::open(dir.path(), o).unwrap();
    assert_eq!(wal.last_index(), Some(5));
}

/// `rolled_over` resolves for a write that opened a segment (also one made before the wait
/// started), and not for writes that fit in the current segment.
#[tokio::test]
async fn rolled_over_resolves_after_a_write_that_opens_a_segment() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), opts(4096)).unwrap();
    let not_yet = |wal: &Wal| {
        let wait = wal.rolled_over();
        futures::FutureExt::now_or_never(wait).is_none()
    };
    // Two small entries fit in the first segment.
    wal.append(&[(1, &data(1, 100)), (2, &data(2, 100))])
        .unwrap();
    assert_eq!(wal.segments().len(), 1);
    assert!(not_yet(&wal), "no rollover yet");
    // Entries of 1 KiB: the fourth no longer fits and opens the second segment.
    let mut index = 3;
    while wal.segments().len() == 1 {
        wal.append(&[(index, &data(index, 1024))]).unwrap();
        index += 1;
        assert!(index < 20, "a 4 KiB segment rolls over within 16 KiB");
    }
    // The rollover happened before anyone waited: the wait resolves at once, once.
    assert!(!not_yet(&wal), "the rollover is remembered");
    assert!(not_yet(&wal), "and consumed");
    // A metadata record that opens a segment signals it too.
    let segments = wal.segments().len();
    let mut writes = 0;
    while wal.segments().len() == segments {
        wal.set_meta(2, &data(writes, 1024)).unwrap();
        writes += 1;
        assert!(writes < 20, "a 4 KiB segment rolls over within 16 KiB");
    }
    assert!(!not_yet(&wal), "a rollover by set_meta is signalled");
}
