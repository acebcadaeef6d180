//! etcd's JSON gateway (issue 14 part 4) on the client URL, asked with raw HTTP/1.1 POSTs
//! as `curl -d` sends them: every route group (KV, Lease and its `/v3/kv/lease/*` aliases,
//! Watch, Auth with the `Authorization` header, Cluster, Maintenance, Lock, Election), the
//! `/v3beta/` alias, etcd's error bodies, and the shapes of the answers compared with etcd
//! 3.4.23's gateway.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use keel_testkit::etcd::{Etcd, etcd_binary};
use keel_testkit::ports::free_port;
use serde_json::{Value, json};

use crate::http::dechunk;
use crate::member;

/// A gateway answer: HTTP status and body.
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) body: String,
}

impl Reply {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// Writes `POST path` with `body` (and `Authorization: token` if given) on a new connection.
fn send(addr: &str, path: &str, body: &str, token: Option<&str>) -> TcpStream {
    let mut stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let auth = token.map_or(String::new(), |t| format!("Authorization: {t}\r\n"));
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: curl/8\r\nAccept: */*\r\n\
         Content-Type: application/x-www-form-urlencoded\r\n{auth}Content-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    stream.flush().unwrap();
    stream
}

/// Appends what `stream` sends to `raw` until the server closes it, `done` holds for all
/// read so far, or 20 s pass.
fn read_until(mut stream: &TcpStream, raw: &mut Vec<u8>, done: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut buf = [0u8; 16 * 1024];
    while Instant::now() < deadline {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
        if done(&String::from_utf8_lossy(raw)) {
            break;
        }
    }
}

/// The status and (de-chunked) body of a raw response.
fn split(raw: &[u8]) -> Reply {
    let raw = String::from_utf8_lossy(raw).to_string();
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .expect("a complete response head");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Reply { status, body }
}

/// Reads `stream` as [`read_until`] does and splits the response.
fn read_reply(stream: TcpStream, done: impl Fn(&str) -> bool) -> Reply {
    let mut raw = Vec::new();
    read_until(&stream, &mut raw, done);
    split(&raw)
}

/// `POST path` with `body`, read to the end.
pub(crate) fn post(addr: &str, path: &str, body: &str) -> Reply {
    read_reply(send(addr, path, body, None), |_| false)
}

/// `POST path` with `body` as the holder of `token`.
fn post_as(addr: &str, token: &str, path: &str, body: &str) -> Reply {
    read_reply(send(addr, path, body, Some(token)), |_| false)
}

/// `POST path` answered 200 with a JSON body.
fn ok(addr: &str, path: &str, body: Value) -> Value {
    let reply = post(addr, path, &body.to_string());
    assert_eq!(reply.status, 200, "{path}: {}", reply.body);
    reply.json()
}

fn b64(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// The newline-delimited `{"result":…}` lines of a stream body.
fn results(body: &str) -> Vec<Value> {
    body.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn kv_routes_answer_etcds_json() {
    let (_guard, keel) = member(&[]);
    let ep = keel.endpoint();
    let put = ok(
        &ep,
        "/v3/kv/put",
        json!({"key": b64("foo"), "value": b64("bar")}),
    );
    let rev: i64 = put["header"]["revision"].as_str().unwrap().parse().unwrap();
    assert!(rev >= 2, "{put}");
    assert!(put["header"]["cluster_id"].is_string(), "{put}");
    ok(
        &ep,
        "/v3/kv/put",
        json!({"key": b64("foo2"), "value": b64("baz")}),
    );

    let range = ok(&ep, "/v3/kv/range", json!({"key": b64("foo")}));
    assert_eq!(range["count"], "1");
    let kv = &range["kvs"][0];
    assert_eq!(kv["key"], b64("foo"));
    assert_eq!(kv["value"], b64("bar"));
    assert_eq!(kv["create_revision"], rev.to_string());
    assert_eq!(kv["mod_revision"], rev.to_string());
    assert_eq!(kv["version"], "1");
    assert!(kv.get("lease").is_none(), "defaults omitted: {kv}");

    // A prefix range, and numbers accepted as JSON numbers or strings.
    let prefix = ok(
        &ep,
        "/v3beta/kv/range",
        json!({"key": b64("foo"), "range_end": b64("fop"), "limit": "1", "sort_order": "DESCEND"}),
    );
    assert_eq!(prefix["count"], "2");
    assert_eq!(prefix["more"], true);
    assert_eq!(prefix["kvs"][0]["key"], b64("foo2"));

    let txn = ok(
        &ep,
        "/v3/kv/txn",
        json!({
            "compare": [{"key": b64("foo"), "target": "VALUE", "result": "EQUAL", "value": b64("bar")}],
            "success": [{"request_put": {"key": b64("foo"), "value": b64("new")}}],
            "failure": [{"request_range": {"key": b64("foo")}}],
        }),
    );
    assert_eq!(txn["succeeded"], true);
    assert!(txn["responses"][0]["response_put"].is_object(), "{txn}");
    let failed = ok(
        &ep,
        "/v3/kv/txn",
        json!({
            "compare": [{"key": b64("foo"), "target": "CREATE", "create_revision": 0}],
            "success": [{"request_put": {"key": b64("foo"), "value": b64("x")}}],
            "failure": [{"request_range": {"key": b64("foo")}}],
        }),
    );
    assert!(failed.get("succeeded").is_none(), "false omitted: {failed}");
    assert_eq!(
        failed["responses"][0]["response_range"]["kvs"][0]["value"],
        b64("new")
    );

    let deleted = ok(
        &ep,
        "/v3/kv/deleterange",
        json!({"key": b64("foo2"), "prev_kv": true}),
    );
    assert_eq!(deleted["deleted"], "1");
    assert_eq!(deleted["prev_kvs"][0]["value"], b64("baz"));
    let head: i64 = deleted["header"]["revision"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();

    ok(
        &ep,
        "/v3/kv/compaction",
        json!({"revision": head.to_string()}),
    );
    let compacted = post(
        &ep,
        "/v3/kv/range",
        &json!({"key": b64("foo"), "revision": rev}).to_string(),
    );
    assert_eq!(compacted.status, 400, "{}", compacted.body);
    assert_eq!(
        compacted.body,
        r#"{"error":"etcdserver: mvcc: required revision has been compacted","message":"etcdserver: mvcc: required revision has been compacted","code":11}"#
    );
    let future = post(&ep, "/v3/kv/range", r#"{"key":"Zm9v","revision":"999"}"#);
    assert_eq!(future.status, 400);
    assert_eq!(future.json()["code"], 11);
    let empty_key = post(&ep, "/v3/kv/put", r#"{"value":"YmFy"}"#);
    assert_eq!(empty_key.status, 400);
    assert_eq!(empty_key.json()["error"], "etcdserver: key is not provided");
    let bad = post(&ep, "/v3/kv/put", "notjson");
    assert_eq!(bad.status, 400);
    assert_eq!(bad.json()["code"], 3);
    // What follows the first JSON value is not read (Go's json.Decoder, etcd 3.4.23).
    let trailing = post(
        &ep,
        "/v3/kv/put",
        r#"{"key":"dA==","value":"MQ=="} trailing"#,
    );
    assert_eq!(trailing.status, 200, "{}", trailing.body);
    let stored = ok(&ep, "/v3/kv/range", json!({"key": b64("t")}));
    assert_eq!(stored["kvs"][0]["value"], b64("1"));
    // A stream's body is read value by value until one is not a message, as grpc-gateway
    // does: the watch of a create with trailing text is created (etcd 3.4.23).
    let created = read_reply(
        send(
            &ep,
            "/v3/watch",
            r#"{"create_request":{"key":"dA==","start_revision":"1"}} trailing"#,
            None,
        ),
        |r| r.contains("created"),
    );
    assert_eq!(created.status, 200, "{}", created.body);
    assert_eq!(results(&created.body)[0]["result"]["created"], true);
    // Streaming routes answer a body they cannot decode with 500 / code 2, as etcd 3.4.23's.
    for route in ["/v3/watch", "/v3/lease/keepalive"] {
        let bad_stream = post(&ep, route, "{bad");
        assert_eq!(bad_stream.status, 500, "{route}: {}", bad_stream.body);
        assert_eq!(bad_stream.json()["code"], 2, "{route}");
    }
    // A value near the default --max-request-bytes (1.5 MiB) fits the HTTP body limit
    // despite base64; one over it gets etcd's error from the gRPC layer.
    let big = "v".repeat(1024 * 1024);
    ok(
        &ep,
        "/v3/kv/put",
        json!({"key": b64("big"), "value": b64(&big)}),
    );
    let huge = "v".repeat(2 * 1024 * 1024);
    let refused = post(
        &ep,
        "/v3/kv/put",
        &json!({"key": b64("big"), "value": b64(&huge)}).to_string(),
    );
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert_eq!(refused.json()["error"], "etcdserver: request is too large");
    // Gateway calls count in the gRPC metrics, as etcd's loopback gRPC calls do.
    let metrics = read_reply(
        {
            let mut s = TcpStream::connect(&ep).unwrap();
            write!(
                s,
                "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            s
        },
        |_| false,
    );
    let puts = metrics
        .body
        .lines()
        .find(|l| {
            l.starts_with("grpc_server_handled_total{")
                && l.contains("grpc_method=\"Put\"")
                && l.contains("grpc_code=\"OK\"")
        })
        .unwrap_or_else(|| panic!("no Put OK series:\n{}", metrics.body));
    let count: f64 = puts.rsplit(' ').next().unwrap().parse().unwrap();
    // foo, foo2, t (the one with trailing text) and big; the refused ones count under their
    // codes.
    assert_eq!(count, 4.0, "{puts}");
    // Unknown fields are ignored, as etcd's gateway does.
    ok(&ep, "/v3/kv/range", json!({"key": b64("foo"), "bogus": 1}));
    // As Go's decoder reads JSON (etcd 3.4.23): a null field is unset, a field named twice
    // keeps its last value, and a null message is the empty one.
    let null_limit = post(&ep, "/v3/kv/range", r#"{"key":"dA==","limit":null}"#);
    assert_eq!(null_limit.status, 200, "{}", null_limit.body);
    assert_eq!(null_limit.json()["kvs"][0]["value"], b64("1"));
    let twice = post(&ep, "/v3/kv/range", r#"{"key":"eA==","key":"dA=="}"#);
    assert_eq!(twice.json()["kvs"][0]["key"], b64("t"), "{}", twice.body);
    let null_body = post(&ep, "/v3/kv/range", "null");
    assert_eq!(
        (null_body.status, null_body.json()["error"].as_str()),
        (400, Some("etcdserver: key is not provided"))
    );
    let get = read_reply(
        {
            let mut s = TcpStream::connect(&ep).unwrap();
            write!(
                s,
                "GET /v3/kv/range HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            s
        },
        |_| false,
    );
    assert_eq!(get.status, 405);
    assert_eq!(get.body, "Method Not Allowed\n");
}

#[test]
fn lease_routes_and_aliases() {
    let (_guard, keel) = member(&[]);
    let ep = keel.endpoint();
    // etcd3gw's grant body: numbers, ID 0.
    let grant = ok(&ep, "/v3/lease/grant", json!({"TTL": 60, "ID": 0}));
    assert_eq!(grant["TTL"], "60");
    let id = grant["ID"].as_str().unwrap().to_string();
    assert!(id.parse::<i64>().unwrap() > 0, "{grant}");
    ok(
        &ep,
        "/v3/kv/put",
        json!({"key": b64("held"), "value": b64("v"), "lease": id}),
    );
    for prefix in ["/v3/lease", "/v3/kv/lease"] {
        let ttl = ok(
            &ep,
            &format!("{prefix}/timetolive"),
            json!({"ID": id, "keys": true}),
        );
        assert_eq!(ttl["ID"], id);
        assert_eq!(ttl["grantedTTL"], "60");
        let left: i64 = ttl["TTL"].as_str().unwrap().parse().unwrap();
        assert!((55..=60).contains(&left), "{ttl}");
        assert_eq!(ttl["keys"], json!([b64("held")]));
        let leases = ok(&ep, &format!("{prefix}/leases"), json!({}));
        assert_eq!(leases["leases"], json!([{"ID": id}]));
    }
    let kept = read_reply(
        send(
            &ep,
            "/v3/lease/keepalive",
            &json!({"ID": id}).to_string(),
            None,
        ),
        |_| false,
    );
    assert_eq!(kept.status, 200);
    let lines = results(&kept.body);
    assert_eq!(lines.len(), 1, "{}", kept.body);
    assert_eq!(lines[0]["result"]["ID"], id);
    assert_eq!(lines[0]["result"]["TTL"], "60");

    ok(&ep, "/v3/kv/lease/revoke", json!({"ID": id}));
    let gone = ok(&ep, "/v3/kv/range", json!({"key": b64("held")}));
    assert!(gone.get("kvs").is_none(), "{gone}");
    let again = post(&ep, "/v3/lease/revoke", &json!({"ID": id}).to_string());
    assert_eq!(again.status, 404);
    assert_eq!(
        again.body,
        r#"{"error":"etcdserver: requested lease not found","message":"etcdserver: requested lease not found","code":5}"#
    );
}

#[test]
fn watch_streams_newline_delimited_results() {
    let (_guard, keel) = member(&[]);
    let ep = keel.endpoint();
    let stream = send(
        &ep,
        "/v3/watch",
        &json!({"create_request": {"key": b64("w"), "range_end": b64("x")}}).to_string(),
        None,
    );
    // The created answer arrives before the put, so the event is the put's.
    let mut raw = Vec::new();
    read_until(&stream, &mut raw, |r| r.contains("created"));
    let put = ok(
        &ep,
        "/v3/kv/put",
        json!({"key": b64("w1"), "value": b64("v1")}),
    );
    read_until(&stream, &mut raw, |r| r.contains("\"events\""));
    let reply = split(&raw);
    assert_eq!(reply.status, 200);
    let lines = results(&reply.body);
    assert_eq!(lines.len(), 2, "{}", reply.body);
    assert_eq!(lines[0]["result"]["created"], true);
    let event = &lines[1]["result"]["events"][0];
    assert!(event.get("type").is_none(), "PUT is the default: {event}");
    assert_eq!(event["kv"]["key"], b64("w1"));
    assert_eq!(event["kv"]["value"], b64("v1"));
    assert_eq!(event["kv"]["mod_revision"], put["header"]["revision"]);
}

#[test]
fn auth_routes_take_the_authorization_header() {
    let (_guard, keel) = member(&[]);
    let ep = keel.endpoint();
    let off = post(
        &ep,
        "/v3/auth/authenticate",
        r#"{"name":"root","password":"pw"}"#,
    );
    assert_eq!(off.status, 412);
    assert_eq!(
        off.json()["error"],
        "etcdserver: authentication is not enabled"
    );
    ok(
        &ep,
        "/v3/auth/user/add",
        json!({"name": "root", "password": "pw"}),
    );
    ok(&ep, "/v3/auth/role/add", json!({"name": "root"}));
    ok(
        &ep,
        "/v3/auth/user/grant",
        json!({"user": "root", "role": "root"}),
    );
    ok(&ep, "/v3/auth/enable", json!({}));

    let denied = post(
        &ep,
        "/v3/kv/put",
        &json!({"key": b64("a"), "value": b64("b")}).to_string(),
    );
    // etcd's ErrUserEmpty is InvalidArgument.
    assert_eq!(denied.status, 400, "{}", denied.body);
    assert_eq!(denied.json()["error"], "etcdserver: user name is empty");
    let wrong = post(
        &ep,
        "/v3/auth/authenticate",
        r#"{"name":"root","password":"no"}"#,
    );
    assert_eq!(wrong.status, 400, "{}", wrong.body);
    assert_eq!(
        wrong.json()["error"],
        "etcdserver: authentication failed, invalid user ID or password"
    );
    // A stream that fails before its first message answers the error's status with one
    // error object, as grpc-gateway's stream forwarding does.
    let kept = post(&ep, "/v3/lease/keepalive", r#"{"ID":"12345"}"#);
    assert_eq!(kept.status, 400);
    assert_eq!(
        kept.body,
        concat!(
            r#"{"error":{"grpc_code":3,"http_code":400,"#,
            r#""message":"etcdserver: user name is empty","http_status":"Bad Request"}}"#,
        )
    );
    let auth = ok(
        &ep,
        "/v3/auth/authenticate",
        json!({"name": "root", "password": "pw"}),
    );
    let token = auth["token"].as_str().unwrap().to_string();
    assert!(!token.is_empty());

    let put = post_as(
        &ep,
        &token,
        "/v3/kv/put",
        &json!({"key": b64("a"), "value": b64("b")}).to_string(),
    );
    assert_eq!(put.status, 200, "{}", put.body);
    let users = post_as(&ep, &token, "/v3/auth/user/list", "{}");
    assert_eq!(users.json()["users"], json!(["root"]));
    let role = post_as(&ep, &token, "/v3/auth/role/get", r#"{"role":"root"}"#);
    assert_eq!(role.status, 200, "{}", role.body);
    let status = post_as(&ep, &token, "/v3/auth/status", "{}");
    assert_eq!(status.json()["enabled"], true);
    let forged = post_as(&ep, "forged.1", "/v3/kv/range", r#"{"key":"YQ=="}"#);
    assert_eq!(forged.status, 401, "{}", forged.body);
    assert_eq!(forged.json()["error"], "etcdserver: invalid auth token");
    assert_eq!(post_as(&ep, &token, "/v3/auth/disable", "{}").status, 200);
    assert_eq!(post(&ep, "/v3/kv/range", r#"{"key":"YQ=="}"#).status, 200);
}

#[test]
fn cluster_maintenance_lock_and_election_routes() {
    let (_guard, keel) = member(&[]);
    let ep = keel.endpoint();
    let members = ok(&ep, "/v3/cluster/member/list", json!({}));
    let list = members["members"].as_array().unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["clientURLs"], json!([format!("http://{ep}")]));
    let status = ok(&ep, "/v3/maintenance/status", json!({}));
    assert_eq!(status["leader"], status["header"]["member_id"]);
    assert!(status["dbSize"].as_str().unwrap().parse::<i64>().unwrap() > 0);
    let alarms = ok(&ep, "/v3/maintenance/alarm", json!({"action": "GET"}));
    assert!(alarms.get("alarms").is_none(), "{alarms}");
    // Hash answers `/v3/maintenance/hash`, whatever the body asks (HashKV shares the route in
    // etcd's rpc.proto and has none of its own: 404, as etcd 3.4.23's and 3.5.1's gateway).
    let hash = ok(&ep, "/v3/maintenance/hash", json!({"revision": "99"}));
    assert!(hash["hash"].is_number(), "{hash}");
    assert!(hash.get("compact_revision").is_none(), "{hash}");
    assert_eq!(post(&ep, "/v3/maintenance/hashkv", "{}").status, 404);
    ok(&ep, "/v3/maintenance/defragment", json!({}));
    // The snapshot streams base64 blobs of an etcd database file (bbolt magic at 16..20).
    let snapshot = post(&ep, "/v3/maintenance/snapshot", "{}");
    assert_eq!(snapshot.status, 200);
    let chunks = results(&snapshot.body);
    let first = chunks[0]["result"]["blob"].as_str().unwrap();
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(first)
        .unwrap();
    assert_eq!(&bytes[16..20], &0xED0CDAEDu32.to_le_bytes(), "bbolt magic");
    assert!(
        chunks.last().unwrap()["result"]
            .get("remaining_bytes")
            .is_none(),
        "the last chunk has 0 remaining"
    );

    let grant = ok(&ep, "/v3/lease/grant", json!({"TTL": 30}));
    let lease = grant["ID"].as_str().unwrap();
    let lock = ok(
        &ep,
        "/v3/lock/lock",
        json!({"name": b64("L"), "lease": lease}),
    );
    let key = lock["key"].as_str().unwrap().to_string();
    let held = ok(&ep, "/v3/kv/range", json!({"key": key}));
    assert_eq!(held["count"], "1");
    ok(&ep, "/v3/lock/unlock", json!({"key": key}));
    let freed = ok(&ep, "/v3/kv/range", json!({"key": key}));
    assert!(freed.get("kvs").is_none(), "{freed}");

    let campaign = ok(
        &ep,
        "/v3/election/campaign",
        json!({"name": b64("E"), "lease": lease, "value": b64("one")}),
    );
    let leader_key = campaign["leader"].clone();
    assert_eq!(leader_key["name"], b64("E"));
    ok(
        &ep,
        "/v3/election/proclaim",
        json!({"leader": leader_key, "value": b64("two")}),
    );
    let leader = ok(&ep, "/v3/election/leader", json!({"name": b64("E")}));
    assert_eq!(leader["kv"]["value"], b64("two"));
    let observe = read_reply(
        send(
            &ep,
            "/v3/election/observe",
            &json!({"name": b64("E")}).to_string(),
            None,
        ),
        |raw| raw.contains("dHdv"),
    );
    assert_eq!(observe.status, 200);
    assert_eq!(
        results(&observe.body)[0]["result"]["kv"]["value"],
        b64("two")
    );
    ok(&ep, "/v3/election/resign", json!({"leader": leader_key}));
    let none = post(
        &ep,
        "/v3/election/leader",
        &json!({"name": b64("E")}).to_string(),
    );
    // etcd's `election: no leader` is a plain error: Unknown, 500.
    assert_eq!(none.status, 500, "{}", none.body);
    assert_eq!(none.json()["error"], "election: no leader");
}

/// The answers' shapes (keys, nesting, JSON types) against etcd 3.4.23's gateway: the same
/// requests to both.
#[test]
fn answers_have_the_shape_of_etcd_3_4() {
    let Some(bin) = etcd_binary("answers_have_the_shape_of_etcd_3_4") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(&bin, &dir.path().join("etcd"), "default", free_port());
    let (_guard, keel) = member(&[]);
    let steps: [(&str, Value); 8] = [
        ("/v3/kv/put", json!({"key": b64("s"), "value": b64("v")})),
        (
            "/v3/kv/put",
            json!({"key": b64("s"), "value": b64("w"), "prev_kv": true}),
        ),
        ("/v3/kv/range", json!({"key": b64("s")})),
        (
            "/v3/kv/txn",
            json!({"compare": [{"key": b64("s"), "target": "VERSION", "version": 2}], "success": [{"request_range": {"key": b64("s")}}, {"request_delete_range": {"key": b64("none")}}]}),
        ),
        (
            "/v3/kv/deleterange",
            json!({"key": b64("s"), "prev_kv": true}),
        ),
        ("/v3/kv/range", json!({"key": b64("s"), "revision": "99"})),
        ("/v3/lease/revoke", json!({"ID": "7"})),
        (
            "/v3/auth/authenticate",
            json!({"name": "root", "password": "x"}),
        ),
    ];
    for (path, body) in steps {
        let ours = post(&keel.endpoint(), path, &body.to_string());
        let theirs = post(&etcd.endpoint, path, &body.to_string());
        assert_eq!(
            ours.status, theirs.status,
            "{path} {body}: {} vs {}",
            ours.body, theirs.body
        );
        assert_eq!(
            shape(&ours.json()),
            shape(&theirs.json()),
            "{path} {body}: keel {} etcd {}",
            ours.body,
            theirs.body
        );
        if ours.status != 200 {
            assert_eq!(ours.body, theirs.body, "{path}: error bodies byte for byte");
        }
    }
}

/// `v` with every leaf replaced by its JSON type name; object keys kept in order.
fn shape(v: &Value) -> String {
    match v {
        Value::Object(map) => {
            let fields: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{k}:{}", shape(v)))
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(shape).collect::<Vec<_>>().join(",")
        ),
        Value::String(_) => "s".into(),
        Value::Number(_) => "n".into(),
        Value::Bool(_) => "b".into(),
        Value::Null => "null".into(),
    }
}
