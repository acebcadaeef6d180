//! [`Primary`]: the leader-only half of the lessor (etcd's lessor "primary" state): the
//! expiry deadlines, the checkpoint schedule and the leases whose revocation is in flight.
//!
//! A `Primary` is created by [`super::Lessor::promote`] when the member becomes leader and
//! dropped by [`super::Lessor::demote`] on step-down, so its memory exists on one member
//! only and is bounded by the number of live leases:
//!
//! - `expiry` holds exactly one deadline per live lease (an indexed heap, so keepalives move
//!   entries instead of adding them);
//! - `checkpoints` holds at most one entry per live lease;
//! - `revoking` holds leases whose `LeaseExpire` entry is proposed but not applied; applying
//!   the revocation (or the lease's absence) removes them.
//!
//! Deadlines are monotonic [`Instant`]s of this process. They never leave the leader and
//! never enter apply.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::LeaseId;
use super::heap::DeadlineHeap;

/// How the leader schedules expiry and checkpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrimaryConfig {
    /// Added to every lease's remaining TTL when a member becomes leader, so clients whose
    /// keepalives went nowhere during the election are not expired for it (etcd
    /// `Promote(electionTimeout)`).
    pub extend: Duration,
    /// How often a lease's remaining TTL is checkpointed through raft (etcd
    /// `--experimental-lease-checkpoint-interval`); `None` disables checkpoints.
    pub checkpoint_interval: Option<Duration>,
    /// When to propose a revocation again if its entry was not applied by then (etcd
    /// `ExpiredLeasesRetryInterval`, the request timeout).
    pub revoke_retry: Duration,
}

/// The outcome of [`Primary::renew`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrimaryRenewal {
    /// The deadline moved to `now + ttl`.
    Renewed,
    /// The lease is past its deadline or being revoked: it cannot be renewed (etcd waits
    /// for the revocation and answers "not found").
    Expired,
}

/// Leader-only lease scheduling state. See the module docs.
#[derive(Debug)]
pub struct Primary {
    config: PrimaryConfig,
    expiry: DeadlineHeap,
    checkpoints: DeadlineHeap,
    revoking: HashSet<LeaseId>,
}

/// The TTL a lease is scheduled with: its checkpointed remaining TTL if it has one (and
/// checkpoints are on), else its granted TTL (etcd `Lease.RemainingTTL`).
fn effective_ttl(config: &PrimaryConfig, ttl: i64, remaining_ttl: i64) -> i64 {
    if config.checkpoint_interval.is_some() && remaining_ttl > 0 {
        remaining_ttl
    } else {
        ttl
    }
}

fn secs(n: i64) -> Duration {
    Duration::from_secs(n.max(0) as u64)
}

impl Primary {
    /// Builds the leader's schedule for `leases` = `(id, ttl, remaining_ttl)`: each expires
    /// at `now + extend + effective TTL`. O(n).
    pub fn promote(
        config: PrimaryConfig,
        leases: impl Iterator<Item = (LeaseId, i64, i64)>,
        now: Instant,
    ) -> Primary {
        let mut expiry = Vec::new();
        let mut checkpoints = Vec::new();
        for (id, ttl, remaining_ttl) in leases {
            let ttl_now = effective_ttl(&config, ttl, remaining_ttl);
            expiry.push((now + config.extend + secs(ttl_now), id));
            if let Some(at) = Self::checkpoint_due(&config, ttl_now, now) {
                checkpoints.push((at, id));
            }
        }
        Primary {
            expiry: DeadlineHeap::from_entries(expiry),
            checkpoints: DeadlineHeap::from_entries(checkpoints),
            revoking: HashSet::new(),
            config,
        }
    }

    /// When a lease with `ttl_now` seconds left should be checkpointed (etcd
    /// `scheduleCheckpointIfNeeded`): only leases that outlive one interval.
    fn checkpoint_due(config: &PrimaryConfig, ttl_now: i64, now: Instant) -> Option<Instant> {
        let interval = config.checkpoint_interval?;
        (secs(ttl_now) > interval).then_some(now + interval)
    }

    /// The configuration this schedule runs with.
    pub fn config(&self) -> &PrimaryConfig {
        &self.config
    }

    /// A lease was granted (applied): schedule it at `now + ttl`.
    pub fn granted(&mut self, id: LeaseId, ttl: i64, now: Instant) {
        self.expiry.upsert(id, now + secs(ttl));
        if let Some(at) = Self::checkpoint_due(&self.config, ttl, now) {
            self.checkpoints.upsert(id, at);
        }
    }

    /// A lease was revoked (applied): forget it.
    pub fn revoked(&mut self, id: LeaseId) {
        self.expiry.remove(id);
        self.checkpoints.remove(id);
        self.revoking.remove(&id);
    }

    /// A checkpoint of `id` was applied. A cleared checkpoint (remaining 0, proposed after a
    /// keepalive) guarantees the full TTL from now; either way the next checkpoint is
    /// scheduled (etcd `lessor.Checkpoint`).
    pub fn checkpointed(&mut self, id: LeaseId, ttl: i64, remaining_ttl: i64, now: Instant) {
        if self.revoking.contains(&id) {
            return;
        }
        if remaining_ttl == 0 {
            let full = now + secs(ttl);
            if self.expiry.get(id).is_some_and(|d| d < full) {
                self.expiry.upsert(id, full);
            }
        }
        let ttl_now = effective_ttl(&self.config, ttl, remaining_ttl);
        match Self::checkpoint_due(&self.config, ttl_now, now) {
            Some(at) => self.checkpoints.upsert(id, at),
            None => {
                self.checkpoints.remove(id);
            }
        }
    }

    /// A keepalive of an existing lease (the lessor checked that it exists): moves the
    /// deadline to `now + ttl` unless the lease already expired.
    pub fn renew(&mut self, id: LeaseId, ttl: i64, now: Instant) -> PrimaryRenewal {
        let expired = self.revoking.contains(&id) || self.expiry.get(id).is_some_and(|d| d <= now);
        if expired {
            return PrimaryRenewal::Expired;
        }
        self.expiry.upsert(id, now + secs(ttl));
        if let Some(at) = Self::checkpoint_due(&self.config, ttl, now) {
            self.checkpoints.upsert(id, at);
        }
        PrimaryRenewal::Renewed
    }

    /// Whole seconds until `id` expires (0 once due or being revoked); `None` if the lease
    /// is not scheduled here.
    pub fn remaining(&self, id: LeaseId, now: Instant) -> Option<i64> {
        if self.revoking.contains(&id) {
            return Some(0);
        }
        self.expiry.get(id).map(|d| super::remaining_secs(d, now))
    }

    /// Takes up to `max` leases whose deadline passed, marks them as being revoked and
    /// reschedules each at `now + revoke_retry` in case its revocation never applies.
    pub fn take_expired(&mut self, now: Instant, max: usize) -> Vec<LeaseId> {
        let mut due = Vec::new();
        while due.len() < max {
            let Some((_, id)) = self.expiry.pop_due(now) else {
                break;
            };
            due.push(id);
        }
        for &id in &due {
            self.revoking.insert(id);
            self.checkpoints.remove(id);
            self.expiry.upsert(id, now + self.config.revoke_retry);
        }
        due
    }

    /// Takes up to `max` due checkpoints as `(lease, remaining TTL in whole seconds,
    /// rounded up as etcd does)`. Leases already due to expire are skipped.
    pub fn take_checkpoints(&mut self, now: Instant, max: usize) -> Vec<(LeaseId, i64)> {
        let mut out = Vec::new();
        while out.len() < max {
            let Some((_, id)) = self.checkpoints.pop_due(now) else {
                break;
            };
            match self.expiry.get(id) {
                Some(deadline) if deadline > now && !self.revoking.contains(&id) => {
                    let left = deadline - now;
                    out.push((
                        id,
                        left.as_secs() as i64 + i64::from(left.subsec_nanos() > 0),
                    ));
                }
                _ => {}
            }
        }
        out
    }

    /// The earliest instant at which an expiry or a checkpoint is due.
    pub fn next_due(&self) -> Option<Instant> {
        let e = self.expiry.peek().map(|(d, _)| d);
        let c = self.checkpoints.peek().map(|(d, _)| d);
        e.into_iter().chain(c).min()
    }

    /// The earliest expiry deadline.
    pub fn next_expiry(&self) -> Option<Instant> {
        self.expiry.peek().map(|(d, _)| d)
    }

    /// Sizes for tests and memory reports: (scheduled expiries, scheduled checkpoints,
    /// revocations in flight, bytes held by the two heaps).
    pub fn stats(&self) -> (usize, usize, usize, usize) {
        (
            self.expiry.len(),
            self.checkpoints.len(),
            self.revoking.len(),
            self.expiry.heap_bytes() + self.checkpoints.heap_bytes(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(checkpoint_s: Option<u64>) -> PrimaryConfig {
        PrimaryConfig {
            extend: Duration::from_secs(1),
            checkpoint_interval: checkpoint_s.map(Duration::from_secs),
            revoke_retry: Duration::from_secs(7),
        }
    }

    #[test]
    fn promotion_uses_checkpointed_remaining_ttl_plus_extension() {
        let t = Instant::now();
        let p = Primary::promote(config(Some(5)), [(1, 60, 20), (2, 60, 0)].into_iter(), t);
        assert_eq!(
            p.remaining(1, t),
            Some(21),
            "checkpointed 20 s + 1 s extension"
        );
        assert_eq!(
            p.remaining(2, t),
            Some(61),
            "no checkpoint: full TTL + extension"
        );
        let off = Primary::promote(config(None), [(1, 60, 20)].into_iter(), t);
        assert_eq!(
            off.remaining(1, t),
            Some(61),
            "checkpoints off: remaining TTL is ignored"
        );
    }

    #[test]
    fn expired_leases_are_taken_once_and_retried_later() {
        let t = Instant::now();
        let mut p = Primary::promote(config(None), std::iter::empty(), t);
        p.granted(1, 2, t);
        p.granted(2, 3, t);
        p.granted(3, 100, t);
        let at = t + Duration::from_secs(3);
        assert_eq!(p.take_expired(at, 10), vec![1, 2]);
        assert_eq!(
            p.take_expired(at, 10),
            Vec::<LeaseId>::new(),
            "in flight: not taken twice"
        );
        assert_eq!(p.renew(1, 2, at), PrimaryRenewal::Expired);
        assert_eq!(p.remaining(1, at), Some(0));
        // The revocation of 2 applied; 1 never did, so it comes back after the retry delay.
        p.revoked(2);
        assert_eq!(p.take_expired(at + Duration::from_secs(7), 10), vec![1]);
        assert_eq!(p.stats().0, 2, "lease 1 (retrying) and lease 3");
    }

    #[test]
    fn renew_moves_the_deadline_and_take_respects_max() {
        let t = Instant::now();
        let mut p = Primary::promote(config(None), std::iter::empty(), t);
        for id in 0..10 {
            p.granted(id, 5, t);
        }
        assert_eq!(
            p.renew(4, 5, t + Duration::from_secs(4)),
            PrimaryRenewal::Renewed
        );
        assert_eq!(p.remaining(4, t + Duration::from_secs(4)), Some(5));
        let due = p.take_expired(t + Duration::from_secs(6), 3);
        assert_eq!(due.len(), 3);
        let rest = p.take_expired(t + Duration::from_secs(6), 100);
        assert_eq!(rest.len(), 6, "all but the renewed lease");
        assert!(!due.contains(&4) && !rest.contains(&4));
        // A lease the schedule missed is scheduled by its keepalive rather than left to wait.
        assert_eq!(p.renew(99, 5, t), PrimaryRenewal::Renewed);
        assert_eq!(p.remaining(99, t), Some(5));
    }

    #[test]
    fn checkpoints_report_remaining_ttl_rounded_up_and_reschedule() {
        let t = Instant::now();
        let mut p = Primary::promote(config(Some(5)), std::iter::empty(), t);
        p.granted(1, 20, t);
        p.granted(2, 4, t); // shorter than the interval: never checkpointed
        assert_eq!(p.take_checkpoints(t + Duration::from_secs(4), 10), vec![]);
        let at = t + Duration::from_millis(5_500);
        assert_eq!(
            p.take_checkpoints(at, 10),
            vec![(1, 15)],
            "14.5 s left rounds up"
        );
        p.checkpointed(1, 20, 15, at);
        assert_eq!(p.stats().1, 1, "rescheduled after the checkpoint applied");
        // A cleared checkpoint (after a keepalive) guarantees the full TTL.
        p.checkpointed(1, 20, 0, at);
        assert_eq!(p.remaining(1, at), Some(20));
    }

    #[test]
    fn next_due_is_the_earliest_of_expiry_and_checkpoint() {
        let t = Instant::now();
        let mut p = Primary::promote(config(Some(5)), std::iter::empty(), t);
        assert_eq!(p.next_due(), None);
        p.granted(1, 30, t);
        assert_eq!(p.next_due(), Some(t + Duration::from_secs(5)));
        assert_eq!(p.next_expiry(), Some(t + Duration::from_secs(30)));
    }
}
