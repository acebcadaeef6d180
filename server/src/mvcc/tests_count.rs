//! `count` and `more` on a large range (issue 20 part 7): the values etcd gives
//! (`count` = every key of the range at the read revision, regardless of `limit`; `more` =
//! `count > limit` with the key-order fast path), checked against a walk of the whole range,
//! at the current and at historical revisions, after deletes and overwrites. Timing goals
//! live in `benches/benches/mvcc.rs`, not here.

use keel_proto::etcdserverpb::{DeleteRangeRequest, PutRequest, RangeRequest};

use super::MvccStore;
use super::test_support::{load_scrambled, temp_tree};

const KEYS: usize = 100_000;
const PER_ENTRY: usize = 1000;

fn key(i: usize) -> Vec<u8> {
    format!("key/{i:06}").into_bytes()
}

/// 100k keys in 100 entries of 1000 puts (revisions 2..=101), keys in a scrambled order.
fn loaded() -> MvccStore {
    let store = MvccStore::open(temp_tree()).unwrap();
    load_scrambled(&store, KEYS, PER_ENTRY, |i| {
        (key(i), format!("v{i}").into_bytes())
    });
    store
}

/// `etcdctl get "" --from-key` with the given shaping.
fn whole(limit: i64, keys_only: bool, count_only: bool, revision: i64) -> RangeRequest {
    RangeRequest {
        key: vec![0],
        range_end: vec![0],
        limit,
        keys_only,
        count_only,
        revision,
        ..Default::default()
    }
}

/// The keys of `req`'s range visible at its revision, by a full unlimited read.
fn walked(store: &MvccStore, req: &RangeRequest) -> Vec<Vec<u8>> {
    let all = RangeRequest {
        limit: 0,
        count_only: false,
        keys_only: true,
        ..req.clone()
    };
    store
        .range(&all)
        .unwrap()
        .kvs
        .into_iter()
        .map(|kv| kv.key)
        .collect()
}

#[test]
fn count_and_more_of_a_100k_key_range_are_etcds() {
    let store = loaded();
    let rev = store.current_revision();
    assert_eq!(rev, 1 + (KEYS / PER_ENTRY) as i64);

    // The count query: limit 1, with its value.
    let r = store.range(&whole(1, false, false, 0)).unwrap();
    assert_eq!((r.count, r.more, r.kvs.len()), (KEYS as i64, true, 1));
    assert_eq!(r.kvs[0].key, key(0));
    assert_eq!(r.kvs[0].value, b"v0");
    assert_eq!(r.header.unwrap().revision, rev);

    // limit 10, keys only.
    let r = store.range(&whole(10, true, false, 0)).unwrap();
    assert_eq!((r.count, r.more, r.kvs.len()), (KEYS as i64, true, 10));
    assert!(r.kvs.iter().all(|kv| kv.value.is_empty()));
    assert_eq!(r.kvs[9].key, key(9));

    // count_only: no kvs, more false (etcd: more is only set when kvs were cut).
    let r = store.range(&whole(0, false, true, 0)).unwrap();
    assert_eq!((r.count, r.more, r.kvs.len()), (KEYS as i64, false, 0));

    // A limit equal to the count cuts nothing; one below it does.
    let r = store.range(&whole(KEYS as i64, true, false, 0)).unwrap();
    assert_eq!((r.count, r.more, r.kvs.len()), (KEYS as i64, false, KEYS));
    let r = store
        .range(&whole(KEYS as i64 - 1, true, false, 0))
        .unwrap();
    assert_eq!(
        (r.count, r.more, r.kvs.len()),
        (KEYS as i64, true, KEYS - 1)
    );

    // A sub-range crossing many index blocks, and the count of a walk over it.
    let sub = RangeRequest {
        key: key(12_345),
        range_end: key(87_654),
        limit: 1,
        ..Default::default()
    };
    let r = store.range(&sub).unwrap();
    assert_eq!((r.count, r.more), (87_654 - 12_345, true));
    assert_eq!(r.count as usize, walked(&store, &sub).len());

    // Historical revisions: entry e (revision e + 2) added 1000 keys.
    for at in [2, 3, 51, rev - 1] {
        let r = store.range(&whole(1, false, false, at)).unwrap();
        let want = (at - 1) * PER_ENTRY as i64;
        assert_eq!((r.count, r.more), (want, true), "at revision {at}");
        assert_eq!(
            r.count as usize,
            walked(&store, &whole(1, false, false, at)).len()
        );
    }
}

#[test]
fn count_follows_deletes_and_overwrites_of_a_100k_key_range() {
    let store = loaded();
    let before = store.current_revision();
    // Delete a block-crossing span of 5,000 keys, overwrite another 5,000.
    let mut w = store.write();
    w.delete_range(&DeleteRangeRequest {
        key: key(40_000),
        range_end: key(45_000),
        ..Default::default()
    })
    .unwrap();
    w.commit().unwrap();
    let mut w = store.write();
    for i in 60_000..65_000 {
        w.put(&PutRequest {
            key: key(i),
            value: b"again".to_vec(),
            ..Default::default()
        })
        .unwrap();
    }
    w.commit().unwrap();
    let now = store.current_revision();
    assert_eq!(now, before + 2);

    let r = store.range(&whole(1, true, false, 0)).unwrap();
    assert_eq!((r.count, r.more), (KEYS as i64 - 5_000, true));
    assert_eq!(
        r.count as usize,
        walked(&store, &whole(1, true, false, 0)).len()
    );
    // Before the delete every key counts; between the delete and the overwrite the deleted
    // ones are gone; overwrites never change the count.
    let r = store.range(&whole(1, true, false, before)).unwrap();
    assert_eq!(r.count, KEYS as i64);
    let r = store.range(&whole(1, true, false, before + 1)).unwrap();
    assert_eq!(r.count, KEYS as i64 - 5_000);
    // The deleted span alone: empty now, full at `before`.
    let span = |revision| RangeRequest {
        key: key(40_000),
        range_end: key(45_000),
        limit: 1,
        revision,
        ..Default::default()
    };
    let r = store.range(&span(0)).unwrap();
    assert_eq!((r.count, r.more, r.kvs.len()), (0, false, 0));
    let r = store.range(&span(before)).unwrap();
    assert_eq!((r.count, r.more, r.kvs.len()), (5_000, true, 1));
}

/// `range_reads`, the API's hint of how long a range takes: the keys a range reads, from the
/// index's counts.
#[test]
fn range_reads_counts_the_keys_a_range_reads() {
    use keel_proto::etcdserverpb::range_request::{SortOrder, SortTarget};
    let store = loaded();
    assert_eq!(store.range_reads(&whole(0, false, false, 0)), KEYS);
    assert_eq!(store.range_reads(&whole(10, false, false, 0)), 10);
    assert_eq!(store.range_reads(&whole(10, true, false, 0)), 10);
    assert_eq!(
        store.range_reads(&whole(0, false, true, 0)),
        0,
        "count_only"
    );
    let by_value = |order: SortOrder| RangeRequest {
        sort_target: SortTarget::Value as i32,
        sort_order: order as i32,
        ..whole(10, false, false, 0)
    };
    // Sorting by value reads every value before the limit cuts (also with order NONE).
    assert_eq!(store.range_reads(&by_value(SortOrder::Descend)), KEYS);
    assert_eq!(store.range_reads(&by_value(SortOrder::None)), KEYS);
    let one = |k: Vec<u8>| RangeRequest {
        key: k,
        ..Default::default()
    };
    assert_eq!(store.range_reads(&one(key(7))), 1);
    // A single key is not looked up: 1 is its bound, present or not.
    assert_eq!(store.range_reads(&one(b"absent".to_vec())), 1);
    let span = RangeRequest {
        key: key(100),
        range_end: key(300),
        ..Default::default()
    };
    assert_eq!(store.range_reads(&span), 200);
    // Deleted keys are not read.
    let mut w = store.write();
    w.delete_range(&DeleteRangeRequest {
        key: key(100),
        range_end: key(150),
        ..Default::default()
    })
    .unwrap();
    w.stage();
    store.flush().unwrap();
    assert_eq!(store.range_reads(&span), 150);
}
