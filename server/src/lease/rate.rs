//! [`TokenBucket`]: the revocation rate limit of the leader's expiry loop.
//!
//! etcd revokes at most `leaseRevokeRate` = 1000 expired leases per second (etcd#12105), so
//! a storm of 100k leases due at once takes 100 s to clear. Keel keeps the limit (a storm
//! must not starve client writes of raft and apply capacity) but makes it a flag,
//! `--lease-revoke-rate`, whose default is far above etcd's; see docs/lease.md for the
//! measured expiry throughput.

use std::time::{Duration, Instant};

/// A token bucket: `rate` tokens per second, at most `burst` stored.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket refilling at `rate_per_sec` (at least 1) up to `burst` (at least 1)
    /// tokens.
    pub fn new(rate_per_sec: u64, burst: u64, now: Instant) -> TokenBucket {
        let burst = burst.max(1) as f64;
        TokenBucket {
            rate: rate_per_sec.max(1) as f64,
            burst,
            tokens: burst,
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.last = now;
    }

    /// Whole tokens available now.
    pub fn available(&mut self, now: Instant) -> usize {
        self.refill(now);
        self.tokens.floor() as usize
    }

    /// Spends `n` tokens (callers spend at most [`TokenBucket::available`]).
    pub fn consume(&mut self, n: usize) {
        self.tokens = (self.tokens - n as f64).max(0.0);
    }

    /// How long until at least `n` whole tokens are available (zero if they are; `n` is
    /// capped at the burst).
    pub fn wait_for(&mut self, n: usize, now: Instant) -> Duration {
        self.refill(now);
        let n = (n as f64).min(self.burst);
        if self.tokens >= n {
            Duration::ZERO
        } else {
            Duration::from_secs_f64((n - self.tokens) / self.rate)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_to_the_rate_after_the_burst() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(1000, 100, t0);
        assert_eq!(b.available(t0), 100, "a full bucket gives its burst");
        b.consume(100);
        assert_eq!(b.available(t0), 0);
        assert_eq!(b.wait_for(1, t0), Duration::from_millis(1));
        assert_eq!(b.wait_for(10, t0), Duration::from_millis(10));
        // 50 ms at 1000/s refills 50 tokens.
        assert_eq!(b.available(t0 + Duration::from_millis(50)), 50);
        // A long pause refills only up to the burst.
        assert_eq!(b.available(t0 + Duration::from_secs(60)), 100);
    }

    #[test]
    fn sustained_rate_matches_configuration() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10_000, 1000, t0);
        let mut taken = 0;
        for ms in 0..=1000 {
            let n = b.available(t0 + Duration::from_millis(ms));
            b.consume(n);
            taken += n;
        }
        // One second at 10k/s plus the initial burst.
        assert!((10_990..=11_000).contains(&taken), "took {taken}");
    }
}
