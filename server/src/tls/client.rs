//! The client side of peer TLS: [`PeerConnector`], the connector the peer channels of
//! `https://` peer URLs dial through.
//!
//! As in etcd (`rafthttp` with `--peer-*` flags), the member's peer certificate is also its
//! client certificate, and the other members' server certificates must chain to
//! `--peer-trusted-ca-file`. With `--peer-auto-tls` (self-signed certificates, no CA) the
//! server certificate is not verified, as etcd's `InsecureSkipVerify` for auto TLS.
//!
//! The rustls client config is built for every new connection, so renewed peer certificate
//! files are used from the next connection on (etcd reloads per handshake too). A connection
//! that cannot be set up fails with the reason in its error, which the caller logs.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls::client::danger::{ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tonic::codegen::http::Uri;

use super::reload::{load_pair, root_store};
use super::{TlsError, TlsOptions};

/// How outgoing peer connections do TLS: the peer side's [`TlsOptions`] (certificate, key,
/// trusted CA), and whether the server certificate goes unverified (`--peer-auto-tls`).
#[derive(Debug, Clone)]
pub struct PeerConnector {
    options: Arc<TlsOptions>,
    skip_verify: bool,
    provider: Arc<CryptoProvider>,
}

impl PeerConnector {
    /// A connector presenting `options.cert_file`/`key_file` and trusting
    /// `options.trusted_ca_file`; `skip_verify` for auto TLS.
    ///
    /// Errors: bad cipher suites; the files are checked once now (a member does not start
    /// with peer files it cannot use).
    pub fn new(options: TlsOptions, skip_verify: bool) -> Result<PeerConnector, TlsError> {
        let connector = PeerConnector {
            provider: options.provider()?,
            options: Arc::new(options),
            skip_verify,
        };
        connector.client_config()?;
        Ok(connector)
    }

    /// The rustls client config, from the files as they are now.
    ///
    /// Errors: an unusable certificate, key or CA file.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, TlsError> {
        let builder = ClientConfig::builder_with_provider(self.provider.clone())
            .with_protocol_versions(self.options.min_version.versions())
            .map_err(|e| TlsError::Rustls(e.to_string()))?;
        let builder = match (&self.options.trusted_ca_file, self.skip_verify) {
            (Some(ca), false) => builder.with_root_certificates(root_store(ca)?),
            (None, false) => builder.with_root_certificates(rustls::RootCertStore::empty()),
            (_, true) => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AcceptAnyServer(self.provider.clone()))),
        };
        let mut config = match (&self.options.cert_file, &self.options.key_file) {
            (Some(cert), Some(key)) => {
                let pair = load_pair(cert, key, &self.provider)?;
                let key = super::files::key(key)?;
                builder
                    .with_client_auth_cert(pair.cert.clone(), key)
                    .map_err(|e| TlsError::Rustls(e.to_string()))?
            }
            _ => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }

    async fn connect(self, uri: Uri) -> Result<TokioIo<Watched>, tonic::codegen::StdError> {
        let host = uri.host().ok_or("peer URL without a host")?;
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = uri.port_u16().unwrap_or(443);
        let tcp = TcpStream::connect((host.as_str(), port)).await?;
        tcp.set_nodelay(true)?;
        let name =
            ServerName::try_from(host.clone()).map_err(|e| format!("peer host {host:?}: {e}"))?;
        let config = self.client_config()?;
        let tls = TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS handshake with peer {host}:{port}: {e}"))?;
        Ok(TokioIo::new(Watched {
            inner: tls,
            peer: format!("{host}:{port}"),
            reported: false,
        }))
    }
}

impl tonic::codegen::Service<Uri> for PeerConnector {
    type Response = TokioIo<Watched>;
    type Error = tonic::codegen::StdError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        Box::pin(self.clone().connect(uri))
    }
}

/// A peer TLS connection that logs the first TLS protocol error it reads. With TLS 1.3 the
/// server checks the client certificate after the client finished its handshake, so a
/// refused peer certificate shows up as an alert on the first read (`received fatal alert:
/// UnknownCA`), inside hyper's connection task, where the RPC only sees "connection closed":
/// the warning is how the member says why.
#[derive(Debug)]
pub struct Watched {
    inner: TlsStream<TcpStream>,
    peer: String,
    reported: bool,
}

impl tokio::io::AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Err(error)) = &result
            && error.kind() == std::io::ErrorKind::InvalidData
            && !self.reported
        {
            self.reported = true;
            tracing::warn!(peer = %self.peer, %error, "peer TLS connection to {} failed: {error}", self.peer);
        }
        result
    }
}

impl tokio::io::AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// `--peer-auto-tls`: any server certificate is accepted (its signatures are still checked).
#[derive(Debug)]
struct AcceptAnyServer(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    signature_checks!(0);
}
