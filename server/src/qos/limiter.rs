//! [`Limiters`]: the per-rule limits of a rule set: a token bucket (`governor`, GCRA) for
//! `rate`/`burst`, an in-flight cap with RAII [`Permit`]s, and the counters behind the
//! `keel_qos_*` metrics.
//!
//! Invariants:
//! - a rule never has more than `max_in_flight` admitted requests whose [`Permit`] is alive
//!   (the count is raised before the check and lowered again on refusal, so racing
//!   requests may both be refused at the cap, never both admitted over it);
//! - a refused request takes no token and holds no in-flight slot: the in-flight cap is
//!   tried before the bucket, and a bucket refusal gives the slot back;
//! - [`Limiters::rebuild`] keeps, by rule name, the counters and the in-flight count of
//!   every rule that stays (metrics are monotonic, live permits stay counted), and the
//!   bucket of every rule whose `rate` and `burst` are unchanged (a rule change must not
//!   hand a noisy client a fresh burst); a rule whose rate or burst changed starts with a
//!   full bucket of the new burst.
//!
//! The clock is a type parameter so tests drive buckets with governor's
//! `FakeRelativeClock`; members use governor's `DefaultClock` (quanta, monotonic).

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use governor::clock::{Clock, DefaultClock};
use governor::middleware::NoOpMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

use super::rules::{Priority, Rule};

/// One rule's token bucket.
pub type Bucket<C> = RateLimiter<NotKeyed, InMemoryState, C, NoOpMiddleware<<C as Clock>::Instant>>;

/// Why a rule's limits refused a request (both are `etcdserver: too many requests` to the
/// client; the reason is for metrics and logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The rule's token bucket is empty.
    Rate,
    /// The rule already has `max_in_flight` admitted requests in flight.
    InFlight,
}

/// The counters of one rule, shared by every limiter set that holds the rule and by its
/// live permits.
#[derive(Debug, Default)]
pub struct RuleCounters {
    in_flight: AtomicU32,
    allowed: AtomicU64,
    refused_rate: AtomicU64,
    refused_in_flight: AtomicU64,
    refused_overload: AtomicU64,
}

/// A snapshot of one rule's counters (`keel_qos_*` metrics, docs/qos.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleStats {
    /// The rule's name.
    pub name: String,
    /// Requests admitted.
    pub allowed: u64,
    /// Requests refused by the token bucket.
    pub refused_rate: u64,
    /// Requests refused by the in-flight cap.
    pub refused_in_flight: u64,
    /// Requests refused by overload protection ([`super::overload`]).
    pub refused_overload: u64,
    /// Admitted requests whose permit is alive.
    pub in_flight: u32,
}

impl RuleStats {
    /// Every refusal, whatever its reason.
    pub fn refused(&self) -> u64 {
        self.refused_rate + self.refused_in_flight + self.refused_overload
    }
}

/// Proof that a request was admitted. Held while the request runs: dropping it releases
/// the request's in-flight slot in its rule.
#[derive(Debug)]
#[must_use = "dropping the permit ends the request's in-flight slot"]
pub struct Permit {
    counters: Option<Arc<RuleCounters>>,
    priority: Priority,
}

impl Permit {
    /// The permit of a request that no rule governs.
    pub(super) fn unmatched(priority: Priority) -> Permit {
        Permit {
            counters: None,
            priority,
        }
    }

    /// The request's priority (its rule's, or its method's).
    pub fn priority(&self) -> Priority {
        self.priority
    }

    /// Whether a rule governs the request.
    pub fn is_ruled(&self) -> bool {
        self.counters.is_some()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(c) = &self.counters {
            c.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// The limits of one rule.
pub struct RuleLimiter<C: Clock = DefaultClock> {
    name: Arc<str>,
    rate_burst: Option<(u32, u32)>,
    max_in_flight: Option<u32>,
    priority: Option<Priority>,
    bucket: Option<Arc<Bucket<C>>>,
    counters: Arc<RuleCounters>,
}

impl<C: Clock> RuleLimiter<C> {
    /// The rule's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The rule's priority, if it sets one.
    pub fn priority(&self) -> Option<Priority> {
        self.priority
    }

    /// Admits one request at `priority` or refuses it: an in-flight slot first, then a
    /// token. Counts the outcome.
    pub fn acquire(&self, priority: Priority) -> Result<Permit, Refusal> {
        let c = &self.counters;
        let before = c.in_flight.fetch_add(1, Ordering::AcqRel);
        if self.max_in_flight.is_some_and(|max| before >= max) {
            c.in_flight.fetch_sub(1, Ordering::AcqRel);
            c.refused_in_flight.fetch_add(1, Ordering::Relaxed);
            return Err(Refusal::InFlight);
        }
        if let Some(bucket) = &self.bucket
            && bucket.check().is_err()
        {
            c.in_flight.fetch_sub(1, Ordering::AcqRel);
            c.refused_rate.fetch_add(1, Ordering::Relaxed);
            return Err(Refusal::Rate);
        }
        c.allowed.fetch_add(1, Ordering::Relaxed);
        Ok(Permit {
            counters: Some(Arc::clone(c)),
            priority,
        })
    }

    /// Counts a request of this rule refused by overload protection.
    pub fn count_overload(&self) {
        self.counters
            .refused_overload
            .fetch_add(1, Ordering::Relaxed);
    }

    /// The rule's counters now.
    pub fn stats(&self) -> RuleStats {
        let c = &self.counters;
        RuleStats {
            name: self.name.to_string(),
            allowed: c.allowed.load(Ordering::Relaxed),
            refused_rate: c.refused_rate.load(Ordering::Relaxed),
            refused_in_flight: c.refused_in_flight.load(Ordering::Relaxed),
            refused_overload: c.refused_overload.load(Ordering::Relaxed),
            in_flight: c.in_flight.load(Ordering::Acquire),
        }
    }
}

/// The limiters of a rule set, index-aligned with its rules (see the module doc).
pub struct Limiters<C: Clock = DefaultClock> {
    rules: Vec<RuleLimiter<C>>,
    clock: C,
}

impl<C: Clock + Clone> Limiters<C> {
    /// Fresh limiters (full buckets, zero counters) for validated `rules`, timed by `clock`.
    pub fn new(rules: &[Rule], clock: C) -> Limiters<C> {
        Limiters {
            rules: Vec::new(),
            clock,
        }
        .rebuild(rules)
    }

    /// The limiters of `rules` after a rule change, keeping what this set holds for the
    /// rules that stay (see the module doc).
    pub fn rebuild(&self, rules: &[Rule]) -> Limiters<C> {
        let old: HashMap<&str, &RuleLimiter<C>> =
            self.rules.iter().map(|l| (&*l.name, l)).collect();
        let rules = rules
            .iter()
            .map(|rule| {
                let kept = old.get(rule.name.as_str());
                let rate_burst = rule.rate.map(|r| (r, rule.burst.unwrap_or(r)));
                let bucket = match kept {
                    Some(k) if k.rate_burst == rate_burst => k.bucket.clone(),
                    _ => rate_burst.map(|(rate, burst)| Arc::new(self.bucket(rate, burst))),
                };
                RuleLimiter {
                    name: kept.map_or_else(|| rule.name.as_str().into(), |k| Arc::clone(&k.name)),
                    rate_burst,
                    max_in_flight: rule.max_in_flight,
                    priority: rule.priority,
                    bucket,
                    counters: kept.map_or_else(Arc::default, |k| Arc::clone(&k.counters)),
                }
            })
            .collect();
        Limiters {
            rules,
            clock: self.clock.clone(),
        }
    }

    fn bucket(&self, rate: u32, burst: u32) -> Bucket<C> {
        let nz = |v: u32| NonZeroU32::new(v).expect("validated rules have rate and burst > 0");
        let quota = Quota::per_second(nz(rate)).allow_burst(nz(burst));
        RateLimiter::direct_with_clock(quota, self.clock.clone())
    }
}

impl<C: Clock> Limiters<C> {
    /// The limiter of rule `index`.
    pub fn get(&self, index: usize) -> &RuleLimiter<C> {
        &self.rules[index]
    }

    /// Every rule's counters, in rule order.
    pub fn stats(&self) -> Vec<RuleStats> {
        self.rules.iter().map(RuleLimiter::stats).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use governor::clock::FakeRelativeClock;

    use super::*;
    use crate::qos::rules::Match;

    fn rule(name: &str, rate: Option<u32>, burst: Option<u32>, max_in_flight: Option<u32>) -> Rule {
        Rule {
            name: name.into(),
            matches: Match::default(),
            rate,
            burst,
            max_in_flight,
            priority: None,
        }
    }

    fn admitted(l: &RuleLimiter<FakeRelativeClock>, n: usize) -> usize {
        (0..n)
            .filter(|_| l.acquire(Priority::Normal).is_ok())
            .count()
    }

    #[test]
    fn a_bucket_admits_its_burst_then_its_rate() {
        let clock = FakeRelativeClock::default();
        let ls = Limiters::new(&[rule("a", Some(10), Some(5), None)], clock.clone());
        assert_eq!(admitted(ls.get(0), 20), 5);
        clock.advance(Duration::from_millis(500)); // 10/s: 5 tokens
        assert_eq!(admitted(ls.get(0), 20), 5);
        clock.advance(Duration::from_millis(99)); // not yet one more
        assert_eq!(admitted(ls.get(0), 1), 0);
        clock.advance(Duration::from_millis(1));
        assert_eq!(admitted(ls.get(0), 20), 1);
        let s = ls.get(0).stats();
        assert_eq!((s.allowed, s.refused_rate, s.in_flight), (11, 50, 0));
    }

    #[test]
    fn permits_hold_in_flight_slots() {
        let ls = Limiters::new(
            &[rule("a", None, None, Some(2))],
            FakeRelativeClock::default(),
        );
        let l = ls.get(0);
        let p1 = l.acquire(Priority::Normal).unwrap();
        let _p2 = l.acquire(Priority::Normal).unwrap();
        assert_eq!(l.acquire(Priority::Normal).unwrap_err(), Refusal::InFlight);
        drop(p1);
        assert!(l.acquire(Priority::Normal).is_ok());
        let s = l.stats();
        assert_eq!((s.allowed, s.refused_in_flight, s.in_flight), (3, 1, 1));
    }

    #[test]
    fn an_empty_bucket_gives_the_in_flight_slot_back() {
        let ls = Limiters::new(
            &[rule("a", Some(1), None, Some(5))],
            FakeRelativeClock::default(),
        );
        let _p = ls.get(0).acquire(Priority::Normal).unwrap();
        assert_eq!(
            ls.get(0).acquire(Priority::Normal).unwrap_err(),
            Refusal::Rate
        );
        assert_eq!(ls.get(0).stats().in_flight, 1);
    }

    #[test]
    fn rebuild_keeps_unchanged_buckets_and_every_kept_rules_counters() {
        let clock = FakeRelativeClock::default();
        let ls = Limiters::new(
            &[
                rule("same", Some(2), None, None),
                rule("changed", Some(2), None, None),
            ],
            clock,
        );
        assert_eq!(admitted(ls.get(0), 5), 2);
        assert_eq!(admitted(ls.get(1), 5), 2);
        assert_eq!(
            ls.get(1).acquire(Priority::Normal).unwrap_err(),
            Refusal::Rate
        );
        let ls2 = ls.rebuild(&[
            rule("changed", Some(3), None, None),
            rule("new", Some(1), None, None),
            rule("same", Some(2), Some(2), None), // burst written out: same quota
        ]);
        assert_eq!(
            admitted(ls2.get(2), 5),
            0,
            "same quota: the bucket is still empty"
        );
        assert_eq!(admitted(ls2.get(0), 5), 3, "new quota: a full bucket");
        assert_eq!(admitted(ls2.get(1), 5), 1);
        let s = ls2.get(0).stats();
        assert_eq!(
            (s.allowed, s.refused_rate),
            (5, 6),
            "counters survive the change"
        );
    }
}
