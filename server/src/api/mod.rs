//! gRPC front ends: the etcd v3 services on the client URLs and Keel's peer protocol on the
//! peer URLs.
//!
//! Request size: gRPC accepts messages up to `--max-request-bytes` plus etcd's 512 KiB
//! framing allowance; the raft request itself is then checked against
//! `--max-request-bytes` (etcd's `ErrRequestTooLarge`), so an oversized request gets a clear
//! error and is never buffered without bound.

mod admit;
mod auth;
mod cluster;
pub mod credentials;
mod kv;
pub mod kv_validate;
mod lease;
mod lease_leader;
mod maintenance;
mod peer;
mod qos;
mod unimplemented;
mod watch;

use std::net::SocketAddr;
use std::sync::Arc;

use keel_proto::etcdserverpb::{
    auth_server::AuthServer, cluster_server::ClusterServer, kv_server::KvServer,
    lease_server::LeaseServer, maintenance_server::MaintenanceServer, watch_server::WatchServer,
};
use keel_proto::keelpb::peer_server::PeerServer;
use keel_proto::keelpb::qos_server::QosServer;
use keel_proto::v3electionpb::election_server::ElectionServer;
use keel_proto::v3lockpb::lock_server::LockServer;
use tokio::net::TcpListener;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

pub use auth::AuthService;
pub use cluster::ClusterService;
pub use kv::KvService;
pub use lease::LeaseService;
pub use maintenance::MaintenanceService;
pub use peer::PeerService;
pub use qos::QosService;
pub use watch::WatchService;

use crate::config::GRPC_OVERHEAD_BYTES;
use crate::node::Node;

/// Serves the etcd v3 API on `addr` until `shutdown` resolves.
///
/// Errors: the address cannot be bound, or the transport fails.
pub async fn serve_clients(
    node: Arc<Node>,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let max = node.config.max_request_bytes as usize + GRPC_OVERHEAD_BYTES;
    let incoming = incoming(listener);
    Server::builder()
        .add_service(KvServer::new(KvService::new(node.clone())).max_decoding_message_size(max))
        .add_service(
            MaintenanceServer::new(MaintenanceService::new(node.clone()))
                .max_decoding_message_size(max),
        )
        .add_service(
            ClusterServer::new(ClusterService::new(node.clone())).max_decoding_message_size(max),
        )
        .add_service(
            WatchServer::new(WatchService::new(node.clone())).max_decoding_message_size(max),
        )
        .add_service(
            LeaseServer::new(LeaseService::new(node.clone())).max_decoding_message_size(max),
        )
        .add_service(QosServer::new(QosService::new(node.clone())).max_decoding_message_size(max))
        .add_service(AuthServer::new(AuthService::new(node.clone())).max_decoding_message_size(max))
        .add_service(LockServer::new(unimplemented::NotYet))
        .add_service(ElectionServer::new(unimplemented::NotYet))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await?;
    Ok(())
}

/// Serves the peer protocol on `addr` until `shutdown` resolves.
///
/// Errors: the address cannot be bound, or the transport fails.
pub async fn serve_peers(
    node: Arc<Node>,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let incoming = incoming(listener);
    Server::builder()
        .add_service(
            PeerServer::new(PeerService::new(node))
                .max_decoding_message_size(usize::MAX)
                .max_encoding_message_size(usize::MAX),
        )
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await?;
    Ok(())
}

/// Binds `addr` (before anything touches the data dir, so a busy port leaves no state).
///
/// Errors: the address cannot be bound; the message names it.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))
}

/// TCP_NODELAY on every accepted connection. (`Server::tcp_nodelay` only applies to
/// listeners tonic binds itself; without it, Nagle's algorithm and the client's delayed ACK
/// add ~40 ms to many small responses.)
fn incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener).with_nodelay(Some(true))
}
