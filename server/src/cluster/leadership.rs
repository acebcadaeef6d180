//! Whether this member has a leader, as etcd's require-leader checks see it, and the monitor
//! that tells long-lived require-leader streams to end (etcd `v3rpc/interceptor.go`:
//! `newUnaryInterceptor`, `newStreamInterceptor`, `monitorLeader`).
//!
//! - A member **has a leader** when raft names one and, if that is this member, a quorum
//!   acknowledged it within the last election timeout, or, when no quorum has acknowledged it
//!   yet in its term, it has led for at most an election timeout. This stands in for etcd's
//!   CheckQuorum: an etcd leader cut off from its quorum steps down after an election
//!   timeout, while openraft 0.9 keeps the role, so without it an isolated leader would
//!   accept require-leader requests that can never complete. (A member can win an election
//!   and never be acknowledged: the last of three, elected with the vote of a member that
//!   then stopped.)
//! - The **monitor** checks once per election timeout; after [`MAX_NO_LEADER_COUNT`]
//!   consecutive checks without a leader it raises [`LeaderLoss`], and any check that finds
//!   a leader lowers it. Streams opened with `hasleader: true` end with `etcdserver: no
//!   leader` when it rises, so clients (kube-apiserver) re-dial a member that has one. New
//!   require-leader requests are refused as soon as there is no leader; existing streams are
//!   cut only after the longer wait because re-establishing them costs much more (etcd's
//!   comment on `maxNoLeaderCnt`).

use std::sync::{Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::Cluster;
use crate::raft::types::{MemberNode, NodeId, Raft};

/// openraft's metrics of this member.
pub type RaftMetrics = openraft::RaftMetrics<NodeId, MemberNode>;

/// etcd `maxNoLeaderCnt`: election timeouts without a leader before require-leader streams
/// are canceled.
pub const MAX_NO_LEADER_COUNT: u32 = 3;

/// Whether a member `me` whose raft reports `metrics` has a leader (module docs);
/// `leading_for`: how long `me` has led in the current term, if it leads.
pub fn has_leader(
    metrics: &RaftMetrics,
    me: NodeId,
    election_timeout: Duration,
    leading_for: Duration,
) -> bool {
    match metrics.current_leader {
        None => false,
        Some(l) if l == me => match metrics.millis_since_quorum_ack {
            Some(ms) => u128::from(ms) <= election_timeout.as_millis(),
            // Not acknowledged yet: it just won a quorum's votes, or a quorum is gone.
            None => leading_for <= election_timeout,
        },
        Some(_) => true,
    }
}

/// [`has_leader`] for one member, with the time it has led noted per term ([`LeadingSince`]).
/// Shared by the cluster state and the read path.
#[derive(Debug)]
pub struct LeaderCheck {
    election_timeout: Duration,
    leading: LeadingSince,
}

impl LeaderCheck {
    /// A check with etcd's `election_timeout`.
    pub fn new(election_timeout: Duration) -> LeaderCheck {
        LeaderCheck {
            election_timeout,
            leading: LeadingSince::default(),
        }
    }

    /// Whether member `me`, as `raft`'s metrics report it now, has a leader.
    pub fn has_leader(&self, raft: &Raft, me: NodeId) -> bool {
        let metrics = raft.metrics();
        let metrics = metrics.borrow();
        let leading_for = self.leading.leading_for(&metrics, me);
        has_leader(&metrics, me, self.election_timeout, leading_for)
    }
}

/// Since when this member has been seen leading in its current term. It is noted the first
/// time a check sees it lead, so it can be late by the time between checks: the monitor
/// checks once per election timeout, so a leader that no quorum ever acknowledges counts as
/// having a leader for at most two election timeouts.
#[derive(Debug, Default)]
pub struct LeadingSince {
    seen: Mutex<Option<(u64, Instant)>>,
}

impl LeadingSince {
    /// How long `me` has led in `metrics`' term (zero when it does not lead, or on the first
    /// check of a term).
    pub fn leading_for(&self, metrics: &RaftMetrics, me: NodeId) -> Duration {
        if metrics.current_leader != Some(me) {
            return Duration::ZERO;
        }
        let mut seen = self.seen.lock().expect("leading-since lock");
        match *seen {
            Some((term, at)) if term == metrics.current_term => at.elapsed(),
            _ => {
                *seen = Some((metrics.current_term, Instant::now()));
                Duration::ZERO
            }
        }
    }
}

/// The "leaderless for too long" signal require-leader streams end on (module docs).
#[derive(Debug)]
pub struct LeaderLoss {
    lost: watch::Sender<bool>,
}

impl Default for LeaderLoss {
    fn default() -> LeaderLoss {
        LeaderLoss {
            lost: watch::Sender::new(false),
        }
    }
}

impl LeaderLoss {
    /// A receiver of the signal; `true` while the member has been leaderless for
    /// [`MAX_NO_LEADER_COUNT`] election timeouts.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.lost.subscribe()
    }

    /// Whether the signal is raised now.
    pub fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }

    fn set(&self, lost: bool) {
        self.lost
            .send_if_modified(|v| std::mem::replace(v, lost) != lost);
    }
}

/// Counts consecutive leaderless checks; returns the new count and whether the signal is up.
fn step(count: u32, has_leader: bool) -> (u32, bool) {
    let count = if has_leader {
        0
    } else {
        count.saturating_add(1)
    };
    (count, count >= MAX_NO_LEADER_COUNT)
}

/// etcd `monitorLeader`: checks every election timeout until the cluster is dropped.
pub async fn monitor(cluster: Weak<Cluster>) {
    let mut count = 0;
    loop {
        let Some(period) = cluster.upgrade().map(|c| c.timing.election_timeout) else {
            return;
        };
        tokio::time::sleep(period).await;
        let Some(c) = cluster.upgrade() else {
            return;
        };
        let lost;
        (count, lost) = step(count, c.has_leader());
        if lost != c.leader_loss.is_lost() {
            tracing::warn!(
                lost,
                "require-leader streams: leaderless for {count} checks"
            );
        }
        c.leader_loss.set(lost);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signal_rises_after_three_leaderless_checks_and_falls_with_a_leader() {
        let (mut count, mut seen) = (0, Vec::new());
        for has in [false, false, true, false, false, false, false, true] {
            let lost;
            (count, lost) = step(count, has);
            seen.push(lost);
        }
        assert_eq!(seen, [false, false, false, false, false, true, true, false]);
    }

    #[test]
    fn a_leader_without_a_recent_quorum_ack_has_no_leader() {
        let et = Duration::from_millis(1000);
        let zero = Duration::ZERO;
        let mut m = RaftMetrics::new_initial(1);
        assert!(!has_leader(&m, 1, et, zero), "nobody leads");
        m.current_leader = Some(2);
        assert!(has_leader(&m, 1, et, zero), "a follower of 2");
        m.current_leader = Some(1);
        assert!(
            has_leader(&m, 1, et, zero),
            "just elected, not acknowledged yet"
        );
        assert!(has_leader(&m, 1, et, et), "elected an election timeout ago");
        assert!(
            !has_leader(&m, 1, et, et + Duration::from_millis(1)),
            "elected longer ago and never acknowledged"
        );
        m.millis_since_quorum_ack = Some(1000);
        assert!(has_leader(&m, 1, et, Duration::from_secs(60)));
        m.millis_since_quorum_ack = Some(1001);
        assert!(!has_leader(&m, 1, et, zero), "cut off from its quorum");
    }

    #[test]
    fn leadership_is_timed_from_the_first_check_of_each_term() {
        let since = LeadingSince::default();
        let mut m = RaftMetrics::new_initial(1);
        m.current_term = 3;
        m.current_leader = Some(2);
        assert_eq!(since.leading_for(&m, 1), Duration::ZERO, "a follower");
        m.current_leader = Some(1);
        assert_eq!(
            since.leading_for(&m, 1),
            Duration::ZERO,
            "first seen leading"
        );
        std::thread::sleep(Duration::from_millis(20));
        assert!(since.leading_for(&m, 1) >= Duration::from_millis(20));
        m.current_term = 4;
        assert_eq!(
            since.leading_for(&m, 1),
            Duration::ZERO,
            "a new term restarts it"
        );
    }

    #[test]
    fn subscribers_see_each_change_once() {
        let loss = LeaderLoss::default();
        let mut rx = loss.subscribe();
        assert!(!*rx.borrow_and_update());
        loss.set(true);
        assert!(rx.has_changed().unwrap());
        assert!(*rx.borrow_and_update());
        loss.set(true);
        assert!(!rx.has_changed().unwrap(), "no change, no wake-up");
    }
}
