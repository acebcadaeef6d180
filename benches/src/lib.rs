//! Keel benchmarks.

pub mod keel_bench;
pub mod mvcc_data;
pub mod watch_scale;
