use std::time::Duration;

use super::grpc::{Call, code_name, grpc_type};
use super::*;

fn line<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    text.lines().find(|l| l.starts_with(prefix))
}

#[test]
fn etcds_families_are_exported_with_their_types() {
    let text = encode();
    for (name, kind) in [
        ("etcd_server_has_leader", "gauge"),
        ("etcd_server_leader_changes_seen_total", "counter"),
        ("etcd_server_proposals_committed_total", "gauge"),
        ("etcd_server_proposals_applied_total", "gauge"),
        ("etcd_server_proposals_pending", "gauge"),
        ("etcd_server_proposals_failed_total", "counter"),
        ("etcd_disk_wal_fsync_duration_seconds", "histogram"),
        ("etcd_disk_backend_commit_duration_seconds", "histogram"),
        ("etcd_mvcc_db_total_size_in_bytes", "gauge"),
        ("etcd_debugging_mvcc_keys_total", "gauge"),
        ("grpc_server_handled_total", "counter"),
        ("grpc_server_started_total", "counter"),
        ("keel_apply_group_entries", "histogram"),
    ] {
        let want = format!("# TYPE {name} {kind}");
        assert!(text.contains(&want), "{want} missing");
    }
    #[cfg(target_os = "linux")]
    assert!(line(&text, "process_resident_memory_bytes ").is_some());
}

#[test]
fn fsync_buckets_are_etcds_one_ms_times_two_to_the_n() {
    disk().observe_wal_fsync(Duration::from_micros(1500));
    let text = encode();
    let les: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("etcd_disk_wal_fsync_duration_seconds_bucket"))
        .map(|l| l.split('"').nth(1).unwrap())
        .collect();
    assert_eq!(les.len(), 15, "14 buckets and +Inf: {les:?}");
    assert_eq!(
        (les[0], les[1], les[13], les[14]),
        ("0.001", "0.002", "8.192", "+Inf")
    );
}

#[test]
fn handled_counts_each_code_of_a_known_method_only() {
    let series = |text: &str, p: &str| line(text, p).unwrap()[p.len()..].parse::<u64>().unwrap();
    let ok = |text: &str| {
        series(
            text,
            "grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Compact\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} ",
        )
    };
    let started = "grpc_server_started_total{grpc_method=\"Compact\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} ";
    let unknown = "grpc_server_handled_total{grpc_code=\"Unknown\",grpc_method=\"Compact\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} ";
    let text = encode();
    let before = (ok(&text), series(&text, started), series(&text, unknown));
    Call::start("/etcdserverpb.KV/Compact").unwrap().finish(0);
    Call::start("/etcdserverpb.KV/Compact").unwrap().finish(9);
    Call::start("/etcdserverpb.KV/Compact").unwrap().finish(99);
    let text = encode();
    assert_eq!(
        (ok(&text), series(&text, started), series(&text, unknown)),
        (before.0 + 1, before.1 + 3, before.2 + 1)
    );
    assert!(Call::start("/etcdserverpb.KV/Nope").is_none());
    assert!(Call::start("/metrics").is_none());
    assert_eq!(grpc_type("etcdserverpb.Watch", "Watch"), "bidi_stream");
    assert_eq!(
        grpc_type("etcdserverpb.Maintenance", "Snapshot"),
        "server_stream"
    );
    assert_eq!(
        (code_name(0), code_name(14), code_name(99)),
        ("OK", "Unavailable", "Unknown")
    );
}

#[test]
fn catch_up_only_moves_a_counter_forward() {
    let c = prometheus::IntCounter::new("t", "t").unwrap();
    catch_up(&c, 5);
    catch_up(&c, 3);
    assert_eq!(c.get(), 5);
    catch_up(&c, 8);
    assert_eq!(c.get(), 8);
}
