//! Write → read round trips, the snapshot framing, and damaged or foreign files.

use sha2::{Digest, Sha256};

use super::super::snapshot::{self, CHUNK_SIZE, SnapshotStream};
use super::super::writer::{DbWriter, PAGE_SIZE};
use super::super::{EtcdDb, EtcdDbError, HashCheck, MvccRecord};
use super::{Contents, History, read, sample, write};
use crate::mvcc::Revision;

#[test]
fn every_section_reads_back_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let c = sample();
    let w = write(&c, &path);
    assert_eq!(w.size % PAGE_SIZE as u64, 0);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), w.size);
    assert!(!dir.path().join("db.part").exists());
    let db = EtcdDb::open(&path, HashCheck::Skip).unwrap();
    assert_eq!(read(&db), c);
    assert_eq!(
        super::describe(&c.records),
        [
            "2_0 key=foo value=bar create=2 mod=2 ver=1 lease=0",
            "3_0 key=foo value=bar2 create=2 mod=3 ver=2 lease=0",
            "4_0 key=lease/a value=held create=4 mod=4 ver=1 lease=694d7a1c3e2f0001",
            "5_0t key=foo value= create=0 mod=0 ver=0 lease=0",
            "6_0 key=a value=1 create=6 mod=6 ver=1 lease=0",
            "7_0 key=b value=<5000 bytes> create=7 mod=7 ver=1 lease=0",
            "8_0 key=a value=2 create=6 mod=8 ver=2 lease=0",
        ]
    );
    let status = db.status().unwrap();
    // 7 records + 1 lease + 2 members + 1 removed + 1 cluster + 1 alarm + 2 auth + 1 user +
    // 1 role + 5 meta (index, term, confState, two compact revisions).
    assert_eq!((status.revision, status.total_key), (8, 22));
    assert_eq!(status.total_size, w.size);
}

#[test]
fn an_empty_database_has_every_bucket_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let w = write(&Contents::default(), &path);
    let db = EtcdDb::open(&path, HashCheck::Skip).unwrap();
    let buckets: Vec<String> = db
        .bolt()
        .entries(&db.bolt().root())
        .map(|e| String::from_utf8(e.unwrap().key).unwrap())
        .collect();
    assert_eq!(
        buckets,
        [
            "alarm",
            "auth",
            "authRoles",
            "authUsers",
            "cluster",
            "key",
            "lease",
            "members",
            "members_removed",
            "meta"
        ]
    );
    // put_auth wrote both flags (disabled, revision 0), which read back as the default.
    assert_eq!(read(&db), Contents::default());
    let s = db.status().unwrap();
    assert_eq!((s.revision, s.total_key, s.total_size), (0, 2, w.size));
}

/// Many records over many transactions and pages (branch pages, overflow pages), with the
/// file staying close to the size of the data.
#[test]
fn a_large_store_streams_through_many_transactions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut h = History::new();
    let n = 25_000;
    let mut raw = 0usize;
    for i in 0..n {
        let key = format!("key/{:06}", i % 9000);
        let value = if i % 5000 == 0 {
            vec![b'v'; 100_000]
        } else {
            vec![b'x'; 100 + i % 50]
        };
        if i % 7 == 3 && i % 9000 < 8000 {
            h.put(key.as_bytes(), &value, 0);
            h.delete(key.as_bytes());
        } else {
            h.put(key.as_bytes(), &value, 0);
        }
    }
    for r in &h.records {
        raw += 17 + r.value.len();
    }
    let mut c = Contents {
        records: h.records.clone(),
        ..Default::default()
    };
    c.meta.consistent_index = 7;
    let w = write(&c, &path);
    let db = EtcdDb::open(&path, HashCheck::Skip).unwrap();
    let mut count = 0usize;
    for (got, want) in db.records().unwrap().zip(&h.records) {
        assert_eq!(&got.unwrap(), want);
        count += 1;
    }
    assert_eq!(count, h.records.len());
    assert_eq!(db.status().unwrap().revision, h.rev());
    // Leaf element headers (16 bytes per entry) and page slack come on top of the data.
    let bound = (raw + 16 * h.records.len()) as u64 * 13 / 10;
    assert!(
        w.size <= bound,
        "file {} bytes for {raw} bytes of records",
        w.size
    );
}

#[test]
fn records_out_of_order_are_refused_and_leave_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let c = sample();
    let mut w = DbWriter::create(&path).unwrap();
    let first = c.records[..3].iter().cloned().map(Ok::<_, std::io::Error>);
    w.put_records(first).unwrap();
    let again = c.records[2..].iter().cloned().map(Ok::<_, std::io::Error>);
    let err = w.put_records(again).unwrap_err();
    assert_eq!(
        err.to_string(),
        "mvcc record 4_0 does not follow 4_0: records must be in revision order"
    );
    drop(w);
    assert!(!path.exists());
    assert!(!dir.path().join("db.part").exists());
}

#[test]
fn a_failing_source_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = DbWriter::create(dir.path().join("db")).unwrap();
    let bad = vec![Err(std::io::Error::other("sled gone"))];
    let err = w
        .put_records(bad.into_iter().map(|r: std::io::Result<MvccRecord>| r))
        .unwrap_err();
    assert_eq!(err.to_string(), "reading the source: sled gone");
}

#[test]
fn the_snapshot_stream_is_32k_chunks_then_the_sha256() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut c = sample();
    // Enough data for several chunks and a short last one.
    let mut h = History::new();
    for i in 0..400 {
        h.put(format!("k{i}").as_bytes(), &[b'z'; 300], 0);
    }
    c.records = h.records;
    let w = write(&c, &path);
    let bytes = std::fs::read(&path).unwrap();
    let chunks: Vec<_> = SnapshotStream::open(&path)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let data = &chunks[..chunks.len() - 1];
    assert_eq!(
        data.len() as u64,
        w.size.div_ceil(CHUNK_SIZE as u64),
        "chunks of 32 KiB"
    );
    let mut sent = 0u64;
    for ch in data {
        assert!(ch.blob.len() == CHUNK_SIZE || ch.remaining_bytes == 0);
        sent += ch.blob.len() as u64;
        assert_eq!(ch.remaining_bytes, w.size - sent);
    }
    let last = chunks.last().unwrap();
    assert_eq!(last.remaining_bytes, 0);
    assert_eq!(last.blob, Sha256::digest(&bytes).to_vec());
    let concat: Vec<u8> = data.iter().flat_map(|c| c.blob.clone()).collect();
    assert_eq!(concat, bytes);

    // Saved as etcdctl does, the file opens with its hash verified and reads the same.
    let snap = dir.path().join("snap.db");
    let size = snapshot::save_stream(chunks.into_iter().map(Ok), &snap).unwrap();
    assert_eq!(size, w.size + 32);
    let db = EtcdDb::open(&snap, HashCheck::Verify).unwrap();
    assert_eq!(read(&db), c);
    let db = EtcdDb::open(&snap, HashCheck::Skip).unwrap();
    assert_eq!(read(&db).records, c.records);
}

#[test]
fn hash_checks_speak_etcds_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    write(&sample(), &path);
    let err = EtcdDb::open(&path, HashCheck::Verify).err().unwrap();
    assert_eq!(
        err.to_string(),
        "snapshot missing hash but --skip-hash-check=false"
    );
    let snap = dir.path().join("snap.db");
    snapshot::save_stream(SnapshotStream::open(&path).unwrap(), &snap).unwrap();
    let mut bytes = std::fs::read(&snap).unwrap();
    let n = bytes.len();
    bytes[n - 1] ^= 0xff;
    std::fs::write(&snap, &bytes).unwrap();
    match EtcdDb::open(&snap, HashCheck::Verify).err().unwrap() {
        e @ EtcdDbError::HashMismatch { .. } => {
            let text = e.to_string();
            assert!(text.starts_with("expected sha256 ["), "{text}");
            let want_tail = format!(" {}]", bytes[n - 1]);
            assert!(text.contains(&want_tail), "{text}");
        }
        e => panic!("expected a hash mismatch, got {e}"),
    }
    // --skip-hash-check: the stale hash is stripped, not compared.
    assert!(EtcdDb::open(&snap, HashCheck::Skip).is_ok());
    // A stream that does not end with a hash is not saved.
    let truncated = SnapshotStream::open(&path).unwrap().take(1);
    let err = snapshot::save_stream(truncated, &dir.path().join("bad.db")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid database: sha256 checksum not found [bytes: 32768]"
    );
    assert!(!dir.path().join("bad.db").exists());
}

/// A damaged page is an error naming the problem, never a panic or a silent skip.
#[test]
fn damaged_pages_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut h = History::new();
    for i in 0..2000 {
        h.put(format!("k{i:05}").as_bytes(), &[b'q'; 200], 0);
    }
    let c = Contents {
        records: h.records,
        ..Default::default()
    };
    write(&c, &path);
    let good = std::fs::read(&path).unwrap();
    let pages = good.len() / PAGE_SIZE;
    let mut failures = 0;
    for page in 2..pages {
        let mut bad = good.clone();
        // Overwrite the page header: id, flags, count.
        bad[page * PAGE_SIZE..page * PAGE_SIZE + 12].fill(0xee);
        let p = dir.path().join(format!("bad{page}"));
        std::fs::write(&p, &bad).unwrap();
        let db = EtcdDb::open(&p, HashCheck::Skip).unwrap();
        let result: Result<Vec<_>, _> = db.records().and_then(|r| r.collect());
        if let Err(e) = result {
            assert!(matches!(e, EtcdDbError::Invalid(_)), "{e}");
            failures += 1;
        }
    }
    // Free pages (old copies of rewritten pages) may be damaged unnoticed; pages in use
    // may not.
    assert!(
        failures > pages / 2,
        "{failures} of {pages} damaged pages detected"
    );
    let mut bad = good.clone();
    bad[16..20].copy_from_slice(&[0, 0, 0, 0]);
    bad[PAGE_SIZE + 16..PAGE_SIZE + 20].copy_from_slice(&[0, 0, 0, 0]);
    let p = dir.path().join("nometa");
    std::fs::write(&p, &bad).unwrap();
    let err = EtcdDb::open(&p, HashCheck::Skip).err().unwrap();
    assert_eq!(
        err.to_string(),
        "invalid database: no valid meta page (not a bbolt file?)"
    );
    let p = dir.path().join("short");
    std::fs::write(&p, &good[..good.len() - PAGE_SIZE]).unwrap();
    let err = EtcdDb::open(&p, HashCheck::Skip).err().unwrap();
    assert!(err.to_string().contains("the file has"), "{err}");
}

#[test]
fn keel_record_keys_convert_to_etcds() {
    let r = MvccRecord {
        rev: Revision::new(300, 1),
        tombstone: false,
        value: vec![],
    };
    let keel = r.keel_key();
    assert_eq!(keel[0], b'k');
    assert_eq!(&keel[1..9], &r.etcd_key()[..8]);
    assert_eq!(r.etcd_key()[8], b'_');
}

/// A store bigger than one write transaction (`BATCH_BYTES`) is written in several and reads
/// back whole. The memory bound of the streaming writer is a benchmark
/// (`storage-bench etcd-db`, docs/benchmarks.md), not a test: this process runs other tests.
#[test]
fn a_store_larger_than_one_write_transaction_reads_back() {
    use keel_proto::mvccpb::KeyValue;
    use prost::Message;
    let dir = tempfile::tempdir().unwrap();
    let n: i64 = 20 * 1024;
    assert!(n as usize * 1024 > super::super::writer::BATCH_BYTES);
    let records = (0..n).map(|i| {
        let kv = KeyValue {
            key: format!("key/{i:08}").into_bytes(),
            create_revision: i + 2,
            mod_revision: i + 2,
            version: 1,
            value: vec![(i % 251) as u8; 1024],
            lease: 0,
        };
        Ok::<_, std::io::Error>(MvccRecord {
            rev: Revision::new(i + 2, 0),
            tombstone: false,
            value: kv.encode_to_vec(),
        })
    });
    let mut w = DbWriter::create(dir.path().join("db")).unwrap();
    assert_eq!(w.put_records(records).unwrap(), n as u64);
    let written = w.finish(&Default::default()).unwrap();
    assert!(written.size > 20 << 20, "{}", written.size);
    let db = EtcdDb::open(&written.path, HashCheck::Skip).unwrap();
    assert_eq!(db.status().unwrap().revision, n + 1);
}
