//! TLS for the client and peer listeners and for the peer client, on rustls (ring provider).
//!
//! etcd's model (`client/pkg/transport/listener.go`, `server/embed/config.go`): a listener
//! whose URL is `https://` serves TLS with `--cert-file`/`--key-file` (peers:
//! `--peer-cert-file`/`--peer-key-file`); `--client-cert-auth` requires a client certificate
//! that chains to `--trusted-ca-file` and is not in `--client-crl-file`; the peer side adds
//! `--peer-cert-allowed-cn`. `--auto-tls` writes a self-signed certificate to the data dir.
//!
//! - [`options`]: one side's settings ([`TlsOptions`]), `--tls-min-version`, `--cipher-suites`;
//! - [`files`]: PEM files (certificates, keys, CRLs) and their change stamps;
//! - [`reload`]: the certificate resolver and client verifier that re-read their files when
//!   they change on disk, per handshake (an unreadable, mismatched or expired new certificate is
//!   logged and the old one keeps serving);
//! - [`server`]: the rustls server config and the accept loop that hands tonic TLS streams;
//! - [`client`]: the peer client's connector (the peer certificate as client certificate);
//! - [`auto`]: `--auto-tls` / `--peer-auto-tls` certificates;
//! - [`identity`]: the Common Name of a verified client certificate, per request.
//!
//! Invariant: a handshake only ever uses a certificate/key pair that matched and was valid
//! when it was loaded, and a client certificate is accepted only after webpki verified it
//! against the trusted CAs current at that handshake.

/// The signature checks of a rustls certificate verifier, by the provider in field `$field`
/// (the same for the client verifier and the auto-TLS server verifier).
macro_rules! signature_checks {
    ($field:tt) => {
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &rustls_pki_types::CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            let algorithms = &self.$field.signature_verification_algorithms;
            rustls::crypto::verify_tls12_signature(message, cert, dss, algorithms)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &rustls_pki_types::CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            let algorithms = &self.$field.signature_verification_algorithms;
            rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms)
        }

        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.$field
                .signature_verification_algorithms
                .supported_schemes()
        }
    };
}

pub mod auto;
pub mod client;
pub mod files;
pub mod identity;
pub mod options;
pub mod reload;
pub mod server;

pub use options::{TlsOptions, TlsVersion};

use std::path::PathBuf;

/// Why TLS cannot be set up (texts follow etcd's where etcd has one).
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file cannot be read or holds no usable PEM item.
    #[error("cannot load {what} {}: {detail}", path.display())]
    File {
        /// What the file should hold ("certificate", "key", "CA", "CRL").
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The reader's or parser's error.
        detail: String,
    },
    /// A certificate/key pair Go's `tls.X509KeyPair` refuses, with Go's text (what etcd
    /// prints): switched files, a certificate in the key file, a key that does not match
    /// ([`files::SWITCHED_INPUTS`], [`files::CERT_AS_KEY`], [`files::KEY_MISMATCH`]).
    #[error("{0}")]
    GoKeyPair(&'static str),
    /// The certificate does not suit the key, or rustls refuses it.
    #[error("invalid certificate/key {}: {detail}", path.display())]
    Pair {
        /// The certificate file.
        path: PathBuf,
        /// rustls's reason.
        detail: String,
    },
    /// The certificate's validity has ended.
    #[error("certificate {} expired at {not_after} (unix seconds)", path.display())]
    Expired {
        /// The certificate file.
        path: PathBuf,
        /// Its `notAfter`.
        not_after: i64,
    },
    /// etcd's `tlsutil.GetTLSVersion` error.
    #[error("unexpected TLS version {0:?} (must be one of: TLS1.2, TLS1.3)")]
    Version(String),
    /// etcd's `tlsutil.GetCipherSuite` error (also for a Go suite rustls does not implement).
    #[error("unexpected TLS cipher suite {0:?}")]
    CipherSuite(String),
    /// etcd's check: TLS 1.3 suites are not configurable.
    #[error("cipher suites cannot be configured when only TLS1.3 is enabled")]
    CiphersWithTls13,
    /// rustls refused the configuration (e.g. no CA certificate usable as a trust anchor).
    #[error("TLS configuration: {0}")]
    Rustls(String),
    /// `--auto-tls` could not generate or write its certificate.
    #[error("cannot generate a self-signed certificate in {}: {detail}", dir.display())]
    Auto {
        /// The directory.
        dir: PathBuf,
        /// The reason.
        detail: String,
    },
}
