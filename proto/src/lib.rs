//! Protocol buffers of Keel.
//!
//! - [`mvccpb`], [`etcdserverpb`], [`authpb`], [`v3lockpb`], [`v3electionpb`]: the etcd v3 API,
//!   wire-compatible with etcd 3.6 (same packages, services, methods, messages and field
//!   numbers), written from etcd's public API reference.
//! - [`keelpb`]: Keel's internal protocol: the raft request carried in log entries and the
//!   peer RPCs between members.

#![allow(clippy::all, missing_docs)]

pub mod mvccpb {
    tonic::include_proto!("mvccpb");
}
