//! openraft's own storage conformance suite (`openraft::testing::Suite`) run against Keel's
//! log store (WAL) and state machine (apply + MVCC + snapshots): vote persistence, log
//! reads, truncate, purge, initial-state recovery, re-apply of committed entries, membership
//! tracking, and snapshot build → install between two state machines.

use std::sync::Arc;

use openraft::testing::{StoreBuilder, Suite};

use super::types::{StorageError, TypeConfig};
use super::{LogStore, SharedStore, StateMachine};
use crate::apply::Applier;
use crate::membership::Attributes;
use crate::mvcc::MvccStore;
use crate::wal::{Wal, WalOptions};

struct Builder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for Builder {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError> {
        let dir = tempfile::tempdir().expect("temp dir");
        let wal_dir = dir.path().join("wal");
        let snap_dir = dir.path().join("snap");
        std::fs::create_dir_all(&wal_dir).unwrap();
        std::fs::create_dir_all(&snap_dir).unwrap();
        let wal = Arc::new(Wal::open(&wal_dir, WalOptions::default()).expect("wal"));
        let db = sled::Config::new()
            .path(dir.path().join("db"))
            .open()
            .expect("sled");
        let tree = db.open_tree("keel").expect("tree");
        let store = Arc::new(MvccStore::open(tree.clone()).expect("mvcc"));
        let attributes = Arc::new(Attributes::default());
        let applier = Applier::open(tree, store.clone(), attributes.clone()).expect("applier");
        let sm = StateMachine::new(
            applier,
            Arc::new(SharedStore::new(store)),
            attributes,
            snap_dir,
        );
        Ok((dir, LogStore::new(wal), sm))
    }
}

#[test]
fn openraft_storage_suite() {
    Suite::test_all(Builder).expect("openraft storage suite");
}
