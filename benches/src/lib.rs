//! Keel benchmarks.

pub mod keel_bench;
pub mod mvcc_data;
