//! The real `etcdctl` (v3 API) against a real single-member `keel`.
//!
//! Each test starts its own member, so revisions are exact: a fresh store is at revision 1 (as
//! in etcd, whose first write gets revision 2) and every write that changes the store adds 1.
//! Expected outputs and error texts are etcd 3.4's, as recorded in
//! `../shared/conformance/cases/`.

use keel_testkit::etcdctl::{self, CtlOutput, etcdctl, etcdctl_stdin};
use keel_testkit::schedule::shared;
use keel_testkit::{Member, b64};
use serde_json::{Value, json};

use crate::{keel_bin, member};

const COMPACTED: &str = "Error: etcdserver: mvcc: required revision has been compacted";
const FUTURE_REV: &str = "Error: etcdserver: mvcc: required revision is a future revision";
const NO_KEY: &str = "Error: etcdserver: key is not provided";

/// Runs etcdctl against `keel` with `args` (a whitespace-free argument list).
fn ctl(keel: &Member, args: &[&str]) -> CtlOutput {
    etcdctl(&keel.endpoint(), args)
}

/// The store revision (`header.revision` of a Range).
fn revision(keel: &Member) -> i64 {
    etcdctl::revision(&keel.endpoint())
}

/// `key = value` as etcdctl prints a KeyValue in `-w json` (bytes as base64, no lease field
/// when 0).
fn kv_json(key: &str, value: &str, create: i64, modified: i64, version: i64) -> Value {
    json!({
        "key": b64::encode(key),
        "create_revision": create,
        "mod_revision": modified,
        "version": version,
        "value": b64::encode(value),
    })
}

#[track_caller]
fn assert_lines(out: &CtlOutput, expected: &[&str]) {
    out.ok();
    assert_eq!(out.lines(), expected, "etcdctl stdout: {out:#?}");
}

#[test]
fn fresh_member_starts_at_revision_one_with_an_empty_keyspace() {
    let (_guard, keel) = member(&[]);
    let out = ctl(&keel, &["get", "", "--from-key", "-w", "json"]).json();
    let header = &out["header"];
    assert_eq!(
        header["revision"], 1,
        "a fresh etcd store is at revision 1: {out}"
    );
    assert!(
        header["cluster_id"].as_u64().unwrap_or(0) != 0,
        "cluster_id set: {out}"
    );
    assert!(
        header["member_id"].as_u64().unwrap_or(0) != 0,
        "member_id set: {out}"
    );
    assert!(
        header["raft_term"].as_u64().unwrap_or(0) >= 1,
        "raft_term >= 1: {out}"
    );
    // etcdctl omits empty/zero fields: no kvs, no count.
    assert_eq!(out.get("kvs"), None, "{out}");
    assert_eq!(out.get("count"), None, "{out}");
}

#[test]
fn put_and_get_single_prefix_and_historical() {
    let (_guard, keel) = member(&[]);
    put_and_get_body(&keel);
}

/// The body of [`put_and_get_single_prefix_and_historical`] on any ready single member (also run over TLS by `tls.rs`).
pub(crate) fn put_and_get_body(keel: &Member) {
    let r0 = revision(keel);

    assert_lines(&ctl(keel, &["put", "foo", "bar"]), &["OK"]);
    assert_lines(&ctl(keel, &["get", "foo"]), &["foo", "bar"]);
    let got = ctl(keel, &["get", "foo", "-w", "json"]).json();
    assert_eq!(got["header"]["revision"], r0 + 1, "{got}");
    assert_eq!(
        got["kvs"],
        json!([kv_json("foo", "bar", r0 + 1, r0 + 1, 1)]),
        "{got}"
    );
    assert_eq!(got["count"], 1, "{got}");
    assert_eq!(got.get("more"), None, "{got}");

    // Overwrite: create_revision stays, mod_revision and version move.
    assert_lines(&ctl(keel, &["put", "foo", "baz"]), &["OK"]);
    let got = ctl(keel, &["get", "foo", "-w", "json"]).json();
    assert_eq!(got["header"]["revision"], r0 + 2, "{got}");
    assert_eq!(
        got["kvs"],
        json!([kv_json("foo", "baz", r0 + 1, r0 + 2, 2)]),
        "{got}"
    );

    assert_lines(&ctl(keel, &["put", "foo1", "x"]), &["OK"]); // r0 + 3
    assert_lines(&ctl(keel, &["put", "foo2", "y"]), &["OK"]); // r0 + 4
    assert_lines(&ctl(keel, &["put", "fop", "z"]), &["OK"]); // r0 + 5

    // --prefix returns keys in byte order and leaves out "fop".
    assert_lines(
        &ctl(keel, &["get", "foo", "--prefix"]),
        &["foo", "baz", "foo1", "x", "foo2", "y"],
    );
    // --limit: count is the size of the whole range, more says it was cut.
    let got = ctl(keel, &["get", "foo", "--prefix", "--limit=2", "-w", "json"]).json();
    assert_eq!(
        got["kvs"],
        json!([
            kv_json("foo", "baz", r0 + 1, r0 + 2, 2),
            kv_json("foo1", "x", r0 + 3, r0 + 3, 1)
        ]),
        "{got}"
    );
    assert_eq!(got["count"], 3, "{got}");
    assert_eq!(got["more"], true, "{got}");

    // Historical reads see the store as of that revision.
    let at = |rev: i64| format!("--rev={rev}");
    assert_lines(&ctl(keel, &["get", "foo", &at(r0 + 1)]), &["foo", "bar"]);
    assert_lines(
        &ctl(keel, &["get", "foo", "--prefix", &at(r0 + 3)]),
        &["foo", "baz", "foo1", "x"],
    );
    let got = ctl(keel, &["get", "foo", "--prefix", &at(r0 + 3), "-w", "json"]).json();
    assert_eq!(
        got["header"]["revision"],
        r0 + 5,
        "header is the current revision: {got}"
    );
    assert_eq!(got["count"], 2, "{got}");
    ctl(keel, &["get", "foo", &at(r0 + 100)]).fails_with(FUTURE_REV);

    // --prev-kv returns the pair the put replaced.
    assert_lines(
        &ctl(keel, &["put", "foo", "qux", "--prev-kv"]),
        &["OK", "foo", "baz"],
    );
    let got = ctl(keel, &["get", "missing", "-w", "json"]).json();
    assert_eq!(got["header"]["revision"], r0 + 6, "{got}");
    assert_eq!(got.get("kvs"), None, "{got}");
}

#[test]
fn delete_single_prefix_and_from_key() {
    let (_guard, keel) = member(&[]);
    let r0 = revision(&keel);
    for (key, value) in [("a", "1"), ("b", "2"), ("ba", "3"), ("bb", "4"), ("c", "5")] {
        assert_lines(&ctl(&keel, &["put", key, value]), &["OK"]);
    }
    // r0 + 5 now.
    assert_lines(&ctl(&keel, &["del", "a"]), &["1"]); // r0 + 6
    // Deleting nothing does not create a revision.
    assert_lines(&ctl(&keel, &["del", "a"]), &["0"]);
    assert_eq!(revision(&keel), r0 + 6);

    // Deleting three keys is one revision.
    let del = ctl(&keel, &["del", "b", "--prefix", "-w", "json"]).json();
    assert_eq!(del["deleted"], 3, "{del}");
    assert_eq!(del["header"]["revision"], r0 + 7, "{del}");
    assert_lines(&ctl(&keel, &["get", "", "--from-key"]), &["c", "5"]);

    assert_lines(&ctl(&keel, &["put", "d", "6"]), &["OK"]); // r0 + 8
    assert_lines(&ctl(&keel, &["put", "e", "7"]), &["OK"]); // r0 + 9
    assert_lines(&ctl(&keel, &["del", "d", "--prev-kv"]), &["1", "d", "6"]); // r0 + 10
    assert_lines(&ctl(&keel, &["del", "c", "--from-key"]), &["2"]); // r0 + 11

    let got = ctl(&keel, &["get", "", "--from-key", "-w", "json"]).json();
    assert_eq!(got["header"]["revision"], r0 + 11, "{got}");
    assert_eq!(got.get("kvs"), None, "{got}");
    // The deleted values are still readable at older revisions.
    assert_lines(
        &ctl(
            &keel,
            &["get", "", "--from-key", &format!("--rev={}", r0 + 9)],
        ),
        &["c", "5", "d", "6", "e", "7"],
    );
}

#[test]
fn txn_takes_success_or_failure_branch_atomically() {
    let (_guard, keel) = member(&[]);
    let r0 = revision(&keel);
    assert_lines(&ctl(&keel, &["put", "foo", "bar"]), &["OK"]); // r0 + 1

    // Interactive form: compares, blank line, success ops, blank line, failure ops, blank line.
    let success = "value(\"foo\") = \"bar\"\n\nput a 1\nget foo\n\nput b 2\n\n";
    let out = etcdctl_stdin(&keel.endpoint(), &["txn"], success);
    assert_lines(&out, &["SUCCESS", "", "OK", "", "foo", "bar"]); // r0 + 2
    assert_lines(
        &ctl(&keel, &["get", "", "--from-key"]),
        &["a", "1", "foo", "bar"],
    );

    let failure = "value(\"foo\") = \"baz\"\n\nput a 2\n\nput b 2\nget foo\n\n";
    let out = etcdctl_stdin(&keel.endpoint(), &["txn", "-w", "json"], failure).json();
    assert_eq!(
        out.get("succeeded"),
        None,
        "failed compare: succeeded is false (omitted): {out}"
    );
    assert_eq!(out["header"]["revision"], r0 + 3, "{out}");
    let responses = out["responses"].as_array().expect("responses");
    assert_eq!(responses.len(), 2, "{out}");
    // etcd fills only `revision` in the headers of the responses inside a txn (the outer
    // header carries the ids and the term).
    let inner_header = json!({ "revision": r0 + 3 });
    assert_eq!(
        responses[0]["Response"]["ResponsePut"]["header"], inner_header,
        "{out}"
    );
    let range = &responses[1]["Response"]["ResponseRange"];
    assert_eq!(range["header"], inner_header, "{out}");
    assert_eq!(
        range["kvs"],
        json!([kv_json("foo", "bar", r0 + 1, r0 + 1, 1)]),
        "{out}"
    );
    assert_lines(
        &ctl(&keel, &["get", "", "--from-key"]),
        &["a", "1", "b", "2", "foo", "bar"],
    );

    // Every write of one txn shares one revision; mod/create/version compares see it.
    let multi = format!(
        "mod(\"b\") = \"{}\"\nversion(\"a\") = \"1\"\n\nput x 1\nput y 2\ndel a\n\n\n",
        r0 + 3
    );
    assert_lines(
        &etcdctl_stdin(&keel.endpoint(), &["txn"], &multi),
        &["SUCCESS", "", "OK", "", "OK", "", "1"],
    );
    let got = ctl(&keel, &["get", "x", "--prefix", "-w", "json"]).json();
    assert_eq!(
        got["kvs"],
        json!([kv_json("x", "1", r0 + 4, r0 + 4, 1)]),
        "{got}"
    );
    let got = ctl(&keel, &["get", "", "--from-key", "-w", "json"]).json();
    assert_eq!(
        got["header"]["revision"],
        r0 + 4,
        "one revision for 3 ops: {got}"
    );
    assert_eq!(got["count"], 4, "b foo x y: {got}");

    // A compare on a missing key's create revision (0) drives "create if absent".
    let create_if_absent = "create(\"new\") = \"0\"\n\nput new v\n\n\n";
    assert_lines(
        &etcdctl_stdin(&keel.endpoint(), &["txn"], create_if_absent),
        &["SUCCESS", "", "OK"],
    );
    assert_lines(
        &etcdctl_stdin(&keel.endpoint(), &["txn"], create_if_absent),
        &["FAILURE"],
    );
    assert_eq!(
        revision(&keel),
        r0 + 5,
        "a txn that writes nothing adds no revision"
    );
}

#[test]
fn compact_then_read_compacted_and_kept_revisions() {
    let (_guard, keel) = member(&[]);
    let r0 = revision(&keel);
    for value in ["v1", "v2", "v3"] {
        assert_lines(&ctl(&keel, &["put", "foo", value]), &["OK"]);
    }
    let rev = |r: i64| format!("--rev={r}");
    let compacted_to = (r0 + 2).to_string();
    assert_lines(
        &ctl(&keel, &["compact", &compacted_to]),
        &[&format!("compacted revision {}", r0 + 2)],
    );
    ctl(&keel, &["get", "foo", &rev(r0 + 1)]).fails_with(COMPACTED);
    assert_lines(&ctl(&keel, &["get", "foo", &rev(r0 + 2)]), &["foo", "v2"]);
    // Compacting at or below the compact revision, or beyond the store, is refused.
    ctl(&keel, &["compact", &compacted_to]).fails_with(COMPACTED);
    ctl(&keel, &["compact", &(r0 + 1).to_string()]).fails_with(COMPACTED);
    ctl(&keel, &["compact", &(r0 + 100).to_string()]).fails_with(FUTURE_REV);
    // Compaction keeps the key's history metadata and adds no revision.
    let got = ctl(&keel, &["get", "foo", "-w", "json"]).json();
    assert_eq!(got["header"]["revision"], r0 + 3, "{got}");
    assert_eq!(
        got["kvs"],
        json!([kv_json("foo", "v3", r0 + 1, r0 + 3, 3)]),
        "{got}"
    );
}

#[test]
fn endpoint_status_and_health_report_this_member_as_leader() {
    let (_guard, keel) = member(&[]);
    let status = |keel: &Member| {
        let out = ctl(keel, &["endpoint", "status", "-w", "json"]).json();
        let list = out.as_array().expect("endpoint status -w json is a list");
        assert_eq!(list.len(), 1, "one endpoint: {out}");
        assert_eq!(list[0]["Endpoint"], keel.endpoint(), "{out}");
        list[0]["Status"].clone()
    };
    let before = status(&keel);
    let member_id = before["header"]["member_id"].as_u64().expect("member_id");
    assert_ne!(member_id, 0, "{before}");
    assert_eq!(
        before["leader"].as_u64(),
        Some(member_id),
        "a single member leads: {before}"
    );
    assert_eq!(before["version"], keel_proto::ETCD_API_VERSION, "{before}");
    let raft_index = before["raftIndex"].as_u64().expect("raftIndex");
    assert!(
        raft_index >= 1,
        "the leader's first entry is committed: {before}"
    );
    assert!(before["raftTerm"].as_u64().unwrap_or(0) >= 1, "{before}");
    assert_eq!(
        before["raftTerm"], before["header"]["raft_term"],
        "{before}"
    );
    assert!(
        before["dbSize"].as_u64().unwrap_or(0) > 0,
        "dbSize: {before}"
    );

    assert_lines(&ctl(&keel, &["put", "a", "1"]), &["OK"]);
    let after = status(&keel);
    let rev = before["header"]["revision"].as_i64().expect("revision");
    assert_eq!(after["header"]["revision"], rev + 1, "{after}");
    let index_after = after["raftIndex"].as_u64().expect("raftIndex");
    assert!(
        index_after > raft_index,
        "a put appends a log entry: {before} -> {after}"
    );
    let applied = after["raftAppliedIndex"]
        .as_u64()
        .expect("raftAppliedIndex");
    assert!(
        applied > raft_index && applied <= index_after,
        "applied index: {after}"
    );

    let health = ctl(&keel, &["endpoint", "health"]);
    health.ok();
    let prefix = format!(
        "{} is healthy: successfully committed proposal: took = ",
        keel.endpoint()
    );
    assert!(
        health.stderr.lines().any(|l| l.starts_with(&prefix)),
        "etcdctl 3.4 reports health on stderr: {health:#?}"
    );
}

#[test]
fn member_list_shows_the_single_member_with_its_urls() {
    let (_guard, keel) = member(&[]);
    let out = ctl(&keel, &["member", "list", "-w", "json"]).json();
    let members = out["members"].as_array().expect("members");
    assert_eq!(members.len(), 1, "{out}");
    let member = &members[0];
    let id = member["ID"].as_u64().expect("member ID");
    assert_eq!(
        Some(id),
        out["header"]["member_id"].as_u64(),
        "the answering member: {out}"
    );
    assert_eq!(member["name"], keel.name(), "{out}");
    assert_eq!(member["peerURLs"], json!([keel.peer_url()]), "{out}");
    assert_eq!(member["clientURLs"], json!([keel.client_url()]), "{out}");
    assert_ne!(member.get("isLearner"), Some(&json!(true)), "{out}");

    let table = format!(
        "{id:x}, started, {}, {}, {}, false",
        keel.name(),
        keel.peer_url(),
        keel.client_url()
    );
    assert_lines(&ctl(&keel, &["member", "list"]), &[&table]);
}

#[test]
fn empty_key_is_rejected_with_etcds_error() {
    let (_guard, keel) = member(&[]);
    ctl(&keel, &["put", "", "v"]).fails_with(NO_KEY);
    ctl(&keel, &["get", ""]).fails_with(NO_KEY);
    ctl(&keel, &["del", ""]).fails_with(NO_KEY);
    assert_eq!(revision(&keel), 1, "rejected requests write nothing");
}

#[test]
fn request_size_and_txn_ops_limits_follow_the_flags() {
    let (_guard, keel) = member(&["--max-request-bytes", "1024", "--max-txn-ops", "2"]);
    let endpoint = keel.endpoint();
    // `put <key>` reads the value from stdin.
    etcdctl_stdin(&endpoint, &["put", "big"], &"a".repeat(2000))
        .fails_with("Error: etcdserver: request is too large");
    assert_lines(
        &etcdctl_stdin(&endpoint, &["put", "small"], &"a".repeat(500)),
        &["OK"],
    );

    etcdctl_stdin(&endpoint, &["txn"], "\nput k1 v\nput k2 v\nput k3 v\n\n\n")
        .fails_with("Error: etcdserver: too many operations in txn request");
    assert_lines(
        &etcdctl_stdin(&endpoint, &["txn"], "\nput k1 v\nput k2 v\n\n\n"),
        &["SUCCESS", "", "OK", "", "OK"],
    );
    assert_lines(
        &ctl(&keel, &["get", "", "--from-key", "--keys-only"]),
        &["k1", "", "k2", "", "small", ""],
    );
}

#[test]
fn config_file_sets_name_urls_and_limits() {
    let _guard = shared();
    let keel = Member::start_with_config_file(&keel_bin(), "from-yaml", "max-txn-ops: 1\n");
    let out = ctl(&keel, &["member", "list", "-w", "json"]).json();
    assert_eq!(out["members"][0]["name"], "from-yaml", "{out}");
    assert_eq!(
        out["members"][0]["clientURLs"],
        json!([keel.client_url()]),
        "{out}"
    );
    etcdctl_stdin(&keel.endpoint(), &["txn"], "\nput k1 v\nput k2 v\n\n\n")
        .fails_with("Error: etcdserver: too many operations in txn request");
    assert_lines(
        &etcdctl_stdin(&keel.endpoint(), &["txn"], "\nput k1 v\n\n\n"),
        &["SUCCESS", "", "OK"],
    );
}

/// `--quota-backend-bytes`: once the store is larger than the quota, puts (and txns that put)
/// fail with etcd's NOSPACE error, while reads and deletes keep working.
#[test]
fn writes_past_the_backend_quota_fail_with_nospace() {
    let (_guard, keel) = member(&["--quota-backend-bytes", "100"]);
    const NOSPACE: &str = "Error: etcdserver: mvcc: database space exceeded";
    // The store's meta keys alone pass a 100-byte quota; `dbSize` (sled's files, refreshed
    // every second) may take that second to show it (bounded wait).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let status = ctl(&keel, &["endpoint", "status", "-w", "json"]).json();
        let db_size = status[0]["Status"]["dbSize"].as_i64().unwrap_or(0);
        if db_size > 100 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "dbSize never exceeded 100: {status}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    ctl(&keel, &["put", "a", "1"]).fails_with(NOSPACE);
    etcdctl_stdin(&keel.endpoint(), &["txn"], "\nput b 2\n\n\n").fails_with(NOSPACE);
    let got = ctl(&keel, &["get", "a", "-w", "json"]).json();
    assert_eq!(got["header"]["revision"], json!(1), "nothing was written");
    assert_eq!(ctl(&keel, &["del", "a"]).ok().lines(), vec!["0"]);
}

/// etcdctl 3.4 dials each endpoint of the maintenance commands as `passthrough:///<url>`, so
/// with `http://` endpoints the HTTP/2 `:authority` is `http://host:port`; Go's server takes it,
/// and so must Keel's (the patched h2 in third_party/, docs/third_party.md). Before the patch
/// every one of these failed with `RST_STREAM with error code: PROTOCOL_ERROR`.
#[test]
fn maintenance_commands_work_on_endpoints_with_a_scheme() {
    let (_guard, keel) = member(&[]);
    let url = keel.client_url();
    assert!(url.starts_with("http://"), "{url}");
    let status = etcdctl(&url, &["endpoint", "status", "-w", "json"]);
    assert_eq!(status.code, Some(0), "{status:?}");
    let status = status.json();
    assert_eq!(status[0]["Endpoint"], url.as_str(), "{status}");
    assert!(
        status[0]["Status"]["header"]["member_id"]
            .as_u64()
            .unwrap_or(0)
            != 0,
        "{status}"
    );
    let hashkv = etcdctl(&url, &["endpoint", "hashkv", "-w", "json"]);
    assert_eq!(hashkv.code, Some(0), "{hashkv:?}");
    let defrag = etcdctl(&url, &["defrag"]);
    assert_eq!(
        (defrag.code, defrag.stdout.trim_end()),
        (
            Some(0),
            format!("Finished defragmenting etcd member[{url}]").as_str()
        ),
        "{defrag:?}"
    );
}
