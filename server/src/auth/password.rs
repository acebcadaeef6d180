//! Password hashing and checking with bcrypt (etcd uses Go's `golang.org/x/crypto/bcrypt`).
//!
//! bcrypt is slow on purpose: at the default cost 10 one hash or check takes tens of
//! milliseconds of CPU. **Never call [`hash`] or [`verify`] while holding a lock** (the auth
//! store's, the apply loop's, or any other): etcd did, and Authenticate then ran one at a time
//! (etcd #11735: 18 → 200 authentications/s once moved out). The API layer hashes before it
//! proposes (the log carries only hashes) and checks after it has copied the hash out of the
//! store ([`super::store::AuthStore::password_check`]), ideally on a blocking-task pool so
//! checks run in parallel on every core.
//!
//! Hashes use the `$2a$` prefix, as Go's bcrypt writes them, so a hash made by Keel verifies
//! in etcd and the other way round.

use base64::Engine as _;

use super::error::AuthError;

/// bcrypt's cost when `--bcrypt-cost` is not given (Go `bcrypt.DefaultCost`).
pub const DEFAULT_COST: u32 = 10;
/// Lowest cost bcrypt accepts (Go `bcrypt.MinCost`).
pub const MIN_COST: u32 = 4;
/// Highest cost bcrypt accepts (Go `bcrypt.MaxCost`).
pub const MAX_COST: u32 = 31;
/// Longest password bcrypt hashes, in bytes (Go `bcrypt.ErrPasswordTooLong` past it).
pub const MAX_PASSWORD_BYTES: usize = 72;

/// The cost to use for `--bcrypt-cost requested`: the value itself within
/// [[`MIN_COST`], [`MAX_COST`]], otherwise [`DEFAULT_COST`] with a warning (etcd
/// `NewAuthStore`).
pub fn effective_cost(requested: u32) -> u32 {
    if (MIN_COST..=MAX_COST).contains(&requested) {
        requested
    } else {
        tracing::warn!(
            min_cost = MIN_COST,
            max_cost = MAX_COST,
            default_cost = DEFAULT_COST,
            given_cost = requested,
            "use default bcrypt cost instead of the invalid given cost"
        );
        DEFAULT_COST
    }
}

/// Hashes `password` with bcrypt at `cost` and returns it as the `hashedPassword` field of
/// UserAdd/UserChangePassword carries it: base64 (standard alphabet) of the `$2a$` hash
/// (etcd `EtcdServer.UserAdd`). Slow: never call it under a lock.
///
/// Errors: a password over [`MAX_PASSWORD_BYTES`] ([`AuthError::PasswordTooLong`]); a cost
/// outside bcrypt's range ([`AuthError::Internal`]; pass [`effective_cost`]'s result).
pub fn hash(password: &str, cost: u32) -> Result<String, AuthError> {
    if password.len() > MAX_PASSWORD_BYTES {
        return Err(AuthError::PasswordTooLong);
    }
    let parts = bcrypt::hash_with_result(password, cost)
        .map_err(|e| AuthError::Internal(format!("bcrypt: {e}")))?;
    let hash = parts.format_for_version(bcrypt::Version::TwoA);
    Ok(base64::engine::general_purpose::STANDARD.encode(hash))
}

/// True when `password` matches the stored bcrypt `hash` (etcd
/// `bcrypt.CompareHashAndPassword`). A hash that does not parse matches nothing. Slow: never
/// call it under a lock.
pub fn verify(password: &str, hash: &[u8]) -> bool {
    let Ok(hash) = std::str::from_utf8(hash) else {
        return false;
    };
    bcrypt::verify(password, hash).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(hashed: &str) -> Vec<u8> {
        base64::engine::general_purpose::STANDARD
            .decode(hashed)
            .unwrap()
    }

    #[test]
    fn hashes_verify_and_wrong_passwords_do_not() {
        let hashed = hash("s3cret", MIN_COST).unwrap();
        let h = stored(&hashed);
        assert!(h.starts_with(b"$2a$04$"), "{}", String::from_utf8_lossy(&h));
        assert!(verify("s3cret", &h));
        assert!(!verify("s3cret ", &h));
        assert!(!verify("", &h));
        assert!(!verify("s3cret", b"not a hash"));
        assert!(!verify("s3cret", b""));
    }

    #[test]
    fn salts_differ_between_hashes() {
        assert_ne!(hash("x", MIN_COST).unwrap(), hash("x", MIN_COST).unwrap());
    }

    #[test]
    fn verifies_a_published_2a_test_vector() {
        // OpenBSD / John the Ripper bcrypt test vector (the format Go's bcrypt writes).
        let vector = b"$2a$05$CCCCCCCCCCCCCCCCCCCCC.E5YPO9kmyuRGyh0XouQYb4YMJKvyOeW";
        assert!(verify("U*U", vector));
        assert!(!verify("U*V", vector));
    }

    #[test]
    fn passwords_longer_than_72_bytes_are_refused() {
        assert!(hash(&"x".repeat(72), MIN_COST).is_ok());
        assert_eq!(
            hash(&"x".repeat(73), MIN_COST),
            Err(AuthError::PasswordTooLong)
        );
    }

    #[test]
    fn costs_outside_bcrypts_range_fall_back_to_the_default() {
        assert_eq!(effective_cost(4), 4);
        assert_eq!(effective_cost(31), 31);
        assert_eq!(effective_cost(3), DEFAULT_COST);
        assert_eq!(effective_cost(32), DEFAULT_COST);
        assert_eq!(effective_cost(0), DEFAULT_COST);
    }
}
