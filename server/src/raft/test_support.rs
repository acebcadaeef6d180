//! Test-only construction of a member's state machine on a directory, with the real applier
//! (tests may wire components from above the module they test, as integration tests do).

use std::path::Path;
use std::sync::Arc;

use super::StateMachine;
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
