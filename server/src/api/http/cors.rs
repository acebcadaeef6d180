//! etcd's CORS handling on the client URLs' HTTP endpoints (etcd 3.4/3.5
//! `embed/serve.go`, `accessController.ServeHTTP`), set by `--cors`:
//! - `*` (the default): every answer carries `Access-Control-Allow-Methods: POST, GET,
//!   OPTIONS, PUT, DELETE`, `Access-Control-Allow-Origin: *` and
//!   `Access-Control-Allow-Headers: accept, content-type, authorization`;
//! - a list: only the answer to a request whose `Origin` header is in it, with that origin;
//! - an `OPTIONS` request to any path is answered `200` with an empty body and reaches no
//!   handler (a browser's preflight).
//!
//! gRPC calls pass untouched: etcd routes them to its gRPC server before this handler.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::config::operator::CorsOrigins;

const ALLOW_METHODS: HeaderValue = HeaderValue::from_static("POST, GET, OPTIONS, PUT, DELETE");
const ALLOW_HEADERS: HeaderValue = HeaderValue::from_static("accept, content-type, authorization");

/// The middleware (`axum::middleware::from_fn_with_state` with the parsed `--cors`).
pub async fn cors(State(origins): State<Arc<CorsOrigins>>, req: Request, next: Next) -> Response {
    if super::grpc_metrics::is_grpc(req.headers()) {
        return next.run(req).await;
    }
    let allowed = match &*origins {
        CorsOrigins::Any => Some(HeaderValue::from_static("*")),
        CorsOrigins::Listed(list) => req
            .headers()
            .get(header::ORIGIN)
            .filter(|o| o.to_str().is_ok_and(|o| list.contains(o)))
            .cloned(),
    };
    let mut resp = if req.method() == Method::OPTIONS {
        StatusCode::OK.into_response()
    } else {
        next.run(req).await
    };
    if let Some(origin) = allowed {
        let headers = resp.headers_mut();
        headers.append(header::ACCESS_CONTROL_ALLOW_METHODS, ALLOW_METHODS);
        headers.append(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        headers.append(header::ACCESS_CONTROL_ALLOW_HEADERS, ALLOW_HEADERS);
    }
    resp
}
