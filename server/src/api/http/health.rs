//! `/health`, `/livez` and `/readyz` with etcd 3.6's checks, texts and status codes
//! (`etcd@v3.6.14:server/etcdserver/api/etcdhttp/health.go`).
//!
//! - `/health`: the raised alarms (`ALARM NOSPACE`, `ALARM CORRUPT`; `?exclude=NOSPACE`
//!   skips one), then the leader (`RAFT NO LEADER`, skipped with `?serializable=true`),
//!   then a `Range{keys_only, limit 1}` (`RANGE ERROR:<err>`). 200
//!   `{"health":"true","reason":""}` or 503 `{"health":"false","reason":"…"}`.
//! - `/livez`: `serializable_read`. `/readyz`: `data_corruption`, `serializable_read`,
//!   `linearizable_read`, `non_learner`. Each check also answers alone on its own subpath
//!   (`/readyz/linearizable_read`); `?exclude=<check>` skips one. 200 `ok\n` (with
//!   `?verbose`, the `[+]<check> ok` lines first) or 503 with the `[+]`/`[-]<check> failed:
//!   <err>` lines.

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::Response;
use keel_proto::etcdserverpb::{AlarmType, RangeRequest};
use serde::Serialize;

use crate::error::EtcdError;
use crate::node::Node;

/// The checks of `/livez`.
pub const LIVEZ: &[Check] = &[Check::SerializableRead];
/// The checks of `/readyz`, in the order they run and print.
pub const READYZ: &[Check] = &[
    Check::DataCorruption,
    Check::SerializableRead,
    Check::LinearizableRead,
    Check::NonLearner,
];

/// One check of `/livez` or `/readyz`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// No CORRUPT alarm is raised.
    DataCorruption,
    /// A local (serializable) read succeeds.
    SerializableRead,
    /// A linearizable read (ReadIndex through the leader) succeeds.
    LinearizableRead,
    /// This member is not a learner.
    NonLearner,
}

impl Check {
    /// etcd's name of the check (its subpath).
    pub fn name(self) -> &'static str {
        match self {
            Check::DataCorruption => "data_corruption",
            Check::SerializableRead => "serializable_read",
            Check::LinearizableRead => "linearizable_read",
            Check::NonLearner => "non_learner",
        }
    }

    async fn run(self, node: &Node) -> Result<(), String> {
        match self {
            Check::DataCorruption if node.alarms.is_active(AlarmType::Corrupt) => {
                Err("alarm activated: CORRUPT".to_string())
            }
            Check::DataCorruption => Ok(()),
            Check::SerializableRead => read(node, true).await.map_err(|e| e.to_string()),
            Check::LinearizableRead => read(node, false).await.map_err(|e| e.to_string()),
            Check::NonLearner if node.is_learner() => Err("not supported for learner".into()),
            Check::NonLearner => Ok(()),
        }
    }
}

/// etcd's health check read: `Range{keys_only, limit 1}`, through ReadIndex unless
/// `serializable`, bounded by the request timeout.
async fn read(node: &Node, serializable: bool) -> Result<(), EtcdError> {
    if !serializable {
        tokio::time::timeout(node.request_timeout(), node.read_barrier())
            .await
            .map_err(|_| EtcdError::Timeout)??;
    }
    let req = RangeRequest {
        key: vec![0],
        range_end: vec![0],
        keys_only: true,
        limit: 1,
        serializable,
        ..Default::default()
    };
    node.store.get().range(&req).map(|_| ())
}

/// The values of query parameter `name` in `query` (`a=1&b=2&a=3`), empty ones skipped.
pub fn query_values<'q>(query: Option<&'q str>, name: &str) -> Vec<&'q str> {
    query
        .unwrap_or("")
        .split('&')
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (k == name && !v.is_empty()).then_some(v)
        })
        .collect()
}

/// Whether query parameter `name` is present, with or without a value (`?verbose`).
pub fn query_has(query: Option<&str>, name: &str) -> bool {
    query
        .unwrap_or("")
        .split('&')
        .any(|pair| pair.split_once('=').map_or(pair, |(k, _)| k) == name)
}

/// etcd's `Health` body.
#[derive(Serialize)]
struct Health {
    health: &'static str,
    reason: String,
}

/// `/health` for query `query`.
pub async fn health(node: &Node, query: Option<&str>) -> Response {
    let excluded = query_values(query, "exclude");
    let serializable = query_values(query, "serializable").first() == Some(&"true");
    match health_reason(node, &excluded, serializable).await {
        None => {
            let body = Health {
                health: "true",
                reason: String::new(),
            };
            text(StatusCode::OK, to_json(&body))
        }
        Some(reason) => {
            let body = Health {
                health: "false",
                reason,
            };
            text(StatusCode::SERVICE_UNAVAILABLE, to_json(&body) + "\n")
        }
    }
}

fn to_json(h: &Health) -> String {
    serde_json::to_string(h).unwrap_or_default()
}

/// Why `/health` fails, in etcd's order (alarms, leader, read); `None` when healthy.
async fn health_reason(node: &Node, excluded: &[&str], serializable: bool) -> Option<String> {
    for alarm in node.alarms.get(AlarmType::None) {
        let kind = AlarmType::try_from(alarm.alarm).unwrap_or(AlarmType::None);
        if excluded.contains(&kind.as_str_name()) {
            continue;
        }
        return Some(
            match kind {
                AlarmType::Nospace => "ALARM NOSPACE",
                AlarmType::Corrupt => "ALARM CORRUPT",
                _ => "ALARM UNKNOWN",
            }
            .to_string(),
        );
    }
    // etcd's leader steps down when a quorum stops answering (CheckQuorum); openraft's does
    // not, so "has a leader" includes that check (`cluster::leadership`).
    if !serializable && !node.cluster.has_leader() {
        return Some("RAFT NO LEADER".to_string());
    }
    read(node, serializable)
        .await
        .err()
        .map(|e| format!("RANGE ERROR:{e}"))
}

/// `/livez` or `/readyz` (`checks`), or one check's subpath (`checks` of one, no
/// `?exclude`).
pub async fn probe(node: &Node, checks: &[Check], query: Option<&str>) -> Response {
    let excluded = query_values(query, "exclude");
    let mut output = String::new();
    let mut failed = false;
    for check in checks.iter().filter(|c| !excluded.contains(&c.name())) {
        match check.run(node).await {
            Ok(()) => output.push_str(&format!("[+]{} ok\n", check.name())),
            Err(e) => {
                failed = true;
                output.push_str(&format!("[-]{} failed: {e}\n", check.name()));
            }
        }
    }
    if failed {
        // Go's `http.Error` appends a newline.
        return text(StatusCode::SERVICE_UNAVAILABLE, output + "\n");
    }
    if !query_has(query, "verbose") {
        output.clear();
    }
    text(StatusCode::OK, output + "ok\n")
}

/// A `text/plain` answer, as Go's `http.Error` and etcd's handlers send.
pub fn text(status: StatusCode, body: String) -> Response {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .header(header::X_CONTENT_TYPE_OPTIONS, "nosniff")
        .body(Body::from(body))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parameters_are_read_as_go_reads_them() {
        let q = Some("exclude=NOSPACE&verbose&exclude=&exclude=CORRUPT&serializable=true");
        assert_eq!(query_values(q, "exclude"), ["NOSPACE", "CORRUPT"]);
        assert_eq!(query_values(q, "serializable"), ["true"]);
        assert!(query_has(q, "verbose"));
        assert!(!query_has(q, "verb"));
        assert!(query_values(None, "exclude").is_empty());
        assert!(query_has(Some("verbose=1"), "verbose"));
    }

    #[test]
    fn check_names_are_etcds() {
        let names: Vec<&str> = READYZ.iter().map(|c| c.name()).collect();
        assert_eq!(
            names,
            [
                "data_corruption",
                "serializable_read",
                "linearizable_read",
                "non_learner"
            ]
        );
        assert_eq!(LIVEZ, [Check::SerializableRead]);
    }
}
