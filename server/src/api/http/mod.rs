//! HTTP next to gRPC: the routes etcd serves on its client URLs (`/metrics`, `/health`,
//! `/livez`, `/readyz` and their subpaths, `/version`, the JSON gateway on `/v3/*`,
//! [`gateway`]) and on `--listen-metrics-urls`
//! (the same without `/version`).
//!
//! The client URLs serve both on one port, as etcd does: tonic's server accepts HTTP/1.1
//! next to HTTP/2 (TLS offers both by ALPN), gRPC services are routed by their
//! `/<package.Service>/` prefix and these routes by path. A request that matches nothing is
//! answered by [`fallback`]: gRPC's `UNIMPLEMENTED` to a gRPC client, Go's `404 page not
//! found` to anyone else. docs/operations.md lists the endpoints.
//!
//! Methods as etcd's handlers take them: `/metrics` answers any method (Prometheus' handler
//! does not look); `/version`, `/health`, `/livez`, `/readyz` and the probes' subpaths answer
//! GET only, anything else (HEAD included, which axum's `get` would serve) with Go's
//! `http.Error` 405 and `Allow: GET` ([`get_only`]).

pub mod cors;
pub mod gateway;
pub mod grpc_metrics;
pub mod health;
pub mod metrics;
pub mod version;

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::handler::Handler;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use axum::routing::{MethodFilter, MethodRouter, any, on};

pub use grpc_metrics::GrpcMetricsLayer;
pub use health::Check;
pub use version::VersionInfo;

use crate::config::operator::CorsOrigins;
use crate::node::Node;

type Shared = State<Arc<Node>>;

/// The routes of the client URLs: health, metrics, `/version` and the gateway, behind
/// etcd's CORS handling ([`cors`]; `--cors` was checked at start-up).
pub fn client_routes(node: Arc<Node>) -> Router {
    let origins = node
        .config
        .operator
        .cors_origins()
        .unwrap_or(CorsOrigins::Listed(Default::default()));
    let routes = with_health(Router::new())
        .route("/version", get_only(version))
        .with_state(node.clone())
        .merge(gateway::routes(node))
        .fallback(fallback);
    // Around the whole router (not each route): a preflight answered here must not pass
    // through a route's method router, which would add its `Allow` header.
    Router::new()
        .fallback_service(routes)
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(origins),
            cors::cors,
        ))
}

/// The routes of `--listen-metrics-urls`: `/metrics` and the health endpoints.
pub fn metrics_routes(node: Arc<Node>) -> Router {
    with_health(Router::new())
        .fallback(fallback)
        .with_state(node)
}

/// The probe roots and their checks.
const LIVEZ_READYZ: [(&str, &[Check]); 2] =
    [("/livez", health::LIVEZ), ("/readyz", health::READYZ)];

/// `router` with `/metrics`, `/health`, `/livez`, `/readyz` and the probes' subpaths.
fn with_health(mut router: Router<Arc<Node>>) -> Router<Arc<Node>> {
    router = router
        .route(
            "/metrics",
            any(|State(node): Shared| async move { metrics::scrape(&node) }),
        )
        .route(
            "/health",
            get_only(|State(node): Shared, RawQuery(q): RawQuery| async move {
                health::health(&node, q.as_deref()).await
            }),
        );
    for (root, checks) in LIVEZ_READYZ {
        router = router.route(
            root,
            get_only(
                move |State(node): Shared, RawQuery(q): RawQuery| async move {
                    health::probe(&node, checks, q.as_deref()).await
                },
            ),
        );
        for check in checks {
            let one: &'static [Check] = std::slice::from_ref(check);
            router = router.route(
                &format!("{root}/{}", check.name()),
                get_only(
                    move |State(node): Shared, RawQuery(q): RawQuery| async move {
                        let verbose =
                            health::query_has(q.as_deref(), "verbose").then_some("verbose");
                        health::probe(&node, one, verbose).await
                    },
                ),
            );
        }
    }
    router
}

/// A route that serves `handler` for GET and answers every other method as etcd's handlers
/// do (`if r.Method != http.MethodGet`): 405, `Allow: GET`, Go's `http.Error` text.
fn get_only<H, T>(handler: H) -> MethodRouter<Arc<Node>>
where
    H: Handler<T, Arc<Node>>,
    T: 'static,
{
    // axum serves HEAD with a GET route unless HEAD has a route of its own.
    on(MethodFilter::GET, handler)
        .head(method_not_allowed)
        .fallback(method_not_allowed)
}

/// Go's `http.Error(w, "Method Not Allowed", 405)` after `Allow: GET`.
async fn method_not_allowed() -> Response {
    let mut response = health::text(
        StatusCode::METHOD_NOT_ALLOWED,
        "Method Not Allowed\n".to_string(),
    );
    response
        .headers_mut()
        .insert(header::ALLOW, header::HeaderValue::from_static("GET"));
    response
}

/// `/version`: etcd's JSON plus Keel's versions ([`VersionInfo`]).
async fn version(State(node): Shared) -> Response {
    let body = serde_json::to_string(&VersionInfo::of(&node)).unwrap_or_default();
    Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .unwrap_or_default()
}

/// No route: `UNIMPLEMENTED` for gRPC (what tonic answers for an unknown service), else
/// Go's `404 page not found`.
async fn fallback(headers: HeaderMap) -> Response {
    if grpc_metrics::is_grpc(&headers) {
        let (parts, ()) = tonic::Status::unimplemented("")
            .into_http::<()>()
            .into_parts();
        return Response::from_parts(parts, Body::empty());
    }
    health::text(StatusCode::NOT_FOUND, "404 page not found\n".to_string())
}
