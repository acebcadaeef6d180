//! The etcd `Watch` service (rpc.proto `service Watch`): one bidirectional stream per call,
//! multiplexing any number of watchers.
//!
//! Each call gets a [`WatchStream`] (requests) and a [`WatchOutput`] (responses) from the
//! member's [`crate::watch::WatchHub`]. A task reads the client's requests and ticks the
//! progress timer; gRPC pulls responses from the output as flow control allows. When the
//! client half-closes, events keep flowing (as in etcd); when the call ends, the output is
//! dropped, the task is aborted and the stream's watchers are removed.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::{Stream, StreamExt};
use keel_proto::etcdserverpb::watch_request::RequestUnion;
use keel_proto::etcdserverpb::watch_server::Watch;
use keel_proto::etcdserverpb::{WatchRequest, WatchResponse};
use keel_proto::rpctypes::RpcError;
use tonic::{Request, Response, Status, Streaming};

use crate::node::Node;
use crate::qos::{Admission, Method, RequestInfo};
use crate::watch::WatchStream;
use crate::watch::progress::jittered;

/// Watch service of one member.
pub struct WatchService {
    node: Arc<Node>,
    /// Seeds the per-stream progress jitter.
    streams: AtomicU64,
}

impl WatchService {
    /// Serves watch streams from `node`'s hub.
    pub fn new(node: Arc<Node>) -> WatchService {
        WatchService {
            node,
            streams: AtomicU64::new(0),
        }
    }
}

/// The response stream type of `Watch` (tonic's `BoxStream`, fixed by the generated trait).
pub type WatchResponseStream =
    Pin<Box<dyn Stream<Item = Result<WatchResponse, Status>> + Send + 'static>>;

/// Reads requests until the client goes away; ticks progress notifications meanwhile.
/// Each create request is admitted by QoS first; a refused one is answered like any create
/// etcd refuses (created and canceled, reason `etcdserver: too many requests`).
async fn serve_requests(
    mut session: WatchStream,
    mut inbound: Streaming<WatchRequest>,
    period: std::time::Duration,
    qos: Arc<Admission>,
    user: Option<String>,
) {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut open = true;
    loop {
        tokio::select! {
            msg = inbound.message(), if open => match msg {
                Ok(Some(request)) => {
                    if let Some(RequestUnion::CreateRequest(c)) = &request.request_union {
                        let info = RequestInfo::new(Method::Watch)
                            .keys(&c.key, &c.range_end)
                            .user(user.as_deref());
                        // A rate governs creates; the permit is not held for the watch's life.
                        if qos.admit(&info).is_err() {
                            session.reject(RpcError::TooManyRequests.message());
                            continue;
                        }
                    }
                    session.handle(request)
                }
                // Half-close: no more requests, but events keep flowing (etcd).
                Ok(None) => open = false,
                Err(status) => {
                    tracing::debug!(%status, "watch stream receive failed");
                    break;
                }
            },
            _ = ticks.tick() => session.progress_tick(),
        }
    }
}

#[tonic::async_trait]
impl Watch for WatchService {
    async fn watch(
        &self,
        request: Request<Streaming<WatchRequest>>,
    ) -> Result<Response<WatchResponseStream>, Status> {
        let user = super::admit::user(&request);
        let inbound = request.into_inner();
        let hub = self.node.watch.clone();
        let seed = self.streams.fetch_add(1, Ordering::Relaxed);
        let period = jittered(hub.config().progress_interval, seed);
        let (session, mut output) = WatchStream::new(hub);
        let qos = self.node.qos.clone();
        let task = tokio::spawn(serve_requests(session, inbound, period, qos, user));
        let abort = task.abort_handle();
        output.on_drop(move || abort.abort());
        let node = self.node.clone();
        let responses = output.map(move |mut resp| {
            let revision = resp.header.as_ref().map_or(0, |h| h.revision);
            resp.header = Some(node.header(revision));
            Ok(resp)
        });
        Ok(Response::new(Box::pin(responses)))
    }
}
