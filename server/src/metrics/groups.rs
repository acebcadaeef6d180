//! The metric groups, each created and registered on first use. Names, help texts, types,
//! labels and buckets of the `etcd_*` ones are etcd's (3.4–3.6).

use std::sync::LazyLock;
use std::time::Duration;

use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec};

use super::{counter, counter_vec, exponential, gauge, gauge_vec, histogram, histogram_vec};

/// Disk latencies (`storage/wal/metrics.go`, `storage/backend/metrics.go`).
pub struct Disk {
    /// `etcd_disk_wal_fsync_duration_seconds`: one observation per WAL group-commit round
    /// (fdatasync of the round's segments), 1 ms × 2^n, 14 buckets.
    pub wal_fsync: Histogram,
    /// `etcd_disk_backend_commit_duration_seconds`: one observation per backend batch commit
    /// (one sled batch per apply group), same buckets.
    pub backend_commit: Histogram,
}

impl Disk {
    /// Records one WAL fsync round that took `took`.
    pub fn observe_wal_fsync(&self, took: Duration) {
        self.wal_fsync.observe(took.as_secs_f64());
    }

    /// Records one backend commit that took `took`.
    pub fn observe_backend_commit(&self, took: Duration) {
        self.backend_commit.observe(took.as_secs_f64());
    }
}

static DISK: LazyLock<Disk> = LazyLock::new(|| Disk {
    wal_fsync: histogram(
        "etcd_disk_wal_fsync_duration_seconds",
        "The latency distributions of fsync called by WAL.",
        exponential(0.001, 2.0, 14),
    ),
    backend_commit: histogram(
        "etcd_disk_backend_commit_duration_seconds",
        "The latency distributions of commit called by backend.",
        exponential(0.001, 2.0, 14),
    ),
});

/// The disk group.
pub fn disk() -> &'static Disk {
    &DISK
}

/// Peer traffic (`api/rafthttp/metrics.go`). Labels are the peer's member ID in hex, as
/// etcd's. Keel measures on the sending side of its peer RPCs: `received` counts the bytes
/// of the answers a peer sent back.
pub struct Network {
    /// `etcd_network_peer_round_trip_time_seconds{To}`: one observation per raft RPC
    /// (append, heartbeat, vote), 0.1 ms × 2^n, 16 buckets.
    pub peer_rtt: HistogramVec,
    /// `etcd_network_peer_sent_bytes_total{To}`.
    pub peer_sent_bytes: IntCounterVec,
    /// `etcd_network_peer_received_bytes_total{From}`.
    pub peer_received_bytes: IntCounterVec,
    /// `etcd_network_peer_sent_failures_total{To}`.
    pub peer_sent_failures: IntCounterVec,
}

impl Network {
    /// Records a raft RPC to member `to` (hex ID) that sent `sent` bytes, answered with
    /// `received` bytes (`None`: it failed) after `took`.
    pub fn record_rpc(&self, to: &str, sent: usize, received: Option<usize>, took: Duration) {
        self.peer_sent_bytes
            .with_label_values(&[to])
            .inc_by(sent as u64);
        match received {
            Some(bytes) => {
                self.peer_received_bytes
                    .with_label_values(&[to])
                    .inc_by(bytes as u64);
                self.peer_rtt
                    .with_label_values(&[to])
                    .observe(took.as_secs_f64());
            }
            None => self.peer_sent_failures.with_label_values(&[to]).inc(),
        }
    }
}

static NETWORK: LazyLock<Network> = LazyLock::new(|| Network {
    peer_rtt: histogram_vec(
        "etcd_network_peer_round_trip_time_seconds",
        "Round-Trip-Time histogram between peers",
        &["To"],
        exponential(0.0001, 2.0, 16),
    ),
    peer_sent_bytes: counter_vec(
        "etcd_network_peer_sent_bytes_total",
        "The total number of bytes sent to peers.",
        &["To"],
    ),
    peer_received_bytes: counter_vec(
        "etcd_network_peer_received_bytes_total",
        "The total number of bytes received from peers.",
        &["From"],
    ),
    peer_sent_failures: counter_vec(
        "etcd_network_peer_sent_failures_total",
        "The total number of send failures from peers.",
        &["To"],
    ),
});

/// The network group.
pub fn network() -> &'static Network {
    &NETWORK
}

/// The member's state (`etcdserver/metrics.go`, `mvcc/metrics.go`). The gauges are set from
/// the member's state before each scrape; the counters count events as they happen.
pub struct Server {
    /// `etcd_server_has_leader`: 1 when this member knows a leader.
    pub has_leader: IntGauge,
    /// `etcd_server_is_leader`.
    pub is_leader: IntGauge,
    /// `etcd_server_is_learner`.
    pub is_learner: IntGauge,
    /// `etcd_server_leader_changes_seen_total`: a new leader (not "none") became known.
    pub leader_changes: IntCounter,
    /// `etcd_server_proposals_committed_total` (a gauge, as etcd's): the commit index.
    pub proposals_committed: IntGauge,
    /// `etcd_server_proposals_applied_total` (a gauge): the applied index.
    pub proposals_applied: IntGauge,
    /// `etcd_server_proposals_pending` (a gauge): proposals waiting in the proposer.
    pub proposals_pending: IntGauge,
    /// `etcd_server_proposals_failed_total`: proposals that returned an error.
    pub proposals_failed: IntCounter,
    /// `etcd_server_quota_backend_bytes`.
    pub quota_backend_bytes: IntGauge,
    /// `etcd_server_version{server_version}` = 1.
    pub server_version: IntGaugeVec,
    /// `etcd_cluster_version{cluster_version}` = 1 (`major.minor`).
    pub cluster_version: IntGaugeVec,
    /// `etcd_server_id{server_id}` = 1 (hex member ID).
    pub server_id: IntGaugeVec,
    /// `etcd_mvcc_db_total_size_in_bytes`: the store's size on disk.
    pub db_total_size: IntGauge,
    /// `etcd_mvcc_db_total_size_in_use_in_bytes`: the bytes the quota counts.
    pub db_in_use: IntGauge,
    /// `etcd_debugging_mvcc_keys_total`: keys that exist at the current revision.
    pub keys_total: IntGauge,
}

static SERVER: LazyLock<Server> = LazyLock::new(|| Server {
    has_leader: gauge(
        "etcd_server_has_leader",
        "Whether or not a leader exists. 1 is existence, 0 is not.",
    ),
    is_leader: gauge(
        "etcd_server_is_leader",
        "Whether or not this member is a leader. 1 if is, 0 otherwise.",
    ),
    is_learner: gauge(
        "etcd_server_is_learner",
        "Whether or not this member is a learner. 1 if is, 0 otherwise.",
    ),
    leader_changes: counter(
        "etcd_server_leader_changes_seen_total",
        "The number of leader changes seen.",
    ),
    proposals_committed: gauge(
        "etcd_server_proposals_committed_total",
        "The total number of consensus proposals committed.",
    ),
    proposals_applied: gauge(
        "etcd_server_proposals_applied_total",
        "The total number of consensus proposals applied.",
    ),
    proposals_pending: gauge(
        "etcd_server_proposals_pending",
        "The current number of pending proposals to commit.",
    ),
    proposals_failed: counter(
        "etcd_server_proposals_failed_total",
        "The total number of failed proposals seen.",
    ),
    quota_backend_bytes: gauge(
        "etcd_server_quota_backend_bytes",
        "Current backend storage quota size in bytes.",
    ),
    server_version: gauge_vec(
        "etcd_server_version",
        "Which version is running. 1 for 'server_version' label with current version.",
        &["server_version"],
    ),
    cluster_version: gauge_vec(
        "etcd_cluster_version",
        "Which version is running. 1 for 'cluster_version' label with current cluster version",
        &["cluster_version"],
    ),
    server_id: gauge_vec(
        "etcd_server_id",
        "Server or member ID in hexadecimal format. 1 for 'server_id' label with current ID.",
        &["server_id"],
    ),
    db_total_size: gauge(
        "etcd_mvcc_db_total_size_in_bytes",
        "Total size of the underlying database physically allocated in bytes.",
    ),
    db_in_use: gauge(
        "etcd_mvcc_db_total_size_in_use_in_bytes",
        "Total size of the underlying database logically in use in bytes.",
    ),
    keys_total: gauge("etcd_debugging_mvcc_keys_total", "Total number of keys."),
});

/// The server group.
pub fn server() -> &'static Server {
    &SERVER
}

/// Keel's own metrics, where etcd has none.
pub struct Keel {
    /// `keel_apply_group_entries`: raft entries applied per backend batch (apply group).
    pub apply_group_entries: Histogram,
    /// `keel_proposal_batch_requests`: client requests per proposed raft entry.
    pub proposal_batch_requests: Histogram,
    /// `keel_lease_count`: live leases.
    pub leases: IntGauge,
    /// `keel_lease_heap_entries`: scheduled expiries in the leader's heap (0 on followers).
    pub lease_heap_entries: IntGauge,
    /// `keel_lease_heap_bytes`: bytes held by the leader's lease heaps (0 on followers).
    pub lease_heap_bytes: IntGauge,
    /// `keel_watch_watchers{group}`: watchers on this member (`synced`, `unsynced`).
    pub watchers: IntGaugeVec,
    /// `keel_watch_ring_reads_total{result}`: catch-up reads of unsynced watchers answered
    /// by the ring of recent events (`hit`) or by the store (`miss`).
    pub watch_ring_reads: IntCounterVec,
    /// `keel_server_version{server_version}` = 1: this binary's Keel version.
    pub server_version: IntGaugeVec,
    /// `keel_cluster_version{cluster_version}` = 1: the replicated Keel cluster version
    /// (`major.minor`, docs/upgrades.md).
    pub cluster_version: IntGaugeVec,
    /// `keel_qos_requests_total{rule,outcome}`: QoS admissions per rule; outcome `allowed`,
    /// `refused_rate`, `refused_in_flight`, `refused_overload`. Requests no rule governs use
    /// rule `""`.
    pub qos_requests: IntCounterVec,
    /// `keel_qos_in_flight{rule}`: admitted requests still running, per rule.
    pub qos_in_flight: IntGaugeVec,
}

/// Powers of two from 1 to 2^`n - 1`: sizes of batches.
fn sizes(n: usize) -> Vec<f64> {
    super::exponential(1.0, 2.0, n)
}

static KEEL: LazyLock<Keel> = LazyLock::new(|| Keel {
    apply_group_entries: histogram(
        "keel_apply_group_entries",
        "Raft log entries applied in one backend batch (apply group).",
        sizes(12),
    ),
    proposal_batch_requests: histogram(
        "keel_proposal_batch_requests",
        "Client requests carried by one proposed raft log entry.",
        sizes(12),
    ),
    leases: gauge("keel_lease_count", "Live leases on this member."),
    lease_heap_entries: gauge(
        "keel_lease_heap_entries",
        "Lease expiries scheduled in the leader's heap (0 on followers).",
    ),
    lease_heap_bytes: gauge(
        "keel_lease_heap_bytes",
        "Bytes held by the leader's lease heaps (0 on followers).",
    ),
    server_version: gauge_vec(
        "keel_server_version",
        "Which Keel version is running. 1 for 'server_version' label with current version.",
        &["server_version"],
    ),
    cluster_version: gauge_vec(
        "keel_cluster_version",
        "The Keel cluster version. 1 for 'cluster_version' label with current cluster version.",
        &["cluster_version"],
    ),
    watchers: gauge_vec(
        "keel_watch_watchers",
        "Watchers on this member, by group (synced, unsynced).",
        &["group"],
    ),
    watch_ring_reads: counter_vec(
        "keel_watch_ring_reads_total",
        "Catch-up reads of unsynced watchers served by the ring of recent events (hit) or the store (miss).",
        &["result"],
    ),
    qos_requests: counter_vec(
        "keel_qos_requests_total",
        "QoS admission decisions per rule and outcome (allowed, refused_rate, refused_in_flight, refused_overload).",
        &["rule", "outcome"],
    ),
    qos_in_flight: gauge_vec(
        "keel_qos_in_flight",
        "Admitted requests still running, per QoS rule.",
        &["rule"],
    ),
});

/// The keel group.
pub fn keel() -> &'static Keel {
    &KEEL
}
