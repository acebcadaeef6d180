//! The MVCC data set the storage benchmarks share (`benches/mvcc.rs` and `storage-bench
//! mvcc`): 16-byte keys `key/000000000042` with 256 B values, loaded straight into an
//! [`MvccStore`] (no raft).

use keel_proto::etcdserverpb::{PutRequest, RangeRequest};
use keel_server::mvcc::{MvccStore, WriteTxn};

/// Puts per write txn while loading: each txn is one revision, and 1000 keeps the load fast.
pub const LOAD_BATCH: u64 = 1000;

/// The sled database at `path` with the 512 MiB page cache the MVCC benchmarks use.
pub fn open_db(path: &std::path::Path) -> sled::Db {
    sled::Config::new()
        .path(path)
        .cache_capacity(512 << 20)
        .open()
        .expect("open sled")
}

/// Key `i`: 16 bytes, `key/000000000042`.
pub fn key(i: u64) -> Vec<u8> {
    format!("key/{i:012}").into_bytes()
}

/// Every key (`key = "\0"`, `range_end = "\0"`).
pub fn all_keys() -> RangeRequest {
    RangeRequest {
        key: vec![0],
        range_end: vec![0],
        ..Default::default()
    }
}

/// Stages a put of `value` under `key` into `w`.
pub fn put(w: &mut WriteTxn<'_>, key: Vec<u8>, value: &[u8]) {
    w.put(&PutRequest {
        key,
        value: value.to_vec(),
        ..Default::default()
    })
    .expect("put");
}

/// Loads keys `0..keys` with 256 B values, [`LOAD_BATCH`] puts per write txn.
pub fn load(store: &MvccStore, keys: u64) {
    let value = vec![b'v'; 256];
    for first in (0..keys).step_by(LOAD_BATCH as usize) {
        let mut w = store.write();
        for i in first..(first + LOAD_BATCH).min(keys) {
            put(&mut w, key(i), &value);
        }
        w.commit().expect("commit");
    }
}
