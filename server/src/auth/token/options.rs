//! The typed `--auth-token` options a token provider is built from (etcd `jwtOptions` in
//! `server/auth/options.go`). The option string itself (`simple`, `jwt,sign-method=...`) is
//! parsed with the flags, by `config/auth_token.rs`, which also reads the key files.

use std::time::Duration;

use jsonwebtoken::Algorithm;

/// Default lifetime of a JWT (etcd `DefaultTTL`).
pub const DEFAULT_JWT_TTL: Duration = Duration::from_secs(5 * 60);

/// A parsed `--auth-token` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenOptions {
    /// `""`: no tokens are issued (etcd `tokenNop`: Authenticate fails).
    Nop,
    /// `simple`.
    Simple,
    /// `jwt,...`.
    Jwt(JwtOptions),
}

/// The options of `--auth-token jwt,...`, with the key files read.
#[derive(Clone, PartialEq, Eq)]
pub struct JwtOptions {
    /// `sign-method`.
    pub sign_method: Algorithm,
    /// Contents of the `pub-key` file, if given.
    pub public_key: Option<Vec<u8>>,
    /// Contents of the `priv-key` file, if given (the secret for HS*).
    pub private_key: Option<Vec<u8>>,
    /// `ttl`: how long a token is valid after it is issued.
    pub ttl: Duration,
}

impl std::fmt::Debug for JwtOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.debug_struct("JwtOptions")
            .field("sign_method", &self.sign_method)
            .field("public_key", &self.public_key.as_ref().map(|k| k.len()))
            .field("private_key", &self.private_key.as_ref().map(|k| k.len()))
            .field("ttl", &self.ttl)
            .finish()
    }
}
