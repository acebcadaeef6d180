//! Keel benchmarks.

pub mod keel_bench;
