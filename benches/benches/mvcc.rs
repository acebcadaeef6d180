//! Criterion: the MVCC store (sled-backed, no raft) over 1M keys of 16 B with 256 B values:
//! single-key put (one write txn and sled batch per put), single-key range, `count_only`,
//! `limit 10`, `limit 10` keys only and the count query (`limit 1` with its value, response
//! encoded) over all keys, and the key index rebuild when the store is opened.
//!
//! The 1M-key store is loaded once (1000 puts per write txn, one revision each) and shared by
//! every group. Puts run after the range groups, so the rebuild also indexes their records.
//!
//! ```sh
//! cargo bench -p keel-benches --bench mvcc -- --sample-size 10
//! ```

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use keel_benches::mvcc_data::{all_keys, key, load, open_db, put};
use keel_proto::etcdserverpb::RangeRequest;
use keel_server::mvcc::MvccStore;

/// Keys in the store.
const KEYS: u64 = 1_000_000;

fn mvcc(c: &mut Criterion) {
    let dir = tempfile::tempdir_in(".").expect("temp dir for sled");
    let db = open_db(dir.path());
    let tree = db.open_tree("keel").expect("open tree");
    let store = MvccStore::open(tree.clone()).expect("open the store");
    load(&store, KEYS);

    let mut group = c.benchmark_group("mvcc_1m_keys");
    group.throughput(Throughput::Elements(1));
    let mut i = 0u64;
    group.bench_function("range_one_key", |b| {
        b.iter(|| {
            i = (i + 7_919) % KEYS;
            let r = store
                .range(&RangeRequest {
                    key: key(i),
                    ..Default::default()
                })
                .expect("range");
            assert_eq!(r.kvs.len(), 1);
        })
    });
    group.bench_function("count_only_all", |b| {
        b.iter(|| {
            let r = store
                .range(&RangeRequest {
                    count_only: true,
                    ..all_keys()
                })
                .expect("range");
            assert_eq!(r.count, KEYS as i64);
        })
    });
    group.bench_function("limit_10_all", |b| {
        b.iter(|| {
            let r = store
                .range(&RangeRequest {
                    limit: 10,
                    ..all_keys()
                })
                .expect("range");
            assert_eq!(r.kvs.len(), 10);
        })
    });
    // The count query of issue 20 part 7 (`etcdctl get "" --from-key --limit 1`): exact
    // count, `more`, one kv with its value, and the response encoded as gRPC sends it.
    group.bench_function("count_query_limit_1_all_encoded", |b| {
        b.iter(|| {
            let r = store
                .range(&RangeRequest {
                    limit: 1,
                    ..all_keys()
                })
                .expect("range");
            assert_eq!((r.count, r.more, r.kvs.len()), (KEYS as i64, true, 1));
            prost::Message::encode_to_vec(&r)
        })
    });
    group.bench_function("keys_only_limit_10_all", |b| {
        b.iter(|| {
            let r = store
                .range(&RangeRequest {
                    limit: 10,
                    keys_only: true,
                    ..all_keys()
                })
                .expect("range");
            assert_eq!((r.count, r.more, r.kvs.len()), (KEYS as i64, true, 10));
        })
    });
    let value = vec![b'w'; 256];
    group.bench_function("put_one_key", |b| {
        b.iter(|| {
            i = (i + 104_729) % KEYS;
            let mut w = store.write();
            put(&mut w, key(i), &value);
            w.commit().expect("commit");
        })
    });
    group.finish();

    drop(store);
    db.flush().expect("flush");
    let mut group = c.benchmark_group("mvcc_index_rebuild");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(40));
    group.throughput(Throughput::Elements(KEYS));
    group.bench_function("open_1m_keys", |b| {
        b.iter(|| MvccStore::open(tree.clone()).expect("reopen"))
    });
    group.finish();
}

criterion_group!(benches, mvcc);
criterion_main!(benches);
