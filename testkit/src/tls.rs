//! TLS material for tests, generated in the test (rcgen), and the registry through which
//! every helper of this kit speaks TLS to a TLS member.
//!
//! - [`TestCa`]: a CA in a directory; [`TestCa::issue`] writes a leaf certificate and key
//!   (SANs `127.0.0.1` and `localhost`, usable as server and client certificate, as etcd's
//!   peer certificates are) and returns its [`CertFiles`].
//! - [`ClientTls`]: what a client presents and trusts (etcdctl's `--cacert --cert --key`).
//! - The registry: [`register`] maps a member's `127.0.0.1:P` endpoint to the [`ClientTls`]
//!   to use with it; [`crate::grpc`] and [`crate::etcdctl`] look endpoints up there, so a test
//!   body written for a plaintext member runs unchanged against a TLS one. A TLS
//!   [`crate::Member`] registers itself when created and unregisters when dropped.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

/// A certificate file and its key file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFiles {
    /// PEM certificate.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
}

/// What a TLS client presents and trusts: etcdctl's `--cacert`, `--cert`, `--key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTls {
    /// CA file the server certificate must chain to.
    pub ca: PathBuf,
    /// The client certificate and key (`None`: present none).
    pub identity: Option<CertFiles>,
}

impl ClientTls {
    /// etcdctl's flags for this client: `--cacert=...` and, with an identity, `--cert=...
    /// --key=...`.
    pub fn etcdctl_flags(&self) -> Vec<String> {
        let mut flags = vec![format!("--cacert={}", self.ca.display())];
        if let Some(id) = &self.identity {
            flags.push(format!("--cert={}", id.cert.display()));
            flags.push(format!("--key={}", id.key.display()));
        }
        flags
    }

    /// tonic's client TLS config for it (server name `127.0.0.1`). Panics if a file cannot
    /// be read.
    pub fn tonic_config(&self) -> tonic::transport::ClientTlsConfig {
        let read =
            |p: &Path| std::fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
        let mut config = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(read(&self.ca)))
            .domain_name("127.0.0.1");
        if let Some(id) = &self.identity {
            config = config.identity(tonic::transport::Identity::from_pem(
                read(&id.cert),
                read(&id.key),
            ));
        }
        config
    }
}

/// A test certificate authority whose files live in `dir`. See the module docs.
pub struct TestCa {
    dir: PathBuf,
    name: String,
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl TestCa {
    /// A new CA named `name` (its CN), writing `<dir>/<name>-ca.pem`. Panics on an I/O or
    /// generation error.
    pub fn new(dir: &Path, name: &str) -> TestCa {
        std::fs::create_dir_all(dir).expect("create the CA dir");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("self-sign the CA");
        let ca = TestCa {
            dir: dir.to_path_buf(),
            name: name.to_string(),
            cert,
            key,
        };
        write(&ca.ca_file(), &ca.cert.pem());
        ca
    }

    /// The CA certificate file (`--trusted-ca-file`, etcdctl's `--cacert`).
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join(format!("{}-ca.pem", self.name))
    }

    /// Issues a certificate with Common Name `cn` for `127.0.0.1`/`localhost`, usable for
    /// server and client authentication, written to `<dir>/<file>.pem` and
    /// `<dir>/<file>-key.pem` (overwritten if they exist: how a test renews a certificate).
    pub fn issue(&self, file: &str, cn: &str) -> CertFiles {
        self.issue_with(file, cn, |_| {})
    }

    /// [`TestCa::issue`] with a certificate that expired in 2020.
    pub fn issue_expired(&self, file: &str, cn: &str) -> CertFiles {
        self.issue_with(file, cn, |p| {
            p.not_before = rcgen::date_time_ymd(2019, 1, 1);
            p.not_after = rcgen::date_time_ymd(2020, 1, 1);
        })
    }

    fn issue_with(
        &self,
        file: &str,
        cn: &str,
        adjust: impl FnOnce(&mut CertificateParams),
    ) -> CertFiles {
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
                .expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        adjust(&mut params);
        let key = KeyPair::generate().expect("leaf key");
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("sign the leaf");
        let files = CertFiles {
            cert: self.dir.join(format!("{file}.pem")),
            key: self.dir.join(format!("{file}-key.pem")),
        };
        // Key first, certificate last: a member that reloads between the two writes sees a
        // mismatched pair, logs it and keeps the old one until the certificate lands.
        write(&files.key, &key.serialize_pem());
        write(&files.cert, &cert.pem());
        files
    }

    /// A client of a member whose server certificate this CA issued, presenting `identity`.
    pub fn client(&self, identity: Option<CertFiles>) -> ClientTls {
        ClientTls {
            ca: self.ca_file(),
            identity,
        }
    }
}

/// Writes through a temp file and a rename, as renewal tools do, so a reader never sees a
/// half-written file.
fn write(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap_or_else(|e| panic!("write {}: {e}", tmp.display()));
    std::fs::rename(&tmp, path).unwrap_or_else(|e| panic!("rename to {}: {e}", path.display()));
}

static REGISTRY: Mutex<Option<HashMap<String, ClientTls>>> = Mutex::new(None);

/// From now on, the helpers of this kit speak TLS to `endpoint` (`127.0.0.1:P`) as `client`.
pub fn register(endpoint: &str, client: ClientTls) {
    REGISTRY
        .lock()
        .expect("tls registry")
        .get_or_insert_with(HashMap::new)
        .insert(endpoint.to_string(), client);
}

/// Forgets `endpoint` (its port may be reused by a plaintext member).
pub fn unregister(endpoint: &str) {
    if let Some(map) = REGISTRY.lock().expect("tls registry").as_mut() {
        map.remove(endpoint);
    }
}

/// The TLS client registered for `endpoint`, if any.
pub fn lookup(endpoint: &str) -> Option<ClientTls> {
    REGISTRY
        .lock()
        .expect("tls registry")
        .as_ref()
        .and_then(|m| m.get(endpoint).cloned())
}

/// The TLS settings of one side (clients or peers) of a test member: its certificate, the
/// CA it trusts, and whether it requires client certificates (`--client-cert-auth` /
/// `--peer-client-cert-auth`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTls {
    /// `--cert-file`/`--key-file` (peers: `--peer-cert-file`/`--peer-key-file`).
    pub files: CertFiles,
    /// `--trusted-ca-file` (peers: `--peer-trusted-ca-file`).
    pub ca: PathBuf,
    /// `--client-cert-auth` (peers: `--peer-client-cert-auth`).
    pub client_cert_auth: bool,
}

impl TestCa {
    /// A member side with a fresh certificate `<file>.pem` (CN `cn`) from this CA, trusting
    /// this CA and requiring client certificates.
    pub fn server(&self, file: &str, cn: &str) -> ServerTls {
        ServerTls {
            files: self.issue(file, cn),
            ca: self.ca_file(),
            client_cert_auth: true,
        }
    }
}
