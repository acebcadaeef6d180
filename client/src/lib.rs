//! Keel client library: a pool of HTTP/2 connections spread over every member of a Keel
//! (or etcd v3) cluster, typed errors that say whether a failed request may have been
//! applied, and a retry policy that only repeats what is safe to repeat.
//!
//! - [`Client`]: connects, hands out the etcd gRPC stubs round robin over its connections
//!   ([`Client::kv`], [`Client::watch`], ...) or for one member ([`Client::on_member`]), and
//!   offers typed calls (`put`, `get`, `delete`, `txn`, `compact`, `lease_grant`,
//!   `lease_keep_alive`, `watch_key`).
//! - [`ClientError`]: a failed call, classified from the gRPC status and etcd's error texts
//!   ([`rpctypes`], etcd's `api/v3rpc/rpctypes/error.go`), with
//!   [`ClientError::may_have_applied`] and [`ClientError::rpc_error`].
//! - [`RetryPolicy`]: bounded attempts and time; reads retry on another member when the
//!   cluster is briefly unavailable, writes only when the error proves they were not applied.

mod client;
mod error;
mod kv;
mod lease;
mod options;
mod retry;
mod watch;

pub use client::{Client, Member};
pub use error::{ClientError, EtcdText};
pub use kv::Consistency;
pub use lease::LeaseKeepAlive;
pub use options::{ClientOptions, TlsFiles};
pub use retry::{Decision, RetryPolicy};
pub use watch::WatchStream;

/// The etcd v3 protocol types this client speaks and etcd's error catalogue (re-exported
/// from `keel-proto`).
pub use keel_proto::{etcdserverpb, mvccpb, rpctypes};
