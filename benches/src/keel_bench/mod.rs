//! `keel-bench`: an etcd-`benchmark`-style load generator for Keel and etcd v3 endpoints.
//!
//! - [`cli`]: the command line (workloads and options, named after etcd's `benchmark`).
//! - [`keys`]: keys and values as etcd's `benchmark` makes them.
//! - [`runner`]: the closed- and open-loop drivers (workers, `--total`/`--duration`,
//!   `--rate`, progress bar).
//! - [`workloads`]: one request of each workload.
//! - [`watch`]: the watch workload (event latency from put to event).
//! - [`report`]: latency histograms, error counts, the text and `--json` reports.

pub mod cli;
pub mod keys;
pub mod report;
pub mod runner;
pub mod watch;
pub mod workloads;
