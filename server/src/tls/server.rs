//! The server side: a rustls [`ServerConfig`] from [`TlsOptions`], and [`incoming`], the
//! accept loop that turns a listener's TCP connections into TLS streams for tonic.
//!
//! Handshakes run in their own tasks (bounded by [`HANDSHAKE_TIMEOUT`]), so a slow or hostile
//! client never holds up the accept loop. A failed handshake — no client certificate, one from
//! another CA, a revoked one, plaintext on a TLS port — is logged like etcd's `rejected
//! connection from ...` and the connection is closed before any request is read, so nothing
//! it sent is applied.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

use super::reload::{ClientTrust, ReloadingCert, ReloadingVerifier};
use super::{TlsError, TlsOptions};

/// Longest time a TLS handshake may take before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Completed handshakes waiting for the gRPC server to take them.
const BACKLOG: usize = 128;

/// The rustls configuration of a listener with certificate `cert` and key `key` (re-read on
/// change, [`ReloadingCert`]): `options.min_version` and cipher suites, HTTP/2 by ALPN, and —
/// with `client_cert_auth` — a required client certificate verified against
/// `options.trusted_ca_file` and `options.crl_file` ([`ReloadingVerifier`]).
///
/// Errors: unusable files; `client_cert_auth` without a trusted CA file; bad suites.
pub fn server_config(
    options: &TlsOptions,
    cert: &Path,
    key: &Path,
) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = options.provider()?;
    let resolver = Arc::new(ReloadingCert::new(cert, key, provider.clone())?);
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(options.min_version.versions())
        .map_err(|e| TlsError::Rustls(e.to_string()))?;
    let builder = if options.client_cert_auth {
        let ca_file = options.trusted_ca_file.clone().ok_or_else(|| {
            TlsError::Rustls("client certificate authentication needs a trusted CA file".into())
        })?;
        let trust = ClientTrust {
            ca_file,
            crl_file: options.crl_file.clone(),
            allowed_cn: options.allowed_cn.clone(),
        };
        builder.with_client_cert_verifier(Arc::new(ReloadingVerifier::new(trust, provider)?))
    } else {
        builder.with_no_client_auth()
    };
    let mut config = builder.with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// `config` that also offers HTTP/1.1 by ALPN (after `h2`): the client and metrics URLs
/// serve etcd's HTTP endpoints to HTTP/1.1 clients too; the peer URLs stay HTTP/2 only.
pub fn with_http1(config: &ServerConfig) -> Arc<ServerConfig> {
    let mut config = config.clone();
    if !config.alpn_protocols.iter().any(|p| p == b"http/1.1") {
        config.alpn_protocols.push(b"http/1.1".to_vec());
    }
    Arc::new(config)
}

/// TLS connections accepted on `listener` (TCP_NODELAY set), as a stream for tonic's
/// `serve_with_incoming*`. Connections whose handshake fails are logged (naming `side`,
/// "client" or "peer") and dropped. The accept task ends when the stream is dropped.
pub fn incoming(
    listener: TcpListener,
    config: Arc<ServerConfig>,
    side: &'static str,
) -> ReceiverStream<Result<TlsStream<TcpStream>, std::io::Error>> {
    let (tx, rx) = tokio::sync::mpsc::channel(BACKLOG);
    let acceptor = TlsAcceptor::from(config);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = tx.closed() => return,
                accepted = listener.accept() => accepted,
            };
            let (tcp, remote) = match accepted {
                Ok(pair) => pair,
                Err(error) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(%error, "accept failed on a {side} TLS listener");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                if let Some(stream) = handshake(acceptor, tcp, remote, side).await {
                    let _ = tx.send(Ok(stream)).await;
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

async fn handshake(
    acceptor: TlsAcceptor,
    tcp: TcpStream,
    remote: SocketAddr,
    side: &'static str,
) -> Option<TlsStream<TcpStream>> {
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(error)) => {
            tracing::warn!(%remote, %error, "rejected {side} connection from {remote}: {error}");
            None
        }
        Err(_) => {
            tracing::warn!(%remote, "rejected {side} connection from {remote}: TLS handshake timed out");
            None
        }
    }
}
