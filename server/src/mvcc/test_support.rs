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
