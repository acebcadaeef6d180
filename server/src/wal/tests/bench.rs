//! Throughput measurement.
