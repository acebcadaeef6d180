//! The flags operators use around a member ([`OperatorFlags`]): the metrics listener and
//! level, logging, gRPC keepalive and stream limits, and etcd's raft toggles Keel accepts
//! for compatibility; plus the check that names etcd flags Keel does not implement
//! ([`unsupported_etcd_flag`]). docs/operations.md lists them; docs/compat.md the
//! differences.

use clap::{ArgAction, Args};
use serde::Deserialize;

use super::{Config, ConfigError, GoDuration, bind_addr, go_scheme, split_urls};

/// Operator flags, etcd's names and defaults (`etcd --help`, "Member", "Logging",
/// "Profiling and Monitoring").
#[derive(Args, Debug, Clone, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
pub struct OperatorFlags {
    /// List of URLs to listen on for the metrics and health endpoints (`/metrics`,
    /// `/health`, `/livez`, `/readyz`), comma-separated.
    #[arg(long, default_value = "")]
    pub listen_metrics_urls: String,
    /// Set level of detail for exported metrics: `basic`, or `extensive` to add the
    /// `grpc_server_handling_seconds` histograms.
    #[arg(long, default_value = "basic", value_parser = ["basic", "extensive"])]
    pub metrics: String,
    /// Logger: `zap` (etcd's structured logger; Keel logs with tracing in the same shape).
    #[arg(long, default_value = "zap", value_parser = ["zap"])]
    pub logger: String,
    /// Where to write logs: `default` (stderr), `stderr`, `stdout`, or file paths,
    /// comma-separated.
    #[arg(long, default_value = "default")]
    pub log_outputs: String,
    /// Log format: `json` or `console`. Keel's default is `console` (etcd's is `json`:
    /// docs/compat.md), the format Keel always logged in and its tests read.
    #[arg(long, default_value = "console", value_parser = ["json", "console"])]
    pub log_format: String,
    /// Enable runtime profiling data via HTTP server (Go's pprof). Not supported by Keel:
    /// accepted with a warning (docs/compat.md).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, value_parser = super::go_bool,
        default_value_t = false, default_missing_value = "true")]
    pub enable_pprof: bool,
    /// Minimum duration interval that a client should wait before pinging the server
    /// (accepted; Keel does not police client pings, docs/compat.md).
    #[arg(long, default_value = "5s")]
    pub grpc_keepalive_min_time: GoDuration,
    /// Frequency duration of server-to-client ping to check if a connection is alive
    /// (0 to disable).
    #[arg(long, default_value = "2h")]
    pub grpc_keepalive_interval: GoDuration,
    /// Additional duration of wait before closing a non-responsive connection (0 to
    /// disable).
    #[arg(long, default_value = "20s")]
    pub grpc_keepalive_timeout: GoDuration,
    /// Maximum concurrent streams that each client can open at a time.
    #[arg(long, default_value_t = u32::MAX)]
    pub max_concurrent_streams: u32,
    /// Reject reconfiguration requests that would cause quorum loss. Keel always checks:
    /// `false` is accepted with a warning (docs/compat.md).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, value_parser = super::go_bool,
        default_value_t = true, default_missing_value = "true")]
    pub strict_reconfig_check: bool,
    /// Enable the raft pre-vote algorithm to prevent disruption when a partitioned member
    /// rejoins (Raft thesis §9.6; etcd's `--pre-vote`, default `true` since etcd 3.5): before
    /// raising its term a member asks the voters whether they would elect it. Independently,
    /// a member always refuses votes while it hears from a leader (openraft's leader lease).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, value_parser = super::go_bool,
        default_value_t = true, default_missing_value = "true")]
    pub pre_vote: bool,
    /// Comma-separated whitelist of origins for CORS (cross-origin resource sharing) on the
    /// client URLs' HTTP endpoints; `*` (the default) allows every origin, empty none. Each
    /// origin is a URL `scheme://host:port` without a path (etcd's `types.NewURLs` rules).
    #[arg(long, default_value = "*")]
    pub cors: String,
}

/// The origins `--cors` allows ([`OperatorFlags::cors_origins`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CorsOrigins {
    /// `*`: every answer carries `Access-Control-Allow-Origin: *`.
    Any,
    /// Only a request whose `Origin` header is one of these (compared as written) gets
    /// the CORS headers, with its own origin; empty: no request does.
    Listed(std::collections::BTreeSet<String>),
}

impl Default for OperatorFlags {
    fn default() -> OperatorFlags {
        Config::default().operator
    }
}

impl OperatorFlags {
    /// Start-up checks: every `--listen-metrics-urls` URL resolves to an address to bind,
    /// every `--log-outputs` target is one Keel can write to.
    ///
    /// Errors: the URL's resolve error; `FlagValue` for `systemd/journal` (not supported).
    pub fn check(&self) -> Result<(), ConfigError> {
        self.cors_origins()?;
        for url in split_urls(&self.listen_metrics_urls) {
            bind_addr(&url)?;
        }
        for output in split_urls(&self.log_outputs) {
            if output == "systemd/journal" {
                return Err(ConfigError::FlagValue {
                    flag: "log-outputs",
                    value: output,
                    reason: "systemd/journal is not supported; use stderr (journald reads a unit's stderr)".into(),
                });
            }
        }
        Ok(())
    }

    /// What an operator should know about the flags given: etcd flags Keel accepts but
    /// cannot act on (logged at start-up).
    pub fn warnings(&self) -> Vec<&'static str> {
        let mut w = Vec::new();
        if self.enable_pprof {
            w.push("--enable-pprof: Go's pprof endpoints are not supported by Keel; ignored (docs/compat.md)");
        }
        if !self.strict_reconfig_check {
            w.push("--strict-reconfig-check=false: Keel always rejects reconfigurations that would lose quorum");
        }
        w
    }

    /// `--cors` parsed as etcd parses it (`flags.NewUniqueURLsWithExceptions("*", "*")`, then
    /// `types.NewURLs` over Go's `url.Parse`): exactly `*`, or a comma-separated list of URLs
    /// (each trimmed), each with an `http`, `https`, `unix` or `unixs` scheme, a `host:port`
    /// and no path. Listed origins are kept as Go's `url.String()` prints them (the scheme
    /// lower-cased, an empty fragment dropped): that is what a request's `Origin` must equal.
    ///
    /// Errors: `BadUrl` with etcd's text for the first URL that breaks a rule.
    pub fn cors_origins(&self) -> Result<CorsOrigins, ConfigError> {
        if self.cors == "*" {
            return Ok(CorsOrigins::Any);
        }
        let mut origins = std::collections::BTreeSet::new();
        for url in self.cors.split(',').map(str::trim) {
            let origin = cors_origin(url).map_err(|reason| ConfigError::BadUrl {
                flag: "cors",
                value: self.cors.clone(),
                reason,
            })?;
            origins.insert(origin);
        }
        Ok(CorsOrigins::Listed(origins))
    }

    /// Whether `--metrics extensive` is set.
    pub fn extensive_metrics(&self) -> bool {
        self.metrics == "extensive"
    }

    /// The server's HTTP/2 ping interval (`None`: off).
    pub fn keepalive_interval(&self) -> Option<std::time::Duration> {
        Some(self.grpc_keepalive_interval.0).filter(|d| !d.is_zero())
    }

    /// How long the server waits for a ping's answer (`None`: hyper's default).
    pub fn keepalive_timeout(&self) -> Option<std::time::Duration> {
        Some(self.grpc_keepalive_timeout.0).filter(|d| !d.is_zero())
    }
}

/// One `--cors` URL checked as `types.NewURLs` checks it, in Go's `url.String()` form.
/// Go's parse errors come first (a colon before any scheme, a bad `%` escape or port in the
/// host), then etcd's rules (scheme, `host:port`, no path).
///
/// Errors: the reason, as etcd prints it after the flag name.
fn cors_origin(url: &str) -> Result<String, String> {
    let (main, fragment) = url.split_once('#').unwrap_or((url, ""));
    let bad_scheme = || format!("URL scheme must be http, https, unix, or unixs: {url}");
    let Some(scheme) = go_scheme(main) else {
        if main.split('/').next().unwrap_or("").contains(':') {
            return Err(format!(
                "parse {url:?}: first path segment in URL cannot contain colon"
            ));
        }
        return Err(bad_scheme());
    };
    let rest = &main[scheme.len() + 1..];
    let (authority, tail) = match rest.strip_prefix("//") {
        Some(r) => r.split_at(r.find(['/', '?']).unwrap_or(r.len())),
        None => ("", rest),
    };
    if let Some(i) = authority.find('%') {
        let escape = authority.get(i..i + 3).unwrap_or(&authority[i..]);
        if escape.len() < 3 || !escape[1..].bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("parse {url:?}: invalid URL escape {escape:?}"));
        }
    }
    // Go's url.Parse: what follows the host's last colon (after an IPv6 `]`) is digits.
    let host_end = authority.rfind(']').map_or(0, |i| i + 1);
    if let Some(colon) = authority[host_end..].rfind(':') {
        let port = &authority[host_end + colon..];
        if !port[1..].bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("parse {url:?}: invalid port {port:?} after host"));
        }
    }
    let scheme = scheme.to_ascii_lowercase();
    if !["http", "https", "unix", "unixs"].contains(&scheme.as_str()) {
        return Err(bad_scheme());
    }
    // net.SplitHostPort: one colon, or a bracketed IPv6 host then a colon.
    let host_port = match authority.strip_prefix('[') {
        Some(v6) => v6.split_once(']').is_some_and(|(_, p)| p.starts_with(':')),
        None => authority.matches(':').count() == 1,
    };
    if !host_port {
        return Err(format!(
            "URL address does not have the form \"host:port\": {url}"
        ));
    }
    let (path, query) = tail.split_at(tail.find('?').unwrap_or(tail.len()));
    if !path.is_empty() {
        return Err(format!("URL must not contain a path: {url}"));
    }
    let fragment = if fragment.is_empty() {
        String::new()
    } else {
        format!("#{fragment}")
    };
    Ok(format!("{scheme}://{authority}{query}{fragment}"))
}

/// etcd flags that Keel does not implement. A command line that uses one fails with a
/// message naming it, instead of clap's generic "unexpected argument".
pub(crate) const UNSUPPORTED_ETCD_FLAGS: &[&str] = &[
    "discovery",
    "discovery-srv",
    "discovery-srv-name",
    "discovery-fallback",
    "discovery-proxy",
    "discovery-token",
    "discovery-endpoints",
    "enable-v2",
    "enable-grpc-gateway",
    "proxy",
    "proxy-failure-wait",
    "proxy-refresh-interval",
    "proxy-dial-timeout",
    "proxy-write-timeout",
    "proxy-read-timeout",
    "unsafe-no-fsync",
    "initial-election-tick-advance",
    "listen-client-http-urls",
    "enable-log-rotation",
    "log-rotation-config-json",
    "socket-reuse-port",
    "socket-reuse-address",
    "host-whitelist",
    "self-signed-cert-validity",
    "client-cert-file",
    "client-key-file",
    "peer-cert-allowed-hostname",
    "client-cert-allowed-hostname",
    "experimental-compaction-batch-limit",
    "experimental-enable-distributed-tracing",
    "experimental-enable-lease-checkpoint",
    "experimental-memory-mlock",
    "experimental-txn-mode-write-with-shared-buffer",
    "experimental-warning-apply-duration",
    "experimental-bootstrap-defrag-threshold-megabytes",
    "experimental-stop-grpc-service-on-defrag",
    "feature-gates",
];

/// The first argument of `args` (a command line, program name first) that is an etcd flag
/// Keel does not implement (`--discovery=x` or `--discovery x`), as `--name`.
pub fn unsupported_etcd_flag<S: AsRef<str>>(args: &[S]) -> Option<String> {
    args.iter().skip(1).find_map(|arg| {
        let name = arg.as_ref().strip_prefix("--")?;
        let name = name.split_once('=').map_or(name, |(n, _)| n);
        UNSUPPORTED_ETCD_FLAGS
            .contains(&name)
            .then(|| format!("--{name}"))
    })
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    /// A flag Keel implements must never be reported as unsupported (a fresh-user check found
    /// the corruption-check flags still listed after they were built).
    #[test]
    fn no_unsupported_flag_is_one_keel_accepts() {
        let command = crate::config::Config::command();
        let accepted: Vec<&str> = command
            .get_arguments()
            .filter_map(|a| a.get_long())
            .collect();
        for flag in UNSUPPORTED_ETCD_FLAGS {
            assert!(
                !accepted.contains(flag),
                "--{flag} is accepted by Keel yet listed as unsupported"
            );
        }
        for built in [
            "experimental-initial-corrupt-check",
            "auto-compaction-mode",
            "auto-compaction-retention",
            "experimental-compact-hash-check-enabled",
            "experimental-compact-hash-check-time",
            "force-new-cluster",
            "max-snapshots",
            "max-wals",
        ] {
            assert!(accepted.contains(&built), "--{built}");
        }
    }

    #[test]
    fn defaults_match_etcd() {
        let f = Config::default().operator;
        assert_eq!(f.listen_metrics_urls, "");
        assert_eq!(
            (f.metrics.as_str(), f.extensive_metrics()),
            ("basic", false)
        );
        assert_eq!(
            (
                f.logger.as_str(),
                f.log_outputs.as_str(),
                f.log_format.as_str()
            ),
            ("zap", "default", "console")
        );
        assert_eq!(f.grpc_keepalive_min_time.0.as_secs(), 5);
        assert_eq!(f.keepalive_interval().unwrap().as_secs(), 7200);
        assert_eq!(f.keepalive_timeout().unwrap().as_secs(), 20);
        assert_eq!(f.max_concurrent_streams, u32::MAX);
        assert!(f.strict_reconfig_check && f.pre_vote && !f.enable_pprof);
        assert_eq!(f.cors_origins().unwrap(), CorsOrigins::Any);
    }

    #[test]
    fn cors_parses_as_etcds_url_list() {
        let parse = |v: &str| {
            let f = OperatorFlags {
                cors: v.into(),
                ..Config::default().operator
            };
            f.cors_origins().map_err(|e| e.to_string())
        };
        // Kept as Go's url.String() prints them: the form a request's Origin must have.
        assert_eq!(
            parse("HTTP://a.example:80, https://[::1]:8443,http://b:1#,unix://c:2?x=1#f"),
            Ok(CorsOrigins::Listed(
                [
                    "http://a.example:80",
                    "https://[::1]:8443",
                    "http://b:1",
                    "unix://c:2?x=1#f"
                ]
                .map(String::from)
                .into()
            ))
        );
        // etcd 3.4.23's texts for the same values.
        for (value, reason) in [
            (
                "http://a.example",
                "URL address does not have the form \"host:port\": http://a.example",
            ),
            (
                "http://a.example:80/x",
                "URL must not contain a path: http://a.example:80/x",
            ),
            (
                "*,http://a:1",
                "URL scheme must be http, https, unix, or unixs: *",
            ),
            (
                "a.example:80",
                "URL scheme must be http, https, unix, or unixs: a.example:80",
            ),
            ("", "URL scheme must be http, https, unix, or unixs: "),
            (
                "http://a:1,",
                "URL scheme must be http, https, unix, or unixs: ",
            ),
            (
                "http://a:b",
                "parse \"http://a:b\": invalid port \":b\" after host",
            ),
            (
                "http://%zz:1",
                "parse \"http://%zz:1\": invalid URL escape \"%zz\"",
            ),
            (
                "127.0.0.1:2379",
                "parse \"127.0.0.1:2379\": first path segment in URL cannot contain colon",
            ),
        ] {
            assert_eq!(
                parse(value),
                Err(format!("invalid value {value:?} for flag -cors: {reason}"))
            );
        }
    }

    #[test]
    fn flags_parse_in_gos_forms() {
        let c = Config::parse_from([
            "keel",
            "--metrics",
            "extensive",
            "--listen-metrics-urls",
            "http://127.0.0.1:2381",
            "--grpc-keepalive-interval",
            "0s",
            "--pre-vote=false",
            "--enable-pprof",
            "--log-format",
            "json",
        ]);
        let f = &c.operator;
        assert!(f.extensive_metrics());
        assert_eq!(f.listen_metrics_urls, "http://127.0.0.1:2381");
        assert_eq!(f.keepalive_interval(), None);
        assert!(!f.pre_vote && f.enable_pprof);
        assert_eq!(f.log_format, "json");
        assert!(Config::try_parse_from(["keel", "--metrics", "all"]).is_err());
        assert_eq!(f.warnings().len(), 1, "pprof; --pre-vote=false is honoured");
        assert!(f.check().is_ok());
        let mut bad = f.clone();
        bad.log_outputs = "stderr,systemd/journal".into();
        assert!(
            bad.check()
                .unwrap_err()
                .to_string()
                .contains("--log-outputs")
        );
        bad.log_outputs = "stderr".into();
        bad.listen_metrics_urls = "http://127.0.0.1".into();
        assert!(bad.check().is_err(), "a URL without a port");
    }

    /// Boolean flags take every spelling of Go's `strconv.ParseBool`, as etcd's do.
    #[test]
    fn boolean_flags_take_gos_spellings() {
        for (value, want) in [
            ("1", true),
            ("t", true),
            ("T", true),
            ("TRUE", true),
            ("True", true),
            ("0", false),
            ("f", false),
            ("F", false),
            ("FALSE", false),
            ("False", false),
        ] {
            let c = Config::parse_from([
                "keel".to_string(),
                format!("--pre-vote={value}"),
                format!("--client-cert-auth={value}"),
                format!("--force-new-cluster={value}"),
                format!("--experimental-initial-corrupt-check={value}"),
            ]);
            assert_eq!(c.operator.pre_vote, want, "--pre-vote={value}");
            assert_eq!(
                c.security.client_cert_auth, want,
                "--client-cert-auth={value}"
            );
            assert_eq!(c.recovery.force_new_cluster, want);
            assert_eq!(c.maintenance.experimental_initial_corrupt_check, want);
        }
        // Bare, a flag is true; etcd takes no separate value (`--pre-vote false`).
        assert!(
            Config::parse_from(["keel", "--strict-reconfig-check"])
                .operator
                .strict_reconfig_check
        );
        for bad in ["--pre-vote=yes", "--pre-vote=", "--enable-pprof=on"] {
            let err = Config::try_parse_from(["keel", bad])
                .unwrap_err()
                .to_string();
            assert!(err.contains("parse error"), "{bad}: {err}");
        }
    }

    #[test]
    fn an_unsupported_etcd_flag_is_named() {
        assert_eq!(
            unsupported_etcd_flag(&["keel", "--name", "a", "--discovery=https://x"]),
            Some("--discovery".to_string())
        );
        assert_eq!(
            unsupported_etcd_flag(&["keel", "--enable-v2"]),
            Some("--enable-v2".to_string())
        );
        assert_eq!(
            unsupported_etcd_flag(&["keel", "--force-new-cluster"]),
            None
        );
        assert_eq!(
            unsupported_etcd_flag(&["keel", "--name", "discovery"]),
            None
        );
    }
}
