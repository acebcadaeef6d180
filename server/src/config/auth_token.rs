//! Parsing of `--auth-token` into auth's typed [`TokenOptions`] (etcd `decomposeOpts`,
//! `jwtOptions.Parse` in `server/auth/store.go` and `options.go`).
//!
//! Shape: `<type>[,<key>=<value>]...`, with type `simple` (default), `jwt`, or empty (no
//! tokens). JWT keys: `sign-method` (required), `pub-key` and `priv-key` (PEM file paths; the
//! HS* methods use the `priv-key` file's bytes as the secret), `ttl` (a Go duration such as
//! `5m`, default 5 minutes). Unknown keys are ignored with a warning; a malformed pair or a
//! repeated key is `auth: invalid auth options`.

use std::collections::BTreeMap;

use jsonwebtoken::Algorithm;

use super::GoDuration;
use crate::auth::AuthError;
use crate::auth::token::options::{DEFAULT_JWT_TTL, JwtOptions, TokenOptions};

/// Parses `--auth-token`, reading the JWT key files it names.
///
/// Errors: [`AuthError::InvalidAuthOpts`] for an unknown type, a malformed or repeated
/// option, an unreadable key file, a bad `ttl`, or a missing or unknown `sign-method`
/// (etcd maps every JWT option error to it).
pub fn parse(value: &str) -> Result<TokenOptions, AuthError> {
    let (kind, opts) = decompose(value)?;
    match kind {
        "" => Ok(TokenOptions::Nop),
        "simple" => Ok(TokenOptions::Simple),
        "jwt" => Ok(TokenOptions::Jwt(jwt_options(&opts)?)),
        other => {
            tracing::warn!(token_type = other, "unknown token type");
            Err(AuthError::InvalidAuthOpts)
        }
    }
}

fn jwt_options(opts: &BTreeMap<&str, &str>) -> Result<JwtOptions, AuthError> {
    let invalid = |why: String| {
        tracing::error!(%why, "problem loading JWT options");
        AuthError::InvalidAuthOpts
    };
    let unknown: Vec<&str> = opts
        .keys()
        .copied()
        .filter(|k| !["sign-method", "pub-key", "priv-key", "ttl"].contains(k))
        .collect();
    if !unknown.is_empty() {
        tracing::warn!(keys = ?unknown, "unknown JWT options");
    }
    let ttl = match opts.get("ttl").copied().filter(|t| !t.is_empty()) {
        None => DEFAULT_JWT_TTL,
        Some(t) => {
            let GoDuration(ttl) = t.parse().map_err(|e| invalid(format!("ttl: {e}")))?;
            ttl
        }
    };
    let read = |key: &str| -> Result<Option<Vec<u8>>, AuthError> {
        match opts.get(key).copied().filter(|p| !p.is_empty()) {
            None => Ok(None),
            Some(path) => std::fs::read(path)
                .map(Some)
                .map_err(|e| invalid(format!("{key} {path}: {e}"))),
        }
    };
    let public_key = read("pub-key")?;
    let private_key = read("priv-key")?;
    let method = opts.get("sign-method").copied().unwrap_or("");
    let sign_method: Algorithm = method
        .parse()
        .map_err(|_| invalid(AuthError::InvalidAuthMethod.to_string()))?;
    Ok(JwtOptions {
        sign_method,
        public_key,
        private_key,
        ttl,
    })
}

/// Splits `type,k=v,...` (etcd `decomposeOpts`).
fn decompose(value: &str) -> Result<(&str, BTreeMap<&str, &str>), AuthError> {
    let mut parts = value.split(',');
    let kind = parts.next().unwrap_or("");
    let mut opts = BTreeMap::new();
    for part in parts {
        let mut pair = part.split('=');
        let (Some(k), Some(v), None) = (pair.next(), pair.next(), pair.next()) else {
            tracing::error!(option = value, "invalid token option");
            return Err(AuthError::InvalidAuthOpts);
        };
        if opts.insert(k, v).is_some() {
            tracing::error!(option = value, duplicate = k, "invalid token option");
            return Err(AuthError::InvalidAuthOpts);
        }
    }
    Ok((kind, opts))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn token_types() {
        assert_eq!(parse("simple"), Ok(TokenOptions::Simple));
        assert_eq!(parse("simple,x=y"), Ok(TokenOptions::Simple));
        assert_eq!(parse(""), Ok(TokenOptions::Nop));
        for bad in [
            "oauth",
            "bogus",
            "simple,x",
            "simple,x=y=z",
            "simple,x=1,x=2",
        ] {
            assert_eq!(parse(bad), Err(AuthError::InvalidAuthOpts), "{bad}");
        }
        assert_eq!(
            AuthError::InvalidAuthOpts.to_string(),
            "auth: invalid auth options"
        );
    }

    #[test]
    fn jwt_options() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, b"s3cret").unwrap();
        let p = secret.display();
        let TokenOptions::Jwt(opts) =
            parse(&format!("jwt,priv-key={p},sign-method=HS256,ttl=1h30m")).unwrap()
        else {
            panic!("not jwt")
        };
        assert_eq!(opts.sign_method, Algorithm::HS256);
        assert_eq!(opts.private_key.as_deref(), Some(&b"s3cret"[..]));
        assert_eq!(opts.public_key, None);
        assert_eq!(opts.ttl, Duration::from_secs(5400));
        let TokenOptions::Jwt(opts) =
            parse(&format!("jwt,priv-key={p},sign-method=HS256,x=y")).unwrap()
        else {
            panic!("not jwt")
        };
        assert_eq!(opts.ttl, DEFAULT_JWT_TTL, "unknown keys are ignored");
        for bad in [
            format!("jwt,priv-key={p}"),
            format!("jwt,priv-key={p},sign-method=ES512"),
            format!("jwt,priv-key={p},sign-method=none"),
            format!("jwt,priv-key={p},sign-method=HS256,ttl=5 minutes"),
            format!("jwt,priv-key={p},sign-method=HS256,ttl=-5m"),
            "jwt,priv-key=/nonexistent/key,sign-method=HS256".to_string(),
        ] {
            assert_eq!(parse(&bad), Err(AuthError::InvalidAuthOpts), "{bad}");
        }
    }
}
