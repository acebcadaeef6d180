//! Keel's test kit: real `keel` member processes for end-to-end tests, benchmarks and the chaos
//! harness, in the spirit of etcd's `tests/framework/e2e`.
//!
//! Bottom-up:
//! - [`binary`]: which `keel` to run (`$KEEL_BIN`, the caller's `CARGO_BIN_EXE_keel`,
//!   `target/<profile>/keel`);
//! - [`ports`]: free loopback ports;
//! - [`spec`]: [`MemberSpec`], the one place that spells a member's flags and environment;
//! - [`process`]: bounded runs of helper processes, signals, resident memory;
//! - [`grpc`]: the etcd v3 gRPC clients of keel-proto with bounded timeouts, and the probes;
//! - [`member`]: [`Member`], one `keel` process (start, SIGKILL, SIGTERM, SIGSTOP/SIGCONT,
//!   restart on the same data dir, readiness, its log tail printed when a test fails);
//! - [`cluster`]: [`Cluster`], N members with leader lookup and membership changes;
//! - [`tls`]: test CAs and certificates (rcgen), and the registry that makes every helper
//!   speak TLS to a TLS member;
//! - [`etcdctl`] and [`b64`]: the real etcd client and the base64 its JSON output uses;
//! - [`etcd`]: the real etcd server as the reference (start, `snapshot restore`, what it serves);
//! - [`schedule`]: which tests of one test binary may overlap.
//!
//! Every wait in here is bounded in time; a test that waits too long fails with the tail of
//! the members' logs instead of hanging. Members bind 127.0.0.1 only.

pub mod b64;
pub mod binary;
pub mod cluster;
pub mod etcd;
pub mod etcdctl;
pub mod grpc;
pub mod member;
pub mod ports;
pub mod process;
pub mod schedule;
pub mod spec;
pub mod tls;

pub use binary::find_keel;
pub use cluster::Cluster;
pub use member::Member;
pub use spec::{ClusterState, MemberSpec};
