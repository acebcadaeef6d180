//! Record frames, segment headers and file names.

use crate::wal::record::{self, FRAME_ALIGN, Identity, Invalid, Record};
use crate::wal::segment::{
    FileKind, HEADER_LEN, SegmentHeader, classify, segment_file_name, spare_file_name,
};

const ID: Identity = Identity {
    seq: 7,
    nonce: 0x1234_5678_9abc_def0,
};

fn all_kinds() -> Vec<Record<'static>> {
    vec![
        Record::Entry {
            index: 42,
            data: b"hello raft",
        },
        Record::Entry {
            index: 1,
            data: b"",
        },
        Record::Meta {
            key: 1,
            value: b"vote",
        },
        Record::Meta {
            key: 255,
            value: b"",
        },
        Record::Truncate { from: 9 },
        Record::Purge { to: u64::MAX },
        Record::SyncPoint {
            durable_through: 4096,
        },
        Record::Seal,
    ]
}

#[test]
fn every_record_kind_round_trips_with_aligned_frames() {
    for rec in all_kinds() {
        let mut buf = Vec::new();
        record::encode(ID, &rec, &mut buf);
        assert_eq!(buf.len() % FRAME_ALIGN, 0, "{rec:?}");
        assert_eq!(buf.len(), rec.frame_len());
        let (decoded, len) = record::decode(ID, &buf).expect("valid frame");
        assert_eq!(decoded, rec);
        assert_eq!(len, buf.len());
    }
}

#[test]
fn frame_layout_matches_the_documented_table() {
    let mut buf = Vec::new();
    record::encode(
        ID,
        &Record::Meta {
            key: 3,
            value: b"ab",
        },
        &mut buf,
    );
    assert_eq!(&buf[0..4], &3u32.to_le_bytes(), "payload length");
    assert_eq!(buf[4], 2, "type Meta");
    assert_eq!(&buf[5..8], &[0, 0, 0], "reserved");
    let mut h = crc32fast::Hasher::new();
    h.update(&7u64.to_le_bytes());
    h.update(&0x1234_5678_9abc_def0u64.to_le_bytes());
    h.update(&buf[0..8]);
    h.update(&[3, b'a', b'b']);
    assert_eq!(
        &buf[8..12],
        &h.finalize().to_le_bytes(),
        "crc over identity, head and payload"
    );
    assert_eq!(&buf[12..15], &[3, b'a', b'b']);
    assert_eq!(buf.len(), 16, "12 + 3 rounded up to 8");
}

#[test]
fn crc_covers_segment_identity() {
    let mut buf = Vec::new();
    record::encode(
        ID,
        &Record::Entry {
            index: 5,
            data: b"x",
        },
        &mut buf,
    );
    for other in [
        Identity { seq: 8, ..ID },
        Identity {
            nonce: ID.nonce ^ 1,
            ..ID
        },
    ] {
        match record::decode(other, &buf) {
            Err(Invalid::Bad(reason)) => assert!(reason.contains("crc mismatch"), "{reason}"),
            other => panic!("record validated under another identity: {other:?}"),
        }
    }
}

#[test]
fn any_single_byte_change_in_a_frame_is_detected() {
    let mut buf = Vec::new();
    record::encode(
        ID,
        &Record::Entry {
            index: 77,
            data: b"payload bytes",
        },
        &mut buf,
    );
    let covered = 12 + 8 + 13;
    for pos in 0..covered {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut bad = buf.clone();
            bad[pos] ^= flip;
            assert!(
                record::decode(ID, &bad).is_err(),
                "flip {flip:#x} at {pos} went unnoticed"
            );
        }
    }
}

#[test]
fn zeros_are_the_end_of_data_and_short_garbage_is_invalid() {
    assert_eq!(record::decode(ID, &[0u8; 64]), Err(Invalid::Zeroed));
    assert_eq!(record::decode(ID, &[0u8; 5]), Err(Invalid::Zeroed));
    assert!(matches!(
        record::decode(ID, &[1, 0, 0]),
        Err(Invalid::Bad(_))
    ));
    let mut buf = Vec::new();
    record::encode(
        ID,
        &Record::Entry {
            index: 1,
            data: &[9; 40],
        },
        &mut buf,
    );
    let torn = &buf[..30];
    match record::decode(ID, torn) {
        Err(Invalid::Bad(reason)) => assert!(reason.contains("exceeds"), "{reason}"),
        other => panic!("torn frame decoded: {other:?}"),
    }
}

#[test]
fn malformed_payload_lengths_are_rejected() {
    // A Truncate frame claiming a 4-byte payload, with a correct CRC.
    let mut buf = vec![4, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4];
    let mut h = crc32fast::Hasher::new();
    h.update(&ID.seq.to_le_bytes());
    h.update(&ID.nonce.to_le_bytes());
    h.update(&buf[0..8]);
    h.update(&buf[12..16]);
    buf[8..12].copy_from_slice(&h.finalize().to_le_bytes());
    match record::decode(ID, &buf) {
        Err(Invalid::Bad(reason)) => assert!(reason.contains("invalid for Truncate"), "{reason}"),
        other => panic!("decoded {other:?}"),
    }
}

#[test]
fn header_round_trips_and_rejects_damage() {
    let h = SegmentHeader {
        seq: 3,
        nonce: 99,
        first_index: 1000,
    };
    let bytes = h.encode();
    assert_eq!(bytes.len() as u64, HEADER_LEN);
    assert_eq!(&bytes[0..8], b"KEELWAL\0");
    assert_eq!(&bytes[8..12], &1u32.to_le_bytes());
    assert_eq!(SegmentHeader::decode(&bytes), Ok(h));
    for pos in 0..44 {
        let mut bad = bytes;
        bad[pos] ^= 0x10;
        assert!(
            SegmentHeader::decode(&bad).is_err(),
            "header flip at {pos} went unnoticed"
        );
    }
    assert!(
        SegmentHeader::decode(&bytes[..20])
            .unwrap_err()
            .to_string()
            .contains("shorter")
    );
}

#[test]
fn unknown_format_version_is_named_in_the_error() {
    let mut bytes = SegmentHeader {
        seq: 1,
        nonce: 1,
        first_index: 0,
    }
    .encode();
    bytes[8..12].copy_from_slice(&2u32.to_le_bytes());
    let crc = crc32fast::hash(&bytes[0..40]);
    bytes[40..44].copy_from_slice(&crc.to_le_bytes());
    assert!(
        SegmentHeader::decode(&bytes)
            .unwrap_err()
            .to_string()
            .contains("version 2")
    );
}

#[test]
fn file_names_follow_the_etcd_like_pattern() {
    assert_eq!(
        segment_file_name(1, 0x2a),
        "0000000000000001-000000000000002a.wal"
    );
    assert_eq!(
        classify("0000000000000001-000000000000002a.wal"),
        Some(FileKind::Segment {
            seq: 1,
            first_index: 42
        })
    );
    assert_eq!(
        classify("00000000000000ff.wal.tmp"),
        Some(FileKind::Temp { seq: 255 })
    );
    assert_eq!(classify(&spare_file_name(4)), Some(FileKind::Spare));
    for junk in [
        "1-2.wal",
        "0000000000000001-000000000000002A.wal",
        "x.wal",
        "LOCK",
        "0000000000000001.wal",
    ] {
        assert_eq!(classify(junk), None, "{junk}");
    }
}
