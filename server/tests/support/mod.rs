//! Shared harness of Keel's end-to-end tests: real `keel` processes ([`process::Keel`]), the
//! real `etcdctl` ([`etcdctl`]) and the generated etcd v3 gRPC clients ([`grpc`]).
//!
//! Every wait in here is bounded in time; a test that waits too long fails with the tail of the
//! member's log instead of hanging.

// Each integration test binary compiles this module and uses only part of it.
#![allow(dead_code)]

pub mod b64;
pub mod cluster;
pub mod etcdctl;
pub mod grpc;
pub mod ports;
pub mod process;
