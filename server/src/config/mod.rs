//! Member configuration: etcd's flag names, defaults and config-file keys.
//!
//! Flags follow etcd's `etcd --help` (v3.4–3.6). As in etcd, when `--config-file` is given
//! the YAML file is the whole configuration and other flags are ignored. Keel differs from
//! etcd only in the default data dir (`<name>.keel` instead of `<name>.etcd`).
//!
//! This module sits with `main.rs` and `node.rs` at the top of the module tree: it turns the
//! flags into each component's own settings ([`settings`]: `WatchConfig`, the lease loop's
//! `RunnerConfig`, the bootstrap flags), so no component below reads `Config`; option
//! strings are parsed here too ([`auth_token`]: `--auth-token` into auth's `TokenOptions`).

pub mod auth_token;
mod duration;
mod error;
mod go_flags;
mod maintenance;
pub mod operator;
mod qos;
mod recovery;
mod settings;
mod tls;

use std::path::PathBuf;

use clap::Parser;
use serde::Deserialize;

pub use duration::{GoDuration, GoDurationError};
pub use error::ConfigError;
pub use go_flags::{go_bool, go_style_args};
pub use maintenance::MaintenanceFlags;
pub use operator::OperatorFlags;
pub use recovery::RecoveryFlags;
pub use tls::{SecurityFlags, is_https, listener_tls};

use crate::raft::dial_override;

/// etcd's default `--max-request-bytes`: 1.5 MiB.
pub const DEFAULT_MAX_REQUEST_BYTES: u32 = 1_572_864;
/// gRPC framing allowance on top of `--max-request-bytes` (etcd's `grpcOverheadBytes`).
pub const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;
/// Longest `--election-timeout` etcd accepts, in ms (etcd `embed.maxElectionMs`).
pub const MAX_ELECTION_TIMEOUT_MS: u64 = 50_000;

/// Command-line flags of `keel`, with etcd's names and defaults.
#[derive(Parser, Debug, Clone, Deserialize)]
// `args_override_self`: a flag given twice keeps its last value, as Go's `flag` package does
// for etcd (`--name a --name b` is `b`), instead of clap's "cannot be used multiple times".
#[command(name = "keel", version = concat!(env!("CARGO_PKG_VERSION"), " (etcd API ", "3.6.0", ")"),
    about = "Keel: a raft-replicated key-value store that speaks the etcd v3 API",
    args_override_self = true)]
#[serde(rename_all = "kebab-case", default)]
pub struct Config {
    /// Human-readable name for this member.
    #[arg(long, default_value = "default")]
    pub name: String,
    /// Path to the data directory (default: `<name>.keel`).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Comma-separated URLs to listen on for client traffic.
    #[arg(long, default_value = "http://localhost:2379")]
    pub listen_client_urls: String,
    /// Comma-separated client URLs of this member to advertise to the cluster.
    #[arg(long, default_value = "http://localhost:2379")]
    pub advertise_client_urls: String,
    /// Comma-separated URLs to listen on for peer traffic.
    #[arg(long, default_value = "http://localhost:2380")]
    pub listen_peer_urls: String,
    /// Comma-separated peer URLs of this member to advertise to the cluster.
    #[arg(long, default_value = "http://localhost:2380")]
    pub initial_advertise_peer_urls: String,
    /// Initial cluster configuration for bootstrapping (`name=peer-url,...`).
    #[arg(long, default_value = "default=http://localhost:2380")]
    pub initial_cluster: String,
    /// Initial cluster state: `new` or `existing`.
    #[arg(long, default_value = "new", value_parser = ["new", "existing"])]
    pub initial_cluster_state: String,
    /// Initial cluster token; member and cluster IDs derive from it.
    #[arg(long, default_value = "etcd-cluster")]
    pub initial_cluster_token: String,
    /// Maximum client request size in bytes the server will accept.
    #[arg(long, default_value_t = DEFAULT_MAX_REQUEST_BYTES)]
    pub max_request_bytes: u32,
    /// Maximum number of operations permitted in a transaction.
    #[arg(long, default_value_t = 128)]
    pub max_txn_ops: u32,
    /// Raise alarms when backend size exceeds the given quota (0 = default 2 GiB).
    #[arg(long, default_value_t = 0)]
    pub quota_backend_bytes: i64,
    /// Number of committed transactions to trigger a snapshot to disk.
    #[arg(long, default_value_t = 10_000)]
    pub snapshot_count: u64,
    /// Maximum time before the store's pending writes are committed to its backend (a Go
    /// duration; etcd `--backend-batch-interval`; 0, the default, means 100ms).
    #[arg(long, default_value = "0")]
    pub backend_batch_interval: GoDuration,
    /// Maximum writes before the store's pending writes are committed to its backend (etcd
    /// `--backend-batch-limit`; 0, the default, means 10000).
    #[arg(long, default_value_t = 0)]
    pub backend_batch_limit: u64,
    /// Number of entries for a slow follower to catch up after compacting the raft log
    /// (entries kept in the log after a snapshot).
    #[arg(long = "experimental-snapshot-catchup-entries", default_value_t = 5000)]
    #[serde(rename = "experimental-snapshot-catchup-entries")]
    pub snapshot_catchup_entries: u64,
    /// Time (in milliseconds) of a heartbeat interval.
    #[arg(long, default_value_t = 100)]
    pub heartbeat_interval: u64,
    /// Time (in milliseconds) for an election to timeout.
    #[arg(long, default_value_t = 1000)]
    pub election_timeout: u64,
    /// Keel: expired leases the leader revokes per second at most (etcd's fixed rate is 1000).
    #[arg(long, default_value_t = 100_000)]
    pub lease_revoke_rate: u64,
    /// Keel: milliseconds between checkpoints of a lease's remaining TTL through raft, so it
    /// survives a leader change (etcd `--experimental-lease-checkpoint-interval`, 5 min);
    /// 0 turns checkpoints off (a new leader then restarts every lease's full TTL).
    #[arg(long, default_value_t = 300_000)]
    pub lease_checkpoint_interval: u64,
    /// Path to the server configuration file (YAML, etcd's keys). Other flags are ignored
    /// when it is given, as in etcd.
    #[arg(long)]
    #[serde(skip)]
    pub config_file: Option<PathBuf>,
    /// Interval of progress notifications to watchers that set `progress_notify` (a Go
    /// duration such as `10m` or `500ms`; etcd's default 10m, minimum 100ms).
    #[arg(long, default_value = "10m")]
    pub experimental_watch_progress_notify_interval: GoDuration,
    /// Keel: responses one watcher may have queued before it falls behind and catches up
    /// from the store (etcd's fixed per-stream channel holds 128).
    #[arg(long, default_value_t = crate::watch::DEFAULT_BUFFER_LEN)]
    pub watch_buffer_len: usize,
    /// Keel: bytes of events one watch stream may have queued for a slow client.
    #[arg(long, default_value_t = crate::watch::DEFAULT_STREAM_BUFFER_BYTES)]
    pub watch_stream_buffer_bytes: usize,
    /// Keel: comma-separated `ADVERTISED_PEER_URL=DIAL_URL` pairs; connections to a peer
    /// advertised at the left URL dial the right URL instead (e.g. a TCP proxy of the chaos
    /// harness). Membership keeps the advertised URLs. See `raft::dial_override`.
    #[arg(long, default_value = "")]
    pub experimental_peer_dial_override: String,
    /// Keel: QoS rule file (YAML, docs/qos.md). Parsed at start (a malformed file stops
    /// the member with an error naming the field); its rules are proposed through raft
    /// when they differ from the rules in force.
    #[arg(long)]
    pub qos_config: Option<PathBuf>,
    /// Keel: apply lag (committed − applied raft entries) above which new proposals are
    /// refused with `etcdserver: too many requests` (etcd's fixed 5000).
    #[arg(long, default_value_t = 5_000)]
    pub qos_max_apply_lag: u64,
    /// Keel: apply lag above which high-priority proposals (lease revoke) are refused too
    /// (etcd 3.7's 10000).
    #[arg(long, default_value_t = 10_000)]
    pub qos_max_priority_apply_lag: u64,
    /// Keel: apply lag above which low-priority proposals (rules with `priority: low`) are
    /// refused.
    #[arg(long, default_value_t = 1_000)]
    pub qos_low_apply_lag: u64,
    /// Keel: requests waiting in the proposer above which low-priority proposals are
    /// refused.
    #[arg(long, default_value_t = 2_048)]
    pub qos_low_queue_depth: u64,
    /// Keel: how long a request a QoS rule refuses (rate or in-flight cap) waits before it
    /// is answered `etcdserver: too many requests` (a Go duration; `0s` answers at once).
    /// A client that resends at once is then held to a few refusals per request slot and
    /// second instead of spinning the member's CPU on refusals; overload refusals are
    /// always immediate, as in etcd.
    #[arg(long, default_value = "100ms")]
    pub qos_refusal_delay: GoDuration,
    /// Logging level: debug, info, warn, error.
    #[arg(long, default_value = "info")]
    pub log_level: String,
    /// Auth token type and options: `simple`, `jwt,pub-key=P,priv-key=K,sign-method=M[,ttl=5m]`,
    /// or empty for none (etcd `--auth-token`; docs/auth.md).
    #[arg(long, default_value = "simple")]
    pub auth_token: String,
    /// Seconds a simple token stays valid after its last use (etcd `--auth-token-ttl`).
    #[arg(long, default_value_t = 300)]
    pub auth_token_ttl: u64,
    /// bcrypt cost of password hashes; outside [4, 31] the default 10 is used with a warning
    /// (etcd `--bcrypt-cost`).
    #[arg(long, default_value_t = 10)]
    pub bcrypt_cost: u32,
    /// TLS of the client and peer URLs (etcd's security flags; docs/security.md).
    #[command(flatten)]
    #[serde(flatten)]
    pub security: SecurityFlags,
    /// Metrics, logging, keepalive and raft toggles (docs/operations.md).
    #[command(flatten)]
    #[serde(flatten)]
    pub operator: OperatorFlags,
    /// Corruption checks and auto-compaction (etcd's flags; issue 15 parts 5 and 6).
    #[command(flatten)]
    #[serde(flatten)]
    pub maintenance: MaintenanceFlags,
    /// `--force-new-cluster`, `--max-snapshots`, `--max-wals` (issue 15 parts 7-8).
    #[command(flatten)]
    #[serde(flatten)]
    pub recovery: RecoveryFlags,
}

impl Default for Config {
    fn default() -> Config {
        Config::parse_from(["keel"])
    }
}

impl Config {
    /// Parses the command line; if `--config-file` is set, loads that file instead.
    ///
    /// Errors: an unreadable or invalid YAML file (message names the file), or a check of
    /// [`Config::normalize`].
    pub fn load() -> Result<Config, ConfigError> {
        let args = go_style_args(std::env::args());
        let cli = match Config::try_parse_from(&args) {
            Ok(cli) => cli,
            Err(e) if e.kind() == clap::error::ErrorKind::UnknownArgument => {
                match operator::unsupported_etcd_flag(&args) {
                    Some(flag) => return Err(ConfigError::UnsupportedEtcdFlag(flag)),
                    None => e.exit(),
                }
            }
            Err(e) => e.exit(),
        };
        let mut cfg = match &cli.config_file {
            None => cli,
            Some(path) => Config::from_yaml_file(path)?,
        };
        cfg.normalize()?;
        Ok(cfg)
    }

    /// etcd's start-up adjustments and checks:
    /// - with only `--name` given (the initial cluster left at its default, or empty), the
    ///   initial cluster becomes `<name>=<each advertised peer URL>` (etcd's
    ///   `UpdateDefaultClusterFromName`);
    /// - the election timeout must be at least 5 heartbeat intervals, and at most
    ///   [`MAX_ELECTION_TIMEOUT_MS`];
    /// - `--experimental-peer-dial-override` must parse;
    /// - `https://` URLs need their certificate (or auto TLS), TLS settings must parse
    ///   ([`Config::check_security`]).
    ///
    /// Errors: etcd's message for a too-short election timeout; the override's parse error;
    /// etcd's TLS messages.
    pub fn normalize(&mut self) -> Result<(), ConfigError> {
        for (flag, urls) in [
            ("listen-client-urls", &self.listen_client_urls),
            ("advertise-client-urls", &self.advertise_client_urls),
            ("listen-peer-urls", &self.listen_peer_urls),
            (
                "initial-advertise-peer-urls",
                &self.initial_advertise_peer_urls,
            ),
            ("listen-metrics-urls", &self.operator.listen_metrics_urls),
        ] {
            check_urls(flag, urls)?;
        }
        let default_cluster = "default=http://localhost:2380";
        if self.initial_cluster.trim().is_empty()
            || (self.initial_cluster == default_cluster && self.name != "default")
        {
            self.initial_cluster = split_urls(&self.initial_advertise_peer_urls)
                .iter()
                .map(|u| format!("{}={u}", self.name))
                .collect::<Vec<_>>()
                .join(",");
        }
        dial_override::parse(&self.experimental_peer_dial_override)?;
        self.qos_thresholds()?;
        self.qos_file_rules()?;
        self.check_security()?;
        self.operator.check()?;
        self.maintenance.auto_compaction()?;
        // etcd's embed.Config.Validate order: heartbeat, election, then their ratio.
        if self.heartbeat_interval == 0 {
            return Err(ConfigError::HeartbeatZero);
        }
        if self.election_timeout < 5 * self.heartbeat_interval {
            return Err(ConfigError::ElectionTimeout {
                election: self.election_timeout,
                heartbeat: self.heartbeat_interval,
            });
        }
        if self.election_timeout > MAX_ELECTION_TIMEOUT_MS {
            return Err(ConfigError::ElectionTimeoutTooLong {
                election: self.election_timeout,
                max: MAX_ELECTION_TIMEOUT_MS,
            });
        }
        Ok(())
    }

    /// Loads a YAML config file with etcd's keys (`name`, `data-dir`, `listen-client-urls`,
    /// ...); missing keys take the flag defaults. Unknown etcd keys are ignored.
    ///
    /// Errors: the file cannot be read, or is not YAML with these keys.
    pub fn from_yaml_file(path: &std::path::Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        let mut cfg: Config = serde_norway::from_str(&text).map_err(|error| ConfigError::Yaml {
            path: path.to_path_buf(),
            error,
        })?;
        cfg.config_file = Some(path.to_path_buf());
        Ok(cfg)
    }

    /// The data directory: `--data-dir`, or `<name>.keel`.
    pub fn data_dir(&self) -> PathBuf {
        self.data_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("{}.keel", self.name)))
    }

    /// Backend quota in bytes (etcd's default when 0: 2 GiB).
    pub fn quota_bytes(&self) -> i64 {
        if self.quota_backend_bytes > 0 {
            self.quota_backend_bytes
        } else {
            2 * 1024 * 1024 * 1024
        }
    }
}

/// etcd's parse of a URL-list flag (`types.NewURLs` over Go's `url.Parse`): each URL needs a
/// scheme of `http`, `https`, `unix` or `unixs`. `127.0.0.1:2379` (no scheme) gets Go's parse
/// error, as etcd prints it.
///
/// Errors: `BadUrl` with etcd's text.
fn check_urls(flag: &'static str, urls: &str) -> Result<(), ConfigError> {
    for url in split_urls(urls) {
        let bad = |reason: String| ConfigError::BadUrl {
            flag,
            value: urls.to_string(),
            reason,
        };
        match go_scheme(&url).map(|s| s.to_ascii_lowercase()) {
            Some(scheme) if ["http", "https", "unix", "unixs"].contains(&scheme.as_str()) => {}
            None if url.split('/').next().unwrap_or("").contains(':') => {
                return Err(bad(format!(
                    "parse {url:?}: first path segment in URL cannot contain colon"
                )));
            }
            _ => {
                return Err(bad(format!(
                    "URL scheme must be http, https, unix, or unixs: {url}"
                )));
            }
        }
    }
    Ok(())
}

/// The scheme Go's `url.Parse` finds in `url` (`getScheme`): letters, then letters, digits,
/// `+`, `-` or `.`, up to a `:`; `None` when `url` does not start that way (`127.0.0.1:2379`
/// has none, `a.example:80` has `a.example`).
pub(super) fn go_scheme(url: &str) -> Option<&str> {
    for (i, c) in url.char_indices() {
        match c {
            c if c.is_ascii_alphabetic() => {}
            '0'..='9' | '+' | '-' | '.' if i > 0 => {}
            ':' if i > 0 => return Some(&url[..i]),
            _ => return None,
        }
    }
    None
}

/// Splits a comma-separated URL list.
pub fn split_urls(urls: &str) -> Vec<String> {
    urls.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_string)
        .collect()
}

/// `host:port` of a URL (what lies between `scheme://` and the path).
pub(crate) fn host_port(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split('/').next().unwrap_or(rest)
}

/// The host of a URL, without its port or an IPv6 address's brackets.
pub(crate) fn url_host(url: &str) -> &str {
    let hp = host_port(url);
    let host = match hp.rsplit_once(':') {
        Some((h, _)) => h,
        None => hp,
    };
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Turns `http://host:port` into a socket address to bind (`localhost` → 127.0.0.1).
///
/// Errors: a URL without a port, or a host that does not resolve.
pub fn bind_addr(url: &str) -> Result<std::net::SocketAddr, ConfigError> {
    use std::net::ToSocketAddrs;
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .unwrap_or(url);
    let hostport = rest.split('/').next().unwrap_or(rest);
    let hostport = hostport.replacen("localhost", "127.0.0.1", 1);
    hostport
        .to_socket_addrs()
        .map_err(|error| ConfigError::Resolve {
            url: url.to_string(),
            error,
        })?
        .next()
        .ok_or_else(|| ConfigError::NoAddress {
            url: url.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_etcd() {
        let c = Config::default();
        assert_eq!(c.name, "default");
        assert_eq!(c.data_dir(), PathBuf::from("default.keel"));
        assert_eq!(c.listen_client_urls, "http://localhost:2379");
        assert_eq!(c.initial_cluster, "default=http://localhost:2380");
        assert_eq!(c.max_request_bytes, 1_572_864);
        assert_eq!(c.max_txn_ops, 128);
        assert_eq!(c.snapshot_count, 10_000);
        assert_eq!(c.snapshot_catchup_entries, 5000);
        assert_eq!(c.quota_bytes(), 2 * 1024 * 1024 * 1024);
        assert_eq!(c.persist_policy(), crate::mvcc::PersistPolicy::BATCHED);
        assert_eq!(
            (c.auth_token.as_str(), c.auth_token_ttl, c.bcrypt_cost),
            ("simple", 300, 10)
        );
    }

    #[test]
    fn yaml_uses_etcd_keys_and_defaults_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("keel.yaml");
        std::fs::write(
            &p,
            "name: n1\ndata-dir: /tmp/x\nmax-txn-ops: 64\nlisten-client-urls: http://127.0.0.1:9\n",
        )
        .unwrap();
        let c = Config::from_yaml_file(&p).unwrap();
        assert_eq!(c.name, "n1");
        assert_eq!(c.data_dir(), PathBuf::from("/tmp/x"));
        assert_eq!(c.max_txn_ops, 64);
        assert_eq!(c.listen_client_urls, "http://127.0.0.1:9");
        assert_eq!(c.max_request_bytes, DEFAULT_MAX_REQUEST_BYTES);
        std::fs::write(&p, "max-txn-ops: [").unwrap();
        let err = Config::from_yaml_file(&p).unwrap_err().to_string();
        assert!(err.contains("invalid --config-file"), "{err}");
    }

    #[test]
    fn name_alone_derives_the_initial_cluster_like_etcd() {
        let mut c = Config::parse_from([
            "keel",
            "--name",
            "foo",
            "--initial-advertise-peer-urls",
            "http://127.0.0.1:9",
        ]);
        c.normalize().unwrap();
        assert_eq!(c.initial_cluster, "foo=http://127.0.0.1:9");
        let mut c = Config::parse_from([
            "keel",
            "--name",
            "foo",
            "--initial-cluster",
            "a=http://1:2,foo=http://3:4",
        ]);
        c.normalize().unwrap();
        assert_eq!(
            c.initial_cluster, "a=http://1:2,foo=http://3:4",
            "an explicit cluster is kept"
        );
        let mut c = Config::default();
        c.normalize().unwrap();
        assert_eq!(c.initial_cluster, "default=http://localhost:2380");
    }

    #[test]
    fn election_timeout_must_cover_five_heartbeats() {
        let mut c = Config::parse_from([
            "keel",
            "--heartbeat-interval",
            "500",
            "--election-timeout",
            "100",
        ]);
        assert_eq!(
            c.normalize().unwrap_err().to_string(),
            "--election-timeout[100ms] should be at least as 5 times as --heartbeat-interval[500ms]"
        );
    }

    #[test]
    fn urls_without_a_scheme_are_refused_as_etcd_does() {
        let mut c = Config::parse_from(["keel", "--listen-client-urls", "127.0.0.1:31990"]);
        assert_eq!(
            c.normalize().unwrap_err().to_string(),
            r#"invalid value "127.0.0.1:31990" for flag -listen-client-urls: parse "127.0.0.1:31990": first path segment in URL cannot contain colon"#
        );
        let mut c = Config::parse_from(["keel", "--advertise-client-urls", "ftp://h:1"]);
        assert_eq!(
            c.normalize().unwrap_err().to_string(),
            r#"invalid value "ftp://h:1" for flag -advertise-client-urls: URL scheme must be http, https, unix, or unixs: ftp://h:1"#
        );
        assert_eq!(c.normalize().unwrap_err().exit_code(), 2);
    }

    #[test]
    fn heartbeat_interval_zero_is_refused_as_etcd_does() {
        let mut c = Config::parse_from(["keel", "--heartbeat-interval", "0"]);
        assert_eq!(
            c.normalize().unwrap_err().to_string(),
            "--heartbeat-interval must be >0 (set to 0ms)"
        );
    }

    #[test]
    fn election_timeout_above_50_s_is_refused_as_etcd_does() {
        let mut c = Config::parse_from(["keel", "--election-timeout", "60000"]);
        assert_eq!(
            c.normalize().unwrap_err().to_string(),
            "--election-timeout[60000ms] is too long, and should be set less than 50000ms"
        );
        // etcd accepts the limit itself.
        let mut c = Config::parse_from(["keel", "--election-timeout", "50000"]);
        c.normalize().unwrap();
    }

    #[test]
    fn peer_dial_override_is_checked_at_start_up() {
        let mut c = Config::parse_from([
            "keel",
            "--experimental-peer-dial-override",
            "http://127.0.0.1:1=http://127.0.0.1:2",
        ]);
        c.normalize().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("keel.yaml");
        std::fs::write(&p, "experimental-peer-dial-override: 'http://a:1'\n").unwrap();
        let mut c = Config::from_yaml_file(&p).unwrap();
        assert_eq!(c.experimental_peer_dial_override, "http://a:1");
        assert!(c.normalize().unwrap_err().to_string().starts_with(
            "invalid value \"http://a:1\" for flag --experimental-peer-dial-override"
        ));
    }

    #[test]
    fn bind_addr_resolves_localhost() {
        assert_eq!(
            bind_addr("http://localhost:2379").unwrap().to_string(),
            "127.0.0.1:2379"
        );
        assert!(bind_addr("http://127.0.0.1").is_err());
    }
}
