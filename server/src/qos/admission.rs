//! [`Admission`]: the one call the API layer makes per request, [`Admission::admit`], which
//! combines the matcher, overload protection and the rule's limits.
//!
//! Order of the checks, cheapest and least wasteful first:
//! 1. the governing rule ([`Matcher::first_match`]) and the request's priority (the rule's,
//!    else the method's);
//! 2. for a proposal, overload protection ([`overload::decide`]); a refusal here takes no
//!    token and no in-flight slot;
//! 3. the rule's in-flight cap, then its token bucket ([`RuleLimiter::acquire`]).
//!
//! [`Admission::check_overload`] runs step 2 alone, for a member that forwards a proposal
//! to the leader (which admits it in full).
//!
//! A request that no rule governs costs one read lock, the match loop, and for a proposal
//! three relaxed loads; it touches no shared counter. Nothing on the path allocates
//! (`server/tests/qos_alloc.rs`).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use governor::clock::{Clock, DefaultClock};
use keel_proto::rpctypes::RpcError;

use super::limiter::{Limiters, Permit, Refusal, RuleLimiter, RuleStats};
use super::matcher::Matcher;
use super::overload::{self, LoadGauge, Overload, Thresholds};
use super::request::RequestInfo;
use super::rules::Priority;
use super::ruleset::RuleSet;

/// Why [`Admission::check`] refused a request. Every reason is
/// `etcdserver: too many requests` to the client ([`RpcError::TooManyRequests`],
/// `ResourceExhausted`, which etcd clients treat as retryable).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The governing rule's limits ([`Refusal`]).
    Limit(Refusal),
    /// Overload protection ([`Overload`]).
    Overload(Overload),
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::Limit(Refusal::Rate) => f.write_str("rate"),
            Refused::Limit(Refusal::InFlight) => f.write_str("max_in_flight"),
            Refused::Overload(o) => write!(f, "overload: {o}"),
        }
    }
}

impl From<Refused> for RpcError {
    fn from(_: Refused) -> RpcError {
        RpcError::TooManyRequests
    }
}

/// Counters of [`Admission`], for the `keel_qos_*` metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissionStats {
    /// Each rule's counters, in rule order.
    pub rules: Vec<RuleStats>,
    /// Requests that no rule governs refused by overload protection, by priority
    /// (`[low, normal, high]`; without a rule only `normal` and `high` occur).
    pub unmatched_refused_overload: [u64; 3],
}

/// The rules in force and what they were compiled into.
struct Active<C: Clock> {
    rules: RuleSet,
    matcher: Matcher,
    limiters: Limiters<C>,
}

/// A member's admission control (see the module doc). Shared by every API handler
/// (`Arc<Admission>`); rule changes swap the compiled rules under a write lock.
pub struct Admission<C: Clock = DefaultClock> {
    active: RwLock<Active<C>>,
    load: Arc<LoadGauge>,
    thresholds: Thresholds,
    unmatched_refused_overload: [AtomicU64; 3],
}

impl Admission<DefaultClock> {
    /// Admission with `rules`, overload `thresholds` and the member's `load`, timed by
    /// governor's monotonic default clock.
    ///
    /// # Panics
    /// If `thresholds` break their ordering ([`Thresholds::validate`]); the config layer
    /// refuses such flags first.
    pub fn new(rules: RuleSet, thresholds: Thresholds, load: Arc<LoadGauge>) -> Admission {
        Admission::with_clock(rules, thresholds, load, DefaultClock::default())
    }
}

impl<C: Clock + Clone> Admission<C> {
    /// As [`Admission::new`], with the token buckets timed by `clock` (tests pass
    /// governor's `FakeRelativeClock`).
    pub fn with_clock(
        rules: RuleSet,
        thresholds: Thresholds,
        load: Arc<LoadGauge>,
        clock: C,
    ) -> Admission<C> {
        if let Err(e) = thresholds.validate() {
            panic!("{e}");
        }
        let limiters = Limiters::new(rules.rules(), clock);
        Admission {
            active: RwLock::new(Active {
                matcher: Matcher::new(rules.rules()),
                limiters,
                rules,
            }),
            load,
            thresholds,
            unmatched_refused_overload: Default::default(),
        }
    }

    /// Admits `request` or refuses it with `etcdserver: too many requests`. Keep the
    /// [`Permit`] until the request is answered.
    pub fn admit(&self, request: &RequestInfo<'_>) -> Result<Permit, RpcError> {
        self.check(request).map_err(RpcError::from)
    }

    /// As [`Admission::admit`], saying why a request was refused (for logs and tests).
    pub fn check(&self, request: &RequestInfo<'_>) -> Result<Permit, Refused> {
        let active = self.active.read().unwrap_or_else(PoisonError::into_inner);
        let (limiter, priority) = self.overload(&active, request)?;
        match limiter {
            None => Ok(Permit::unmatched(priority)),
            Some(l) => l.acquire(priority).map_err(Refused::Limit),
        }
    }

    /// Only the overload step of [`Admission::check`]: no token, no in-flight slot. For a
    /// member that forwards a proposal to the leader, which admits it in full (so a rule's
    /// rate holds for the cluster, not per member; docs/qos.md, "wiring"), while this member
    /// still refuses new proposals when it lags itself, as etcd does.
    pub fn check_overload(&self, request: &RequestInfo<'_>) -> Result<(), Refused> {
        let active = self.active.read().unwrap_or_else(PoisonError::into_inner);
        self.overload(&active, request).map(drop)
    }

    /// The governing rule's limiter and the request's priority, or the overload refusal
    /// (counted).
    fn overload<'a>(
        &self,
        active: &'a Active<C>,
        request: &RequestInfo<'_>,
    ) -> Result<(Option<&'a RuleLimiter<C>>, Priority), Refused> {
        let limiter = active
            .matcher
            .first_match(request)
            .map(|i| active.limiters.get(i));
        let priority = limiter
            .and_then(RuleLimiter::priority)
            .unwrap_or(request.method.default_priority());
        if request.proposal
            && let Err(o) = overload::decide(self.load.load(), priority, &self.thresholds)
        {
            match limiter {
                Some(l) => l.count_overload(),
                None => {
                    self.unmatched_refused_overload[priority as usize]
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
            return Err(Refused::Overload(o));
        }
        Ok((limiter, priority))
    }

    /// Puts `rules` in force: what apply calls after a rule change committed (or at start
    /// with the replicated rules). Buckets of unchanged rules and the counters of every
    /// rule that stays are kept ([`Limiters::rebuild`]).
    pub fn set_rules(&self, rules: RuleSet) {
        let mut active = self.active.write().unwrap_or_else(PoisonError::into_inner);
        let limiters = active.limiters.rebuild(rules.rules());
        *active = Active {
            matcher: Matcher::new(rules.rules()),
            limiters,
            rules,
        };
    }
}

impl<C: Clock> Admission<C> {
    /// The rules in force.
    pub fn rules(&self) -> RuleSet {
        self.read().rules.clone()
    }

    /// Whether some rule looks at a range's cost: only then must the caller count a
    /// range's keys before admitting it ([`RequestInfo::range`]).
    pub fn needs_range_cost(&self) -> bool {
        self.read().matcher.needs_range_cost()
    }

    /// The overload thresholds.
    pub fn thresholds(&self) -> &Thresholds {
        &self.thresholds
    }

    /// The load gauge that overload protection reads.
    pub fn load(&self) -> &Arc<LoadGauge> {
        &self.load
    }

    /// The counters now.
    pub fn stats(&self) -> AdmissionStats {
        AdmissionStats {
            rules: self.read().limiters.stats(),
            unmatched_refused_overload: [Priority::Low, Priority::Normal, Priority::High]
                .map(|p| self.unmatched_refused_overload[p as usize].load(Ordering::Relaxed)),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Active<C>> {
        self.active.read().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use governor::clock::FakeRelativeClock;

    use super::*;
    use crate::qos::method::Method;

    fn admission(yaml: &str) -> Admission<FakeRelativeClock> {
        Admission::with_clock(
            RuleSet::from_yaml(yaml).unwrap(),
            Thresholds::default(),
            Arc::default(),
            FakeRelativeClock::default(),
        )
    }

    #[test]
    fn admission_is_shared_and_permits_cross_awaits() {
        fn shared<T: Send + Sync + 'static>() {}
        shared::<Admission>();
        shared::<Permit>();
    }

    #[test]
    fn the_refusal_is_etcds_too_many_requests() {
        let a = admission("rules: [{name: one, rate: 1, match: {methods: [Put]}}]");
        let put = RequestInfo::new(Method::Put).keys(b"k", b"");
        let _p = a.admit(&put).unwrap();
        let e = a.admit(&put).unwrap_err();
        assert_eq!(e, RpcError::TooManyRequests);
        assert_eq!(e.status().code(), tonic::Code::ResourceExhausted);
        assert_eq!(e.message(), "etcdserver: too many requests");
        // Another method is not governed by the rule.
        assert!(
            !a.admit(&RequestInfo::new(Method::Range))
                .unwrap()
                .is_ruled()
        );
    }

    #[test]
    fn overload_refuses_before_spending_a_token() {
        let a = admission("rules: [{name: one, rate: 1, match: {methods: [Put]}}]");
        a.load().set_committed(6_000);
        let put = RequestInfo::new(Method::Put).keys(b"k", b"");
        assert!(matches!(a.check(&put), Err(Refused::Overload(_))));
        assert!(a.check(&RequestInfo::new(Method::LeaseRevoke)).is_ok());
        a.load().set_applied(6_000);
        assert!(a.check(&put).is_ok(), "the token is still there");
        let s = a.stats();
        assert_eq!((s.rules[0].allowed, s.rules[0].refused_overload), (1, 1));
    }

    #[test]
    fn check_overload_takes_no_token() {
        let a = admission("rules: [{name: one, rate: 1, priority: low, match: {methods: [Put]}}]");
        let put = RequestInfo::new(Method::Put).keys(b"k", b"");
        for _ in 0..10 {
            assert_eq!(a.check_overload(&put), Ok(()));
        }
        assert!(a.check(&put).is_ok(), "the bucket is still full");
        a.load().set_committed(1_001);
        assert!(matches!(a.check_overload(&put), Err(Refused::Overload(_))));
        assert_eq!(a.stats().rules[0].refused_overload, 1);
    }
}
