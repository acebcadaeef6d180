//! Auth (etcd `server/auth`): users, roles, key-range permissions, the auth revision, and the
//! tokens that carry a user's identity from Authenticate to later requests.
//!
//! # Model
//!
//! - A **user** has a bcrypt password hash (or none: `no_password`, for TLS-CN logins), and a
//!   sorted list of role names.
//! - A **role** has permissions: READ, WRITE or READWRITE on a single key (empty
//!   `range_end`), a range `[key, range_end)`, a prefix (a range whose end is the prefix + 1),
//!   or every key from `key` on (`range_end = "\0"`).
//! - User **`root`** with role **`root`** is the superuser. Role `root` grants READWRITE on
//!   every key and is the only admin role; it may be granted without existing as a role.
//! - The **auth revision** starts at 1 and moves by one on every user or role change and on
//!   AuthDisable. A request made with credentials from an older revision is refused with
//!   `ErrGRPCAuthOldRevision`, and clients re-authenticate.
//!
//! # Parts
//!
//! - [`store`]: the state machine (`apply_*` per Auth request) and its loading;
//!   [`storage`]: the records' encoding and the [`storage::AuthWrites`] trait apply stages into;
//!   [`perm`]: the per-user permission cache; [`check`]: which request needs what;
//!   [`apply`]: the hook that runs one auth entry (check, change, token effects);
//!   [`state`]: the store and token provider the applier and the API share;
//!   [`password`]: bcrypt; [`token`]: simple and JWT tokens; [`error`]: auth's errors.
//!
//! # Storage (first byte `a`, owned by this module)
//!
//! The keys are declared in [`crate::backend::schema`] (`AUTH_*`: format version, enabled
//! flag, auth revision, `a/user/<name>` → prost `authpb.User`, `a/role/<name>` → prost
//! `authpb.Role`); [`storage`] encodes and decodes their values.
//!
//! # Invariants
//!
//! - Apply results depend only on the entry and the state (no clock, randomness or local
//!   flag): members applying the same log hold equal stores. Passwords arrive hashed; tokens'
//!   random parts arrive in the entry.
//! - Every durable auth change is staged in the same batch as the consistent index of the
//!   entry that made it, so a restart never re-applies it (etcd #11651).
//! - The permission cache is rebuilt from the stored users and roles whenever the store is
//!   loaded from sled or from a snapshot's records (etcd #14571), and kept equal to that
//!   rebuild by every change.
//! - bcrypt never runs under a lock ([`password`]).
//! - While auth is enabled, user `root` exists and holds role `root`.

pub mod apply;
pub mod check;
pub mod error;
pub mod model;
pub mod password;
pub mod perm;
pub mod state;
pub mod storage;
pub mod store;
pub mod token;

#[cfg(test)]
mod tests;

pub use apply::{AuthRequest, AuthResponse, InternalAuthenticate};
pub use error::AuthError;
pub use model::{Access, AuthInfo, ROOT_ROLE, ROOT_USER};
pub use state::AuthState;
pub use storage::AuthWrites;
pub use store::AuthStore;
pub use token::TokenProvider;
