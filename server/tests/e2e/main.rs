//! Keel's end-to-end tests: the real `keel` binary, driven through the real `etcdctl` and the
//! etcd v3 gRPC clients, one module per area. One test binary for all of them, so CI links
//! once; the harness is keel-testkit.
//!
//! `cargo test -p keel-server --test e2e <area or test name>` runs a part. Tests that start
//! multi-member clusters or assert timing take [`keel_testkit::schedule::exclusive`] and run
//! alone; the others take [`keel_testkit::schedule::shared`]. The failpoint tests are their own
//! binary (`--test failpoints`, `--features failpoints`).

mod cluster_basic;
mod cluster_failover;
mod cluster_five;
mod cluster_membership;
mod crash_recovery;
mod etcdctl;
mod lease_etcdctl;
mod lease_leader_kill;
mod peer_dial_override;
mod shutdown;
mod startup;
mod watch;

use std::path::PathBuf;

/// The `keel` under test: `$KEEL_BIN`, else the one cargo built for this test binary.
fn keel_bin() -> PathBuf {
    keel_testkit::keel_binary!()
}
