//! QoS (issue 17): rate-limit rules by method, key range and user, limits on expensive
//! reads and on requests in flight, overload protection by apply lag with priorities.
//! docs/qos.md describes the rules for operators and what wiring this module needs.
//!
//! The model:
//! - A [`Rule`] names which requests it governs ([`Match`]: methods, a key prefix or
//!   range, a user, an expensive-read threshold) and what it does to them: a token bucket
//!   (`rate`/s, `burst`), a cap on admitted requests in flight (`max_in_flight`), and a
//!   [`Priority`] under overload.
//! - A [`RuleSet`] is the ordered, versioned list of rules every member holds. It is
//!   replicated through raft as [`RuleChange`]s, each a pure function of the set, with one
//!   canonical encoding, so every member applies the same rules at the same log index.
//! - A request is governed by **the first rule that matches it** ([`Matcher`]), or by none.
//!   Its priority is its rule's, else its method's (lease revoke and keep-alive are high).
//! - [`Admission::admit`] admits a request or refuses it with etcd's
//!   `etcdserver: too many requests`: overload protection first ([`overload::decide`]:
//!   apply lag and proposal queue against thresholds per priority, for proposals only),
//!   then the rule's in-flight cap and token bucket ([`Limiters`]).
//!
//! Invariants (each has a test):
//! - matching is O(rules) and allocates nothing; admitting allocates nothing;
//! - `RuleSet::decode(b) == Ok(s)` iff `s.encode() == b`; changes are deterministic;
//! - a malformed rule file, rule or change is refused with an error naming the field
//!   (`rules[2].rate: must be > 0`), and the rules in force stay as they were;
//! - a rule change keeps the token bucket of every rule whose rate and burst are unchanged;
//! - a higher priority is never refused by overload where a lower one is admitted.
//!
//! Per-member state (buckets, in-flight counts, counters) is not replicated: each member
//! limits the requests it receives. Only the rules are.
//!
//! Modules, bottom up: [`method`] (RPC names), [`rules`] (one rule, the file format,
//! validation), [`ruleset`] (the replicated set, encoding, changes), [`request`] (what a
//! request looks like to QoS), [`matcher`], [`limiter`], [`overload`], [`admission`].

pub mod admission;
pub mod limiter;
pub mod matcher;
pub mod method;
pub mod overload;
pub mod request;
pub mod rules;
pub mod ruleset;

#[cfg(test)]
mod tests;

pub use admission::{Admission, AdmissionStats, Refused};
pub use limiter::{Limiters, Permit, Refusal, RuleStats};
pub use matcher::Matcher;
pub use method::{Method, MethodSet, UnknownName};
pub use overload::{Load, LoadGauge, Overload, ThresholdError, Thresholds};
pub use request::{RangeCost, RequestInfo};
pub use rules::{Match, Priority, Rule, RuleError};
pub use ruleset::{RuleChange, RuleSet};
