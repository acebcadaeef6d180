//! The identity a client proved in the TLS handshake: the Common Name of its verified
//! certificate.
//!
//! etcd's rule (`server/auth/store.go`, `AuthInfoFromTLS`): with auth enabled and no token in
//! the request, the CN of the client certificate is the user name. A certificate reaches a
//! request only when `--client-cert-auth` made the listener verify it (without it the server
//! asks for none), so [`client_common_name`] never reports an unverified name. tonic puts the
//! connection's certificates into every request's extensions (`TlsConnectInfo`, read with
//! `Request::peer_certs`); the CN is parsed from the leaf when asked for.

use rustls_pki_types::CertificateDer;

/// The first Common Name of the subject of DER certificate `cert` (`None` if it has none or
/// does not parse).
pub fn common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let cn = parsed.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_string)
}

/// The CN of the verified client certificate of the connection `request` came on: `None` on
/// a plaintext listener, on a TLS listener without `--client-cert-auth`, or for a certificate
/// without a CN. This is the hook auth uses when a request carries no token (docs/security.md).
pub fn client_common_name<T>(request: &tonic::Request<T>) -> Option<String> {
    let certs = request.peer_certs()?;
    common_name(certs.first()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert_with_cn(cn: Option<&str>) -> CertificateDer<'static> {
        let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        if let Some(cn) = cn {
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, cn);
        }
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "keel");
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().clone()
    }

    #[test]
    fn common_name_is_the_subjects_cn() {
        assert_eq!(
            common_name(&cert_with_cn(Some("alice"))).as_deref(),
            Some("alice")
        );
        assert_eq!(common_name(&cert_with_cn(None)), None);
        assert_eq!(common_name(&CertificateDer::from(vec![1, 2, 3])), None);
    }

    #[test]
    fn a_request_without_tls_has_no_common_name() {
        assert_eq!(client_common_name(&tonic::Request::new(())), None);
    }
}
