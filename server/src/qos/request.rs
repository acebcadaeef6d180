//! [`RequestInfo`]: what admission knows about a request, borrowed from it (no copy, no
//! allocation), and [`RangeCost`]: the size of a range's answer, which the caller
//! estimates from the request and its key index.

use super::method::Method;

/// One request as QoS sees it. Everything is borrowed from the request; building one
/// allocates nothing.
///
/// `key`/`range_end` follow etcd's `RangeRequest` convention: an empty `key` is a request
/// without keys (lease, auth, maintenance); an empty `range_end` is the single key `key`;
/// `range_end == "\0"` is every key from `key` on; otherwise `[key, range_end)`. A
/// `range_end` at or before `key` (an empty range) counts as the single key `key`. For a
/// `Txn`, the caller passes one range that covers every key of its compares and
/// operations, e.g. the lowest key and the highest end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestInfo<'a> {
    /// The RPC.
    pub method: Method,
    /// The first key, or empty for a request without keys.
    pub key: &'a [u8],
    /// The end of the range (see above).
    pub range_end: &'a [u8],
    /// The authenticated user (token or TLS CN); `None` when auth is off.
    pub user: Option<&'a str>,
    /// For a range read, the size of its answer; `None` otherwise, or when no rule asks
    /// for it ([`super::Admission::needs_range_cost`]).
    pub range: Option<RangeCost>,
    /// Whether the request will be proposed through raft, so that the apply-lag check of
    /// [`super::overload`] applies to it. Default: [`Method::is_proposal`]; a read-only
    /// `Txn` sets it to false.
    pub proposal: bool,
}

impl<'a> RequestInfo<'a> {
    /// A request of `method` without keys, user or range cost.
    pub const fn new(method: Method) -> RequestInfo<'a> {
        RequestInfo {
            method,
            key: b"",
            range_end: b"",
            user: None,
            range: None,
            proposal: method.is_proposal(),
        }
    }

    /// With the request's `key` and `range_end` (see the type doc).
    pub const fn keys(mut self, key: &'a [u8], range_end: &'a [u8]) -> RequestInfo<'a> {
        self.key = key;
        self.range_end = range_end;
        self
    }

    /// With the authenticated user.
    pub const fn user(mut self, user: Option<&'a str>) -> RequestInfo<'a> {
        self.user = user;
        self
    }

    /// With the range's cost.
    pub const fn range_cost(mut self, cost: RangeCost) -> RequestInfo<'a> {
        self.range = Some(cost);
        self
    }

    /// With `proposal` set (false for a read-only `Txn`).
    pub const fn proposal(mut self, proposal: bool) -> RequestInfo<'a> {
        self.proposal = proposal;
        self
    }
}

/// How much a range read returns, estimated before it runs: what expensive-read rules
/// (`range_keys_over`, `range_bytes_over`) compare against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeCost {
    /// Key-values the answer holds.
    pub keys: u64,
    /// Bytes of those key-values.
    pub bytes: u64,
}

impl RangeCost {
    /// The cost of a range whose key index counts `index_count` live keys in the range, for
    /// a request with `limit` (etcd `RangeRequest.limit`, 0 or less = no limit) and
    /// `count_only`; `bytes_per_kv` is the caller's mean size of one returned key-value
    /// (of one key for `keys_only`). The answer holds `min(limit, index_count)` keys, none
    /// for `count_only`.
    pub const fn estimate(
        limit: i64,
        index_count: u64,
        count_only: bool,
        bytes_per_kv: u64,
    ) -> RangeCost {
        let keys = if count_only {
            0
        } else if limit > 0 && (limit as u64) < index_count {
            limit as u64
        } else {
            index_count
        };
        RangeCost {
            keys,
            bytes: keys.saturating_mul(bytes_per_kv),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_caps_the_index_count() {
        assert_eq!(
            RangeCost::estimate(0, 5000, false, 100),
            RangeCost {
                keys: 5000,
                bytes: 500_000
            }
        );
        assert_eq!(
            RangeCost::estimate(10, 5000, false, 100),
            RangeCost {
                keys: 10,
                bytes: 1000
            }
        );
        assert_eq!(
            RangeCost::estimate(-1, 7, false, 3),
            RangeCost { keys: 7, bytes: 21 }
        );
        assert_eq!(
            RangeCost::estimate(9000, 7, false, 3),
            RangeCost { keys: 7, bytes: 21 }
        );
        assert_eq!(
            RangeCost::estimate(0, 5000, true, 100),
            RangeCost { keys: 0, bytes: 0 }
        );
        assert_eq!(RangeCost::estimate(0, 2, false, u64::MAX).bytes, u64::MAX);
    }

    #[test]
    fn proposal_defaults_to_the_method() {
        assert!(RequestInfo::new(Method::Txn).proposal);
        assert!(!RequestInfo::new(Method::Txn).proposal(false).proposal);
        assert!(!RequestInfo::new(Method::Range).proposal);
    }
}
