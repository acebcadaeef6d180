//! The connection pool: HTTP/2 channels spread over every endpoint, stubs round robin.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use keel_proto::etcdserverpb::auth_client::AuthClient;
use keel_proto::etcdserverpb::cluster_client::ClusterClient;
use keel_proto::etcdserverpb::kv_client::KvClient;
use keel_proto::etcdserverpb::lease_client::LeaseClient;
use keel_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use keel_proto::etcdserverpb::watch_client::WatchClient;
use tonic::Status;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::error::ClientError;
use crate::options::{ClientOptions, TlsFiles};
use crate::retry::Decision;

/// A client of a Keel (or etcd v3) cluster. Cheap to clone: clones share the connections.
///
/// Invariant: channel `j` is connected to endpoint `j % endpoints.len()`.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    endpoints: Vec<String>,
    channels: Vec<Channel>,
    next: AtomicUsize,
    options: ClientOptions,
}

/// One member's endpoint and a connection to it, from [`Client::on_member`].
pub type Member = Client;

impl Client {
    /// Opens `max(options.conns, endpoints.len())` HTTP/2 connections, connection `i` to
    /// `endpoints[i % endpoints.len()]`, with TCP_NODELAY and the windows and keep-alive of
    /// `options`. Endpoints are `host:port` or `http://host:port` (etcd's `--endpoints`).
    /// A member that cannot be reached now is connected lazily on first use, so a client can
    /// start while part of the cluster is down.
    ///
    /// Errors: [`ClientError::Rejected`] (InvalidArgument) for an empty list or a malformed
    /// endpoint; [`ClientError::NotSent`] when no endpoint accepts a connection within
    /// `options.connect_timeout`.
    pub async fn connect<S: AsRef<str>>(
        endpoints: &[S],
        options: ClientOptions,
    ) -> Result<Client, ClientError> {
        if endpoints.is_empty() {
            return Err(invalid("no endpoints given".into()));
        }
        let endpoints: Vec<String> = endpoints
            .iter()
            .map(|e| {
                let e = e.as_ref().trim();
                if e.starts_with("https://") && options.tls.is_none() {
                    return Err(invalid(format!(
                        "{e}: an https endpoint needs TLS files (--cacert)"
                    )));
                }
                let e = e.strip_prefix("http://").unwrap_or(e);
                Ok(e.strip_prefix("https://").unwrap_or(e).to_string())
            })
            .collect::<Result<_, _>>()?;
        let configured: Vec<Endpoint> = endpoints
            .iter()
            .map(|e| configure(e, &options))
            .collect::<Result<_, _>>()?;
        let count = options.conns.max(endpoints.len());
        let attempts = (0..count).map(|i| {
            let endpoint = configured[i % endpoints.len()].clone();
            async move {
                match endpoint.connect().await {
                    Ok(channel) => (channel, None),
                    Err(e) => (endpoint.connect_lazy(), Some(e.to_string())),
                }
            }
        });
        let results = futures::future::join_all(attempts).await;
        if results.iter().all(|(_, failed)| failed.is_some()) {
            return Err(ClientError::NotSent {
                endpoint: endpoints.join(","),
                message: results[0].1.clone().unwrap_or_default(),
            });
        }
        Ok(Client {
            inner: Arc::new(Inner {
                endpoints,
                channels: results.into_iter().map(|(c, _)| c).collect(),
                next: AtomicUsize::new(0),
                options,
            }),
        })
    }

    /// The endpoints (`host:port`), in the order given to [`Client::connect`].
    pub fn endpoints(&self) -> &[String] {
        &self.inner.endpoints
    }

    /// The options the client was opened with.
    pub fn options(&self) -> &ClientOptions {
        &self.inner.options
    }

    /// Number of HTTP/2 connections.
    pub fn conns(&self) -> usize {
        self.inner.channels.len()
    }

    /// A client that only talks to member `i` (index into [`Client::endpoints`]), sharing
    /// this client's connections to it; typed calls retry on that member only. `None` if `i`
    /// is out of range. The chaos harness uses it to aim requests at one member.
    pub fn on_member(&self, i: usize) -> Option<Member> {
        let n = self.inner.endpoints.len();
        let endpoint = self.inner.endpoints.get(i)?.clone();
        let channels = self
            .inner
            .channels
            .iter()
            .skip(i)
            .step_by(n)
            .cloned()
            .collect();
        Some(Client {
            inner: Arc::new(Inner {
                endpoints: vec![endpoint],
                channels,
                next: AtomicUsize::new(0),
                options: self.inner.options.clone(),
            }),
        })
    }

    /// etcd `KV` stub on the next connection (round robin). Calls on raw stubs carry no
    /// deadline and are not retried.
    pub fn kv(&self) -> KvClient<Channel> {
        KvClient::new(self.next_channel())
    }

    /// etcd `Watch` stub on the next connection (round robin).
    pub fn watch(&self) -> WatchClient<Channel> {
        WatchClient::new(self.next_channel())
    }

    /// etcd `Lease` stub on the next connection (round robin).
    pub fn lease(&self) -> LeaseClient<Channel> {
        LeaseClient::new(self.next_channel())
    }

    /// etcd `Cluster` stub on the next connection (round robin).
    pub fn cluster(&self) -> ClusterClient<Channel> {
        ClusterClient::new(self.next_channel())
    }

    /// etcd `Auth` stub on the next connection (round robin).
    pub fn auth(&self) -> AuthClient<Channel> {
        AuthClient::new(self.next_channel())
    }

    /// etcd `Maintenance` stub on the next connection (round robin).
    pub fn maintenance(&self) -> MaintenanceClient<Channel> {
        MaintenanceClient::new(self.next_channel())
    }

    fn next_index(&self) -> usize {
        self.inner.next.fetch_add(1, Ordering::Relaxed) % self.inner.channels.len()
    }

    pub(crate) fn next_channel(&self) -> Channel {
        self.inner.channels[self.next_index()].clone()
    }

    /// The next connection and its endpoint (for streams, whose errors name the member).
    pub(crate) fn next_channel_at(&self) -> (Channel, String) {
        let i = self.next_index();
        (
            self.inner.channels[i].clone(),
            self.endpoint_of(i).to_string(),
        )
    }

    pub(crate) fn endpoint_of(&self, channel: usize) -> &str {
        &self.inner.endpoints[channel % self.inner.endpoints.len()]
    }

    /// The channel of attempt `attempt` when the first attempt used channel `first`: the
    /// first retry goes to the next member, and so on (channel `e` is the first connection
    /// of endpoint `e`).
    fn channel_for_attempt(&self, first: usize, attempt: u32) -> usize {
        if attempt == 0 {
            return first;
        }
        let n = self.inner.endpoints.len();
        (first % n + attempt as usize) % n
    }

    /// A request with the unary deadline (`grpc-timeout`) of the options.
    pub(crate) fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(self.inner.options.request_timeout);
        if let Some(token) = &self.inner.options.token {
            // A token that is not valid metadata is left out (the server then answers
            // `user name is empty`).
            if let Ok(value) = token.parse() {
                request.metadata_mut().insert("token", value);
            }
        }
        request
    }

    /// Runs `attempt` on a channel, retrying per [`crate::RetryPolicy::decide`] on the next
    /// members; `idempotent` marks requests that may be repeated whatever happened (reads).
    pub(crate) async fn call<T, F, Fut>(
        &self,
        idempotent: bool,
        mut attempt: F,
    ) -> Result<T, ClientError>
    where
        F: FnMut(Channel) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let first = self.next_index();
        let started = Instant::now();
        let mut tries = 0;
        loop {
            let channel = self.channel_for_attempt(first, tries);
            match attempt(self.inner.channels[channel].clone()).await {
                Ok(v) => return Ok(v),
                Err(status) => {
                    let err = ClientError::from_status(&status, self.endpoint_of(channel));
                    match self.inner.options.retry.decide(
                        tries,
                        started.elapsed(),
                        idempotent,
                        &err,
                    ) {
                        Decision::GiveUp => return Err(err),
                        Decision::RetryAfter(pause) => {
                            tokio::time::sleep(pause).await;
                            tries += 1;
                        }
                    }
                }
            }
        }
    }

    /// [`Client::call`] for one unary RPC: sends `req` with the unary deadline to `method`
    /// (a generated client's method on the attempt's channel) and unwraps the response.
    pub(crate) async fn unary<Req, Resp, F, Fut>(
        &self,
        idempotent: bool,
        req: Req,
        method: F,
    ) -> Result<Resp, ClientError>
    where
        Req: Clone,
        F: Fn(Channel, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
    {
        self.call(idempotent, |ch| {
            let response = method(ch, self.request(req.clone()));
            async move { response.await.map(tonic::Response::into_inner) }
        })
        .await
    }
}

fn invalid(message: String) -> ClientError {
    ClientError::Rejected {
        code: tonic::Code::InvalidArgument,
        message,
    }
}

fn configure(endpoint: &str, o: &ClientOptions) -> Result<Endpoint, ClientError> {
    let scheme = if o.tls.is_some() { "https" } else { "http" };
    let mut e = Endpoint::from_shared(format!("{scheme}://{endpoint}"))
        .map_err(|err| invalid(format!("bad endpoint {endpoint:?}: {err}")))?;
    if let Some(files) = &o.tls {
        e = e
            .tls_config(tls_config(files)?)
            .map_err(|err| invalid(format!("TLS for {endpoint:?}: {err}")))?;
    }
    let mut e = e
        .tcp_nodelay(true)
        .connect_timeout(o.connect_timeout)
        .initial_stream_window_size(o.stream_window_bytes)
        .initial_connection_window_size(o.connection_window_bytes);
    if let Some(interval) = o.keep_alive_interval {
        e = e
            .http2_keep_alive_interval(interval)
            .keep_alive_timeout(interval)
            .keep_alive_while_idle(true);
    }
    Ok(e)
}

/// tonic's TLS config from etcdctl's files.
fn tls_config(files: &TlsFiles) -> Result<ClientTlsConfig, ClientError> {
    let read = |flag: &str, path: &std::path::Path| {
        std::fs::read(path)
            .map_err(|e| invalid(format!("cannot read {flag} {}: {e}", path.display())))
    };
    let mut config =
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read("--cacert", &files.ca)?));
    match (&files.cert, &files.key) {
        (Some(cert), Some(key)) => {
            config = config.identity(Identity::from_pem(
                read("--cert", cert)?,
                read("--key", key)?,
            ));
        }
        (None, None) => {}
        _ => return Err(invalid("--cert and --key go together".into())),
    }
    Ok(config)
}
