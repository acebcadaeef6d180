//! A tower layer around the gRPC services of the client URLs that counts every RPC in
//! go-grpc-prometheus' `grpc_server_started_total` / `grpc_server_handled_total` (and times
//! it with `--metrics extensive`), as etcd's interceptors do.
//!
//! The status code is read where gRPC puts it: the response headers of a trailers-only
//! answer (most errors), else the trailers at the end of the body (every OK, streams). A
//! stream whose body is dropped before its trailers (the client went away) counts as
//! `Canceled`. Requests that are not gRPC (`/metrics`, `/health`) pass through uncounted.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::http::{HeaderMap, Request, Response, header};
use http_body::{Body, Frame, SizeHint};
use tower_layer::Layer;
use tower_service::Service;

use crate::metrics::grpc::Call;

/// gRPC code `Canceled`.
const CANCELED: i32 = 1;
/// gRPC code `Unknown`.
const UNKNOWN: i32 = 2;

/// The layer ([`Server::layer`](tonic::transport::Server::layer)).
#[derive(Clone, Copy, Debug, Default)]
pub struct GrpcMetricsLayer;

impl<S> Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetrics<S>;

    fn layer(&self, inner: S) -> GrpcMetrics<S> {
        GrpcMetrics { inner }
    }
}

/// The service [`GrpcMetricsLayer`] wraps around `S`.
#[derive(Clone, Debug)]
pub struct GrpcMetrics<S> {
    inner: S,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for GrpcMetrics<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = Response<CountedBody<ResBody>>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let call = is_grpc(req.headers())
            .then(|| Call::start(req.uri().path()))
            .flatten();
        let future = self.inner.call(req);
        Box::pin(async move {
            let mut tracker = Tracker(call);
            match future.await {
                Ok(response) => {
                    if let Some(code) = grpc_status(response.headers()) {
                        tracker.finish(code);
                    }
                    Ok(response.map(|inner| CountedBody { inner, tracker }))
                }
                Err(e) => {
                    tracker.finish(UNKNOWN);
                    Err(e)
                }
            }
        })
    }
}

/// Whether a request is a gRPC call (`content-type: application/grpc…`).
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

fn grpc_status(headers: &HeaderMap) -> Option<i32> {
    headers.get("grpc-status")?.to_str().ok()?.parse().ok()
}

/// The RPC a response belongs to, until its status is known.
#[derive(Debug)]
struct Tracker(Option<Call>);

impl Tracker {
    fn finish(&mut self, code: i32) {
        if let Some(call) = self.0.take() {
            call.finish(code);
        }
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.finish(CANCELED);
    }
}

/// A response body that reports the gRPC status of its trailers.
#[derive(Debug)]
pub struct CountedBody<B> {
    inner: B,
    tracker: Tracker,
}

impl<B: Body + Unpin> Body for CountedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(code) = frame.trailers_ref().and_then(grpc_status) {
                    this.tracker.finish(code);
                }
            }
            Poll::Ready(Some(Err(_))) => this.tracker.finish(UNKNOWN),
            Poll::Ready(None) | Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
