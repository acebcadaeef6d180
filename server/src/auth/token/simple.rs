//! etcd's `simple` tokens (`server/auth/simple_token.go`): random, unsigned, kept in each
//! member's memory.
//!
//! Format: `<16 random letters [a-zA-Z]>.<raft index>`, e.g. `sssvIpwfnLAcWAQH.9`. The
//! proposer draws the letters ([`SimpleTokens::gen_prefix`]) and proposes them with the
//! Authenticate entry; every member that applies the entry at index `i` records
//! `<letters>.<i>` for the user ([`SimpleTokens::assign`]), so the token is valid on every
//! member once it has applied index `i` (the caller waits for that index, taken from the
//! token by [`index_of`], before it looks the token up: etcd's `indexWaiter`).
//!
//! A token lives `--auth-token-ttl` seconds (default 300) after its last use: each
//! successful lookup pushes the deadline back (etcd `resetSimpleToken`). Tokens are dropped
//! on UserDelete and UserChangePassword ([`SimpleTokens::invalidate_user`]), all of them on
//! AuthDisable, and none survive a restart. Deadlines use the local monotonic clock: they
//! never influence apply results, only whether this member still accepts a token.
//!
//! The map sits behind a mutex held only for a map operation (no I/O, no bcrypt).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::Rng as _;

/// Letters a simple token's random part is drawn from (etcd `letters`).
const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
/// Length of the random part (etcd `defaultSimpleTokenLength`).
pub const PREFIX_LEN: usize = 16;
/// `--auth-token-ttl` default (etcd `simpleTokenTTLDefault`).
pub const DEFAULT_TTL: Duration = Duration::from_secs(300);

/// The raft index a simple token was issued at, or `None` if `token` is not
/// `<prefix>.<decimal index>` (etcd `isValidSimpleToken`'s parse).
pub fn index_of(token: &str) -> Option<u64> {
    let (prefix, index) = token.split_once('.')?;
    if prefix.contains('.') || index.contains('.') {
        return None;
    }
    // Go's ParseUint: decimal digits only (no sign).
    if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    index.parse().ok()
}

/// The simple-token provider of one member.
#[derive(Debug)]
pub struct SimpleTokens {
    ttl: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// False while auth is disabled: nothing is recorded (etcd: no TTL keeper).
    enabled: bool,
    /// token → (user name, deadline).
    tokens: HashMap<String, (String, Instant)>,
}

impl SimpleTokens {
    /// A provider whose tokens live `ttl` after their last use (zero = [`DEFAULT_TTL`], as
    /// etcd treats a non-positive TTL). Starts disabled.
    pub fn new(ttl: Duration) -> SimpleTokens {
        SimpleTokens {
            ttl: if ttl.is_zero() { DEFAULT_TTL } else { ttl },
            state: Mutex::default(),
        }
    }

    /// The TTL in force.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// 16 random letters from a cryptographically secure generator (etcd `genTokenPrefix`).
    pub fn gen_prefix() -> String {
        let mut rng = rand::thread_rng();
        (0..PREFIX_LEN)
            .map(|_| LETTERS[rng.gen_range(0..LETTERS.len())] as char)
            .collect()
    }

    /// Records the token of the Authenticate entry at raft `index` with random part
    /// `prefix`, for `username`, and returns it. While disabled the token is returned but not
    /// recorded, so it is never accepted (etcd).
    pub fn assign(&self, username: &str, prefix: &str, index: u64, now: Instant) -> String {
        let token = format!("{prefix}.{index}");
        let mut state = self.state.lock().expect("simple token map poisoned");
        if state.enabled {
            state
                .tokens
                .insert(token.clone(), (username.to_string(), now + self.ttl));
        }
        token
    }

    /// The user of a live `token`, pushing its deadline to `now + ttl`; `None` for an
    /// unknown, malformed or expired token (an expired one is dropped).
    pub fn lookup(&self, token: &str, now: Instant) -> Option<String> {
        index_of(token)?;
        let mut state = self.state.lock().expect("simple token map poisoned");
        let (user, deadline) = state.tokens.get_mut(token)?;
        if *deadline <= now {
            state.tokens.remove(token);
            return None;
        }
        *deadline = now + self.ttl;
        Some(user.clone())
    }

    /// Drops every token of `username` (UserDelete, UserChangePassword).
    pub fn invalidate_user(&self, username: &str) {
        let mut state = self.state.lock().expect("simple token map poisoned");
        state.tokens.retain(|_, (user, _)| user != username);
    }

    /// Starts recording tokens (auth enabled, on apply or on load).
    pub fn enable(&self) {
        self.state
            .lock()
            .expect("simple token map poisoned")
            .enabled = true;
    }

    /// Stops recording tokens and drops all of them (AuthDisable).
    pub fn disable(&self) {
        let mut state = self.state.lock().expect("simple token map poisoned");
        state.enabled = false;
        state.tokens.clear();
    }

    /// Drops the tokens whose deadline is at or before `now`, returning how many (call it
    /// about once a second: etcd's `simpleTokenTTLResolution`).
    pub fn sweep(&self, now: Instant) -> usize {
        let mut state = self.state.lock().expect("simple token map poisoned");
        let before = state.tokens.len();
        state.tokens.retain(|_, (_, deadline)| *deadline > now);
        before - state.tokens.len()
    }

    /// How many tokens are live or not yet swept.
    pub fn len(&self) -> usize {
        self.state
            .lock()
            .expect("simple token map poisoned")
            .tokens
            .len()
    }

    /// True when no token is recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_16_letters_and_differ() {
        let a = SimpleTokens::gen_prefix();
        assert_eq!(a.len(), PREFIX_LEN);
        assert!(a.bytes().all(|b| b.is_ascii_alphabetic()), "{a}");
        assert_ne!(a, SimpleTokens::gen_prefix());
    }

    #[test]
    fn index_is_parsed_like_etcd() {
        assert_eq!(index_of("sssvIpwfnLAcWAQH.9"), Some(9));
        assert_eq!(index_of("abc.18446744073709551615"), Some(u64::MAX));
        assert_eq!(index_of("abc"), None);
        assert_eq!(index_of("abc.9.1"), None);
        assert_eq!(index_of("abc.x"), None);
        assert_eq!(index_of("abc.+9"), None);
        assert_eq!(index_of("abc."), None);
        assert_eq!(index_of("abc.18446744073709551616"), None);
    }

    #[test]
    fn the_ttl_slides_with_each_use() {
        let tokens = SimpleTokens::new(Duration::from_secs(10));
        tokens.enable();
        let t0 = Instant::now();
        let token = tokens.assign("alice", "sssvIpwfnLAcWAQH", 9, t0);
        assert_eq!(token, "sssvIpwfnLAcWAQH.9");
        let s = Duration::from_secs;
        assert_eq!(tokens.lookup(&token, t0 + s(9)).as_deref(), Some("alice"));
        // Used at 9 s: now valid until 19 s.
        assert_eq!(tokens.lookup(&token, t0 + s(18)).as_deref(), Some("alice"));
        assert_eq!(
            tokens.lookup(&token, t0 + s(28)),
            None,
            "expired 10 s after last use"
        );
        assert_eq!(
            tokens.lookup(&token, t0 + s(18)),
            None,
            "an expired token is gone"
        );
    }

    #[test]
    fn user_changes_and_disable_drop_tokens() {
        let tokens = SimpleTokens::new(Duration::ZERO);
        assert_eq!(tokens.ttl(), DEFAULT_TTL);
        let now = Instant::now();
        let ignored = tokens.assign("alice", "aaaaaaaaaaaaaaaa", 1, now);
        assert_eq!(
            tokens.lookup(&ignored, now),
            None,
            "not recorded while disabled"
        );
        tokens.enable();
        let a = tokens.assign("alice", "aaaaaaaaaaaaaaaa", 2, now);
        let b = tokens.assign("bob", "bbbbbbbbbbbbbbbb", 3, now);
        tokens.invalidate_user("alice");
        assert_eq!(tokens.lookup(&a, now), None);
        assert_eq!(tokens.lookup(&b, now).as_deref(), Some("bob"));
        tokens.disable();
        assert_eq!(tokens.lookup(&b, now), None);
        assert!(tokens.is_empty());
    }

    #[test]
    fn sweep_drops_only_expired_tokens() {
        let tokens = SimpleTokens::new(Duration::from_secs(5));
        tokens.enable();
        let t0 = Instant::now();
        tokens.assign("a", "aaaaaaaaaaaaaaaa", 1, t0);
        tokens.assign("b", "bbbbbbbbbbbbbbbb", 2, t0 + Duration::from_secs(3));
        assert_eq!(tokens.sweep(t0 + Duration::from_secs(6)), 1);
        assert_eq!(tokens.len(), 1);
    }
}
