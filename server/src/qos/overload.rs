//! Overload protection: [`decide`], a pure function of the member's [`Load`] and a
//! request's [`Priority`], and [`LoadGauge`], where the member publishes its load.
//!
//! The decision, for a request that will be proposed through raft (reads are never
//! refused here, as in etcd), with `lag = committed index - applied index`:
//!
//! | priority | refused when | source |
//! |---|---|---|
//! | `normal` | `lag > 5,000` | etcd `maxGapBetweenApplyAndCommitIndex` (`v3_server.go`) |
//! | `high` (lease revoke, keep-alive) | `lag > 10,000` | etcd 3.7 `PriorityRequest`, `maxPriorityGap = 2 × 5,000` (`util.go`) |
//! | `low` | `lag > 1,000` or `queued > 2,048` | Keel |
//!
//! The low thresholds are Keel's choice: low-priority requests are refused first, so
//! - the lag bound is a fifth of etcd's: low traffic stops while 4,000 entries of headroom
//!   remain before normal traffic is refused;
//! - the queue bound is one full proposal pipeline: the proposer puts up to 512 requests in
//!   one raft entry and keeps 4 entries in flight, so 2,048 requests waiting for a batch is
//!   a whole pipeline turn of queueing before the request is even proposed.
//!
//! All four are [`Thresholds`] fields (flags later) with the invariant
//! `low_apply_lag ≤ max_apply_lag ≤ max_priority_apply_lag`: a higher priority is never
//! refused where a lower one is admitted.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use super::rules::Priority;

/// A member's load, as read for one decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Load {
    /// The last applied raft log index.
    pub applied: u64,
    /// The last committed raft log index.
    pub committed: u64,
    /// Requests accepted by the proposer and not yet in a raft entry.
    pub queued: u64,
}

impl Load {
    /// Committed entries not yet applied (0 if the two indexes were read out of order).
    pub const fn apply_lag(&self) -> u64 {
        self.committed.saturating_sub(self.applied)
    }
}

/// The bounds of [`decide`] (see the module doc for the defaults and their sources).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// A `normal` request is refused above this apply lag (etcd: 5,000).
    pub max_apply_lag: u64,
    /// A `high` request is refused above this apply lag (etcd 3.7: 10,000).
    pub max_priority_apply_lag: u64,
    /// A `low` request is refused above this apply lag.
    pub low_apply_lag: u64,
    /// A `low` request is refused above this proposal queue depth.
    pub low_queue_depth: u64,
}

impl Default for Thresholds {
    fn default() -> Thresholds {
        Thresholds {
            max_apply_lag: 5_000,
            max_priority_apply_lag: 10_000,
            low_apply_lag: 1_000,
            low_queue_depth: 2_048,
        }
    }
}

impl Thresholds {
    /// Checks the ordering invariant (see the module doc).
    pub fn validate(&self) -> Result<(), ThresholdError> {
        if self.low_apply_lag <= self.max_apply_lag
            && self.max_apply_lag <= self.max_priority_apply_lag
        {
            return Ok(());
        }
        Err(ThresholdError(*self))
    }
}

/// [`Thresholds`] out of order (see the module doc): the thresholds given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "qos thresholds: need low apply lag ({}) <= max apply lag ({}) <= max priority apply lag ({})",
    .0.low_apply_lag, .0.max_apply_lag, .0.max_priority_apply_lag
)]
pub struct ThresholdError(pub Thresholds);

/// Why overload protection refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overload {
    /// The apply lag is above the request's priority's bound.
    ApplyLag {
        /// Committed entries not yet applied.
        lag: u64,
        /// The bound for the request's priority.
        limit: u64,
    },
    /// The proposal queue is deeper than the low-priority bound.
    QueueDepth {
        /// Requests waiting in the proposer.
        queued: u64,
        /// The bound.
        limit: u64,
    },
}

impl fmt::Display for Overload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Overload::ApplyLag { lag, limit } => write!(f, "apply lag {lag} > {limit}"),
            Overload::QueueDepth { queued, limit } => {
                write!(f, "proposal queue {queued} > {limit}")
            }
        }
    }
}

/// Whether a proposal at `priority` may go ahead under `load` (see the module doc).
pub fn decide(load: Load, priority: Priority, t: &Thresholds) -> Result<(), Overload> {
    let lag = load.apply_lag();
    let lag_limit = match priority {
        Priority::Low => t.low_apply_lag,
        Priority::Normal => t.max_apply_lag,
        Priority::High => t.max_priority_apply_lag,
    };
    if lag > lag_limit {
        return Err(Overload::ApplyLag {
            lag,
            limit: lag_limit,
        });
    }
    if priority == Priority::Low && load.queued > t.low_queue_depth {
        return Err(Overload::QueueDepth {
            queued: load.queued,
            limit: t.low_queue_depth,
        });
    }
    Ok(())
}

/// Where a member publishes its [`Load`] for admission: apply sets the applied index, raft
/// the committed index, the proposer its queue depth. Reads and writes are single relaxed
/// atomics (the three values need not be a consistent snapshot: a decision only has to be
/// about right, and [`Load::apply_lag`] saturates).
#[derive(Debug, Default)]
pub struct LoadGauge {
    applied: AtomicU64,
    committed: AtomicU64,
    queued: AtomicU64,
}

impl LoadGauge {
    /// Records the last applied index.
    pub fn set_applied(&self, index: u64) {
        self.applied.store(index, Ordering::Relaxed);
    }

    /// Records the last committed index.
    pub fn set_committed(&self, index: u64) {
        self.committed.store(index, Ordering::Relaxed);
    }

    /// Records the proposer's queue depth.
    pub fn set_queued(&self, queued: u64) {
        self.queued.store(queued, Ordering::Relaxed);
    }

    /// The load now.
    pub fn load(&self) -> Load {
        Load {
            applied: self.applied.load(Ordering::Relaxed),
            committed: self.committed.load(Ordering::Relaxed),
            queued: self.queued.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(lag: u64, queued: u64, p: Priority) -> Result<(), Overload> {
        let load = Load {
            applied: 100,
            committed: 100 + lag,
            queued,
        };
        decide(load, p, &Thresholds::default())
    }

    #[test]
    fn bounds_are_strict_as_in_etcd() {
        use Priority::{High, Low, Normal};
        let apply_lag = |lag, limit| Err(Overload::ApplyLag { lag, limit });
        // (apply lag, queued, priority, decision)
        let cases = [
            // etcd refuses when `committedIndex > appliedIndex + 5000`.
            (5_000, 0, Normal, Ok(())),
            (5_001, 0, Normal, apply_lag(5_001, 5_000)),
            (10_000, 0, High, Ok(())),
            (1_000, 2_048, Low, Ok(())),
            (
                0,
                2_049,
                Low,
                Err(Overload::QueueDepth {
                    queued: 2_049,
                    limit: 2_048,
                }),
            ),
            // The queue bound is for low priority only.
            (0, 1_000_000, Normal, Ok(())),
        ];
        for (lag, queued, p, decision) in cases {
            assert_eq!(
                at(lag, queued, p),
                decision,
                "lag {lag}, queued {queued}, {p}"
            );
        }
        assert!(at(10_001, 0, High).is_err());
        assert!(at(1_001, 0, Low).is_err());
    }

    #[test]
    fn a_higher_priority_is_never_refused_where_a_lower_one_passes() {
        let t = Thresholds::default();
        t.validate().unwrap();
        for lag in [
            0, 999, 1_000, 1_001, 4_999, 5_000, 5_001, 9_999, 10_000, 10_001,
        ] {
            for queued in [0, 2_048, 2_049] {
                let load = Load {
                    applied: 7,
                    committed: 7 + lag,
                    queued,
                };
                let ok = |p| decide(load, p, &t).is_ok();
                assert!(!ok(Priority::Low) || ok(Priority::Normal), "{load:?}");
                assert!(!ok(Priority::Normal) || ok(Priority::High), "{load:?}");
            }
        }
    }

    #[test]
    fn indexes_read_out_of_order_are_no_lag() {
        let load = Load {
            applied: 9,
            committed: 3,
            queued: 0,
        };
        assert_eq!(load.apply_lag(), 0);
        let bad = Thresholds {
            low_apply_lag: 6_000,
            ..Thresholds::default()
        };
        assert!(bad.validate().is_err());
    }
}
