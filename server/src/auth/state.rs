//! The member's auth state as the applier and the API share it: the [`AuthStore`] behind a
//! read-write lock and the member's [`TokenProvider`].
//!
//! Invariants:
//! - Only the applier takes the write lock (to apply an auth entry, or to replace the whole
//!   store after a snapshot install); the API only reads.
//! - No lock is held while bcrypt runs: [`AuthState::password_check`] copies the hash out
//!   under the read lock and returns; the caller verifies after.
//! - The token provider follows the store: [`AuthState::replace`] re-syncs it
//!   ([`super::apply::sync_tokens`]), so a store loaded enabled records tokens and one loaded
//!   disabled drops them.

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::apply::sync_tokens;
use super::error::AuthError;
use super::model::AuthInfo;
use super::store::{AuthStore, PasswordCheck};
use super::token::TokenProvider;

/// The auth store and token provider of one member (module docs).
#[derive(Debug)]
pub struct AuthState {
    store: RwLock<AuthStore>,
    tokens: TokenProvider,
}

impl AuthState {
    /// Shares `store` (as loaded from the backend) with `tokens` put in step with it.
    pub fn new(store: AuthStore, tokens: TokenProvider) -> AuthState {
        sync_tokens(&store, &tokens);
        AuthState {
            store: RwLock::new(store),
            tokens,
        }
    }

    /// The store, for reading (checks, Authenticate's password lookup). Hold it briefly:
    /// the applier waits for it.
    pub fn read(&self) -> RwLockReadGuard<'_, AuthStore> {
        // A panic under the lock leaves the store as the last apply left it (apply changes
        // nothing on failure), so a poisoned lock is still consistent.
        self.store.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The store, for the applier.
    pub fn write(&self) -> RwLockWriteGuard<'_, AuthStore> {
        self.store.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The token provider.
    pub fn tokens(&self) -> &TokenProvider {
        &self.tokens
    }

    /// Replaces the whole store (open after a snapshot install; its permission cache was
    /// rebuilt by [`AuthStore::load`]) and re-syncs the tokens.
    pub fn replace(&self, store: AuthStore) {
        let mut guard = self.write();
        sync_tokens(&store, &self.tokens);
        *guard = store;
    }

    /// Whether auth is enabled now.
    pub fn is_enabled(&self) -> bool {
        self.read().is_enabled()
    }

    /// The auth revision now.
    pub fn revision(&self) -> u64 {
        self.read().revision()
    }

    /// [`AuthStore::password_check`] under the read lock, released on return.
    ///
    /// Errors: as [`AuthStore::password_check`].
    pub fn password_check(&self, name: &str) -> Result<PasswordCheck, AuthError> {
        self.read().password_check(name)
    }

    /// Who `token` authenticates, judged now (the caller waited for
    /// [`TokenProvider::required_index`]). `None` for a token that does not resolve.
    pub fn lookup(&self, token: &str) -> Option<AuthInfo> {
        let revision = self.revision();
        self.tokens.lookup(token, revision)
    }
}
