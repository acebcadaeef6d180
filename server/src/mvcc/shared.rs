//! [`SharedStore`]: the member's current MVCC store, swappable when a snapshot install
//! replaces the store.

use std::sync::{Arc, RwLock};

use super::MvccStore;

/// The current MVCC store, swappable when a snapshot is installed. Readers take a clone of
/// the `Arc` per request and never hold the lock while reading; only the applier swaps it.
pub struct SharedStore {
    store: RwLock<Arc<MvccStore>>,
}

impl SharedStore {
    /// Wraps the store opened at start-up.
    pub fn new(store: Arc<MvccStore>) -> SharedStore {
        SharedStore {
            store: RwLock::new(store),
        }
    }

    /// The store to read from now.
    pub fn get(&self) -> Arc<MvccStore> {
        self.store.read().expect("store lock").clone()
    }

    /// Makes `store` the one readers get from now on (after a snapshot install).
    pub fn set(&self, store: Arc<MvccStore>) {
        *self.store.write().expect("store lock") = store;
    }
}
