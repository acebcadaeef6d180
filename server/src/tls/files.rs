//! PEM files: certificate chains, private keys, CA bundles and CRLs (parsed by
//! rustls-pki-types), and [`Stamp`], how a reloader notices that a file changed.

use std::path::Path;
use std::time::SystemTime;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};

use super::TlsError;

/// Go's `tls.X509KeyPair` text for a certificate file that holds a private key and no
/// certificate (the two files given the other way round).
pub const SWITCHED_INPUTS: &str = "tls: failed to find certificate PEM data in certificate input, but did find a private key; PEM inputs may have been switched";
/// Go's `tls.X509KeyPair` text for a key file that holds a certificate and no key.
pub const CERT_AS_KEY: &str =
    "tls: found a certificate rather than a key in the PEM for the private key";
/// Go's `tls.X509KeyPair` text for a key that is not the certificate's.
pub const KEY_MISMATCH: &str = "tls: private key does not match public key";

/// The certificate chain at `cert` and the key at `key`, refused with Go's texts where
/// etcd's `tls.X509KeyPair` would refuse them: [`SWITCHED_INPUTS`], [`CERT_AS_KEY`] (the
/// key/certificate match is checked by the caller, [`KEY_MISMATCH`]).
///
/// Errors: those; otherwise as [`certs`] and [`key`].
pub fn pair(
    cert: &Path,
    key_path: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
    let chain = match certs(cert, "certificate") {
        Err(_) if key(cert).is_ok() => return Err(TlsError::GoKeyPair(SWITCHED_INPUTS)),
        other => other?,
    };
    let key_der = match key(key_path) {
        Err(_) if certs(key_path, "key").is_ok() => return Err(TlsError::GoKeyPair(CERT_AS_KEY)),
        other => other?,
    };
    Ok((chain, key_der))
}

/// Every certificate in the PEM file `path` (a chain, leaf first; or a CA bundle).
///
/// Errors: the file cannot be read, a block does not parse, or it holds no certificate.
pub fn certs(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let fail = |detail: String| TlsError::File {
        what,
        path: path.to_path_buf(),
        detail,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| fail(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| fail(e.to_string()))?;
    if certs.is_empty() {
        return Err(fail("no CERTIFICATE block".into()));
    }
    Ok(certs)
}

/// The first private key (PKCS#8, PKCS#1 or SEC1) in the PEM file `path`.
///
/// Errors: the file cannot be read or holds no key.
pub fn key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsError::File {
        what: "key",
        path: path.to_path_buf(),
        detail: e.to_string(),
    })
}

/// Every CRL in the PEM file `path` (`X509 CRL` blocks).
///
/// Errors: the file cannot be read or a block does not parse.
pub fn crls(path: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>, TlsError> {
    let fail = |detail: String| TlsError::File {
        what: "CRL",
        path: path.to_path_buf(),
        detail,
    };
    CertificateRevocationListDer::pem_file_iter(path)
        .map_err(|e| fail(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| fail(e.to_string()))
}

/// What a reloader compares to notice a change: (modification time, length) of each file,
/// `None` for one that cannot be stat'ed. Renewal tools replace files (rename) or rewrite
/// them; either changes the stamp.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Stamp(Vec<Option<(SystemTime, u64)>>);

impl Stamp {
    /// The stamp of `paths` now (one `stat` each).
    pub fn of<'a>(paths: impl IntoIterator<Item = &'a Path>) -> Stamp {
        Stamp(
            paths
                .into_iter()
                .map(|p| {
                    std::fs::metadata(p)
                        .ok()
                        .and_then(|m| Some((m.modified().ok()?, m.len())))
                })
                .collect(),
        )
    }
}

/// The `notAfter` of a DER certificate, in unix seconds (`None` if it does not parse).
pub fn not_after(cert: &CertificateDer<'_>) -> Option<i64> {
    x509_parser::parse_x509_certificate(cert.as_ref())
        .ok()
        .map(|(_, c)| c.validity().not_after.timestamp())
}

/// Unix seconds now.
pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}
