//! Leases (etcd `server/lease`): a key lives while the owner of its lease keeps the lease
//! alive.
//!
//! The work is split by who may do it (docs/lease.md has the full picture):
//!
//! - [`Lessor`] exists on **every member**. It holds the applied lease state: each lease's
//!   ID, granted TTL, last checkpointed remaining TTL, and the keys attached to it. Only the
//!   applier changes it, from committed raft entries, so every member holds the same leases.
//!   ID and TTLs are persisted under sled keys starting with `l` ([`record`]) in the apply
//!   batch of the entry, next to the consistent index; attachments are the `lease` field of
//!   the MVCC records and are re-read from the key index on open (etcd `lessor.Recover`).
//! - [`Primary`] exists **only on the leader**, inside the lessor: the min-heap of expiry
//!   deadlines ([`heap::DeadlineHeap`]) and the checkpoint schedule. It is built when the
//!   member becomes leader (and has applied its term's first entry) and dropped on
//!   step-down. A follower holds no heap, no deadlines and runs no lease timer.
//! - [`runner`] is the leader's loop: it pops due leases and revokes them through raft
//!   (`keelpb.LeaseExpire` entries, batched and rate-limited by [`rate::TokenBucket`]), and
//!   proposes `LeaseCheckpoint` entries so remaining TTLs survive a leader change.
//!
//! Apply never reads a clock: deadlines live only in the leader's heap, lease IDs are chosen
//! before proposing ([`id::LeaseIdGenerator`]) and the minimum TTL is applied before
//! proposing too.

mod apply;
pub mod heap;
pub mod id;
mod lessor;
mod primary;
pub mod rate;
pub mod record;
pub mod runner;

#[cfg(test)]
mod tests;

pub use lessor::{ApplyOutcome, LeaseInfo, Lessor, LessorStats, Remaining, Renewal};
pub use primary::{Primary, PrimaryConfig};

/// A lease ID (etcd `lease.LeaseID`, the `ID` fields of the Lease API).
pub type LeaseId = i64;

/// The "no lease" ID (etcd `lease.NoLease`): a put with lease 0 attaches nothing, a grant
/// with ID 0 asks the server to choose one.
pub const NO_LEASE: LeaseId = 0;

/// Largest TTL a lease may be granted with, in seconds (etcd `lease.MaxLeaseTTL`);
/// larger requests fail with `etcdserver: too large lease TTL`.
pub const MAX_LEASE_TTL: i64 = 9_000_000_000;

/// etcd's minimum lease TTL in seconds for a member with the given raft timings (ms):
/// `ceil(((3 * electionTicks) / 2) * heartbeat)`, with `electionTicks = election /
/// heartbeat` (etcd `NewServer`: a lease must outlive a leader election). With etcd's
/// defaults (100 ms, 1000 ms) it is 2 s.
pub fn min_lease_ttl(election_timeout_ms: u64, heartbeat_interval_ms: u64) -> i64 {
    let heartbeat = heartbeat_interval_ms.max(1);
    let election_ticks = election_timeout_ms / heartbeat;
    let min_ms = (3 * election_ticks / 2) * heartbeat;
    min_ms.div_ceil(1000) as i64
}

/// Whole seconds left until `deadline`, rounded down as etcd does for
/// `LeaseTimeToLive` (`int64(l.Remaining().Seconds())`); 0 once it has passed.
pub fn remaining_secs(deadline: std::time::Instant, now: std::time::Instant) -> i64 {
    deadline.saturating_duration_since(now).as_secs() as i64
}
