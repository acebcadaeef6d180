//! Test-only construction of a member's state machine on a directory, with the real applier
//! (tests may wire components from above the module they test, as integration tests do).

use std::path::Path;
use std::sync::Arc;

use keel_proto::etcdserverpb::{PutRequest, RangeRequest};
use keel_proto::keelpb::{RaftRequest, raft_request};
use openraft::EntryPayload;

use super::StateMachine;
use super::log_store::{META_COMMITTED, META_VOTE};
use super::types::{Entry, LogId, NodeId, Request};
use crate::apply::Applier;
use crate::backend::schema;
use crate::membership::Attributes;
use crate::mvcc::{MvccStore, SharedStore};

/// A state machine on `<dir>/db` (sled tree `keel`) with snapshots in `<dir>/snap`, as a
/// member opens it, plus the shared store handle readers use.
pub fn state_machine(dir: &Path) -> (StateMachine, Arc<SharedStore>) {
    let snap_dir = dir.join("snap");
    std::fs::create_dir_all(&snap_dir).unwrap();
    let db = sled::Config::new().path(dir.join("db")).open().unwrap();
    let tree = db.open_tree(schema::MEMBER_TREE).unwrap();
    let store = Arc::new(MvccStore::open(tree.clone()).unwrap());
    let attributes = Arc::new(Attributes::default());
    let applier = Applier::open(tree, store, attributes).unwrap();
    let shared = applier.shared_store().clone();
    (StateMachine::new(applier, snap_dir), shared)
}

/// Writes a member's raft log as a crash left it: `entries`, the saved `vote` and the
/// `committed` log id, all durable, in the WAL at `wal_dir`.
pub fn write_wal(
    wal_dir: &Path,
    entries: &[Entry],
    vote: openraft::Vote<NodeId>,
    committed: LogId,
) {
    let wal = crate::wal::Wal::open(wal_dir, crate::wal::WalOptions::default()).unwrap();
    let encoded: Vec<(u64, Vec<u8>)> = entries
        .iter()
        .map(|e| (e.log_id.index, bincode::serialize(e).unwrap()))
        .collect();
    let refs: Vec<(u64, &[u8])> = encoded.iter().map(|(i, b)| (*i, b.as_slice())).collect();
    wal.append(&refs).unwrap();
    wal.set_meta(META_VOTE, &bincode::serialize(&vote).unwrap())
        .unwrap();
    let lsn = wal
        .set_meta(
            META_COMMITTED,
            &bincode::serialize(&Some(committed)).unwrap(),
        )
        .unwrap();
    wal.wait_durable(lsn).unwrap();
}

/// Log entry `log_id` holding a Put of `k{i}` = `v` (request id `i`).
pub fn put_entry(log_id: LogId, i: u64) -> Entry {
    Entry {
        log_id,
        payload: EntryPayload::Normal(Request::new(RaftRequest {
            auth_header: None,
            id: i,
            request: Some(raft_request::Request::Put(PutRequest {
                key: format!("k{i}").into_bytes(),
                value: b"v".to_vec(),
                ..Default::default()
            })),
        })),
    }
}

/// The `k*` keys `shared` serves, with their mod revisions.
pub fn k_revisions(shared: &SharedStore) -> Vec<(Vec<u8>, i64)> {
    shared
        .get()
        .range(&RangeRequest {
            key: b"k".to_vec(),
            range_end: b"l".to_vec(),
            ..Default::default()
        })
        .unwrap()
        .kvs
        .iter()
        .map(|kv| (kv.key.clone(), kv.mod_revision))
        .collect()
}

/// What [`k_revisions`] gives after the puts `k1..=kn` applied once each, in log order, on an
/// empty store (revision 1).
pub fn k_applied_in_order(n: u64) -> Vec<(Vec<u8>, i64)> {
    (1..=n)
        .map(|i| (format!("k{i}").into_bytes(), i as i64 + 1))
        .collect()
}
