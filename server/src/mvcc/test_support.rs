//! Test-only helpers shared by the mvcc unit tests.

/// An empty sled tree in a temporary database that sled removes when the last handle drops.
pub(crate) fn temp_tree() -> sled::Tree {
    sled::Config::new()
        .temporary(true)
        .open()
        .unwrap()
        .open_tree("t")
        .unwrap()
}

/// Puts keys `0..keys` once each, in write entries of `per_entry` puts (one revision each),
/// in the scrambled order `n * 7919 mod keys` (a permutation: 7919 is prime and divides
/// neither 100k nor 1M), so the index grows by inserts all over the key space. `kv(i)` is
/// the key and value of key number `i`.
pub(crate) fn load_scrambled(
    store: &super::MvccStore,
    keys: usize,
    per_entry: usize,
    kv: impl Fn(usize) -> (Vec<u8>, Vec<u8>),
) {
    for entry in 0..keys / per_entry {
        let mut w = store.write();
        for j in 0..per_entry {
            let (key, value) = kv((entry * per_entry + j).wrapping_mul(7_919) % keys);
            w.put(&keel_proto::etcdserverpb::PutRequest {
                key,
                value,
                ..Default::default()
            })
            .unwrap();
        }
        w.commit().unwrap();
    }
}

/// A txn without compares: `success` and `failure` as given.
pub(crate) fn txn_of(
    success: Vec<keel_proto::etcdserverpb::RequestOp>,
    failure: Vec<keel_proto::etcdserverpb::RequestOp>,
) -> keel_proto::etcdserverpb::TxnRequest {
    keel_proto::etcdserverpb::TxnRequest {
        compare: vec![],
        success,
        failure,
    }
}
