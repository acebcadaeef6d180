//! `--auto-tls` and `--peer-auto-tls`: a self-signed certificate in the data dir, as etcd's
//! `transport.SelfCert` writes one (`<data-dir>/fixtures/client` and `.../fixtures/peer`,
//! files `cert.pem` and `key.pem`, reused when they exist, valid for one year, for the hosts
//! of the listen URLs).

use std::io::Write;
use std::path::{Path, PathBuf};

use super::TlsError;

/// Validity of a generated certificate (etcd's `--self-signed-cert-validity` default: 1 year).
const VALIDITY_DAYS: i64 = 365;

/// The certificate and key files of the self-signed pair in `dir`, generated for `hosts` (IP
/// addresses or DNS names) unless both files exist already.
///
/// Errors: the directory or files cannot be written, or generation fails.
pub fn self_signed(dir: &Path, hosts: &[String]) -> Result<(PathBuf, PathBuf), TlsError> {
    let cert_path = dir.join("cert.pem");
    let key_path = dir.join("key.pem");
    if cert_path.is_file() && key_path.is_file() {
        return Ok((cert_path, key_path));
    }
    let fail = |detail: String| TlsError::Auto {
        dir: dir.to_path_buf(),
        detail,
    };
    let mut params =
        rcgen::CertificateParams::new(hosts.to_vec()).map_err(|e| fail(e.to_string()))?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "keel");
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(VALIDITY_DAYS);
    params.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let key = rcgen::KeyPair::generate().map_err(|e| fail(e.to_string()))?;
    let cert = params.self_signed(&key).map_err(|e| fail(e.to_string()))?;
    std::fs::create_dir_all(dir).map_err(|e| fail(e.to_string()))?;
    write_private(&key_path, key.serialize_pem().as_bytes()).map_err(|e| fail(e.to_string()))?;
    std::fs::write(&cert_path, cert.pem()).map_err(|e| fail(e.to_string()))?;
    tracing::info!(cert = %cert_path.display(), ?hosts, "generated a self-signed certificate");
    Ok((cert_path, key_path))
}

/// Writes `bytes` to a new file readable by its owner only.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_pair_loads_and_is_reused() {
        let dir = tempfile::tempdir().unwrap();
        let fixtures = dir.path().join("fixtures/client");
        let hosts = vec!["127.0.0.1".to_string(), "localhost".to_string()];
        let (cert, key) = self_signed(&fixtures, &hosts).unwrap();
        let provider = rustls::crypto::ring::default_provider();
        super::super::reload::load_pair(&cert, &key, &provider).unwrap();
        let first = std::fs::read(&cert).unwrap();
        self_signed(&fixtures, &hosts).unwrap();
        assert_eq!(
            std::fs::read(&cert).unwrap(),
            first,
            "existing files are reused"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&key).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
