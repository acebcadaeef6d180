//! [`LeaseIdGenerator`]: lease IDs chosen by the proposing member, before proposing.
//!
//! etcd's `LeaseGrant` picks an ID with the member's request ID generator
//! (`idutil.Generator`) when the client leaves `ID` at 0, and keeps only positive values
//! (`id & (1<<63 - 1)`). The layout is the same here: the low 16 bits of the member ID, then
//! a 48-bit counter that starts at the start-up time in milliseconds shifted left by 8. Two
//! members therefore never generate the same ID, and a restarted member starts past the IDs
//! it generated before (unless its clock went back). The ID is fixed before the entry is
//! proposed, so every member applies the same one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use super::LeaseId;

const SUFFIX_BITS: u32 = 48;
const SUFFIX_MASK: u64 = (1 << SUFFIX_BITS) - 1;

/// Generates positive, non-zero lease IDs unique to one member. Thread-safe.
#[derive(Debug)]
pub struct LeaseIdGenerator {
    prefix: u64,
    suffix: AtomicU64,
}

impl LeaseIdGenerator {
    /// A generator for `member_id`, seeded from the wall clock.
    pub fn new(member_id: u64) -> LeaseIdGenerator {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        LeaseIdGenerator::with_seed(member_id, ms)
    }

    /// A generator for `member_id` whose counter starts at `unix_ms << 8` (tests).
    pub fn with_seed(member_id: u64, unix_ms: u64) -> LeaseIdGenerator {
        LeaseIdGenerator {
            prefix: (member_id & 0xffff) << SUFFIX_BITS,
            suffix: AtomicU64::new((unix_ms << 8) & SUFFIX_MASK),
        }
    }

    /// The next ID: positive and never 0 ([`super::NO_LEASE`]).
    pub fn next(&self) -> LeaseId {
        loop {
            let suffix = self.suffix.fetch_add(1, Ordering::Relaxed).wrapping_add(1) & SUFFIX_MASK;
            let id = ((self.prefix | suffix) & (i64::MAX as u64)) as i64;
            if id != 0 {
                return id;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_positive_distinct_and_carry_the_member() {
        let a = LeaseIdGenerator::with_seed(0xabcd_1234, 1_700_000_000_000);
        let b = LeaseIdGenerator::with_seed(0xabcd_5678, 1_700_000_000_000);
        let (x, y) = (a.next(), a.next());
        assert!(x > 0 && y > x);
        assert_eq!((x as u64) >> SUFFIX_BITS, 0x1234);
        assert_ne!(a.next(), b.next(), "members differ in the prefix");
    }

    #[test]
    fn never_returns_zero_when_the_counter_wraps() {
        let g = LeaseIdGenerator::with_seed(0, 0);
        g.suffix.store(SUFFIX_MASK, Ordering::Relaxed);
        assert_eq!(g.next(), 1, "the wrapped counter skips 0");
    }
}
