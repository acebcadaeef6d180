//! openraft's own storage conformance suite (`openraft::testing::Suite`) run against Keel's
//! log store (WAL) and state machine (apply + MVCC + snapshots): vote persistence, log
//! reads, truncate, purge, initial-state recovery, re-apply of committed entries, membership
//! tracking, and snapshot build → install between two state machines.

use std::sync::Arc;

use openraft::testing::{StoreBuilder, Suite};

use super::types::{StorageError, TypeConfig};
use super::{LogStore, StateMachine};
use crate::wal::{Wal, WalOptions};

struct Builder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for Builder {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError> {
        let dir = tempfile::tempdir().expect("temp dir");
        let wal_dir = dir.path().join("wal");
        std::fs::create_dir_all(&wal_dir).unwrap();
        let wal = Arc::new(Wal::open(&wal_dir, WalOptions::default()).expect("wal"));
        let (sm, _) = super::test_support::state_machine(dir.path());
        Ok((dir, LogStore::new(wal), sm))
    }
}

#[test]
fn openraft_storage_suite() {
    Suite::test_all(Builder).expect("openraft storage suite");
}
