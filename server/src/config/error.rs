//! [`ConfigError`]: why a member cannot start with its flags.

use std::path::PathBuf;

use crate::raft::dial_override::DialOverrideError;

/// A configuration that cannot be used; the texts are what `keel` prints before it exits.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `--config-file` cannot be read.
    #[error("cannot read --config-file {}: {error}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    /// `--config-file` is not valid YAML for these keys.
    #[error("invalid --config-file {}: {error}", path.display())]
    Yaml {
        /// The file.
        path: PathBuf,
        /// The parser's error.
        error: serde_norway::Error,
    },
    /// A URL-list flag that does not parse as etcd's (`config::check_urls`).
    #[error("invalid value {value:?} for flag -{flag}: {reason}")]
    BadUrl {
        /// The flag, without dashes.
        flag: &'static str,
        /// The flag's whole value.
        value: String,
        /// Go's parse error or etcd's scheme rule.
        reason: String,
    },
    /// `--heartbeat-interval 0` (etcd: `--heartbeat-interval must be >0`).
    #[error("--heartbeat-interval must be >0 (set to 0ms)")]
    HeartbeatZero,
    /// etcd's check of `--election-timeout` against `--heartbeat-interval`.
    #[error(
        "--election-timeout[{election}ms] should be at least as 5 times as --heartbeat-interval[{heartbeat}ms]"
    )]
    ElectionTimeout {
        /// `--election-timeout` (ms).
        election: u64,
        /// `--heartbeat-interval` (ms).
        heartbeat: u64,
    },
    /// `--election-timeout` above etcd's `maxElectionMs` ([`super::MAX_ELECTION_TIMEOUT_MS`]).
    #[error("--election-timeout[{election}ms] is too long, and should be set less than {max}ms")]
    ElectionTimeoutTooLong {
        /// `--election-timeout` (ms).
        election: u64,
        /// The limit (ms).
        max: u64,
    },
    /// `--experimental-peer-dial-override` does not parse.
    #[error(transparent)]
    DialOverride(#[from] DialOverrideError),
    /// A URL to listen on does not resolve to a socket address.
    #[error("cannot resolve {url}: {error}")]
    Resolve {
        /// The URL.
        url: String,
        /// The resolver's error.
        error: std::io::Error,
    },
    /// `--qos-config` cannot be read.
    #[error("cannot read --qos-config {}: {error}", path.display())]
    QosRead {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    /// `--qos-config` is not a valid rule file; the error names the field.
    #[error("invalid --qos-config {}: {error}", path.display())]
    QosRules {
        /// The file.
        path: PathBuf,
        /// The first problem, with its path (`rules[1].rate: must be > 0`).
        error: crate::qos::RuleError,
    },
    /// The `--qos-*-apply-lag` flags are out of order.
    #[error(transparent)]
    QosThresholds(#[from] crate::qos::ThresholdError),
    /// A URL to listen on resolves to nothing.
    #[error("{url} resolves to no address")]
    NoAddress {
        /// The URL.
        url: String,
    },
    /// A TLS setting or file that cannot be used (etcd's texts where it has one).
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    /// An `https://` client URL without `--cert-file`/`--key-file` or `--auto-tls`.
    #[error(
        "TLS key/cert (--cert-file, --key-file) must be provided for client url {url} with HTTPS scheme"
    )]
    ClientTlsMissing {
        /// The URL.
        url: String,
    },
    /// An `https://` URL whose side has only one of its certificate and key files (etcd
    /// `transport.TLSInfo.baseConfig`).
    #[error("KeyFile and CertFile must both be present[key: {key}, cert: {cert}]")]
    TlsHalfPair {
        /// The key file given (empty if none).
        key: String,
        /// The certificate file given (empty if none).
        cert: String,
    },
    /// An `https://` peer URL to listen on without `--peer-cert-file`/`--peer-key-file` or
    /// `--peer-auto-tls`.
    #[error("cannot listen on TLS for {host}: KeyFile and CertFile are not presented")]
    PeerTlsMissing {
        /// `host:port` of the URL.
        host: String,
    },
    /// An etcd flag Keel does not implement (`config::operator`).
    #[error("etcd flag {0} is not supported by Keel (docs/compat.md lists what is)")]
    UnsupportedEtcdFlag(String),
    /// A flag value Keel cannot honour (`--strict-reconfig-check=false`, a `--log-outputs`
    /// target it cannot open, ...).
    #[error("invalid value {value:?} for flag --{flag}: {reason}")]
    FlagValue {
        /// The flag, without `--`.
        flag: &'static str,
        /// The value given.
        value: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// `--auto-compaction-mode` is neither `periodic` nor `revision` (etcd's text).
    #[error("unknown auto-compaction-mode {0:?}")]
    CompactionMode(String),
    /// `--auto-compaction-retention` does not parse (etcd's text, with Go's parse error).
    #[error("error parsing CompactionRetention: {0}")]
    CompactionRetention(String),
}

impl ConfigError {
    /// The exit status of a start refused with this error, as etcd's: 2 for a flag value that
    /// does not parse (Go's `flag` package exits 2; Keel's own flags with a syntax of their
    /// own do the same), 1 for everything etcd refuses after parsing ("error verifying
    /// flags", TLS files, the config file).
    pub fn exit_code(&self) -> u8 {
        match self {
            ConfigError::DialOverride(_)
            | ConfigError::QosRead { .. }
            | ConfigError::QosRules { .. }
            | ConfigError::QosThresholds(_)
            // A flag the command line cannot take, like Go's "flag provided but not defined".
            | ConfigError::UnsupportedEtcdFlag(_)
            | ConfigError::BadUrl { .. } => 2,
            _ => 1,
        }
    }
}
