//! The MVCC test fixture (a store on a temporary sled tree, shared with the model test and
//! the goldenscript runner) and the store tests that are not scenarios: byte-exact hashing,
//! type properties, rebuilds after a reopen and crash or corruption injection into sled.
//! The scenarios themselves (etcd 3.4.23 conformance goldens `kv`, `del`, `txn`, `compact`,
//! `badinput`, `grpc-kv`, `grpc-maint`, `maint`) are goldenscripts: `mvcc/testscripts/`.

use keel_proto::etcdserverpb::{DeleteRangeRequest, PutRequest, RangeRequest, RangeResponse};
use keel_proto::mvccpb::KeyValue;

use super::{Committed, MvccStore};
use crate::error::EtcdError;

/// Revisions below are relative to a fresh store's revision 1 where written `r(n)`.
const R0: i64 = 1;
fn r(n: i64) -> i64 {
    R0 + n
}

pub(super) struct Fixture {
    pub db: sled::Db,
    pub store: MvccStore,
}

pub(super) fn fixture() -> Fixture {
    let db = sled::Config::new().temporary(true).open().unwrap();
    let store = MvccStore::open(db.open_tree("keel").unwrap()).unwrap();
    Fixture { db, store }
}

impl Fixture {
    pub fn reopen(self) -> Fixture {
        let Fixture { db, store } = self;
        // As a member's shutdown does; a crash would re-apply the pending groups from the WAL.
        store.persist().unwrap();
        drop(store);
        let store = MvccStore::open(db.open_tree("keel").unwrap()).unwrap();
        Fixture { db, store }
    }

    fn write<T>(
        &self,
        f: impl FnOnce(&mut super::WriteTxn<'_>) -> Result<T, EtcdError>,
    ) -> Result<(T, Committed), EtcdError> {
        let mut w = self.store.write();
        let out = f(&mut w)?;
        Ok((out, w.commit().unwrap()))
    }

    fn put(&self, key: &str, value: &str) -> i64 {
        let req = PutRequest {
            key: key.into(),
            value: value.into(),
            ..Default::default()
        };
        self.write(|w| w.put(&req)).unwrap().1.revision
    }

    fn del(&self, key: &str, end: &str) -> i64 {
        let req = DeleteRangeRequest {
            key: key.into(),
            range_end: end.into(),
            prev_kv: false,
        };
        self.write(|w| w.delete_range(&req)).unwrap().1.revision
    }

    fn compact(&self, rev: i64) -> Result<i64, EtcdError> {
        self.write(|w| w.compact(rev))
            .map(|(resp, _)| resp.header.unwrap().revision)
    }

    fn get(&self, req: RangeRequest) -> Result<RangeResponse, EtcdError> {
        self.store.range(&req)
    }

    /// Every key at revision `rev`.
    fn all_at(&self, rev: i64) -> RangeResponse {
        let mut req = rq("\0", "\0");
        req.revision = rev;
        self.get(req).unwrap()
    }
}

fn rq(key: &str, end: &str) -> RangeRequest {
    RangeRequest {
        key: key.into(),
        range_end: end.into(),
        ..Default::default()
    }
}

#[test]
fn hashkv_matches_etcd_bytes_for_a_single_put() {
    // etcd HashKV: crc32c("key" + rev bytes + KeyValue bytes) over every record.
    let f = fixture();
    f.put("a", "1");
    let mut expected = b"key".to_vec();
    expected.extend_from_slice(&crate::mvcc::revision::etcd_rev_bytes(
        crate::mvcc::Revision::new(2, 0),
        false,
    ));
    let kv = KeyValue {
        key: b"a".to_vec(),
        create_revision: 2,
        mod_revision: 2,
        version: 1,
        value: b"1".to_vec(),
        lease: 0,
    };
    expected.extend_from_slice(&prost::Message::encode_to_vec(&kv));
    assert_eq!(f.store.hash_kv(0).unwrap().hash, super::crc32c(&expected));
}

#[test]
#[should_panic(expected = "one writer only")]
fn a_second_writer_is_refused() {
    let f = fixture();
    let _w1 = f.store.write();
    let _w2 = f.store.write();
}

#[test]
fn reopen_rebuilds_the_same_state() {
    let f = fixture();
    for i in 0..300 {
        f.put(&format!("key{:03}", i % 70), &format!("v{i}"));
        if i % 9 == 0 {
            f.del(&format!("key{:03}", (i * 7) % 70), "");
        }
    }
    f.compact(r(120)).unwrap();
    let ranges: Vec<RangeResponse> = (120..=f.store.current_revision() - R0)
        .step_by(13)
        .map(|n| f.all_at(r(n)))
        .collect();
    let hash = f.store.hash_kv(0).unwrap();
    let stats = f.store.index_stats();
    let rev = f.store.current_revision();
    let f = f.reopen();
    assert_eq!(
        (f.store.current_revision(), f.store.compact_revision()),
        (rev, r(120))
    );
    assert_eq!(f.store.hash_kv(0).unwrap(), hash);
    assert_eq!(f.store.index_stats().keys, stats.keys);
    for (i, want) in ranges.iter().enumerate() {
        assert_eq!(&f.all_at(r(120 + 13 * i as i64)), want);
    }
}

fn record_count(f: &Fixture) -> usize {
    f.db.open_tree("keel").unwrap().scan_prefix(b"k").count()
}

#[test]
fn reopen_finishes_an_interrupted_compaction() {
    let f = fixture();
    // put/delete generations (a), overwrites (b), a delete at the compact revision (c).
    f.put("a", "1"); // 2
    f.del("a", ""); // 3
    f.put("b", "1"); // 4
    f.put("b", "2"); // 5
    f.put("c", "1"); // 6
    f.put("a", "2"); // 7
    f.del("c", ""); // 8
    f.put("d", "1"); // 9
    let tree = f.db.open_tree("keel").unwrap();
    let all: Vec<(sled::IVec, sled::IVec)> = tree.scan_prefix(b"k").map(|r| r.unwrap()).collect();
    f.compact(7).unwrap(); // absolute revisions in this test
    let kept: std::collections::HashSet<sled::IVec> =
        tree.scan_prefix(b"k").map(|r| r.unwrap().0).collect();
    let removed: Vec<_> = all
        .iter()
        .filter(|(k, _)| !kept.contains(k))
        .cloned()
        .collect();
    // a@2, a@3 (tombstone) and b@4 go; c@6 stays (its tombstone at 8 is after 7).
    assert_eq!(removed.len(), 3, "{removed:?}");
    let want_ranges: Vec<_> = (7..=9).map(|n| f.all_at(n)).collect();
    let want_hash = f.store.hash_kv(0).unwrap();
    let want_events = f.store.events(7, i64::MAX, 0).unwrap();
    // Crash after removing only the oldest record: the later ones come back.
    for (k, v) in &removed[1..] {
        tree.insert(k, v).unwrap();
    }
    let f = f.reopen();
    for (i, want) in want_ranges.iter().enumerate() {
        assert_eq!(&f.all_at(7 + i as i64), want);
    }
    assert_eq!(f.store.hash_kv(0).unwrap(), want_hash);
    assert_eq!(f.store.events(7, i64::MAX, 0).unwrap(), want_events);
    assert!(
        f.store
            .wait_physical_compaction(7, std::time::Duration::from_secs(20))
    );
    assert_eq!(record_count(&f), all.len() - removed.len());
}

#[test]
fn a_missing_record_is_compacted_only_if_a_compaction_passed_the_read_revision() {
    use std::sync::atomic::Ordering;
    let f = fixture();
    for (k, v) in [("a", "1"), ("b", "1"), ("a", "2")] {
        f.put(k, v); // revisions 2, 3, 4
    }
    let tree = f.db.open_tree("keel").unwrap();
    // Simulate the record of b@3 vanishing under a reader.
    let rkey = crate::mvcc::revision::record_key(crate::mvcc::Revision::new(3, 0), false);
    let saved = tree.remove(&rkey).unwrap().unwrap();
    let read_b = rq("b", "");
    let internal = |e: EtcdError| matches!(e, EtcdError::Internal(_));
    assert!(internal(f.get(read_b.clone()).unwrap_err()));
    let mut keys_only = read_b.clone();
    keys_only.keys_only = true;
    assert_eq!(
        f.get(keys_only).unwrap().count,
        1,
        "keys_only reads no record"
    );
    assert!(internal(f.store.hash_kv(0).unwrap_err()), "dense path");
    assert!(internal(f.store.hash_kv(3).unwrap_err()));
    // A compaction past the read revision explains the missing record.
    f.store.compact_floor.store(10, Ordering::Release);
    assert_eq!(f.get(read_b).unwrap_err(), EtcdError::Compacted);
    assert_eq!(f.store.hash_kv(0).unwrap_err(), EtcdError::Compacted);
    f.store.compact_floor.store(-1, Ordering::Release);
    tree.insert(&rkey, saved).unwrap();
    assert_eq!(f.get(rq("b", "")).unwrap().kvs[0].value, b"1");
    // Sparse path: more history than visible revisions.
    for v in ["3", "4", "5", "6"] {
        f.put("a", v);
    }
    let a_rev = crate::mvcc::revision::record_key(crate::mvcc::Revision::new(8, 0), false);
    tree.remove(&a_rev).unwrap().unwrap();
    assert!(internal(f.store.hash_kv(0).unwrap_err()), "sparse path");
}

#[test]
fn store_is_shareable_and_write_txn_is_send() {
    fn shareable<T: Send + Sync>() {}
    fn sendable<T: Send>() {}
    shareable::<MvccStore>();
    shareable::<std::sync::Arc<MvccStore>>();
    sendable::<super::WriteTxn<'static>>();
}

/// Waits (bounded) until the store keeps a compaction hash for `revision`.
fn wait_for_compact_hash(f: &Fixture, revision: i64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !f
        .store
        .compact_hashes()
        .iter()
        .any(|h| h.revision == revision)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no hash at {revision}"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn compaction_hashes_are_kept_newest_first_and_served_after_later_compactions() {
    let f = fixture();
    f.store.set_compact_hashing(true);
    for i in 0..40 {
        f.put(&format!("k{}", i % 7), &format!("v{i}"));
    }
    let compactions = [6, 11, 16];
    // HashKV at a revision does not depend on compaction progress (hash.rs), so the hashes
    // taken before compacting are the ones the compactions must keep.
    let before: Vec<u32> = compactions
        .iter()
        .map(|&c| f.store.hash_kv(c).unwrap().hash)
        .collect();
    for &c in &compactions {
        f.compact(c).unwrap();
        wait_for_compact_hash(&f, c);
    }
    let kept: Vec<(i64, u32)> = f
        .store
        .compact_hashes()
        .iter()
        .map(|h| (h.revision, h.hash))
        .collect();
    assert_eq!(kept, [(16, before[2]), (11, before[1]), (6, before[0])]);
    assert_eq!(f.store.hash_kv(6), Err(EtcdError::Compacted));
    let served = f.store.hash_at_compaction(6).unwrap();
    assert_eq!(
        (served.hash, served.hash_revision, served.compact_revision),
        (before[0], 6, 16),
        "a kept hash answers below the compact revision"
    );
    // Not kept but still held: computed, as etcd's HashByRev.
    assert_eq!(
        f.store.hash_at_compaction(30).unwrap().hash,
        f.store.hash_kv(30).unwrap().hash
    );
    assert_eq!(f.store.hash_at_compaction(8), Err(EtcdError::Compacted));
    // Only the last ten.
    for c in 17..=28 {
        f.compact(c).unwrap();
    }
    wait_for_compact_hash(&f, 28);
    let revisions: Vec<i64> = f
        .store
        .compact_hashes()
        .iter()
        .map(|h| h.revision)
        .collect();
    assert_eq!(revisions, (19..=28).rev().collect::<Vec<_>>());
    // After a reopen nothing is kept until hashing is turned on; then the current
    // compaction's hash comes back, equal to the one taken before.
    let h28 = f.store.compact_hashes()[0].hash;
    let f = f.reopen();
    assert!(f.store.compact_hashes().is_empty());
    f.store.set_compact_hashing(true);
    wait_for_compact_hash(&f, 28);
    assert_eq!(f.store.compact_hashes()[0].hash, h28);
    // Off: a compaction is not hashed.
    f.store.set_compact_hashing(false);
    f.compact(30).unwrap();
    assert!(
        f.store
            .wait_physical_compaction(30, std::time::Duration::from_secs(20))
    );
    assert_eq!(f.store.compact_hashes().len(), 1);
}
