//! Which end-to-end tests may run at the same time inside one test binary.
//!
//! libtest runs a binary's tests on several threads. Tests whose assertions involve timing
//! (failover within two election timeouts, lease expiry bounds, RPC batching) or that start
//! multi-member clusters must not share the 2-core CI box with another test's members, so
//! they run [`exclusive`]ly; light single-member tests run [`shared`], alongside each other.
//! Every test that starts a member takes one of the two guards for its whole run; a test that
//! takes neither may overlap anything.

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

static SCHEDULE: RwLock<()> = RwLock::new(());

/// Held by a test that runs alone: no other guarded test runs until it is dropped.
pub struct Exclusive {
    _guard: RwLockWriteGuard<'static, ()>,
}

/// Held by a test that may run alongside other [`shared`] tests, but never alongside an
/// [`exclusive`] one.
pub struct Shared {
    _guard: RwLockReadGuard<'static, ()>,
}

/// Waits until no other guarded test runs, then keeps them out until the guard is dropped.
/// A panicking test releases it as usual (the lock's poison is ignored).
pub fn exclusive() -> Exclusive {
    Exclusive {
        _guard: SCHEDULE.write().unwrap_or_else(|e| e.into_inner()),
    }
}

/// Waits until no [`exclusive`] test runs; runs alongside other shared tests.
pub fn shared() -> Shared {
    Shared {
        _guard: SCHEDULE.read().unwrap_or_else(|e| e.into_inner()),
    }
}
