//! Real etcd as the reference: finding its binaries, starting a member on 127.0.0.1, and
//! restoring a snapshot with `etcdctl snapshot restore` (Debian's `etcd-server` and
//! `etcd-client` 3.4.23; `ETCD_BIN`, `ETCDCTL_BIN`, `ETCDUTL_BIN` choose other builds).
//!
//! Tests that need a binary call [`have_programs`]: when one is missing they print
//! `SKIPPED <test>: needs ...` and pass, unless `KEEL_REQUIRE_ETCD` is set (then they fail).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::etcdctl::{CtlOutput, etcdctl};
use crate::process::KillOnDrop;
use crate::spec::initial_cluster;
use crate::{MemberSpec, ports};

/// The path of a program on `PATH`, or of `$<env>` if set; `None` if neither exists.
pub fn find_program(name: &str, env: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        return Some(p.into());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|c| c.is_file())
}

/// Whether every `(program, env override)` a test needs exists. When one does not, prints
/// `SKIPPED <test>: needs <install>` and returns false, or fails the test if
/// `KEEL_REQUIRE_ETCD` is set (CI installs them).
pub fn have_programs(test: &str, programs: &[(&str, &str)], install: &str) -> bool {
    if programs
        .iter()
        .all(|(p, env)| find_program(p, env).is_some())
    {
        return true;
    }
    let why = format!("needs {install}");
    assert!(
        std::env::var_os("KEEL_REQUIRE_ETCD").is_none(),
        "{test}: KEEL_REQUIRE_ETCD is set but it {why}"
    );
    eprintln!("SKIPPED {test}: {why}");
    false
}

/// `etcd` (and `etcdctl`), or `None` when the test should skip ([`have_programs`]).
pub fn etcd_binary(test: &str) -> Option<PathBuf> {
    let needed = [("etcd", "ETCD_BIN"), ("etcdctl", "ETCDCTL_BIN")];
    let install = "etcd and etcdctl 3.4.23 (apt-get install -y etcd-server etcd-client)";
    have_programs(test, &needed, install).then(|| find_program("etcd", "ETCD_BIN").unwrap())
}

/// `etcdctl snapshot restore <snap>` into a new data dir for the one-member cluster
/// `<name>=<peer>`; asserts success.
pub fn etcdctl_restore(snap: &Path, data: &Path, name: &str, peer: &str) {
    // The member flags come from the one builder; `snapshot restore` takes all but the
    // listen URL.
    let member = MemberSpec::new()
        .name(name)
        .data_dir(data)
        .peer_url(peer)
        .initial_cluster(&initial_cluster([(name, peer)]));
    let flags = member
        .settings()
        .into_iter()
        .filter(|(flag, _)| *flag != "listen-peer-urls")
        .map(|(flag, value)| format!("--{flag}={value}"));
    let args: Vec<String> = ["snapshot", "restore", snap.to_str().unwrap()]
        .map(String::from)
        .into_iter()
        .chain(flags)
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    etcdctl("127.0.0.1:1", &args).ok();
}

/// A running etcd member, killed when dropped.
pub struct Etcd {
    _child: KillOnDrop,
    /// `127.0.0.1:<client port>`.
    pub endpoint: String,
    /// Its stdout and stderr.
    pub log: PathBuf,
}

impl Etcd {
    /// Starts member `name` of a one-member cluster on `data_dir` (new or restored) with a
    /// free loopback client port and `peer_port`, and waits (up to 20 s) until it answers.
    pub fn start(bin: &Path, data_dir: &Path, name: &str, peer_port: u16) -> Etcd {
        let client = ports::free_port();
        let endpoint = format!("127.0.0.1:{client}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let log = data_dir.with_extension("log");
        let out = std::fs::File::create(&log).unwrap();
        // etcd and keel share the member flags: one builder spells them.
        let child = MemberSpec::new()
            .name(name)
            .data_dir(data_dir)
            .client_url(&format!("http://{endpoint}"))
            .peer_url(&peer)
            .initial_cluster(&initial_cluster([(name, peer.as_str())]))
            .command(bin)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        let etcd = Etcd {
            _child: KillOnDrop(child),
            endpoint,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let h = etcdctl(&etcd.endpoint, &["endpoint", "health"]);
            if h.code == Some(0) {
                return etcd;
            }
            assert!(
                Instant::now() < deadline,
                "etcd did not become healthy: {h:#?}\n{}",
                std::fs::read_to_string(&etcd.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs etcdctl against this member and asserts success.
    pub fn ctl(&self, args: &[&str]) -> CtlOutput {
        let out = etcdctl(&self.endpoint, args);
        out.ok();
        out
    }
}

/// `etcdctl get "" --prefix -w json` (with `extra` flags) against `endpoint`: the header
/// revision and each key as `key = value create=C mod=M ver=V lease=L` (key and value
/// base64, as etcdctl prints them).
pub fn served(endpoint: &str, extra: &[&str]) -> (i64, Vec<String>) {
    let mut args = vec!["get", "", "--prefix", "-w", "json"];
    args.extend_from_slice(extra);
    let json = etcdctl(endpoint, &args).json();
    let rev = json["header"]["revision"].as_i64().unwrap();
    let kvs = json["kvs"].as_array().cloned().unwrap_or_default();
    (rev, kvs.iter().map(describe_json).collect())
}

/// One key of etcdctl's JSON as [`served`] lists it.
pub fn describe_json(kv: &Value) -> String {
    format!(
        "{} = {} create={} mod={} ver={} lease={}",
        kv["key"].as_str().unwrap(),
        kv["value"].as_str().unwrap_or(""),
        kv["create_revision"].as_i64().unwrap_or(0),
        kv["mod_revision"].as_i64().unwrap_or(0),
        kv["version"].as_i64().unwrap_or(0),
        kv["lease"].as_i64().unwrap_or(0),
    )
}
