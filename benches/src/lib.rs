//! Keel benchmarks.
