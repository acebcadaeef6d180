//! [`TlsOptions`]: the TLS settings of one side (client listeners or peers), and etcd's
//! `--tls-min-version` and `--cipher-suites` turned into a rustls crypto provider.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::{SupportedCipherSuite, SupportedProtocolVersion};

use super::TlsError;

/// `--tls-min-version`: etcd accepts `TLS1.2` (the default) and `TLS1.3`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TlsVersion {
    /// TLS 1.2 and 1.3.
    #[default]
    Tls12,
    /// TLS 1.3 only.
    Tls13,
}

impl TlsVersion {
    /// Parses etcd's spelling (`TLS1.2`, `TLS1.3`).
    ///
    /// Errors: [`TlsError::Version`] with etcd's text.
    pub fn parse(s: &str) -> Result<TlsVersion, TlsError> {
        match s {
            "TLS1.2" => Ok(TlsVersion::Tls12),
            "TLS1.3" => Ok(TlsVersion::Tls13),
            other => Err(TlsError::Version(other.to_string())),
        }
    }

    /// The protocol versions a handshake may use.
    pub fn versions(self) -> &'static [&'static SupportedProtocolVersion] {
        static BOTH: &[&SupportedProtocolVersion] =
            &[&rustls::version::TLS13, &rustls::version::TLS12];
        static ONLY_13: &[&SupportedProtocolVersion] = &[&rustls::version::TLS13];
        match self {
            TlsVersion::Tls12 => BOTH,
            TlsVersion::Tls13 => ONLY_13,
        }
    }
}

/// The TLS settings of one side of a member, from etcd's flags (`--cert-file`, `--key-file`,
/// `--trusted-ca-file`, `--client-cert-auth`, `--client-crl-file`, `--auto-tls` for clients;
/// the `--peer-*` ones for peers) plus the shared `--tls-min-version` and `--cipher-suites`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// PEM certificate chain this side presents (server certificate; for peers also the
    /// client certificate of outgoing connections).
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
    /// PEM CA certificates that client certificates (and, for peers, the other members'
    /// server certificates) must chain to.
    pub trusted_ca_file: Option<PathBuf>,
    /// Require and verify a client certificate (etcd `RequireAndVerifyClientCert`).
    pub client_cert_auth: bool,
    /// PEM certificate revocation list checked against client certificates.
    pub crl_file: Option<PathBuf>,
    /// Peers only: the Common Name a peer's client certificate must carry (empty: any).
    pub allowed_cn: Option<String>,
    /// Generate a self-signed certificate into the data dir when no cert/key is given.
    pub auto_tls: bool,
    /// `--tls-min-version`.
    pub min_version: TlsVersion,
    /// `--cipher-suites`: Go's names of the TLS 1.2 suites allowed (empty: rustls's set).
    pub cipher_suites: Vec<String>,
}

impl TlsOptions {
    /// Whether a certificate and key are configured (etcd's `TLSInfo.Empty()` is the negation).
    pub fn has_cert(&self) -> bool {
        self.cert_file.is_some() && self.key_file.is_some()
    }

    /// The ring provider restricted to `--cipher-suites` (TLS 1.3 suites always stay: as in
    /// Go, they are not configurable).
    ///
    /// Errors: an unknown or unsupported suite name; suites given with `--tls-min-version
    /// TLS1.3` (etcd's texts).
    pub fn provider(&self) -> Result<Arc<CryptoProvider>, TlsError> {
        let mut provider = rustls::crypto::ring::default_provider();
        if !self.cipher_suites.is_empty() {
            if self.min_version == TlsVersion::Tls13 {
                return Err(TlsError::CiphersWithTls13);
            }
            let mut chosen: Vec<SupportedCipherSuite> = provider
                .cipher_suites
                .iter()
                .copied()
                .filter(|s| s.version() == &rustls::version::TLS13)
                .collect();
            for name in &self.cipher_suites {
                chosen.push(tls12_suite(name)?);
            }
            provider.cipher_suites = chosen;
        }
        Ok(Arc::new(provider))
    }
}

/// The TLS 1.2 suite Go calls `name` (IANA's name; Go's short `..._CHACHA20_POLY1305` alias
/// is accepted too).
fn tls12_suite(name: &str) -> Result<SupportedCipherSuite, TlsError> {
    let wanted = match name {
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305" | "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305" => {
            format!("{name}_SHA256")
        }
        other => other.to_string(),
    };
    rustls::crypto::ring::ALL_CIPHER_SUITES
        .iter()
        .copied()
        .find(|s| s.version() == &rustls::version::TLS12 && format!("{:?}", s.suite()) == wanted)
        .ok_or_else(|| TlsError::CipherSuite(name.to_string()))
}

/// Splits etcd's comma-separated `--cipher-suites` value.
pub fn split_suites(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_use_etcds_names() {
        assert_eq!(TlsVersion::parse("TLS1.2").unwrap(), TlsVersion::Tls12);
        assert_eq!(TlsVersion::parse("TLS1.3").unwrap().versions().len(), 1);
        assert_eq!(
            TlsVersion::parse("TLS1.1").unwrap_err().to_string(),
            "unexpected TLS version \"TLS1.1\" (must be one of: TLS1.2, TLS1.3)"
        );
    }

    #[test]
    fn cipher_suites_restrict_tls12_and_keep_tls13() {
        let options = TlsOptions {
            cipher_suites: split_suites(
                "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
            ),
            ..TlsOptions::default()
        };
        let provider = options.provider().unwrap();
        let tls12: Vec<String> = provider
            .cipher_suites
            .iter()
            .filter(|s| s.version() == &rustls::version::TLS12)
            .map(|s| format!("{:?}", s.suite()))
            .collect();
        assert_eq!(
            tls12,
            [
                "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
                "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"
            ]
        );
        assert_eq!(
            provider
                .cipher_suites
                .iter()
                .filter(|s| s.version() == &rustls::version::TLS13)
                .count(),
            3
        );
        let bad = TlsOptions {
            cipher_suites: vec!["TLS_RSA_WITH_RC4_128_SHA".into()],
            ..TlsOptions::default()
        };
        assert_eq!(
            bad.provider().unwrap_err().to_string(),
            "unexpected TLS cipher suite \"TLS_RSA_WITH_RC4_128_SHA\""
        );
        let only13 = TlsOptions {
            min_version: TlsVersion::Tls13,
            ..options
        };
        assert_eq!(
            only13.provider().unwrap_err().to_string(),
            "cipher suites cannot be configured when only TLS1.3 is enabled"
        );
    }
}
