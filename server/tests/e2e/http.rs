//! The HTTP surface (issue 14): `/metrics`, `/health`, `/livez`, `/readyz`, `/version` on
//! the client URL (the same port as gRPC) and on `--listen-metrics-urls`, asked with raw
//! HTTP/1.1 requests as `curl` sends them. The values are live: the puts served, the
//! leader, the alarms, a member that lost its leader.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use keel_proto::etcdserverpb::alarm_request::AlarmAction;
use keel_proto::etcdserverpb::{AlarmRequest, AlarmType, PutRequest};
use keel_testkit::Member;
use keel_testkit::etcdctl::etcdctl;
use keel_testkit::grpc;
use keel_testkit::ports::free_port;

use crate::{cluster, keel_bin, member};

/// A response: status code, lower-cased headers, body.
struct Reply {
    status: u16,
    headers: String,
    body: String,
}

/// `method path` on `addr` (`127.0.0.1:port`) over HTTP/1.1, read to the end.
fn request(addr: &str, method: &str, path: &str) -> Reply {
    request_with(addr, method, path, "")
}

/// [`request`] with `extra` header lines (each ending in `\r\n`).
fn request_with(addr: &str, method: &str, path: &str, extra: &str) -> Reply {
    let stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    exchange(stream, addr, method, path, extra)
}

/// One HTTP/1.1 request on `stream` (plain or TLS), read until the server closes.
fn exchange(
    mut stream: impl Read + Write,
    addr: &str,
    method: &str,
    path: &str,
    extra: &str,
) -> Reply {
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: curl/8\r\nAccept: */*\r\n{extra}Connection: close\r\n\r\n"
    )
    .unwrap();
    stream.flush().unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    // A TLS peer may close without close_notify: what was read counts.
    while let Ok(n) = stream.read(&mut buf) {
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
    }
    let raw = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = raw.split_once("\r\n\r\n").expect("a complete response");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let headers = head.to_ascii_lowercase();
    let body = if headers.contains("transfer-encoding: chunked") {
        dechunk(body)
    } else {
        body.to_string()
    };
    Reply {
        status,
        headers,
        body,
    }
}

fn get(addr: &str, path: &str) -> Reply {
    request(addr, "GET", path)
}

pub(crate) fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        out.push_str(&rest[..size]);
        body = &rest[size + 2..];
    }
    out
}

/// The value of the sample `series` (the full name with labels, as printed) in a metrics
/// text.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn raise(endpoint: &str, alarm: AlarmType) {
    let endpoint = endpoint.to_string();
    grpc::block_on_thread(async move {
        grpc::maintenance(&endpoint)
            .await
            .alarm(AlarmRequest {
                action: AlarmAction::Activate as i32,
                member_id: 7,
                alarm: alarm as i32,
            })
            .await
            .map(|_| ())
    })
    .unwrap()
    .unwrap_or_else(|s| panic!("raise {alarm:?}: {s:?}"));
}

const PUT_OK: &str = r#"grpc_server_handled_total{grpc_code="OK",grpc_method="Put",grpc_service="etcdserverpb.KV",grpc_type="unary"}"#;
const RANGE_OUT_OF_RANGE: &str = r#"grpc_server_handled_total{grpc_code="OutOfRange",grpc_method="Range",grpc_service="etcdserverpb.KV",grpc_type="unary"}"#;

/// One member with `--listen-metrics-urls` and `--metrics extensive`: etcd's metrics with
/// the live values of the puts it served, on both URLs; the endpoints answer as etcd 3.6's.
#[test]
fn metrics_and_probes_answer_on_the_client_and_metrics_urls() {
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let metrics_url = format!("http://{metrics_addr}");
    let (_guard, keel) = member(&[
        "--listen-metrics-urls",
        &metrics_url,
        "--metrics",
        "extensive",
    ]);
    let ep = keel.endpoint();
    for i in 0..3 {
        etcdctl(&ep, &["put", &format!("k{i}"), "v"]).ok();
    }
    // A future revision: an error answered in the response headers (trailers-only).
    let out = etcdctl(&ep, &["get", "k0", "--rev", "99"]);
    assert_ne!(out.code, Some(0));
    // Writes reach the backend in batches (every 100 ms, docs/mvcc.md); HashKV commits
    // whatever is pending first, so at least one backend commit has happened after it.
    assert_eq!(etcdctl(&ep, &["endpoint", "hashkv"]).code, Some(0));

    let m = get(&ep, "/metrics");
    assert_eq!(m.status, 200);
    assert!(
        m.headers
            .contains("content-type: text/plain; version=0.0.4"),
        "{}",
        m.headers
    );
    let text = &m.body;
    assert_eq!(sample(text, "etcd_server_has_leader"), Some(1.0));
    assert_eq!(sample(text, "etcd_server_is_leader"), Some(1.0));
    assert_eq!(sample(text, "etcd_server_is_learner"), Some(0.0));
    assert_eq!(
        sample(text, "etcd_server_leader_changes_seen_total"),
        Some(1.0)
    );
    assert_eq!(sample(text, PUT_OK), Some(3.0), "the three puts");
    assert_eq!(
        sample(text, RANGE_OUT_OF_RANGE),
        Some(1.0),
        "the future revision"
    );
    assert_eq!(
        sample(
            text,
            r#"grpc_server_started_total{grpc_method="Put",grpc_service="etcdserverpb.KV",grpc_type="unary"}"#
        ),
        Some(3.0)
    );
    assert_eq!(
        sample(
            text,
            r#"grpc_server_handling_seconds_count{grpc_method="Put",grpc_service="etcdserverpb.KV",grpc_type="unary"}"#
        ),
        Some(3.0),
        "--metrics extensive"
    );
    assert_eq!(sample(text, "etcd_debugging_mvcc_keys_total"), Some(3.0));
    assert_eq!(
        sample(text, "etcd_server_quota_backend_bytes"),
        Some(2147483648.0)
    );
    assert_eq!(
        sample(text, r#"etcd_server_version{server_version="3.6.0"}"#),
        Some(1.0)
    );
    assert_eq!(
        sample(text, r#"etcd_cluster_version{cluster_version="3.6"}"#),
        Some(1.0)
    );
    let applied = sample(text, "etcd_server_proposals_applied_total").unwrap();
    assert!(applied >= 4.0, "3 puts and the leader's entries: {applied}");
    assert!(sample(text, "etcd_server_proposals_committed_total").unwrap() >= applied);
    assert!(sample(text, "etcd_disk_wal_fsync_duration_seconds_count").unwrap() >= 3.0);
    assert!(sample(text, "etcd_disk_backend_commit_duration_seconds_count").unwrap() >= 1.0);
    assert!(
        sample(
            text,
            r#"etcd_disk_wal_fsync_duration_seconds_bucket{le="8.192"}"#
        )
        .is_some()
    );
    assert!(sample(text, "etcd_mvcc_db_total_size_in_bytes").unwrap() > 0.0);
    assert!(sample(text, "process_resident_memory_bytes").unwrap() > 1e6);
    assert!(sample(text, "keel_apply_group_entries_count").unwrap() >= 3.0);

    // The metrics URL: the same registry, health too, but no /version.
    let mm = get(&metrics_addr, "/metrics");
    assert_eq!(mm.status, 200);
    assert_eq!(sample(&mm.body, "etcd_server_has_leader"), Some(1.0));
    let keel_server = format!(
        "keel_server_version{{server_version=\"{}\"}}",
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(sample(&mm.body, &keel_server), Some(1.0));
    assert_eq!(sample(&mm.body, PUT_OK), Some(3.0));
    assert_eq!(get(&metrics_addr, "/health").status, 200);
    assert_eq!(get(&metrics_addr, "/version").status, 404);

    let h = get(&ep, "/health");
    assert_eq!(
        (h.status, h.body.as_str()),
        (200, r#"{"health":"true","reason":""}"#)
    );
    // The leader decides the cluster version within seconds of start: poll, bounded.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let version = loop {
        let v = get(&ep, "/version");
        let version: serde_json::Value = serde_json::from_str(&v.body).unwrap();
        if version["keelcluster"] != "0.1.0" || std::time::Instant::now() > deadline {
            break version;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(version["etcdserver"], "3.6.0");
    assert_eq!(version["etcdcluster"], "3.6.0");
    assert_eq!(version["keelserver"], env!("CARGO_PKG_VERSION"));
    let ours = env!("CARGO_PKG_VERSION").rsplit_once('.').unwrap().0;
    assert_eq!(version["keelcluster"], format!("{ours}.0"));
    assert_eq!(get(&ep, "/livez").body, "ok\n");
    assert_eq!(
        get(&ep, "/readyz?verbose").body,
        "[+]data_corruption ok\n[+]serializable_read ok\n[+]linearizable_read ok\n[+]non_learner ok\nok\n"
    );
    assert_eq!(
        get(
            &ep,
            "/readyz?verbose&exclude=linearizable_read&exclude=non_learner"
        )
        .body,
        "[+]data_corruption ok\n[+]serializable_read ok\nok\n"
    );
    assert_eq!(
        get(&ep, "/readyz/non_learner?verbose").body,
        "[+]non_learner ok\nok\n"
    );
    // Methods as etcd's handlers take them: GET only, Go's http.Error 405 otherwise (HEAD
    // included); /metrics answers any method.
    for (addr, method, path) in [
        (ep.as_str(), "POST", "/health"),
        (ep.as_str(), "HEAD", "/health"),
        (ep.as_str(), "PUT", "/version"),
        (ep.as_str(), "DELETE", "/readyz/non_learner"),
        (metrics_addr.as_str(), "OPTIONS", "/livez"),
        (metrics_addr.as_str(), "HEAD", "/health"),
    ] {
        let r = request(addr, method, path);
        assert_eq!(r.status, 405, "{method} {path} on {addr}");
        assert!(
            r.headers.lines().any(|l| l.trim_end() == "allow: get"),
            "{}",
            r.headers
        );
        if method != "HEAD" {
            assert_eq!(r.body, "Method Not Allowed\n", "{method} {path}");
        }
    }
    for addr in [&ep, &metrics_addr] {
        let r = request(addr, "POST", "/metrics");
        assert_eq!(r.status, 200, "POST /metrics on {addr}");
        assert!(r.body.contains("etcd_server_has_leader 1"), "POST /metrics");
    }
    let missing = get(&ep, "/nope");
    assert_eq!(
        (missing.status, missing.body.as_str()),
        (404, "404 page not found\n")
    );

    // Alarms turn /health and /readyz unhealthy with etcd's reasons.
    raise(&ep, AlarmType::Nospace);
    let h = get(&ep, "/health");
    assert_eq!(
        (h.status, h.body.as_str()),
        (503, "{\"health\":\"false\",\"reason\":\"ALARM NOSPACE\"}\n")
    );
    assert_eq!(get(&ep, "/health?exclude=NOSPACE").status, 200);
    raise(&ep, AlarmType::Corrupt);
    let h = get(&ep, "/health?exclude=NOSPACE");
    assert_eq!(
        h.body,
        "{\"health\":\"false\",\"reason\":\"ALARM CORRUPT\"}\n"
    );
    let r = get(&ep, "/readyz");
    assert_eq!(r.status, 503);
    assert!(
        r.body.starts_with(
            "[-]data_corruption failed: alarm activated: CORRUPT\n[+]serializable_read ok\n"
        ),
        "{}",
        r.body
    );
    assert_eq!(get(&ep, "/readyz?exclude=data_corruption").status, 200);
    assert_eq!(get(&ep, "/livez").status, 200, "alive all the same");
}

/// A member whose leader and one other member stopped: `/health` answers 503 `RAFT NO
/// LEADER` (200 with `?serializable=true`), `etcd_server_has_leader` is 0, and `/livez` still
/// passes.
/// A `KV.Put` of `iso/deadline` sent over raw HTTP/2 with `grpc-timeout: timeout`; the
/// status of the answer (its response headers or trailers).
fn put_with_grpc_timeout(ep: &str, timeout: &str) -> tonic::Status {
    use prost::Message;
    let put = PutRequest {
        key: b"iso/deadline".to_vec(),
        value: b"v".to_vec(),
        ..Default::default()
    };
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(put.encoded_len() as u32).to_be_bytes());
    frame.extend_from_slice(&put.encode_to_vec());
    let (ep, timeout) = (ep.to_string(), timeout.to_string());
    grpc::block_on_thread(async move {
        let tcp = tokio::net::TcpStream::connect(&ep).await.unwrap();
        let (client, connection) = h2::client::handshake(tcp).await.unwrap();
        tokio::spawn(connection);
        let mut client = client.ready().await.unwrap();
        let request = axum::http::Request::post(format!("http://{ep}/etcdserverpb.KV/Put"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("grpc-timeout", timeout)
            .body(())
            .unwrap();
        let (response, mut body) = client.send_request(request, false).unwrap();
        body.send_data(frame.into(), true).unwrap();
        let response = response.await.unwrap();
        let mut headers = response.headers().clone();
        if !headers.contains_key("grpc-status") {
            let mut recv = response.into_body();
            while let Some(data) = recv.data().await {
                data.unwrap();
            }
            headers = recv.trailers().await.unwrap().unwrap_or_default();
        }
        tonic::Status::from_header_map(&headers).expect("a grpc-status")
    })
    .unwrap()
}

/// etcd's three CORS headers, as `Reply::headers` holds them (lower-cased), for `origin`.
fn cors_headers(origin: &str) -> String {
    format!(
        "access-control-allow-methods: post, get, options, put, delete\r\naccess-control-allow-origin: {origin}\r\naccess-control-allow-headers: accept, content-type, authorization"
    )
}

/// `--cors` as etcd 3.4.23 answers it: by default every HTTP answer on the client URL
/// carries the CORS headers with origin `*`, and a preflight (`OPTIONS`, any path) is 200
/// with an empty body; with a list, only a listed `Origin` gets them, echoed.
#[test]
fn cors_headers_follow_the_cors_flag() {
    let (_guard, keel) = member(&[]);
    let ep = keel.endpoint();
    for (method, path, status) in [
        ("OPTIONS", "/v3/kv/range", 200),
        ("OPTIONS", "/no/such/path", 200),
        ("GET", "/health", 200),
        ("GET", "/no/such/path", 404),
    ] {
        let r = request(&ep, method, path);
        assert_eq!(r.status, status, "{method} {path}: {}", r.headers);
        assert!(
            r.headers.contains(&cors_headers("*")),
            "{method} {path}: {}",
            r.headers
        );
        if method == "OPTIONS" {
            assert_eq!(r.body, "", "{method} {path}");
            assert!(!r.headers.contains("\r\nallow:"), "{}", r.headers);
        }
    }
    drop(keel);

    // Under the same guard: taking a second one could wait behind a cluster test's.
    let keel = Member::start_with(&keel_bin(), &["--cors", "http://a.example:80"]);
    let ep = keel.endpoint();
    let listed = request_with(
        &ep,
        "OPTIONS",
        "/v3/kv/put",
        "Origin: http://a.example:80\r\n",
    );
    assert_eq!(listed.status, 200);
    assert!(
        listed
            .headers
            .contains(&cors_headers("http://a.example:80")),
        "{}",
        listed.headers
    );
    for extra in ["Origin: http://b.example:80\r\n", ""] {
        let other = request_with(&ep, "GET", "/health", extra);
        assert_eq!(other.status, 200);
        assert!(
            !other.headers.contains("access-control-"),
            "{extra:?}: {}",
            other.headers
        );
    }
}

#[test]
fn health_reports_raft_no_leader_on_a_member_without_quorum() {
    let (_alone, mut cluster) = cluster(3, &[]);
    // The leader is the one left: openraft keeps it leading without a quorum (etcd's would
    // step down), so "no leader" rests on the quorum check (`cluster::leadership`).
    let survivor = cluster.leader(Duration::from_secs(20));
    let ep = cluster.members[survivor].endpoint();
    assert_eq!(get(&ep, "/health").status, 200);
    let granted = etcdctl(&ep, &["lease", "grant", "600"]);
    let lease = granted
        .ok()
        .stdout
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_string();
    for i in 0..3 {
        if i != survivor {
            cluster.members[i].terminate();
        }
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let h = loop {
        // Until an election timeout passed without a quorum's acknowledgement it still
        // counts as leader, and the read fails instead (`RANGE ERROR:…`), as etcd's would.
        let h = get(&ep, "/health");
        if h.body.contains("RAFT NO LEADER") || Instant::now() > deadline {
            break h;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        (h.status, h.body.as_str()),
        (
            503,
            "{\"health\":\"false\",\"reason\":\"RAFT NO LEADER\"}\n"
        )
    );
    assert_eq!(
        sample(&get(&ep, "/metrics").body, "etcd_server_has_leader"),
        Some(0.0)
    );
    // Status names no leader, as an etcd leader that stepped down (CheckQuorum) does, so
    // `etcdctl endpoint status` shows IS LEADER false.
    let status = cluster.status(survivor).unwrap();
    assert_eq!((status.leader, status.raft_term > 0), (0, true));
    assert_eq!(status.errors, ["etcdserver: no leader"]);
    let fields = etcdctl(&ep, &["endpoint", "status", "-w", "fields"]);
    assert!(
        fields.ok().stdout.contains("\"Leader\" : 0\n"),
        "{fields:#?}"
    );
    assert_eq!(get(&ep, "/health?serializable=true").status, 200);
    assert_eq!(get(&ep, "/livez").status, 200);
    assert_eq!(get(&ep, "/readyz?exclude=linearizable_read").status, 200);

    // A member without a quorum runs no read-index rounds: each would fail at once, and
    // openraft logs every failure (a fresh-user check saw ~15,000 such lines a second, a log
    // growing by 10 MB/s, when the last member led alone). /health keeps asking meanwhile.
    let failures = |log: &str| log.matches("timeout while confirming leadership").count();
    let before = failures(&cluster.members[survivor].log());
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        assert_eq!(get(&ep, "/health").status, 503);
        std::thread::sleep(Duration::from_millis(100));
    }
    let grown = failures(&cluster.members[survivor].log()) - before;
    assert!(
        grown <= 20,
        "{grown} failed leadership confirmations logged in 3 s by a member without a quorum"
    );

    // Writes and keepalives wait for a leader, as on an etcd leader that stepped down: none
    // is appended to the log, so none commits when the quorum comes back.
    let t = "--command-timeout=2s";
    for args in [
        &[t, "put", "iso/x", "y"][..],
        &[t, "lease", "grant", "60"],
        &[t, "lease", "keep-alive", "--once", &lease],
    ] {
        let out = etcdctl(&ep, args);
        assert_ne!(
            out.code,
            Some(0),
            "{args:?} succeeded without a quorum: {out:#?}"
        );
    }
    // A client deadline that runs out while the put waits is answered as etcd does
    // (tonic's own answer would be `Cancelled`, "Timeout expired"). Raw HTTP/2: a gRPC
    // client would end the call at its deadline itself.
    let expired = put_with_grpc_timeout(&ep, "300m");
    assert_eq!(
        (expired.code(), expired.message()),
        (tonic::Code::DeadlineExceeded, "context deadline exceeded")
    );
    for i in 0..3 {
        if i != survivor {
            cluster.members[i].restart();
        }
    }
    cluster.leader(Duration::from_secs(20));
    let got = etcdctl(&ep, &["get", "iso/x"]);
    assert_eq!(
        got.ok().stdout,
        "",
        "a put refused without a quorum was applied"
    );
    let leases = etcdctl(&ep, &["lease", "list"]);
    assert_eq!(
        leases.ok().stdout,
        format!("found 1 leases\n{lease}\n"),
        "a grant refused without a quorum was applied"
    );
}

/// An `https://` client URL serves the HTTP endpoints to an HTTP/1.1 client: TLS offers
/// `http/1.1` by ALPN next to `h2` (which gRPC keeps using).
#[test]
fn the_endpoints_answer_http1_over_tls() {
    let _guard = keel_testkit::schedule::shared();
    let certs = tempfile::tempdir().unwrap();
    let ca = keel_testkit::tls::TestCa::new(certs.path(), "ca");
    let mut server = ca.server("server", "server");
    server.client_cert_auth = false;
    let ports = keel_testkit::ports::free_ports(2);
    let spec = keel_testkit::MemberSpec::single("default", ports[0], ports[1]).client_tls(server);
    let mut keel = keel_testkit::Member::new(&crate::keel_bin(), spec);
    keel.restart();
    let addr = format!("127.0.0.1:{}", ports[0]);

    let (alpn, _) = tls_get(&addr, &ca.ca_file(), &[b"http/1.1", b"h2"], "/health");
    assert_eq!(alpn.as_deref(), Some(&b"h2"[..]), "the server prefers h2");
    let (alpn, reply) = tls_get(&addr, &ca.ca_file(), &[b"http/1.1"], "/health");
    assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]));
    assert_eq!(
        (reply.status, reply.body.as_str()),
        (200, r#"{"health":"true","reason":""}"#)
    );
    let (_, reply) = tls_get(&addr, &ca.ca_file(), &[b"http/1.1"], "/metrics");
    assert_eq!(sample(&reply.body, "etcd_server_has_leader"), Some(1.0));
}

/// `GET path` over TLS to `addr`, trusting `ca` and offering `alpn`; the protocol the server
/// chose and, for `http/1.1`, its answer (a status of 0 otherwise).
fn tls_get(
    addr: &str,
    ca: &std::path::Path,
    alpn: &[&[u8]],
    path: &str,
) -> (Option<Vec<u8>>, Reply) {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name).unwrap();
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock).expect("TLS handshake");
    }
    let chosen = tls.conn.alpn_protocol().map(<[u8]>::to_vec);
    if chosen.as_deref() != Some(b"http/1.1") {
        let none = Reply {
            status: 0,
            headers: String::new(),
            body: String::new(),
        };
        return (chosen, none);
    }
    (chosen, exchange(tls, addr, "GET", path, ""))
}
