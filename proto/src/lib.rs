//! Protocol buffers of Keel.
//!
//! - [`mvccpb`], [`etcdserverpb`], [`authpb`], [`v3lockpb`], [`v3electionpb`]: the etcd v3 API,
//!   wire-compatible with etcd 3.6 (same packages, services, methods, messages and field
//!   numbers), written from etcd's public API reference.
//! - [`leasepb`]: etcd's persisted `Lease` (the `lease` bucket of etcd's database file).
//! - [`keelpb`]: Keel's internal protocol: the raft request carried in log entries and the
//!   peer RPCs between members.
//! - [`rpctypes`]: etcd's error catalogue (codes and exact texts), shared by server and client.

#![allow(clippy::all, missing_docs)]

/// The etcd API version the protos of this crate implement; Keel reports it in
/// `Maintenance.Status` as `StatusResponse.version` (etcd's `api/etcdserverpb/rpc.proto`).
pub const ETCD_API_VERSION: &str = "3.6.0";

pub mod rpctypes;

/// etcd `mvccpb`: `KeyValue` and watch `Event` (api/mvccpb/kv.proto).
pub mod mvccpb {
    tonic::include_proto!("mvccpb");
    include!(concat!(env!("OUT_DIR"), "/mvccpb.serde.rs"));
}

/// etcd `authpb`: `User`, `Role`, `Permission`, `UserAddOptions` (api/authpb/auth.proto).
pub mod authpb {
    tonic::include_proto!("authpb");
    include!(concat!(env!("OUT_DIR"), "/authpb.serde.rs"));
}

/// etcd `leasepb`: `Lease`, the value of etcd's `lease` bucket (server/lease/leasepb/lease.proto).
pub mod leasepb {
    tonic::include_proto!("leasepb");
}

/// etcd `etcdserverpb`: the KV, Watch, Lease, Cluster, Maintenance and Auth services and
/// their messages (api/etcdserverpb/rpc.proto).
pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
    include!(concat!(env!("OUT_DIR"), "/etcdserverpb.serde.rs"));
}

/// etcd `v3lockpb`: the Lock service (server/etcdserver/api/v3lock/v3lockpb/v3lock.proto).
pub mod v3lockpb {
    tonic::include_proto!("v3lockpb");
    include!(concat!(env!("OUT_DIR"), "/v3lockpb.serde.rs"));
}

/// etcd `v3electionpb`: the Election service
/// (server/etcdserver/api/v3election/v3electionpb/v3election.proto).
pub mod v3electionpb {
    tonic::include_proto!("v3electionpb");
    include!(concat!(env!("OUT_DIR"), "/v3electionpb.serde.rs"));
}

/// Keel's internal protocol: raft entry payloads and the member-to-member `Peer` service.
pub mod keelpb {
    tonic::include_proto!("keelpb");
}
