//! Auth tokens: what Authenticate hands out and every later request carries in the gRPC
//! metadata key `token` (etcd `TokenProvider`, `server/auth/store.go`).
//!
//! - [`simple`]: etcd's default, `<16 letters>.<raft index>`, kept in each member's memory
//!   with a sliding TTL (`--auth-token-ttl`).
//! - [`jwt`]: signed tokens carrying the user name and auth revision
//!   (`--auth-token jwt,pub-key=...,priv-key=...,sign-method=...,ttl=...`).
//! - Nop (`--auth-token ""`): Authenticate always fails.
//!
//! Tokens are not part of the replicated state: the Authenticate entry carries the simple
//! token's random part, each member derives the same simple token from it, and the clocks
//! used for TTLs only decide whether this member still accepts a token.

pub mod jwt;
pub mod options;
pub mod simple;

use std::time::{Duration, Instant, SystemTime};

use keel_proto::rpctypes::RpcError;

use super::error::AuthError;
use super::model::AuthInfo;
pub use jwt::JwtTokens;
pub use options::{JwtOptions, TokenOptions};
pub use simple::SimpleTokens;

/// The token provider a member was started with.
#[derive(Debug)]
pub enum TokenProvider {
    /// `--auth-token ""`: no tokens.
    Nop,
    /// `--auth-token simple`.
    Simple(SimpleTokens),
    /// `--auth-token jwt,...` (boxed: its keys are large, and the provider is built once).
    Jwt(Box<JwtTokens>),
}

impl TokenProvider {
    /// The provider for the parsed `--auth-token` (`config/auth_token.rs`) and
    /// `--auth-token-ttl simple_ttl` (simple tokens only; zero means 300 s).
    ///
    /// Errors: see [`JwtTokens::new`].
    pub fn new(options: &TokenOptions, simple_ttl: Duration) -> Result<TokenProvider, AuthError> {
        Ok(match options {
            TokenOptions::Nop => TokenProvider::Nop,
            TokenOptions::Simple => {
                tracing::warn!("simple token is not cryptographically signed");
                TokenProvider::Simple(SimpleTokens::new(simple_ttl))
            }
            TokenOptions::Jwt(opts) => TokenProvider::Jwt(Box::new(JwtTokens::new(opts)?)),
        })
    }

    /// The random part the proposer puts into an Authenticate entry: 16 letters for simple
    /// tokens, empty otherwise (etcd `GenTokenPrefix`).
    pub fn gen_prefix(&self) -> String {
        match self {
            TokenProvider::Simple(_) => SimpleTokens::gen_prefix(),
            _ => String::new(),
        }
    }

    /// The raft index this member must have applied before it can judge `token` (simple
    /// tokens: the index in the token; others: none). The caller waits for it, then calls
    /// [`Self::lookup`] (etcd's `indexWaiter`).
    pub fn required_index(&self, token: &str) -> Option<u64> {
        match self {
            TokenProvider::Simple(_) => simple::index_of(token),
            _ => None,
        }
    }

    /// Issues the token of an applied Authenticate entry: for `who` (from
    /// [`super::store::AuthStore::apply_authenticate`]), entry index `index` and the entry's
    /// random part `prefix`.
    ///
    /// Errors: nop provider ([`RpcError::AuthFailed`]), verify-only JWT
    /// ([`AuthError::VerifyOnly`]).
    pub fn assign(&self, who: &AuthInfo, prefix: &str, index: u64) -> Result<String, AuthError> {
        match self {
            TokenProvider::Nop => Err(RpcError::AuthFailed.into()),
            TokenProvider::Simple(t) => Ok(t.assign(&who.username, prefix, index, Instant::now())),
            TokenProvider::Jwt(t) => t.assign(&who.username, who.revision, unix_now()),
        }
    }

    /// Who `token` authenticates; `None` for an unknown, expired, forged or malformed token
    /// (the caller answers [`RpcError::InvalidAuthToken`]). `current_revision` is the
    /// store's revision: a simple token stands for the user at the current revision, a JWT
    /// for the revision it was signed at.
    pub fn lookup(&self, token: &str, current_revision: u64) -> Option<AuthInfo> {
        match self {
            TokenProvider::Nop => None,
            TokenProvider::Simple(t) => t
                .lookup(token, Instant::now())
                .map(|user| AuthInfo::new(user, current_revision)),
            TokenProvider::Jwt(t) => t.lookup(token, unix_now()),
        }
    }

    /// Drops `username`'s tokens (after UserDelete and UserChangePassword apply). JWTs cannot
    /// be dropped; the revision they carry is now old.
    pub fn invalidate_user(&self, username: &str) {
        if let TokenProvider::Simple(t) = self {
            t.invalidate_user(username);
        }
    }

    /// Auth became enabled (AuthEnable applied, or a store loaded enabled).
    pub fn enable(&self) {
        if let TokenProvider::Simple(t) = self {
            t.enable();
        }
    }

    /// Auth became disabled (AuthDisable applied, or a snapshot installed disabled): drops
    /// every simple token.
    pub fn disable(&self) {
        if let TokenProvider::Simple(t) = self {
            t.disable();
        }
    }
}

/// Seconds since the Unix epoch (0 if the clock is before it).
fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simple_provider_issues_tokens_valid_after_their_index() {
        let p = TokenProvider::new(&TokenOptions::Simple, Duration::from_secs(300)).unwrap();
        p.enable();
        let prefix = p.gen_prefix();
        assert_eq!(prefix.len(), 16);
        let token = p.assign(&AuthInfo::new("alice", 4), &prefix, 12).unwrap();
        assert_eq!(token, format!("{prefix}.12"));
        assert_eq!(p.required_index(&token), Some(12));
        assert_eq!(p.lookup(&token, 9), Some(AuthInfo::new("alice", 9)));
        p.invalidate_user("alice");
        assert_eq!(p.lookup(&token, 9), None);
    }

    #[test]
    fn nop_provider_refuses_to_issue() {
        let p = TokenProvider::new(&TokenOptions::Nop, Duration::ZERO).unwrap();
        assert_eq!(p.gen_prefix(), "");
        assert_eq!(
            p.assign(&AuthInfo::new("a", 1), "", 1),
            Err(RpcError::AuthFailed.into())
        );
        assert_eq!(p.lookup("x.1", 1), None);
    }

    #[test]
    fn jwt_provider_carries_the_signing_revision() {
        let key = |file: &str| {
            let dir = env!("CARGO_MANIFEST_DIR");
            Some(std::fs::read(format!("{dir}/src/auth/testdata/{file}")).unwrap())
        };
        let mut opts = JwtOptions {
            sign_method: jsonwebtoken::Algorithm::ES256,
            public_key: key("ec.pub"),
            private_key: key("ec.key"),
            ttl: options::DEFAULT_JWT_TTL,
        };
        let p = TokenProvider::new(&TokenOptions::Jwt(opts.clone()), Duration::ZERO).unwrap();
        assert_eq!(p.gen_prefix(), "");
        let token = p.assign(&AuthInfo::new("alice", 4), "", 12).unwrap();
        assert_eq!(p.required_index(&token), None);
        assert_eq!(p.lookup(&token, 9), Some(AuthInfo::new("alice", 4)));
        (opts.public_key, opts.private_key) = (None, None);
        assert!(matches!(
            TokenProvider::new(&TokenOptions::Jwt(opts), Duration::ZERO),
            Err(AuthError::MissingKey)
        ));
    }
}
