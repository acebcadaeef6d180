//! The store with published groups pending (unpersisted.rs): readers see a group at once,
//! sled gets the pending groups whole when a bound is reached or before a reader scans sled,
//! and a compaction takes everything pending with it.

use std::time::Duration;

use keel_proto::etcdserverpb::{DeleteRangeRequest, PutRequest, RangeRequest};

use super::PersistPolicy;
use super::tests_scenarios::{Fixture, fixture};

/// Groups stay pending until `max_writes` writes gather (or something persists them).
fn batched(max_writes: usize) -> Fixture {
    let f = fixture();
    f.store
        .set_persist_policy(PersistPolicy {
            max_writes,
            max_bytes: u64::MAX,
            max_age: Duration::from_secs(3600),
            background: false,
        })
        .unwrap();
    f
}

/// Puts `key = value` in an entry of its own; returns the put's `prev_kv` value.
fn put(f: &Fixture, key: &str, value: &str) -> Option<Vec<u8>> {
    let mut w = f.store.write();
    let resp = w
        .put(&PutRequest {
            key: key.into(),
            value: value.into(),
            prev_kv: true,
            ..Default::default()
        })
        .unwrap();
    w.commit().unwrap();
    resp.prev_kv.map(|kv| kv.value)
}

fn delete(f: &Fixture, key: &str) {
    let mut w = f.store.write();
    w.delete_range(&DeleteRangeRequest {
        key: key.into(),
        ..Default::default()
    })
    .unwrap();
    w.commit().unwrap();
}

/// `(value, mod_revision, version)` of `key` at `revision` (0 = current).
fn get(f: &Fixture, key: &str, revision: i64) -> Option<(Vec<u8>, i64, i64)> {
    let resp = f
        .store
        .range(&RangeRequest {
            key: key.into(),
            revision,
            ..Default::default()
        })
        .unwrap();
    resp.kvs
        .first()
        .map(|kv| (kv.value.clone(), kv.mod_revision, kv.version))
}

fn records_in_sled(f: &Fixture) -> usize {
    f.db.open_tree("keel").unwrap().scan_prefix(b"k").count()
}

#[test]
fn published_groups_are_read_from_the_overlay_until_they_reach_sled() {
    let f = batched(1_000);
    assert_eq!(put(&f, "a", "1"), None);
    // The second put's prev_kv is the first put's record, read from the overlay.
    assert_eq!(put(&f, "a", "2"), Some(b"1".to_vec()));
    {
        let mut w = f.store.write();
        w.put(&PutRequest {
            key: b"b".to_vec(),
            value: b"1".to_vec(),
            ..Default::default()
        })
        .unwrap();
        w.batch_mut().insert(b"c/extra".as_slice(), b"x".as_slice());
        w.commit().unwrap();
    }
    assert_eq!(f.store.current_revision(), 4, "every group is published");
    assert_eq!(records_in_sled(&f), 0, "no group reached sled");
    let tree = f.db.open_tree("keel").unwrap();
    assert!(tree.get(b"c/extra").unwrap().is_none());
    let expect = |f: &Fixture| {
        assert_eq!(get(f, "a", 0), Some((b"2".to_vec(), 3, 2)));
        assert_eq!(get(f, "a", 2), Some((b"1".to_vec(), 2, 1)));
        assert_eq!(get(f, "b", 0), Some((b"1".to_vec(), 4, 1)));
    };
    expect(&f);

    f.store.persist().unwrap();
    assert_eq!(records_in_sled(&f), 3);
    assert_eq!(tree.get(b"c/extra").unwrap().unwrap(), b"x");
    expect(&f);
    let f = f.reopen();
    assert_eq!(f.store.current_revision(), 4);
    expect(&f);
}

#[test]
fn the_write_bound_sends_the_pending_groups_to_sled_together() {
    let f = batched(3);
    put(&f, "a", "1");
    put(&f, "b", "1");
    assert_eq!(records_in_sled(&f), 0);
    put(&f, "c", "1");
    assert_eq!(records_in_sled(&f), 3, "the third write reached the bound");
    put(&f, "d", "1");
    assert_eq!(records_in_sled(&f), 3);
    assert_eq!(get(&f, "d", 0), Some((b"1".to_vec(), 5, 1)));
}

#[test]
fn readers_that_scan_sled_commit_the_pending_groups_first() {
    let (f, every) = (batched(1_000), fixture());
    for s in [&f, &every] {
        put(s, "a", "1");
        put(s, "b", "1");
        delete(s, "a");
        put(s, "c", "1");
    }
    assert_eq!(records_in_sled(&f), 0);
    let events = f.store.events(1, 100, 0).unwrap();
    assert_eq!(events, every.store.events(1, 100, 0).unwrap());
    assert_eq!(events.events.len(), 4);
    assert_eq!(records_in_sled(&f), 4, "events() persisted first");

    for s in [&f, &every] {
        put(s, "d", "1");
    }
    assert_eq!(records_in_sled(&f), 4);
    let hash = f.store.hash_kv(0).unwrap();
    assert_eq!(hash, every.store.hash_kv(0).unwrap());
    assert_eq!(hash.hash_revision, 6);
    assert_eq!(records_in_sled(&f), 5, "hash_kv() persisted first");
}

#[test]
fn a_compaction_takes_everything_pending_with_it() {
    let f = batched(1_000);
    put(&f, "a", "1");
    put(&f, "a", "2");
    put(&f, "a", "3");
    assert_eq!(records_in_sled(&f), 0);
    {
        let mut w = f.store.write();
        w.compact(4).unwrap();
        w.commit().unwrap();
    }
    assert!(f.store.wait_physical_compaction(4, Duration::from_secs(10)));
    // a@2 and a@3 were written and removed in the same sled batch; a@4 stays.
    assert_eq!(records_in_sled(&f), 1);
    assert_eq!(get(&f, "a", 0), Some((b"3".to_vec(), 4, 3)));
    let f = f.reopen();
    assert_eq!(f.store.compact_revision(), 4);
    assert_eq!(get(&f, "a", 0), Some((b"3".to_vec(), 4, 3)));
}

#[test]
fn the_background_committer_takes_due_groups_to_sled_while_apply_goes_on() {
    let f = fixture();
    f.store
        .set_persist_policy(PersistPolicy {
            max_writes: 2,
            max_bytes: u64::MAX,
            max_age: Duration::from_secs(3600),
            background: true,
        })
        .unwrap();
    put(&f, "a", "1");
    assert_eq!(records_in_sled(&f), 0, "below the bound");
    put(&f, "b", "1");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while records_in_sled(&f) < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the committer did not commit within 10 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(get(&f, "a", 0), Some((b"1".to_vec(), 2, 1)));
    assert_eq!(get(&f, "b", 0), Some((b"1".to_vec(), 3, 1)));
    put(&f, "c", "1");
    assert_eq!(get(&f, "c", 0), Some((b"1".to_vec(), 4, 1)));
    let f = f.reopen();
    assert_eq!(f.store.current_revision(), 4);
    assert_eq!(get(&f, "c", 0), Some((b"1".to_vec(), 4, 1)));
}
