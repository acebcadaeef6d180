//! etcd's `jwt` tokens (`server/auth/jwt.go`): signed, self-contained, valid on any member
//! that holds the verification key.
//!
//! Claims (etcd's, as JSON): `username` (string), `revision` (the auth revision the token was
//! issued at) and `exp` (Unix seconds, issue time + `ttl`). No server state: a token is valid
//! until `exp` whatever happens to the user, but since it carries the auth revision, any auth
//! change makes it fail permission checks with `ErrGRPCAuthOldRevision`,
//! and clientv3 re-authenticates.
//!
//! Keys: RS*/PS* (RSA), ES256/ES384 (ECDSA), EdDSA (Ed25519) use PEM files; HS* uses the
//! `priv-key` file's bytes as the shared secret. With only `pub-key` the provider verifies but
//! cannot issue ([`AuthError::VerifyOnly`]); with only `priv-key` the public key is derived
//! from it. A pair that does not match is refused at start-up ([`AuthError::KeyMismatch`]).

use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey, EncodingKey, Header, Validation};
use serde::Serialize;

use super::super::error::AuthError;
use super::super::model::AuthInfo;
use super::options::JwtOptions;

/// The claims etcd signs, in the order Go's `jwt.MapClaims` writes them (sorted keys).
#[derive(Serialize)]
struct Claims<'a> {
    exp: u64,
    revision: u64,
    username: &'a str,
}

/// The JWT provider of one member.
pub struct JwtTokens {
    algorithm: Algorithm,
    /// `None` when only a public key was given (verify-only).
    signing: Option<EncodingKey>,
    verifying: DecodingKey,
    ttl_secs: u64,
    validation: Validation,
}

impl std::fmt::Debug for JwtTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtTokens")
            .field("algorithm", &self.algorithm)
            .field("verify_only", &self.signing.is_none())
            .field("ttl_secs", &self.ttl_secs)
            .finish()
    }
}

impl JwtTokens {
    /// A provider for `opts`.
    ///
    /// Errors: no usable key ([`AuthError::MissingKey`]), keys that are not one pair
    /// ([`AuthError::KeyMismatch`]), a key file that does not parse ([`AuthError::Internal`]
    /// naming the key).
    pub fn new(opts: &JwtOptions) -> Result<JwtTokens, AuthError> {
        let algorithm = opts.sign_method;
        let bad = |which: &str, e: jsonwebtoken::errors::Error| {
            AuthError::Internal(format!("JWT {which} for {algorithm:?}: {e}"))
        };
        let family = algorithm.family();
        let (signing, verifying) = if family == AlgorithmFamily::Hmac {
            let secret = opts.private_key.as_deref().ok_or(AuthError::MissingKey)?;
            let signing = EncodingKey::from_secret(secret).map_err(|e| bad("secret", e))?;
            let verifying = DecodingKey::from_secret(secret).map_err(|e| bad("secret", e))?;
            (Some(signing), verifying)
        } else {
            let signing = opts
                .private_key
                .as_deref()
                .map(|pem| match family {
                    AlgorithmFamily::Rsa => EncodingKey::from_rsa_pem(pem),
                    AlgorithmFamily::Ec => EncodingKey::from_ec_pem(pem),
                    _ => EncodingKey::from_ed_pem(pem),
                })
                .transpose()
                .map_err(|e| bad("priv-key", e))?;
            let verifying = match (&opts.public_key, &signing) {
                (Some(pem), _) => match family {
                    AlgorithmFamily::Rsa => DecodingKey::from_rsa_pem(pem),
                    AlgorithmFamily::Ec => DecodingKey::from_ec_pem(pem),
                    _ => DecodingKey::from_ed_pem(pem),
                }
                .map_err(|e| bad("pub-key", e))?,
                (None, Some(key)) => Jwk::from_encoding_key(key, algorithm)
                    .and_then(|jwk| DecodingKey::from_jwk(&jwk))
                    .map_err(|e| bad("public key derived from priv-key", e))?,
                (None, None) => return Err(AuthError::MissingKey),
            };
            (signing, verifying)
        };
        let mut validation = Validation::new(algorithm);
        // `exp` is checked against the caller's clock in `lookup`, and is optional as in
        // etcd (golang-jwt validates it only when present).
        validation.validate_exp = false;
        validation.required_spec_claims.clear();
        validation.leeway = 0;
        let tokens = JwtTokens {
            algorithm,
            signing,
            verifying,
            ttl_secs: opts.ttl.as_secs(),
            validation,
        };
        if tokens.signing.is_some() {
            let probe = tokens.assign("", 0, 0)?;
            if tokens.lookup(&probe, 0).is_none() {
                return Err(AuthError::KeyMismatch);
            }
        }
        Ok(tokens)
    }

    /// True when this member can verify tokens but not issue them.
    pub fn is_verify_only(&self) -> bool {
        self.signing.is_none()
    }

    /// Signs a token for `username` at auth `revision`, expiring `ttl` after `now_unix`
    /// (seconds since the Unix epoch).
    ///
    /// Errors: verify-only ([`AuthError::VerifyOnly`]), a signing failure
    /// ([`AuthError::Internal`]).
    pub fn assign(
        &self,
        username: &str,
        revision: u64,
        now_unix: u64,
    ) -> Result<String, AuthError> {
        let key = self.signing.as_ref().ok_or(AuthError::VerifyOnly)?;
        let claims = Claims {
            exp: now_unix.saturating_add(self.ttl_secs),
            revision,
            username,
        };
        jsonwebtoken::encode(&Header::new(self.algorithm), &claims, key)
            .map_err(|e| AuthError::Internal(format!("signing a JWT: {e}")))
    }

    /// Who `token` authenticates, if it is signed by this provider's key with its algorithm,
    /// carries a string `username` and a numeric `revision`, and has not expired at
    /// `now_unix` (valid through second `exp`, as golang-jwt checks it).
    pub fn lookup(&self, token: &str, now_unix: u64) -> Option<AuthInfo> {
        let data = jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(
            token,
            &self.verifying,
            &self.validation,
        )
        .ok()?;
        let claims = data.claims;
        if let Some(exp) = claims.get("exp")
            && exp.as_f64()? < now_unix as f64
        {
            return None;
        }
        let username = claims.get("username")?.as_str()?;
        // etcd reads it as a float64 and converts (a JSON number either way).
        let revision = claims.get("revision")?.as_f64()?;
        Some(AuthInfo::new(username, revision as u64))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn key(name: &str) -> Vec<u8> {
        let path = format!("{}/src/auth/testdata/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    fn opts(alg: Algorithm, public: Option<&str>, private: Option<&str>) -> JwtOptions {
        JwtOptions {
            sign_method: alg,
            public_key: public.map(key),
            private_key: private.map(key),
            ttl: Duration::from_secs(300),
        }
    }

    const NOW: u64 = 1_700_000_000;

    fn round_trip(tokens: &JwtTokens) {
        let token = tokens.assign("alice", 7, NOW).unwrap();
        assert_eq!(token.split('.').count(), 3, "{token}");
        assert_eq!(tokens.lookup(&token, NOW), Some(AuthInfo::new("alice", 7)));
        assert_eq!(
            tokens.lookup(&token, NOW + 300),
            Some(AuthInfo::new("alice", 7)),
            "valid through exp"
        );
        assert_eq!(tokens.lookup(&token, NOW + 301), None, "expired");
    }

    #[test]
    fn rs256_es256_eddsa_and_hs256_round_trip() {
        round_trip(
            &JwtTokens::new(&opts(Algorithm::RS256, Some("rsa.pub"), Some("rsa.key"))).unwrap(),
        );
        round_trip(
            &JwtTokens::new(&opts(Algorithm::ES256, Some("ec.pub"), Some("ec.key"))).unwrap(),
        );
        round_trip(
            &JwtTokens::new(&opts(Algorithm::EdDSA, Some("ed.pub"), Some("ed.key"))).unwrap(),
        );
        // Any bytes are an HS secret; the EC private key file will do.
        round_trip(&JwtTokens::new(&opts(Algorithm::HS256, None, Some("ec.key"))).unwrap());
    }

    #[test]
    fn the_public_key_is_derived_from_a_private_key_alone() {
        round_trip(&JwtTokens::new(&opts(Algorithm::ES256, None, Some("ec.key"))).unwrap());
    }

    #[test]
    fn claims_are_etcds() {
        let tokens =
            JwtTokens::new(&opts(Algorithm::ES256, Some("ec.pub"), Some("ec.key"))).unwrap();
        let token = tokens.assign("alice", 7, NOW).unwrap();
        let payload = token.split('.').nth(1).unwrap();
        use base64::Engine as _;
        let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .unwrap();
        assert_eq!(
            String::from_utf8(json).unwrap(),
            format!(r#"{{"exp":{},"revision":7,"username":"alice"}}"#, NOW + 300)
        );
    }

    #[test]
    fn forged_and_foreign_tokens_are_refused() {
        let ours = JwtTokens::new(&opts(Algorithm::ES256, Some("ec.pub"), Some("ec.key"))).unwrap();
        let other = JwtTokens::new(&opts(
            Algorithm::ES256,
            Some("ec-other.pub"),
            Some("ec-other.key"),
        ))
        .unwrap();
        let foreign = other.assign("root", 1, NOW).unwrap();
        assert_eq!(ours.lookup(&foreign, NOW), None, "signed by another key");
        let token = ours.assign("alice", 7, NOW).unwrap();
        let mut parts: Vec<&str> = token.split('.').collect();
        use base64::Engine as _;
        let forged_claims = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!(
            r#"{{"exp":{},"revision":7,"username":"root"}}"#,
            NOW + 300
        ));
        parts[1] = &forged_claims;
        assert_eq!(ours.lookup(&parts.join("."), NOW), None, "claims changed");
        assert_eq!(ours.lookup("not.a.token", NOW), None);
        assert_eq!(ours.lookup("", NOW), None);
        let hs = JwtTokens::new(&opts(Algorithm::HS256, None, Some("ec.key"))).unwrap();
        let hs_token = hs.assign("root", 1, NOW).unwrap();
        assert_eq!(ours.lookup(&hs_token, NOW), None, "another algorithm");
    }

    #[test]
    fn key_problems() {
        let verify_only = JwtTokens::new(&opts(Algorithm::ES256, Some("ec.pub"), None)).unwrap();
        assert!(verify_only.is_verify_only());
        assert_eq!(verify_only.assign("a", 1, NOW), Err(AuthError::VerifyOnly));
        let signer =
            JwtTokens::new(&opts(Algorithm::ES256, Some("ec.pub"), Some("ec.key"))).unwrap();
        let token = signer.assign("alice", 3, NOW).unwrap();
        assert_eq!(
            verify_only.lookup(&token, NOW),
            Some(AuthInfo::new("alice", 3))
        );

        let err = |o| JwtTokens::new(&o).unwrap_err();
        assert_eq!(
            err(opts(Algorithm::ES256, None, None)),
            AuthError::MissingKey
        );
        assert_eq!(
            err(opts(Algorithm::HS256, Some("ec.pub"), None)),
            AuthError::MissingKey
        );
        assert_eq!(
            err(opts(Algorithm::ES256, Some("ec-other.pub"), Some("ec.key"))),
            AuthError::KeyMismatch
        );
        assert!(matches!(
            err(opts(Algorithm::RS256, Some("ec.pub"), Some("ec.key"))),
            AuthError::Internal(_)
        ));
    }
}
