//! Keel benchmarks.

pub mod local_cluster;
