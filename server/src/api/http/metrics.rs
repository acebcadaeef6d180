//! `/metrics`: sets the state gauges of [`crate::metrics`] from the member, then encodes
//! the registry. The event counters and histograms are recorded where the events happen.

use std::sync::Arc;

use axum::body::Body;
use axum::http::header;
use axum::response::Response;

use super::version::VersionInfo;
use crate::metrics;
use crate::node::Node;

/// The `/metrics` answer for `node`.
pub fn scrape(node: &Node) -> Response {
    refresh(node);
    Response::builder()
        .header(header::CONTENT_TYPE, metrics::CONTENT_TYPE)
        .body(Body::from(metrics::encode()))
        .unwrap_or_default()
}

/// Sets every state gauge from `node` now.
pub fn refresh(node: &Node) {
    let s = metrics::server();
    // As etcd's, whose leader steps down without a quorum (CheckQuorum; `cluster::leadership`).
    let has_leader = node.cluster.has_leader();
    s.has_leader.set(i64::from(has_leader));
    s.is_leader
        .set(i64::from(has_leader && node.cluster.is_leader()));
    s.is_learner.set(i64::from(node.is_learner()));
    let load = node.qos.load().load();
    s.proposals_committed.set(as_i64(load.committed));
    s.proposals_applied.set(as_i64(load.applied));
    s.proposals_pending.set(as_i64(node.proposals_pending()));
    s.quota_backend_bytes.set(node.config.quota_bytes());
    s.db_total_size.set(node.db_size());
    s.db_in_use.set(node.db_size_in_use());
    s.keys_total
        .set(as_i64(node.store.get().index_stats().live_keys as u64));
    let versions = VersionInfo::of(node);
    set_only(&s.server_version, &versions.etcd_server);
    set_only(&s.cluster_version, &versions.cluster_label());
    set_only(&s.server_id, &format!("{:x}", node.id));

    let k = metrics::keel();
    set_only(&k.server_version, &versions.keel_server);
    set_only(&k.cluster_version, &node.cluster_version().to_string());
    let leases = node.lessor.stats();
    k.leases.set(as_i64(leases.leases as u64));
    k.lease_heap_entries
        .set(as_i64(leases.primary_expiry.unwrap_or(0) as u64));
    k.lease_heap_bytes
        .set(as_i64(leases.primary_heap_bytes.unwrap_or(0) as u64));
    let watch = node.watch.stats();
    k.watchers
        .with_label_values(&["synced"])
        .set(as_i64(watch.synced as u64));
    k.watchers
        .with_label_values(&["unsynced"])
        .set(as_i64(watch.unsynced as u64));
    for (result, total) in [("hit", watch.ring_hits), ("miss", watch.ring_misses)] {
        metrics::catch_up(&k.watch_ring_reads.with_label_values(&[result]), total);
    }
    let qos = node.qos.stats();
    for rule in &qos.rules {
        for (outcome, total) in [
            ("allowed", rule.allowed),
            ("refused_rate", rule.refused_rate),
            ("refused_in_flight", rule.refused_in_flight),
            ("refused_overload", rule.refused_overload),
        ] {
            let c = k.qos_requests.with_label_values(&[&rule.name, outcome]);
            metrics::catch_up(&c, total);
        }
        k.qos_in_flight
            .with_label_values(&[&rule.name])
            .set(i64::from(rule.in_flight));
    }
    let unmatched: u64 = qos.unmatched_refused_overload.iter().sum();
    let c = k.qos_requests.with_label_values(&["", "refused_overload"]);
    metrics::catch_up(&c, unmatched);
}

/// Sets `gauge{label}` to 1 and drops any other label value (a version that changed).
fn set_only(gauge: &prometheus::IntGaugeVec, label: &str) {
    if gauge.with_label_values(&[label]).get() != 1 {
        gauge.reset();
        gauge.with_label_values(&[label]).set(1);
    }
}

fn as_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Counts leader changes (`etcd_server_leader_changes_seen_total`) as etcd does: each time a
/// leader other than the last one seen (none included) becomes known. Ends with raft.
pub fn spawn_leader_watch(node: &Arc<Node>) {
    let mut rx = node.raft.metrics();
    tokio::spawn(async move {
        let mut last = None;
        loop {
            let leader = rx.borrow_and_update().current_leader;
            if leader.is_some() && leader != last {
                metrics::server().leader_changes.inc();
            }
            last = leader;
            if rx.changed().await.is_err() {
                return;
            }
        }
    });
}
