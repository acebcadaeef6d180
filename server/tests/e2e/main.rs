//! Keel's end-to-end tests: the real `keel` binary, driven through the real `etcdctl` and the
//! etcd v3 gRPC clients, one module per area. One test binary for all of them, so CI links
//! once; the harness is keel-testkit.
//!
//! `cargo test -p keel-server --test e2e <area or test name>` runs a part. Tests that start
//! multi-member clusters or assert timing run alone ([`cluster`], or
//! [`keel_testkit::schedule::exclusive`]); single-member tests share the box with each other
//! ([`member`], or [`keel_testkit::schedule::shared`]). The failpoint tests are their own binary
//! (`--test failpoints`, `--features failpoints`).

mod auth;
mod auth_permissions;
mod autocompact;
mod client_cancels;
mod cluster_basic;
mod cluster_failover;
mod cluster_five;
mod cluster_membership;
mod corrupt;
mod crash_recovery;
mod defrag;
mod deploy;
mod disaster_recovery;
mod etcdctl;
mod gateway;
mod http;
mod keelutl;
mod kubernetes;
mod leader_change;
mod lease_etcdctl;
mod lease_leader_kill;
mod lockelect;
mod maintenance;
mod peer_dial_override;
mod qos;
mod range_stream;
mod response_shapes;
mod retention;
mod shutdown;
mod snapshot;
mod startup;
mod tls;
mod txn_read_only;
mod versions;
mod watch;

use std::path::PathBuf;

use keel_testkit::schedule::{Exclusive, Shared, exclusive, shared};
use keel_testkit::{Cluster, Member};

/// The `keel` under test: `$KEEL_BIN`, else the one cargo built for this test binary.
fn keel_bin() -> PathBuf {
    keel_testkit::keel_binary!()
}

/// A fresh ready single-member cluster with `extra` flags ([`Member::start_with`]), started
/// once no exclusive test runs; bind the guard for the whole test (`let (_guard, keel) = ...`).
fn member(extra: &[&str]) -> (Shared, Member) {
    let guard = shared();
    (guard, Member::start_with(&keel_bin(), extra))
}

/// A fresh ready cluster of `n` members with `extra` flags ([`Cluster::start`]), started once
/// no other test runs; bind the guard for the whole test (`let (_alone, cluster) = ...`), so
/// the cluster is dropped first.
fn cluster(n: usize, extra: &[&str]) -> (Exclusive, Cluster) {
    let guard = exclusive();
    (guard, Cluster::start(&keel_bin(), n, extra))
}
