//! Connection settings of a [`crate::Client`].

use std::path::PathBuf;
use std::time::Duration;

use crate::retry::RetryPolicy;

/// How a [`crate::Client`] connects and how long its calls may take.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// HTTP/2 connections to open. Connection `i` goes to endpoint `i % endpoints`; at least
    /// one connection per endpoint is always opened, so `conns` below the number of
    /// endpoints is raised to it. Many concurrent streams share each connection.
    pub conns: usize,
    /// Time to establish one TCP connection (etcd clientv3 `DialTimeout`).
    pub connect_timeout: Duration,
    /// Deadline of one unary call attempt, sent to the server as `grpc-timeout`. Streams
    /// (watch, lease keep-alive) have no deadline.
    pub request_timeout: Duration,
    /// HTTP/2 per-stream flow-control window, bytes. etcd's gRPC server advertises 1 MiB
    /// windows; a small window throttles large ranges and busy watch streams.
    pub stream_window_bytes: u32,
    /// HTTP/2 per-connection flow-control window, bytes (shared by all its streams).
    pub connection_window_bytes: u32,
    /// HTTP/2 PING interval that detects a dead member on an idle connection (etcd
    /// clientv3 `DialKeepAliveTime`); `None` disables keep-alive pings.
    pub keep_alive_interval: Option<Duration>,
    /// Retries of the typed calls ([`RetryPolicy::none`] to surface every error).
    pub retry: RetryPolicy,
    /// Auth token (from `Auth.Authenticate`) sent in the gRPC metadata `token` of every
    /// typed unary call, as clientv3 does; `None` sends no credentials.
    pub token: Option<String>,
    /// TLS (etcdctl's `--cacert`, `--cert`, `--key`): `Some` connects with TLS to every
    /// endpoint; `None` uses plaintext, except that an `https://` endpoint then fails.
    pub tls: Option<TlsFiles>,
}

/// The files of a TLS client, as etcdctl names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// `--cacert`: PEM CA certificates the members' server certificates must chain to.
    pub ca: PathBuf,
    /// `--cert`: PEM client certificate (for members with `--client-cert-auth`).
    pub cert: Option<PathBuf>,
    /// `--key`: PEM key of `cert`.
    pub key: Option<PathBuf>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            conns: 1,
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(10),
            stream_window_bytes: 1 << 20,
            connection_window_bytes: 16 << 20,
            keep_alive_interval: Some(Duration::from_secs(10)),
            retry: RetryPolicy::default(),
            token: None,
            tls: None,
        }
    }
}
