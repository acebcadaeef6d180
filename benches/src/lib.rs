//! Keel benchmarks.

pub mod keel_bench;
pub mod local_cluster;
