//! etcd's security flags ([`SecurityFlags`]) and what they become: each side's
//! [`TlsOptions`], the start-up checks of `https://` URLs, and the `--auto-tls` certificates.

use std::path::PathBuf;

use std::sync::Arc;

use clap::{ArgAction, Args};
use rustls::ServerConfig;
use serde::Deserialize;

use super::{Config, ConfigError, host_port, split_urls, url_host};
use crate::tls::client::PeerConnector;
use crate::tls::{TlsError, TlsOptions, TlsVersion, auto, options::split_suites};

/// etcd's client and peer TLS flags (`etcd --help`, "Security"), same names and defaults.
/// Boolean flags take Go's forms: `--client-cert-auth` or `--client-cert-auth=true`.
#[derive(Args, Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case", default)]
pub struct SecurityFlags {
    /// Path to the client server TLS cert file.
    #[arg(long)]
    pub cert_file: Option<PathBuf>,
    /// Path to the client server TLS key file.
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// Enable client cert authentication.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, value_parser = super::go_bool,
        default_value_t = false, default_missing_value = "true")]
    pub client_cert_auth: bool,
    /// Path to the client certificate revocation list file.
    #[arg(long)]
    pub client_crl_file: Option<PathBuf>,
    /// Path to the client server TLS trusted CA cert file.
    #[arg(long)]
    pub trusted_ca_file: Option<PathBuf>,
    /// Client TLS using generated certificates.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, value_parser = super::go_bool,
        default_value_t = false, default_missing_value = "true")]
    pub auto_tls: bool,
    /// Path to the peer server TLS cert file.
    #[arg(long)]
    pub peer_cert_file: Option<PathBuf>,
    /// Path to the peer server TLS key file.
    #[arg(long)]
    pub peer_key_file: Option<PathBuf>,
    /// Enable peer client cert authentication.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, value_parser = super::go_bool,
        default_value_t = false, default_missing_value = "true")]
    pub peer_client_cert_auth: bool,
    /// Path to the peer server TLS trusted CA file.
    #[arg(long)]
    pub peer_trusted_ca_file: Option<PathBuf>,
    /// Required CN for client certs connecting to the peer endpoint.
    #[arg(long, default_value = "")]
    pub peer_cert_allowed_cn: String,
    /// Peer TLS using self-generated certificates if --peer-key-file and --peer-cert-file
    /// are not provided.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, value_parser = super::go_bool,
        default_value_t = false, default_missing_value = "true")]
    pub peer_auto_tls: bool,
    /// Path to the peer certificate revocation list file.
    #[arg(long)]
    pub peer_crl_file: Option<PathBuf>,
    /// Comma-separated list of supported TLS cipher suites between client/server and peers
    /// (empty: rustls's set). TLS 1.3 suites are not configurable.
    #[arg(long, default_value = "")]
    pub cipher_suites: String,
    /// Minimum TLS version supported: TLS1.2 or TLS1.3.
    #[arg(long, default_value = "TLS1.2")]
    pub tls_min_version: String,
}

impl Default for SecurityFlags {
    fn default() -> SecurityFlags {
        Config::default().security
    }
}

impl Config {
    /// The client side's TLS settings (`--cert-file` ... and the shared version and suites).
    ///
    /// Errors: `--tls-min-version` does not parse.
    pub fn client_tls(&self) -> Result<TlsOptions, ConfigError> {
        let s = &self.security;
        Ok(TlsOptions {
            cert_file: s.cert_file.clone(),
            key_file: s.key_file.clone(),
            trusted_ca_file: s.trusted_ca_file.clone(),
            client_cert_auth: s.client_cert_auth,
            crl_file: s.client_crl_file.clone(),
            allowed_cn: None,
            auto_tls: s.auto_tls,
            min_version: TlsVersion::parse(&s.tls_min_version)?,
            cipher_suites: split_suites(&s.cipher_suites),
        })
    }

    /// The peer side's TLS settings (`--peer-cert-file` ...).
    ///
    /// Errors: `--tls-min-version` does not parse.
    pub fn peer_tls(&self) -> Result<TlsOptions, ConfigError> {
        let s = &self.security;
        Ok(TlsOptions {
            cert_file: s.peer_cert_file.clone(),
            key_file: s.peer_key_file.clone(),
            trusted_ca_file: s.peer_trusted_ca_file.clone(),
            client_cert_auth: s.peer_client_cert_auth,
            crl_file: s.peer_crl_file.clone(),
            allowed_cn: Some(s.peer_cert_allowed_cn.clone()).filter(|cn| !cn.is_empty()),
            auto_tls: s.peer_auto_tls,
            min_version: TlsVersion::parse(&s.tls_min_version)?,
            cipher_suites: split_suites(&s.cipher_suites),
        })
    }

    /// etcd's start-up checks of the security flags: the version and suites parse, and every
    /// `https://` client URL (listen or advertise) has `--cert-file`/`--key-file` or
    /// `--auto-tls`, every `https://` peer URL to listen on has the peer pair or
    /// `--peer-auto-tls`.
    ///
    /// Errors: etcd's texts ([`ConfigError::TlsHalfPair`], [`ConfigError::ClientTlsMissing`],
    /// [`ConfigError::PeerTlsMissing`], the `tlsutil` ones).
    pub fn check_security(&self) -> Result<(), ConfigError> {
        let client = self.client_tls()?;
        client.provider()?;
        let peer = self.peer_tls()?;
        let client_urls = split_urls(&self.listen_client_urls)
            .into_iter()
            .chain(split_urls(&self.advertise_client_urls));
        for url in client_urls {
            if is_https(&url) {
                half_pair(&client)?;
            }
            if is_https(&url) && !client.has_cert() && !client.auto_tls {
                return Err(ConfigError::ClientTlsMissing { url });
            }
        }
        for url in split_urls(&self.listen_peer_urls) {
            if is_https(&url) {
                half_pair(&peer)?;
            }
            if is_https(&url) && !peer.has_cert() && !peer.auto_tls {
                return Err(ConfigError::PeerTlsMissing {
                    host: host_port(&url).to_string(),
                });
            }
        }
        Ok(())
    }

    /// `--auto-tls` and `--peer-auto-tls`: when the side has no certificate and key, writes
    /// (or reuses) a self-signed pair under `<data-dir>/fixtures/{client,peer}` for the hosts
    /// of its listen URLs and points the side's cert/key flags at it. With files given, auto
    /// TLS is ignored with a warning, as in etcd.
    ///
    /// Errors: the pair cannot be generated or written.
    pub fn prepare_auto_tls(&mut self) -> Result<(), ConfigError> {
        let fixtures = self.data_dir().join("fixtures");
        let s = &mut self.security;
        if s.auto_tls {
            if s.cert_file.is_some() && s.key_file.is_some() {
                tracing::warn!("ignoring client auto TLS since certs given");
            } else {
                let hosts = hosts(&self.listen_client_urls);
                let (cert, key) = auto::self_signed(&fixtures.join("client"), &hosts)?;
                s.cert_file = Some(cert);
                s.key_file = Some(key);
            }
        }
        if s.peer_auto_tls {
            if s.peer_cert_file.is_some() && s.peer_key_file.is_some() {
                tracing::warn!("ignoring peer auto TLS since certs given");
                s.peer_auto_tls = false;
            } else {
                let hosts = hosts(&self.listen_peer_urls);
                let (cert, key) = auto::self_signed(&fixtures.join("peer"), &hosts)?;
                s.peer_cert_file = Some(cert);
                s.peer_key_file = Some(key);
            }
        }
        Ok(())
    }
}

/// etcd's refusal of a side with only one of `cert_file` and `key_file` (an empty path is
/// none), checked before auto TLS: etcd ignores `--auto-tls` once either file is given.
///
/// Errors: [`ConfigError::TlsHalfPair`].
fn half_pair(side: &TlsOptions) -> Result<(), ConfigError> {
    let given = |p: &Option<PathBuf>| {
        p.as_ref()
            .filter(|p| !p.as_os_str().is_empty())
            .map(|p| p.display().to_string())
    };
    match (given(&side.cert_file), given(&side.key_file)) {
        (Some(cert), None) => Err(ConfigError::TlsHalfPair {
            key: String::new(),
            cert,
        }),
        (None, Some(key)) => Err(ConfigError::TlsHalfPair {
            key,
            cert: String::new(),
        }),
        _ => Ok(()),
    }
}

/// The rustls server config of a listener of the side `options` describes (client or peer),
/// after [`Config::prepare_auto_tls`].
///
/// Errors: the side has no certificate/key; its files or settings cannot be used.
pub fn listener_tls(options: &TlsOptions) -> Result<Arc<ServerConfig>, ConfigError> {
    match (&options.cert_file, &options.key_file) {
        (Some(cert), Some(key)) => Ok(crate::tls::server::server_config(options, cert, key)?),
        _ => Err(ConfigError::Tls(TlsError::Rustls(
            "a TLS listener needs a certificate and key".into(),
        ))),
    }
}

impl Config {
    /// The connector of outgoing `https://` peer connections: the peer certificate as client
    /// certificate, the peer CA as trust, no verification with `--peer-auto-tls`.
    ///
    /// Errors: unusable peer files or settings.
    pub fn peer_connector(&self) -> Result<PeerConnector, ConfigError> {
        let options = self.peer_tls()?;
        let skip_verify = options.auto_tls;
        Ok(PeerConnector::new(options, skip_verify)?)
    }
}

/// Whether `url` is an `https://` URL.
pub fn is_https(url: &str) -> bool {
    url.starts_with("https://")
}

/// The distinct hosts of a URL list (without ports or brackets).
fn hosts(urls: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for url in split_urls(urls) {
        let host = url_host(&url).to_string();
        if !out.contains(&host) {
            out.push(host);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn parse(args: &[&str]) -> Result<(), ConfigError> {
        let mut c = Config::parse_from(std::iter::once("keel").chain(args.iter().copied()));
        c.normalize()
    }

    #[test]
    fn https_urls_need_their_certificates_with_etcds_texts() {
        assert_eq!(
            parse(&["--listen-client-urls", "https://127.0.0.1:1"])
                .unwrap_err()
                .to_string(),
            "TLS key/cert (--cert-file, --key-file) must be provided for client url \
             https://127.0.0.1:1 with HTTPS scheme"
        );
        assert_eq!(
            parse(&["--listen-peer-urls", "https://127.0.0.1:2"])
                .unwrap_err()
                .to_string(),
            "cannot listen on TLS for 127.0.0.1:2: KeyFile and CertFile are not presented"
        );
        parse(&[
            "--listen-client-urls",
            "https://127.0.0.1:1",
            "--advertise-client-urls",
            "https://127.0.0.1:1",
            "--auto-tls",
        ])
        .unwrap();
        assert_eq!(
            parse(&["--tls-min-version", "TLS1.0"])
                .unwrap_err()
                .to_string(),
            "unexpected TLS version \"TLS1.0\" (must be one of: TLS1.2, TLS1.3)"
        );
    }

    #[test]
    fn boolean_flags_take_gos_forms_and_yaml_keys_are_etcds() {
        let c = Config::parse_from(["keel", "--client-cert-auth", "--peer-auto-tls=true"]);
        assert!(c.security.client_cert_auth && c.security.peer_auto_tls);
        assert!(!c.security.auto_tls);
        assert_eq!(c.security.tls_min_version, "TLS1.2");
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("keel.yaml");
        std::fs::write(
            &p,
            "cert-file: /c.pem\nclient-cert-auth: true\npeer-cert-allowed-cn: m\n",
        )
        .unwrap();
        let c = Config::from_yaml_file(&p).unwrap();
        assert_eq!(c.security.cert_file, Some(PathBuf::from("/c.pem")));
        assert!(c.security.client_cert_auth);
        assert_eq!(c.peer_tls().unwrap().allowed_cn.as_deref(), Some("m"));
        assert_eq!(c.security.tls_min_version, "TLS1.2");
    }

    #[test]
    fn auto_tls_writes_into_the_data_dir_unless_files_are_given() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("d");
        let mut c = Config::parse_from([
            "keel",
            "--data-dir",
            data.to_str().unwrap(),
            "--auto-tls",
            "--peer-auto-tls",
            "--peer-cert-file",
            "/p.pem",
            "--peer-key-file",
            "/p.key",
        ]);
        c.prepare_auto_tls().unwrap();
        assert_eq!(
            c.security.cert_file,
            Some(data.join("fixtures/client/cert.pem"))
        );
        assert!(data.join("fixtures/client/key.pem").is_file());
        assert_eq!(c.security.peer_cert_file, Some(PathBuf::from("/p.pem")));
        assert!(!c.security.peer_auto_tls, "given files win over auto TLS");
        assert_eq!(
            hosts("http://127.0.0.1:1,https://localhost:2,http://[::1]:3"),
            ["127.0.0.1", "localhost", "::1"]
        );
    }
}
