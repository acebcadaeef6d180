//! Certificates and trust that follow their files: etcd re-reads its certificate files on
//! every handshake (`tlsutil.NewCert` in `GetCertificate`/`GetClientCertificate`); Keel stats
//! them on every handshake and re-reads them when their [`Stamp`] changed.
//!
//! A renewal that cannot be used — a file that does not parse, a key that does not match the
//! certificate, a certificate whose `notAfter` has passed — is logged (`warn`) and the
//! previous certificate or trust keeps serving; the next change of the files is tried again.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustls::crypto::CryptoProvider;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DistinguishedName, RootCertStore};
use rustls_pki_types::{CertificateDer, UnixTime};

use super::TlsError;
use super::files::{self, Stamp};
use super::identity::common_name;

/// Loads the certificate chain at `cert` with the key at `key`.
///
/// Errors: either file unusable, a key that does not match, a leaf past its `notAfter`.
pub fn load_pair(
    cert: &Path,
    key: &Path,
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, TlsError> {
    let (chain, key_der) = files::pair(cert, key)?;
    if let Some(not_after) = files::not_after(&chain[0])
        && not_after < files::unix_now()
    {
        return Err(TlsError::Expired {
            path: cert.to_path_buf(),
            not_after,
        });
    }
    let pair = CertifiedKey::from_der(chain, key_der, provider).map_err(|e| match e {
        rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
            TlsError::GoKeyPair(files::KEY_MISMATCH)
        }
        e => TlsError::Pair {
            path: cert.to_path_buf(),
            detail: e.to_string(),
        },
    })?;
    Ok(Arc::new(pair))
}

/// A value built from files, rebuilt when their stamp changes.
#[derive(Debug)]
struct Reloaded<T> {
    stamp: Stamp,
    current: T,
}

/// Re-stats `paths`; when the stamp changed, tries `load` and keeps the old value (with a
/// warning naming `what`) if it fails. Returns the value to use now.
fn refresh<T: Clone>(
    state: &Mutex<Reloaded<T>>,
    paths: &[&Path],
    what: &str,
    load: impl FnOnce() -> Result<T, TlsError>,
) -> T {
    let stamp = Stamp::of(paths.iter().copied());
    let mut state = state.lock().expect("tls reload lock");
    if stamp != state.stamp {
        state.stamp = stamp;
        match load() {
            Ok(value) => {
                tracing::info!(files = ?paths, "reloaded {what}");
                state.current = value;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot reload {what}; the previous one keeps serving")
            }
        }
    }
    state.current.clone()
}

/// The server certificate of a listener, re-read when `--cert-file`/`--key-file` change.
#[derive(Debug)]
pub struct ReloadingCert {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    state: Mutex<Reloaded<Arc<CertifiedKey>>>,
}

impl ReloadingCert {
    /// Loads the pair once (a member does not start with an unusable certificate).
    ///
    /// Errors: those of [`load_pair`].
    pub fn new(cert: &Path, key: &Path, provider: Arc<CryptoProvider>) -> Result<Self, TlsError> {
        let stamp = Stamp::of([cert, key]);
        let current = load_pair(cert, key, &provider)?;
        Ok(ReloadingCert {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            provider,
            state: Mutex::new(Reloaded { stamp, current }),
        })
    }

    /// The pair to present now (after a reload check).
    pub fn current(&self) -> Arc<CertifiedKey> {
        refresh(&self.state, &[&self.cert, &self.key], "certificate", || {
            load_pair(&self.cert, &self.key, &self.provider)
        })
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// What a client certificate must satisfy: chain to the CAs, not be revoked, and (peers with
/// `--peer-cert-allowed-cn`) carry that Common Name.
#[derive(Debug, Clone)]
pub struct ClientTrust {
    /// `--trusted-ca-file` / `--peer-trusted-ca-file`.
    pub ca_file: PathBuf,
    /// `--client-crl-file` / `--peer-crl-file`.
    pub crl_file: Option<PathBuf>,
    /// `--peer-cert-allowed-cn`.
    pub allowed_cn: Option<String>,
}

impl ClientTrust {
    fn paths(&self) -> Vec<&Path> {
        std::iter::once(self.ca_file.as_path())
            .chain(self.crl_file.as_deref())
            .collect()
    }
}

/// The CAs of `ca_file` as a root store.
///
/// Errors: the file is unusable or none of its certificates is a valid trust anchor.
pub fn root_store(ca_file: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(files::certs(ca_file, "CA")?);
    if added == 0 {
        return Err(TlsError::File {
            what: "CA",
            path: ca_file.to_path_buf(),
            detail: "no usable CA certificate".into(),
        });
    }
    Ok(roots)
}

/// webpki's verifier for `trust`: client certificate required; revocation checked for the
/// end entity only, a certificate no CRL speaks of is accepted (etcd compares serial numbers
/// with the revoked list).
fn build_verifier(
    trust: &ClientTrust,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let roots = Arc::new(root_store(&trust.ca_file)?);
    let mut builder = WebPkiClientVerifier::builder_with_provider(roots, provider.clone());
    if let Some(crl) = &trust.crl_file {
        builder = builder
            .with_crls(files::crls(crl)?)
            .only_check_end_entity_revocation()
            .allow_unknown_revocation_status();
    }
    builder.build().map_err(|e| TlsError::Rustls(e.to_string()))
}

/// The client certificate check of a listener with `--client-cert-auth` (or
/// `--peer-client-cert-auth`), re-read when the CA or CRL file changes.
#[derive(Debug)]
pub struct ReloadingVerifier {
    trust: ClientTrust,
    provider: Arc<CryptoProvider>,
    state: Mutex<Reloaded<Arc<dyn ClientCertVerifier>>>,
}

impl ReloadingVerifier {
    /// Loads the trust once.
    ///
    /// Errors: an unusable CA or CRL file.
    pub fn new(trust: ClientTrust, provider: Arc<CryptoProvider>) -> Result<Self, TlsError> {
        let stamp = Stamp::of(trust.paths());
        let current = build_verifier(&trust, &provider)?;
        Ok(ReloadingVerifier {
            trust,
            provider,
            state: Mutex::new(Reloaded { stamp, current }),
        })
    }

    fn current(&self) -> Arc<dyn ClientCertVerifier> {
        refresh(&self.state, &self.trust.paths(), "client CA/CRL", || {
            build_verifier(&self.trust, &self.provider)
        })
    }
}

impl ClientCertVerifier for ReloadingVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // No hints (the CAs may change under us): a client then sends the certificate it has.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .current()
            .verify_client_cert(end_entity, intermediates, now)?;
        if let Some(allowed) = &self.trust.allowed_cn
            && common_name(end_entity).as_deref() != Some(allowed.as_str())
        {
            // etcd's text (client/pkg/transport/listener.go, AllowedCN).
            return Err(rustls::Error::General(
                "CommonName authentication failed".into(),
            ));
        }
        Ok(verified)
    }

    signature_checks!(provider);
}
