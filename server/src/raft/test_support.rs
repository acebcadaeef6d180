//! Test-only construction of a member's state machine on a directory.

use std::path::Path;
use std::sync::Arc;

use super::{SharedStore, StateMachine};
use crate::apply::Applier;
use crate::membership::Attributes;
use crate::mvcc::MvccStore;

/// A state machine on `<dir>/db` (sled tree `keel`) with snapshots in `<dir>/snap`, as a
/// member opens it, plus the shared store handle readers use.
pub fn state_machine(dir: &Path) -> (StateMachine, Arc<SharedStore>) {
    let snap_dir = dir.join("snap");
    std::fs::create_dir_all(&snap_dir).unwrap();
    let db = sled::Config::new().path(dir.join("db")).open().unwrap();
    let tree = db.open_tree("keel").unwrap();
    let store = Arc::new(MvccStore::open(tree.clone()).unwrap());
    let attributes = Arc::new(Attributes::default());
    let applier = Applier::open(tree, store.clone(), attributes.clone()).unwrap();
    let shared = Arc::new(SharedStore::new(store));
    (
        StateMachine::new(applier, shared.clone(), attributes, snap_dir),
        shared,
    )
}
