//! go-grpc-prometheus' server metrics, as etcd registers them (`v3rpc/grpc.go`):
//! `grpc_server_started_total` and `grpc_server_handled_total` with the labels `grpc_type`,
//! `grpc_service`, `grpc_method` (and `grpc_code`), and, with `--metrics extensive`, the
//! `grpc_server_handling_seconds` histogram (Go's default buckets, 5 ms … 10 s).
//!
//! As go-grpc-prometheus' `Register`, every method of every served service starts at 0 for
//! every code, so dashboards see the series before the first call.

use std::sync::{LazyLock, OnceLock};
use std::time::Instant;

use prometheus::{HistogramVec, IntCounter};

use super::{counter_vec, histogram_vec};

/// gRPC status codes by number, with go-grpc-prometheus' names (Go's `codes.Code.String`).
pub const CODES: [&str; 17] = [
    "OK",
    "Canceled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
];

/// The name of gRPC status code `code` (`Unknown` for a number outside the table, as grpc-go).
pub fn code_name(code: i32) -> &'static str {
    CODES[code_index(code)]
}

/// The position of `code` in [`CODES`]; `Unknown`'s (2) for a number outside the table.
fn code_index(code: i32) -> usize {
    usize::try_from(code)
        .ok()
        .filter(|&i| i < CODES.len())
        .unwrap_or(2)
}

/// The streaming methods of the served services and their go-grpc-prometheus `grpc_type`;
/// every other method is `unary`.
const STREAMING: [(&str, &str, &str); 4] = [
    ("etcdserverpb.Watch", "Watch", "bidi_stream"),
    ("etcdserverpb.Lease", "LeaseKeepAlive", "bidi_stream"),
    ("etcdserverpb.Maintenance", "Snapshot", "server_stream"),
    ("v3electionpb.Election", "Observe", "server_stream"),
];

/// Every method of the services on the client URLs (the etcd protos and Keel's QoS admin).
pub const METHODS: &[(&str, &[&str])] = &[
    (
        "etcdserverpb.KV",
        &["Range", "Put", "DeleteRange", "Txn", "Compact"],
    ),
    ("etcdserverpb.Watch", &["Watch"]),
    (
        "etcdserverpb.Lease",
        &[
            "LeaseGrant",
            "LeaseRevoke",
            "LeaseKeepAlive",
            "LeaseTimeToLive",
            "LeaseLeases",
        ],
    ),
    (
        "etcdserverpb.Cluster",
        &[
            "MemberAdd",
            "MemberRemove",
            "MemberUpdate",
            "MemberList",
            "MemberPromote",
        ],
    ),
    (
        "etcdserverpb.Maintenance",
        &[
            "Alarm",
            "Status",
            "Defragment",
            "Hash",
            "HashKV",
            "Snapshot",
            "MoveLeader",
            "Downgrade",
        ],
    ),
    (
        "etcdserverpb.Auth",
        &[
            "AuthEnable",
            "AuthDisable",
            "AuthStatus",
            "Authenticate",
            "UserAdd",
            "UserGet",
            "UserList",
            "UserDelete",
            "UserChangePassword",
            "UserGrantRole",
            "UserRevokeRole",
            "RoleAdd",
            "RoleGet",
            "RoleList",
            "RoleDelete",
            "RoleGrantPermission",
            "RoleRevokePermission",
        ],
    ),
    ("v3lockpb.Lock", &["Lock", "Unlock"]),
    (
        "v3electionpb.Election",
        &["Campaign", "Proclaim", "Leader", "Observe", "Resign"],
    ),
    (
        "keelpb.Qos",
        &[
            "RuleList",
            "RuleAdd",
            "RuleUpdate",
            "RuleRemove",
            "RuleReplace",
        ],
    ),
];

/// go-grpc-prometheus' `grpc_type` of `service`/`method`.
pub fn grpc_type(service: &str, method: &str) -> &'static str {
    STREAMING
        .iter()
        .find(|(s, m, _)| *s == service && *m == method)
        .map_or("unary", |(_, _, t)| t)
}

/// The gRPC server metrics.
pub struct Grpc {
    handling: OnceLock<HistogramVec>,
    /// Each served method's counters, resolved once: a request then bumps two atomics
    /// instead of hashing its labels into the vectors twice (1.8 % of a serializable range's
    /// CPU, twenty-first sitting).
    methods: Vec<MethodCounters>,
}

/// One method's labels and its series of `started_total` and `handled_total` (by code).
struct MethodCounters {
    labels: [&'static str; 3],
    started: IntCounter,
    handled: [IntCounter; CODES.len()],
}

static GRPC: LazyLock<Grpc> = LazyLock::new(|| {
    let started = counter_vec(
        "grpc_server_started_total",
        "Total number of RPCs started on the server.",
        &["grpc_type", "grpc_service", "grpc_method"],
    );
    let handled = counter_vec(
        "grpc_server_handled_total",
        "Total number of RPCs completed on the server, regardless of success or failure.",
        &["grpc_type", "grpc_service", "grpc_method", "grpc_code"],
    );
    let mut methods = Vec::new();
    for (service, names) in METHODS {
        for method in *names {
            let labels = [grpc_type(service, method), *service, *method];
            let [kind, service, method] = labels;
            methods.push(MethodCounters {
                labels,
                started: started.with_label_values(&labels),
                handled: CODES
                    .map(|code| handled.with_label_values(&[kind, service, method, code])),
            });
        }
    }
    Grpc {
        handling: OnceLock::new(),
        methods,
    }
});

/// The gRPC group.
pub fn grpc() -> &'static Grpc {
    &GRPC
}

/// Turns on `grpc_server_handling_seconds` (etcd's `--metrics extensive`). Idempotent.
pub fn enable_handling_histogram() {
    grpc().handling.get_or_init(|| {
        histogram_vec(
            "grpc_server_handling_seconds",
            "Histogram of response latency (seconds) of gRPC that had been application-level handled by the server.",
            &["grpc_type", "grpc_service", "grpc_method"],
            prometheus::DEFAULT_BUCKETS.to_vec(),
        )
    });
}

/// One RPC being served: created when it starts (counted in `started_total`), finished with
/// its status code (counted in `handled_total`, timed with `--metrics extensive`).
pub struct Call {
    counters: &'static MethodCounters,
    started: Instant,
}

impl std::fmt::Debug for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Call")
            .field("labels", &self.counters.labels)
            .field("started", &self.started)
            .finish()
    }
}

impl Call {
    /// Starts the RPC of request path `path` (`/etcdserverpb.KV/Put`); `None` for a path
    /// that names no served method (so a client cannot grow the label set without bound).
    pub fn start(path: &str) -> Option<Call> {
        let (service, method) = path.strip_prefix('/')?.split_once('/')?;
        let counters = grpc()
            .methods
            .iter()
            .find(|m| m.labels[1] == service && m.labels[2] == method)?;
        counters.started.inc();
        Some(Call {
            counters,
            started: Instant::now(),
        })
    }

    /// Ends the RPC with gRPC status code `code` (a number outside the table counts as
    /// `Unknown`, as grpc-go names it).
    pub fn finish(self, code: i32) {
        self.counters.handled[code_index(code)].inc();
        if let Some(h) = grpc().handling.get() {
            h.with_label_values(&self.counters.labels)
                .observe(self.started.elapsed().as_secs_f64());
        }
    }
}
