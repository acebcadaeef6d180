//! etcd's JSON gateway (grpc-gateway) on the client URLs: `POST /v3/<service>/<method>` with
//! the request message as JSON, answered with the response message as JSON, and the same
//! under `/v3beta/` (etcd 3.4/3.5 rewrite it to `/v3/`). Routes are those of etcd's
//! `rpc.proto`, `v3lock.proto` and `v3election.proto` `google.api.http` options
//! (RangeStream has none: it is gRPC-only).
//!
//! JSON follows etcd's gateway marshaler (`jsonpb`, `OrigName`): proto field names, bytes
//! in base64, 64-bit integers as strings, enums by name, default values omitted, unknown
//! fields ignored. The serde code is generated from the protos (`pbjson`, keel-proto's
//! build script), never written per message.
//!
//! Each route calls the gRPC service implementation in-process with a `tonic::Request`
//! carrying the HTTP `Authorization` header as the `token` metadata, so validation, auth,
//! QoS, the learner gate ([`crate::api::learner_gate`]) and error texts are the gRPC API's.
//! Errors answer etcd's body
//! `{"error":"<message>","message":"<message>","code":<gRPC code>}` with grpc-gateway's
//! HTTP status for the code ([`error`]). Streams (Watch, LeaseKeepAlive, Observe,
//! Snapshot) answer newline-delimited `{"result":{…}}` objects ([`stream`]).

mod body;
pub mod error;
pub mod stream;

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use axum::routing::post;
use keel_proto::etcdserverpb::auth_server::Auth;
use keel_proto::etcdserverpb::cluster_server::Cluster;
use keel_proto::etcdserverpb::kv_server::Kv;
use keel_proto::etcdserverpb::lease_server::Lease;
use keel_proto::etcdserverpb::maintenance_server::Maintenance;
use keel_proto::etcdserverpb::watch_server::Watch;
use keel_proto::v3electionpb::election_server::Election;
use keel_proto::v3lockpb::lock_server::Lock;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::Status;

use crate::api::credentials::TOKEN_METADATA;
use crate::api::{
    AuthService, ClusterService, ElectionService, KvService, LeaseService, LockService,
    MaintenanceService, WatchService,
};
use crate::config::GRPC_OVERHEAD_BYTES;
use crate::node::Node;

/// The gRPC services the gateway calls, one instance each per client listener.
struct Services {
    /// The member, for the learner gate.
    node: Arc<Node>,
    kv: KvService,
    lease: LeaseService,
    watch: WatchService,
    cluster: ClusterService,
    maintenance: MaintenanceService,
    auth: AuthService,
    lock: LockService,
    election: ElectionService,
}

/// Adds the route `POST $path` that answers with `$answer` ([`call_unary`],
/// [`stream::bidi`] or [`stream::server`]) around `$svc.$method` (one field of
/// [`Services`]); `unary!` is the common case.
macro_rules! route {
    ($router:ident, $services:ident, $path:expr, $answer:path, $svc:ident, $method:ident) => {
        route!($router, $services, $path, $answer, $svc, $method, false)
    };
    ($router:ident, $services:ident, $path:expr, $answer:path, $svc:ident, $method:ident,
     $metered:expr) => {{
        let services = $services.clone();
        // The gRPC method's path, spelled once per route (the learner gate, the metrics).
        let grpc: Arc<str> = grpc_path(stringify!($svc), stringify!($method)).into();
        $router = $router.route(
            &$path,
            post(move |headers: HeaderMap, body: Bytes| {
                let (services, grpc) = (services.clone(), grpc.clone());
                async move {
                    $answer(&headers, &body, |r| async move {
                        crate::api::learner_gate::check(&services.node, &grpc)?;
                        let call = services.$svc.$method(r);
                        if $metered {
                            metered(&grpc, call).await
                        } else {
                            call.await
                        }
                    })
                    .await
                }
            }),
        );
    }};
}

/// A unary route ([`route!`] with [`call_unary`]), counted in the gRPC metrics.
macro_rules! unary {
    ($router:ident, $services:ident, $path:expr, $svc:ident, $method:ident) => {
        route!($router, $services, $path, call_unary, $svc, $method, true)
    };
}

/// `call` counted in go-grpc-prometheus' `grpc_server_{started,handled}_total` as the gRPC
/// method at gRPC path `grpc` it is (etcd's gateway dials its own gRPC port, so its calls
/// are counted there).
async fn metered<T>(
    grpc: &str,
    call: impl Future<Output = Result<T, Status>>,
) -> Result<T, Status> {
    let tracker = crate::metrics::grpc::Call::start(grpc);
    let result = call.await;
    if let Some(tracker) = tracker {
        tracker.finish(result.as_ref().map_or_else(|s| s.code() as i32, |_| 0));
    }
    result
}

/// The gRPC path (`/etcdserverpb.KV/DeleteRange`) of a [`Services`] field and trait method.
fn grpc_path(field: &str, method: &str) -> String {
    let service = match field {
        "kv" => "etcdserverpb.KV",
        "lease" => "etcdserverpb.Lease",
        "watch" => "etcdserverpb.Watch",
        "cluster" => "etcdserverpb.Cluster",
        "maintenance" => "etcdserverpb.Maintenance",
        "auth" => "etcdserverpb.Auth",
        "lock" => "v3lockpb.Lock",
        "election" => "v3electionpb.Election",
        _ => "",
    };
    let camel: String = method
        .split('_')
        .map(|word| match word {
            "kv" => "KV".to_string(),
            _ => {
                let mut chars = word.chars();
                chars.next().map_or_else(String::new, |first| {
                    first.to_ascii_uppercase().to_string() + chars.as_str()
                })
            }
        })
        .collect();
    format!("/{service}/{camel}")
}

/// The gateway's routes under `/v3` and `/v3beta`.
pub fn routes(node: Arc<Node>) -> Router {
    // A request at `--max-request-bytes` grows by base64 (4/3) and JSON framing; the gRPC
    // layer then enforces the limit itself, with etcd's error.
    let body_limit = node.config.max_request_bytes as usize * 2 + GRPC_OVERHEAD_BYTES;
    let s = Arc::new(Services {
        node: node.clone(),
        kv: KvService::new(node.clone()),
        lease: LeaseService::new(node.clone()),
        watch: WatchService::new(node.clone()),
        cluster: ClusterService::new(node.clone()),
        maintenance: MaintenanceService::new(node.clone()),
        auth: AuthService::new(node.clone()),
        lock: LockService::new(node.clone()),
        election: ElectionService::new(node),
    });
    let mut r = Router::new();
    unary!(r, s, "/kv/range", kv, range);
    unary!(r, s, "/kv/put", kv, put);
    unary!(r, s, "/kv/deleterange", kv, delete_range);
    unary!(r, s, "/kv/txn", kv, txn);
    unary!(r, s, "/kv/compaction", kv, compact);

    unary!(r, s, "/lease/grant", lease, lease_grant);
    for prefix in ["/lease", "/kv/lease"] {
        unary!(r, s, format!("{prefix}/revoke"), lease, lease_revoke);
        unary!(
            r,
            s,
            format!("{prefix}/timetolive"),
            lease,
            lease_time_to_live
        );
        unary!(r, s, format!("{prefix}/leases"), lease, lease_leases);
    }
    route!(
        r,
        s,
        "/lease/keepalive",
        stream::bidi,
        lease,
        lease_keep_alive
    );
    route!(r, s, "/watch", stream::bidi, watch, watch);

    unary!(r, s, "/cluster/member/add", cluster, member_add);
    unary!(r, s, "/cluster/member/remove", cluster, member_remove);
    unary!(r, s, "/cluster/member/update", cluster, member_update);
    unary!(r, s, "/cluster/member/list", cluster, member_list);
    unary!(r, s, "/cluster/member/promote", cluster, member_promote);

    unary!(r, s, "/maintenance/alarm", maintenance, alarm);
    unary!(r, s, "/maintenance/status", maintenance, status);
    unary!(r, s, "/maintenance/defragment", maintenance, defragment);
    // etcd's rpc.proto maps Hash and HashKV both to `/v3/maintenance/hash`, and Hash answers
    // there (etcd 3.4.23 and 3.5.1: `{"revision":"99"}` gets a hash, `/hashkv` a 404).
    unary!(r, s, "/maintenance/hash", maintenance, hash);
    unary!(
        r,
        s,
        "/maintenance/transfer-leadership",
        maintenance,
        move_leader
    );
    unary!(r, s, "/maintenance/downgrade", maintenance, downgrade);
    route!(
        r,
        s,
        "/maintenance/snapshot",
        stream::server,
        maintenance,
        snapshot
    );

    unary!(r, s, "/auth/enable", auth, auth_enable);
    unary!(r, s, "/auth/disable", auth, auth_disable);
    unary!(r, s, "/auth/status", auth, auth_status);
    unary!(r, s, "/auth/authenticate", auth, authenticate);
    unary!(r, s, "/auth/user/add", auth, user_add);
    unary!(r, s, "/auth/user/get", auth, user_get);
    unary!(r, s, "/auth/user/list", auth, user_list);
    unary!(r, s, "/auth/user/delete", auth, user_delete);
    unary!(r, s, "/auth/user/changepw", auth, user_change_password);
    unary!(r, s, "/auth/user/grant", auth, user_grant_role);
    unary!(r, s, "/auth/user/revoke", auth, user_revoke_role);
    unary!(r, s, "/auth/role/add", auth, role_add);
    unary!(r, s, "/auth/role/get", auth, role_get);
    unary!(r, s, "/auth/role/list", auth, role_list);
    unary!(r, s, "/auth/role/delete", auth, role_delete);
    unary!(r, s, "/auth/role/grant", auth, role_grant_permission);
    unary!(r, s, "/auth/role/revoke", auth, role_revoke_permission);

    unary!(r, s, "/lock/lock", lock, lock);
    unary!(r, s, "/lock/unlock", lock, unlock);

    unary!(r, s, "/election/campaign", election, campaign);
    unary!(r, s, "/election/proclaim", election, proclaim);
    unary!(r, s, "/election/leader", election, leader);
    unary!(r, s, "/election/resign", election, resign);
    route!(r, s, "/election/observe", stream::server, election, observe);

    // Go's `http.Error` text for a non-POST method, as etcd's gateway mux answers it.
    let r = r
        .method_not_allowed_fallback(|| async {
            super::health::text(
                StatusCode::METHOD_NOT_ALLOWED,
                "Method Not Allowed\n".to_string(),
            )
        })
        .layer(DefaultBodyLimit::max(body_limit));
    Router::new().nest("/v3", r.clone()).nest("/v3beta", r)
}

/// The request message of `body`: its first JSON value ([`body`]: nulls unset, the last
/// of a repeated field), or the default message for an empty body (grpc-gateway treats EOF
/// as an empty message). What follows the first value is not read, as grpc-gateway's
/// `json.Decoder.Decode` does not read it (etcd 3.4.23 applies
/// `{"key":"YQ==","value":"Yg=="} trailing`).
///
/// Errors: JSON that is not the message: `InvalidArgument` with serde's text.
fn decode<Req: DeserializeOwned + Default>(body: &[u8]) -> Result<Req, Status> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Req::default());
    }
    match body::messages(body).next() {
        Some(value) => value.map_err(|e| Status::invalid_argument(e.to_string())),
        None => Ok(Req::default()),
    }
}

/// `message` in a `tonic::Request` with the caller's token (the HTTP `Authorization`
/// header, as etcd's gateway forwards it) in the `token` metadata.
fn grpc_request<T>(headers: &HeaderMap, message: T) -> Result<tonic::Request<T>, Status> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = headers.get(header::AUTHORIZATION) {
        let value = tonic::metadata::MetadataValue::try_from(token.as_bytes())
            .map_err(|_| Status::from(crate::error::EtcdError::InvalidAuthToken))?;
        request.metadata_mut().insert(TOKEN_METADATA, value);
    }
    Ok(request)
}

/// Decodes `body`, calls `call` and answers its response as JSON, or etcd's error body.
async fn call_unary<Req, Resp, F, Fut>(headers: &HeaderMap, body: &[u8], call: F) -> Response
where
    Req: DeserializeOwned + Default,
    Resp: Serialize,
    F: FnOnce(tonic::Request<Req>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
{
    let request = match decode(body).and_then(|m| grpc_request(headers, m)) {
        Ok(request) => request,
        Err(status) => return error::response(&status),
    };
    match call(request).await {
        Ok(resp) => json(StatusCode::OK, &resp.into_inner()),
        Err(status) => error::response(&status),
    }
}

/// `value` as an `application/json` response with `status`.
fn json(status: StatusCode, value: &impl Serialize) -> Response {
    let body = serde_json::to_vec(value).unwrap_or_default();
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::grpc_path;

    #[test]
    fn grpc_paths_are_the_served_methods() {
        assert_eq!(
            grpc_path("kv", "delete_range"),
            "/etcdserverpb.KV/DeleteRange"
        );
        assert_eq!(
            grpc_path("maintenance", "hash_kv"),
            "/etcdserverpb.Maintenance/HashKV"
        );
        assert_eq!(
            grpc_path("lease", "lease_time_to_live"),
            "/etcdserverpb.Lease/LeaseTimeToLive"
        );
        assert_eq!(grpc_path("lock", "unlock"), "/v3lockpb.Lock/Unlock");
        assert_eq!(grpc_path("watch", "watch"), "/etcdserverpb.Watch/Watch");
        assert!(
            crate::metrics::grpc::Call::start(&grpc_path("auth", "user_change_password")).is_some()
        );
    }
}
