//! Front ends: the etcd v3 gRPC services and etcd's HTTP endpoints ([`http`]) on the client
//! URLs, the metrics and health endpoints on `--listen-metrics-urls`, and Keel's peer
//! protocol on the peer URLs.
//!
//! Request size: gRPC accepts messages up to `--max-request-bytes` plus etcd's 512 KiB
//! framing allowance; the raft request itself is then checked against
//! `--max-request-bytes` (etcd's `ErrRequestTooLarge`), so an oversized request gets a clear
//! error and is never buffered without bound.

mod admit;
mod auth;
mod cluster;
mod concurrency;
pub mod credentials;
pub mod deadline;
mod downgrade;
mod election;
pub mod http;
mod kv;
pub mod kv_validate;
pub mod learner_gate;
mod lease;
mod lease_leader;
mod lock;
mod maintenance;
mod peer;
mod peer_calls;
pub mod peer_cluster_id;
mod peer_stream;
mod qos;
pub mod range_stream;
pub mod require_leader;
mod until_stopped;
mod watch;

use std::net::SocketAddr;
use std::sync::Arc;

use futures::Stream;
use keel_proto::etcdserverpb::{
    auth_server::AuthServer, cluster_server::ClusterServer, kv_server::KvServer,
    lease_server::LeaseServer, maintenance_server::MaintenanceServer, watch_server::WatchServer,
};
use keel_proto::keelpb::peer_server::PeerServer;
use keel_proto::keelpb::qos_server::QosServer;
use keel_proto::v3electionpb::election_server::ElectionServer;
use keel_proto::v3lockpb::lock_server::LockServer;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tonic::service::Routes;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Server;
use tonic::transport::server::{Connected, TcpIncoming};

pub use auth::AuthService;
pub use cluster::ClusterService;
pub use election::ElectionService;
pub use kv::KvService;
pub use lease::LeaseService;
pub use lock::LockService;
pub use maintenance::MaintenanceService;
pub use peer::PeerService;
pub use qos::QosService;
pub use watch::WatchService;

use crate::config::GRPC_OVERHEAD_BYTES;
use crate::node::Node;

/// Serves the etcd v3 API on the connections of `incoming` (plain TCP, [`plain`], or TLS,
/// `tls::server::incoming`) until `shutdown` resolves, with etcd's HTTP endpoints on the
/// same connections (HTTP/1.1 and HTTP/2, [`http::client_routes`]) and every RPC counted in
/// the gRPC metrics ([`http::GrpcMetricsLayer`]). Keepalive and stream limits follow
/// `--grpc-keepalive-interval`, `--grpc-keepalive-timeout`, `--max-concurrent-streams`.
///
/// Errors: the transport fails.
pub async fn serve_clients<I, IO, IE>(
    node: Arc<Node>,
    incoming: I,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()>
where
    I: Stream<Item = Result<IO, IE>>,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    IE: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let max = node.config.max_request_bytes as usize + GRPC_OVERHEAD_BYTES;
    let ops = &node.config.operator;
    let routes = Routes::from(http::client_routes(node.clone()))
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
        .add_service(LockServer::new(LockService::new(node.clone())).max_decoding_message_size(max))
        .add_service(
            ElectionServer::new(ElectionService::new(node.clone())).max_decoding_message_size(max),
        );
    Server::builder()
        .accept_http1(true)
        .http2_keepalive_interval(ops.keepalive_interval())
        .http2_keepalive_timeout(ops.keepalive_timeout())
        .max_concurrent_streams(ops.max_concurrent_streams)
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_ACCEPT_RESET_STREAMS))
        // Outermost first: the metrics also count what require-leader and the learner gate
        // refuse.
        .layer(http::GrpcMetricsLayer)
        .layer(tonic::service::InterceptorLayer::new(
            require_leader::interceptor(node.cluster.clone()),
        ))
        .layer(learner_gate::LearnerGateLayer::new(node.clone()))
        // Innermost, so its answer to an expired grpc-timeout is the one sent (api/deadline.rs).
        .layer(deadline::DeadlineLayer)
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await?;
    Ok(())
}

/// How many streams of one client connection may be reset by the client before the server
/// took them up, at once, before the connection is closed with GOAWAY `ENHANCE_YOUR_CALM`
/// (h2's guard against rapid-reset floods, CVE-2023-44487). h2's default, 20, closed the
/// connection of a client that cancels requests quickly, and every call in flight on it
/// failed with `Unavailable`; etcd (Go) has no such limit. Found by a fresh-user check; e2e
/// `client_cancels::streams_the_client_resets_before_the_server_takes_them_up_do_not_close_the_connection`.
pub const MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 4096;

/// Serves `/metrics` and the health endpoints ([`http::metrics_routes`]) on `listener`
/// (a `--listen-metrics-urls` URL; TLS with `tls`, the client side's configuration, for
/// `https://`), HTTP/1.1 and HTTP/2, until `shutdown` resolves.
///
/// Errors: the transport fails.
pub async fn serve_metrics_listener(
    node: Arc<Node>,
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let routes = Routes::from(http::metrics_routes(node));
    let mut server = Server::builder().accept_http1(true);
    match tls {
        Some(config) => {
            let incoming = crate::tls::server::incoming(listener, config, "metrics");
            server
                .add_routes(routes)
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await?
        }
        None => {
            server
                .add_routes(routes)
                .serve_with_incoming_shutdown(plain(listener), shutdown)
                .await?
        }
    }
    Ok(())
}

/// Serves the peer protocol on the connections of `incoming` ([`plain`] or TLS) until
/// `shutdown` resolves.
///
/// Errors: the transport fails.
pub async fn serve_peers<I, IO, IE>(
    node: Arc<Node>,
    incoming: I,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()>
where
    I: Stream<Item = Result<IO, IE>>,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    IE: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let check = peer_cluster_id::ClusterIdCheck {
        local: node.cluster_id,
    };
    // The AppendEntries streams end when the member stops: a graceful shutdown waits for
    // open streams, and a leader's stream stays open as long as the leader.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let shutdown = async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    };
    let service = PeerServer::new(PeerService::new(node, stop_rx))
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX);
    Server::builder()
        .add_service(InterceptedService::new(service, check))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await?;
    Ok(())
}

/// [`serve_clients`] on `listener`: TLS with `tls` (an `https://` URL), else plaintext.
///
/// Errors: the transport fails.
pub async fn serve_client_listener(
    node: Arc<Node>,
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    match tls {
        Some(config) => {
            let incoming = crate::tls::server::incoming(listener, config, "client");
            serve_clients(node, incoming, shutdown).await
        }
        None => serve_clients(node, plain(listener), shutdown).await,
    }
}

/// [`serve_peers`] on `listener`: TLS with `tls` (an `https://` URL), else plaintext.
///
/// Errors: the transport fails.
pub async fn serve_peer_listener(
    node: Arc<Node>,
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    match tls {
        Some(config) => {
            let incoming = crate::tls::server::incoming(listener, config, "peer");
            serve_peers(node, incoming, shutdown).await
        }
        None => serve_peers(node, plain(listener), shutdown).await,
    }
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
pub fn plain(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener).with_nodelay(Some(true))
}
