//! Every error the auth component can return, with etcd's exact text and gRPC code.
//!
//! This file is the ONE place that holds auth's error texts. clientv3 and etcdctl recognise
//! errors by their message (`rpctypes.Error` looks them up in `errStringToError`), so each
//! text is byte-for-byte etcd's:
//!
//! - the client-facing ones are etcd's `ErrGRPC*` of `api/v3rpc/rpctypes/error.go` (v3.6.14,
//!   unchanged since 3.4), the status etcd's `togRPCError` gives the `auth.Err*` of
//!   `server/auth/store.go`;
//! - the others are `auth.Err*` (or bcrypt) errors that `togRPCError` does not map: etcd
//!   answers them with gRPC `Unknown` and the Go error's own text, and so does Keel;
//! - [`AuthError::PlaintextPassword`] and [`AuthError::Internal`] are Keel's own (see
//!   docs/auth.md, "What differs from etcd").

use tonic::{Code, Status};

/// An auth failure: one of etcd's auth errors, or a Keel-only internal one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// AuthEnable without a user `root` (`ErrGRPCRootUserNotExist`).
    #[error("etcdserver: root user does not exist")]
    RootUserNotExist,
    /// AuthEnable while user `root` lacks role `root` (`ErrGRPCRootRoleNotExist`).
    #[error("etcdserver: root user does not have root role")]
    RootRoleNotExist,
    /// UserAdd of an existing name (`ErrGRPCUserAlreadyExist`).
    #[error("etcdserver: user name already exists")]
    UserAlreadyExist,
    /// UserAdd with an empty name, or a request without credentials while auth is on
    /// (`ErrGRPCUserEmpty`).
    #[error("etcdserver: user name is empty")]
    UserEmpty,
    /// A user that does not exist (`ErrGRPCUserNotFound`).
    #[error("etcdserver: user name not found")]
    UserNotFound,
    /// RoleAdd of an existing name (`ErrGRPCRoleAlreadyExist`).
    #[error("etcdserver: role name already exists")]
    RoleAlreadyExist,
    /// A role that does not exist (`ErrGRPCRoleNotFound`).
    #[error("etcdserver: role name not found")]
    RoleNotFound,
    /// RoleAdd with an empty name (`ErrGRPCRoleEmpty`).
    #[error("etcdserver: role name is empty")]
    RoleEmpty,
    /// Authenticate with an unknown user or a wrong password (`ErrGRPCAuthFailed`).
    #[error("etcdserver: authentication failed, invalid user ID or password")]
    AuthFailed,
    /// RoleGrantPermission without a permission (`ErrGRPCPermissionNotGiven`).
    #[error("etcdserver: permission not given")]
    PermissionNotGiven,
    /// The user may not do this (`ErrGRPCPermissionDenied`).
    #[error("etcdserver: permission denied")]
    PermissionDenied,
    /// UserRevokeRole of a role the user does not hold (`ErrGRPCRoleNotGranted`).
    #[error("etcdserver: role is not granted to the user")]
    RoleNotGranted,
    /// RoleRevokePermission of a permission the role does not hold
    /// (`ErrGRPCPermissionNotGranted`).
    #[error("etcdserver: permission is not granted to the role")]
    PermissionNotGranted,
    /// Authenticate while auth is disabled (`ErrGRPCAuthNotEnabled`).
    #[error("etcdserver: authentication is not enabled")]
    AuthNotEnabled,
    /// A token that is unknown, expired, forged or malformed (`ErrGRPCInvalidAuthToken`).
    #[error("etcdserver: invalid auth token")]
    InvalidAuthToken,
    /// A change the root rules forbid, or an invalid permission range
    /// (`ErrGRPCInvalidAuthMgmt`).
    #[error("etcdserver: invalid auth management")]
    InvalidAuthMgmt,
    /// The request's auth revision is older than the store's (`ErrGRPCAuthOldRevision`);
    /// clientv3 re-authenticates and retries.
    #[error("etcdserver: revision of auth store is old")]
    AuthOldRevision,

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
    /// The gRPC status code etcd answers this error with (its `rpctypes` entry, or `Unknown`
    /// for the errors `togRPCError` does not map).
    pub fn code(&self) -> Code {
        use AuthError::*;
        match self {
            UserEmpty | RoleEmpty | AuthFailed | PermissionNotGiven | InvalidAuthMgmt
            | AuthOldRevision => Code::InvalidArgument,
            RootUserNotExist | RootRoleNotExist | UserAlreadyExist | UserNotFound
            | RoleAlreadyExist | RoleNotFound | RoleNotGranted | PermissionNotGranted
            | AuthNotEnabled => Code::FailedPrecondition,
            PermissionDenied => Code::PermissionDenied,
            InvalidAuthToken => Code::Unauthenticated,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// etcd's `rpctypes.ErrGRPC*` for auth, copied from api/v3rpc/rpctypes/error.go (v3.6.14).
    #[test]
    fn client_facing_texts_and_codes_are_etcds() {
        use AuthError::*;
        let table = [
            (
                RootUserNotExist,
                Code::FailedPrecondition,
                "etcdserver: root user does not exist",
            ),
            (
                RootRoleNotExist,
                Code::FailedPrecondition,
                "etcdserver: root user does not have root role",
            ),
            (
                UserAlreadyExist,
                Code::FailedPrecondition,
                "etcdserver: user name already exists",
            ),
            (
                UserEmpty,
                Code::InvalidArgument,
                "etcdserver: user name is empty",
            ),
            (
                UserNotFound,
                Code::FailedPrecondition,
                "etcdserver: user name not found",
            ),
            (
                RoleAlreadyExist,
                Code::FailedPrecondition,
                "etcdserver: role name already exists",
            ),
            (
                RoleNotFound,
                Code::FailedPrecondition,
                "etcdserver: role name not found",
            ),
            (
                RoleEmpty,
                Code::InvalidArgument,
                "etcdserver: role name is empty",
            ),
            (
                AuthFailed,
                Code::InvalidArgument,
                "etcdserver: authentication failed, invalid user ID or password",
            ),
            (
                PermissionNotGiven,
                Code::InvalidArgument,
                "etcdserver: permission not given",
            ),
            (
                PermissionDenied,
                Code::PermissionDenied,
                "etcdserver: permission denied",
            ),
            (
                RoleNotGranted,
                Code::FailedPrecondition,
                "etcdserver: role is not granted to the user",
            ),
            (
                PermissionNotGranted,
                Code::FailedPrecondition,
                "etcdserver: permission is not granted to the role",
            ),
            (
                AuthNotEnabled,
                Code::FailedPrecondition,
                "etcdserver: authentication is not enabled",
            ),
            (
                InvalidAuthToken,
                Code::Unauthenticated,
                "etcdserver: invalid auth token",
            ),
            (
                InvalidAuthMgmt,
                Code::InvalidArgument,
                "etcdserver: invalid auth management",
            ),
            (
                AuthOldRevision,
                Code::InvalidArgument,
                "etcdserver: revision of auth store is old",
            ),
        ];
        for (err, code, text) in table {
            let status = err.to_status();
            assert_eq!(status.code(), code, "{err:?}");
            assert_eq!(status.message(), text, "{err:?}");
        }
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
