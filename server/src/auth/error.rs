//! Every error the auth component can return, with etcd's exact text and gRPC code.
//!
//! clientv3 and etcdctl recognise errors by their message (`rpctypes.Error` looks them up in
//! `errStringToError`), so each text is byte-for-byte etcd's:
//!
//! - the client-facing ones are entries of etcd's catalogue, [`keel_proto::rpctypes`]
//!   (`ErrGRPC*` of `api/v3rpc/rpctypes/error.go`), wrapped as [`AuthError::Rpc`] with the
//!   code and text the catalogue gives them (etcd's `togRPCError` maps the `auth.Err*` of
//!   `server/auth/store.go` to them);
//! - the others are `auth.Err*` (or bcrypt) errors that `togRPCError` does not map: etcd
//!   answers them with gRPC `Unknown` and the Go error's own text, and so does Keel. Their
//!   texts live here, the one place in auth that spells an error text;
//! - [`AuthError::PlaintextPassword`] and [`AuthError::Internal`] are Keel's own (see
//!   docs/auth.md, "What differs from etcd").

use keel_proto::rpctypes::RpcError;
use tonic::{Code, Status};

use crate::error::EtcdError;

/// An auth failure: one of etcd's auth errors, or a Keel-only internal one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// One of etcd's client-facing errors (in auth: `RootUserNotExist`, `RootRoleNotExist`,
    /// `UserAlreadyExist`, `UserEmpty`, `UserNotFound`, `RoleAlreadyExist`, `RoleNotFound`,
    /// `RoleEmpty`, `AuthFailed`, `PermissionNotGiven`, `PermissionDenied`, `RoleNotGranted`,
    /// `PermissionNotGranted`, `AuthNotEnabled`, `InvalidAuthToken`, `InvalidAuthMgmt`,
    /// `AuthOldRevision`), sent with the catalogue's code and text.
    #[error(transparent)]
    Rpc(#[from] RpcError),

    /// Authenticate as a user created with `no_password`, or a hashed password that does not
    /// decode (etcd `auth.ErrNoPasswordUser`; gRPC `Unknown`).
    #[error("auth: authentication failed, password was given for no password user")]
    NoPasswordUser,
    /// A password longer than bcrypt's 72 bytes (Go `bcrypt.ErrPasswordTooLong`, returned by
    /// etcd's UserAdd/UserChangePassword; gRPC `Unknown`).
    #[error("bcrypt: password length exceeds 72 bytes")]
    PasswordTooLong,
    /// Authenticate on a member whose JWT provider only has a public key
    /// (etcd `auth.ErrVerifyOnly`; gRPC `Unknown`).
    #[error("auth: token signing attempted with verify-only key")]
    VerifyOnly,
    /// A malformed `--auth-token` value (etcd `auth.ErrInvalidAuthOpts`); a start-up error.
    #[error("auth: invalid auth options")]
    InvalidAuthOpts,
    /// A JWT `sign-method` etcd does not know (etcd `auth.ErrInvalidAuthMethod`).
    #[error("auth: invalid auth signature method")]
    InvalidAuthMethod,
    /// JWT options without a usable key (etcd `auth.ErrMissingKey`).
    #[error("auth: missing key data")]
    MissingKey,
    /// JWT `pub-key` and `priv-key` that are not one key pair (etcd `auth.ErrKeyMismatch`).
    #[error("auth: public and private keys don't match")]
    KeyMismatch,

    /// Keel only: an applied UserAdd/UserChangePassword carries a plaintext `password` and no
    /// `hashedPassword`. Keel's API hashes before proposing, so this never comes from Keel;
    /// hashing at apply (etcd's pre-3.5 path) would make members differ (random salts).
    #[error("keel: auth request carries a plaintext password; only hashed passwords are applied")]
    PlaintextPassword,
    /// Keel only: a failure that is not etcd's (bcrypt, key loading); the text says what.
    #[error("keel: auth: {0}")]
    Internal(String),
}

impl AuthError {
    /// The gRPC status code etcd answers this error with (its [`RpcError::code`], or
    /// `Unknown` for the errors `togRPCError` does not map).
    pub fn code(&self) -> Code {
        use AuthError::*;
        match self {
            Rpc(e) => e.code(),
            NoPasswordUser | PasswordTooLong | VerifyOnly | InvalidAuthOpts | InvalidAuthMethod
            | MissingKey | KeyMismatch => Code::Unknown,
            PlaintextPassword => Code::InvalidArgument,
            Internal(_) => Code::Internal,
        }
    }

    /// The gRPC status a client receives: [`Self::code`] with etcd's text.
    pub fn to_status(&self) -> Status {
        Status::new(self.code(), self.to_string())
    }
}

impl From<AuthError> for Status {
    fn from(e: AuthError) -> Status {
        e.to_status()
    }
}

/// An auth error on the paths that carry [`EtcdError`] (an apply result in the log, the
/// API's shared error type): catalogue entries stay themselves; the Go-text errors keep their
/// text (`InvalidArgument` for Keel's plaintext refusal, `Internal` otherwise, as a raft
/// response's error decodes them).
impl From<AuthError> for EtcdError {
    fn from(e: AuthError) -> EtcdError {
        match e {
            AuthError::Rpc(r) => EtcdError::Rpc(r),
            AuthError::PlaintextPassword => EtcdError::InvalidArgument(e.to_string()),
            other => EtcdError::Internal(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The catalogue's entries pass through unchanged (their texts and codes are pinned by
    /// `keel_proto::rpctypes`' own tests against etcd's `error.go`).
    #[test]
    fn client_facing_errors_are_the_catalogues() {
        for e in [
            RpcError::UserNotFound,
            RpcError::AuthOldRevision,
            RpcError::PermissionDenied,
        ] {
            let status = AuthError::from(e).to_status();
            assert_eq!((status.code(), status.message()), (e.code(), e.message()));
        }
        assert_eq!(
            AuthError::from(RpcError::InvalidAuthToken).code(),
            Code::Unauthenticated
        );
    }

    #[test]
    fn unmapped_errors_answer_unknown_with_gos_text() {
        let status = AuthError::NoPasswordUser.to_status();
        assert_eq!(status.code(), Code::Unknown);
        assert_eq!(
            status.message(),
            "auth: authentication failed, password was given for no password user"
        );
        assert_eq!(
            AuthError::InvalidAuthOpts.to_string(),
            "auth: invalid auth options"
        );
        assert_eq!(
            AuthError::PasswordTooLong.to_string(),
            "bcrypt: password length exceeds 72 bytes"
        );
    }
}
