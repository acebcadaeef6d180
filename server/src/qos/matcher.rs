//! [`Matcher`]: which rule governs a request. Built once per rule set; a match costs
//! O(rules) comparisons and allocates nothing (pinned by `server/tests/qos_alloc.rs`,
//! which counts allocations with a global allocator).
//!
//! Semantics:
//! - **First match wins**: a request is governed by the first rule, in set order, whose
//!   every given match field holds (as Kubernetes API Priority and Fairness puts a request
//!   in exactly one flow schema). Put specific rules before general ones.
//! - Keys: a rule's key condition is a set of keys (a prefix, one key, or `[key,
//!   range_end)`), compiled to one interval `[lo, hi)`; a request matches when **every key
//!   it may touch** lies in that set (etcd auth's containment test for range permissions).
//!   A request without keys never matches a rule with a key condition.
//! - Expensive reads: `range_keys_over`/`range_bytes_over` hold when the request carries a
//!   [`RangeCost`](super::RangeCost) above them; a request without one never matches. Such
//!   a rule governs only `Range` and `RangeStream`, whether or not it names them.

use super::method::{Method, MethodSet};
use super::request::RequestInfo;
use super::rules::Rule;

/// The rules of a set, compiled for matching (see the module doc).
#[derive(Debug, Clone, Default)]
pub struct Matcher {
    rules: Vec<Compiled>,
    needs_range_cost: bool,
}

/// One rule's match, with its key set as an interval and its methods as a bit mask.
#[derive(Debug, Clone)]
struct Compiled {
    methods: MethodSet,
    user: Option<Box<str>>,
    keys_over: Option<u64>,
    bytes_over: Option<u64>,
    keys: Option<KeyInterval>,
}

/// A set of keys `[lo, hi)`, `hi == None` meaning every key from `lo` on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyInterval {
    lo: Box<[u8]>,
    hi: Option<Box<[u8]>>,
}

impl KeyInterval {
    /// Every key that starts with `prefix` (non-empty): `[prefix, prefix_end)`, etcd's
    /// `GetPrefixRangeEnd` (the last byte below 0xff incremented, the rest cut).
    pub fn prefix(prefix: &[u8]) -> KeyInterval {
        assert!(!prefix.is_empty(), "an empty prefix is no key condition");
        let hi = prefix.iter().rposition(|&b| b < 0xff).map(|i| {
            let mut end = prefix[..=i].to_vec();
            end[i] += 1;
            end.into_boxed_slice()
        });
        KeyInterval {
            lo: prefix.into(),
            hi,
        }
    }

    /// The single key `key`: `[key, key + "\0")`, the next key being `key` followed by NUL.
    pub fn key(key: &[u8]) -> KeyInterval {
        let mut next = key.to_vec();
        next.push(0);
        KeyInterval {
            lo: key.into(),
            hi: Some(next.into_boxed_slice()),
        }
    }

    /// `[key, range_end)`, or every key from `key` on when `range_end` is `"\0"`.
    pub fn range(key: &[u8], range_end: &[u8]) -> KeyInterval {
        KeyInterval {
            lo: key.into(),
            hi: (range_end != b"\0").then(|| range_end.into()),
        }
    }

    /// Whether every key of the request range `key`/`range_end` (etcd's convention, see
    /// [`RequestInfo`]) lies in this set. An empty `key` (no keys) never does.
    #[inline]
    pub fn contains(&self, key: &[u8], range_end: &[u8]) -> bool {
        if key.is_empty() || key < &*self.lo {
            return false;
        }
        let to_the_end = range_end == b"\0";
        let single = range_end.is_empty() || (!to_the_end && range_end <= key);
        match &self.hi {
            None => true,
            Some(hi) if single => key < &**hi,
            Some(hi) => !to_the_end && range_end <= &**hi,
        }
    }
}

impl Compiled {
    fn of(rule: &Rule) -> Compiled {
        let m = &rule.matches;
        let keys = match (&m.key_prefix, &m.key, &m.range_end) {
            (Some(p), _, _) => Some(KeyInterval::prefix(p.as_bytes())),
            (None, Some(k), None) => Some(KeyInterval::key(k.as_bytes())),
            (None, Some(k), Some(e)) => Some(KeyInterval::range(k.as_bytes(), e.as_bytes())),
            (None, None, _) => None,
        };
        let reads = [Method::Range, Method::RangeStream];
        let any = match m.range_keys_over.is_some() || m.range_bytes_over.is_some() {
            true => MethodSet::of(&reads),
            false => MethodSet::ANY,
        };
        Compiled {
            methods: m.methods.as_deref().map_or(any, MethodSet::of),
            user: m.user.as_deref().map(Into::into),
            keys_over: m.range_keys_over,
            bytes_over: m.range_bytes_over,
            keys,
        }
    }

    /// Cheapest tests first: the method bit, the user, the cost, then the keys.
    #[inline]
    fn matches(&self, r: &RequestInfo<'_>) -> bool {
        if !self.methods.contains(r.method) {
            return false;
        }
        if let Some(user) = &self.user
            && r.user != Some(&**user)
        {
            return false;
        }
        if self.keys_over.is_some() || self.bytes_over.is_some() {
            let Some(cost) = r.range else {
                return false;
            };
            if self.keys_over.is_some_and(|n| cost.keys <= n)
                || self.bytes_over.is_some_and(|n| cost.bytes <= n)
            {
                return false;
            }
        }
        match &self.keys {
            Some(keys) => keys.contains(r.key, r.range_end),
            None => true,
        }
    }
}

impl Matcher {
    /// The matcher of validated `rules` (in set order).
    pub fn new(rules: &[Rule]) -> Matcher {
        let rules: Vec<Compiled> = rules.iter().map(Compiled::of).collect();
        let needs_range_cost = rules
            .iter()
            .any(|r| r.keys_over.is_some() || r.bytes_over.is_some());
        Matcher {
            rules,
            needs_range_cost,
        }
    }

    /// The index of the rule that governs `request`: the first that matches.
    #[inline]
    pub fn first_match(&self, request: &RequestInfo<'_>) -> Option<usize> {
        self.rules.iter().position(|r| r.matches(request))
    }

    /// Whether some rule looks at [`RequestInfo::range`]: only then need a caller count the
    /// keys of a range before admitting it.
    pub fn needs_range_cost(&self) -> bool {
        self.needs_range_cost
    }

    /// Whether there are no rules (every request is unmatched).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends_as_etcd_computes_them() {
        assert_eq!(KeyInterval::prefix(b"/a/").hi.as_deref(), Some(&b"/a0"[..]));
        assert_eq!(KeyInterval::prefix(b"a\xff").hi.as_deref(), Some(&b"b"[..]));
        assert_eq!(KeyInterval::prefix(b"\xff\xff").hi, None);
    }

    #[test]
    fn containment() {
        let p = KeyInterval::prefix(b"/a/");
        assert!(p.contains(b"/a/x", b""));
        assert!(p.contains(b"/a/", b"/a0")); // the prefix query itself
        assert!(p.contains(b"/a/b", b"/a/c"));
        assert!(!p.contains(b"/a/b", b"/a1")); // reaches past the prefix
        assert!(!p.contains(b"/a/b", b"\0")); // to the end of the key space
        assert!(!p.contains(b"/a", b""));
        assert!(!p.contains(b"", b""));
        assert!(p.contains(b"/a/x", b"/a/")); // an empty range: the single key
        let all_ff = KeyInterval::prefix(b"\xff");
        assert!(all_ff.contains(b"\xff", b"\0"));
        assert!(!all_ff.contains(b"\xfe", b"\0"));

        let k = KeyInterval::key(b"k");
        assert!(k.contains(b"k", b""));
        assert!(k.contains(b"k", b"k\0"));
        assert!(!k.contains(b"k", b"k\0\0"));
        assert!(!k.contains(b"k\0", b""));

        let from = KeyInterval::range(b"m", b"\0");
        assert!(from.contains(b"z", b"\0"));
        assert!(!from.contains(b"a", b"z"));
        let r = KeyInterval::range(b"b", b"d");
        assert!(r.contains(b"b", b"d") && r.contains(b"c", b""));
        assert!(!r.contains(b"d", b"") && !r.contains(b"c", b"e"));
    }
}
