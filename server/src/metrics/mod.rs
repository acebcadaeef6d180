//! The member's Prometheus registry: every metric Keel exports on `/metrics`, with etcd's
//! names, types, labels and buckets where etcd has the metric (so etcd's Grafana dashboard
//! and `contrib/mixin` alerts work unchanged), and `keel_`-prefixed ones where it has none.
//!
//! A leaf: it uses no other module, so every layer records into it through the narrow
//! handles of its groups ([`disk`], [`network`], [`server`], [`keel`], [`grpc`]). Recording is
//! an atomic add or a histogram observation (prometheus' lock-free counters): no lock is
//! taken on a hot path. Gauges that describe state (leader, indexes, sizes) are set by the
//! HTTP layer from the member's state right before each scrape (`api::http::metrics`), so
//! every value is live, never a constant.
//!
//! One registry per process (a Keel process runs one member).
//!
//! Sources: `etcd@v3.6.14:server/etcdserver/metrics.go`, `storage/wal/metrics.go`,
//! `storage/backend/metrics.go`, `storage/mvcc/metrics.go`, `api/rafthttp/metrics.go`,
//! go-grpc-prometheus `server_metrics.go`.

mod groups;
pub mod grpc;

use std::sync::LazyLock;

use prometheus::core::Collector;
use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

pub use groups::{Disk, Keel, Network, Server, disk, keel, network, server};

/// The `Content-Type` of the Prometheus text exposition format 0.0.4 (what etcd answers).
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

static REGISTRY: LazyLock<Registry> = LazyLock::new(|| {
    let registry = Registry::new();
    // `process_*` (CPU seconds, resident memory, open and max fds, start time), as Go's
    // process collector exports them for etcd.
    #[cfg(target_os = "linux")]
    registry
        .register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))
        .expect("process collector registers once");
    registry
});

/// The registry `/metrics` encodes.
pub fn registry() -> &'static Registry {
    &REGISTRY
}

/// Every registered metric in the Prometheus text format.
pub fn encode() -> String {
    // Touch every group so that its metrics appear before their first use (etcd registers
    // all of them at start).
    let _ = (disk(), network(), server(), keel(), grpc::grpc());
    TextEncoder::new()
        .encode_to_string(&registry().gather())
        .unwrap_or_else(|e| format!("# encoding failed: {e}\n"))
}

/// Registers `c` in the registry and returns it. A duplicate name is a programming error
/// (each metric is created once, by its group's `LazyLock`).
fn register<C: Collector + Clone + 'static>(c: C) -> C {
    registry()
        .register(Box::new(c.clone()))
        .expect("every metric name is registered once");
    c
}

fn gauge(name: &str, help: &str) -> IntGauge {
    register(IntGauge::new(name, help).expect("valid metric name"))
}

fn gauge_vec(name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    register(IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric name"))
}

fn counter(name: &str, help: &str) -> IntCounter {
    register(IntCounter::new(name, help).expect("valid metric name"))
}

fn counter_vec(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register(IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric name"))
}

fn histogram(name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
    let opts = HistogramOpts::new(name, help).buckets(buckets);
    register(Histogram::with_opts(opts).expect("valid metric name"))
}

fn histogram_vec(name: &str, help: &str, labels: &[&str], buckets: Vec<f64>) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(buckets);
    register(HistogramVec::new(opts, labels).expect("valid metric name"))
}

/// `start`, `start·factor`, … (`count` buckets): Go's `prometheus.ExponentialBuckets`.
fn exponential(start: f64, factor: f64, count: usize) -> Vec<f64> {
    prometheus::exponential_buckets(start, factor, count).expect("valid bucket layout")
}

/// Raises counter `c` to `total` (a monotonic total kept elsewhere, e.g. QoS admission
/// counts): counters only go up, so a source that restarted from 0 leaves `c` where it is.
pub fn catch_up(c: &IntCounter, total: u64) {
    let current = c.get();
    if total > current {
        c.inc_by(total - current);
    }
}

#[cfg(test)]
mod tests;
