//! openraft timers from etcd's `--heartbeat-interval` and `--election-timeout` (ms).
//!
//! etcd: a follower campaigns after a randomized election timeout in `[ET, 2·ET)` without a
//! message from the leader. openraft 0.9.25: a follower that has a leader campaigns after
//! `leader_lease + election_timeout`, where `leader_lease = election_timeout_max` and
//! `election_timeout` is drawn from `[election_timeout_min, election_timeout_max)` (once per
//! member in openraft; again for every election with Keel's patch, docs/third_party.md);
//! before the lease ends it also refuses to vote. Passing etcd's
//! numbers straight through would make a failover take `3·ET` to `4·ET`.
//!
//! Keel therefore sets `election_timeout_max = 0.6·ET` and `election_timeout_min = 0.4·ET`:
//! a follower campaigns `1.0·ET` to `1.2·ET` after the last message of a crashed leader
//! (plus up to one openraft tick of `1.5 × heartbeat`), about as soon as etcd, and a new
//! leader serves writes well within `2·ET`. etcd requires `ET ≥ 5 × heartbeat`, so
//! `0.4·ET ≥ 2 × heartbeat` and heartbeats still fit several times into the lease.

/// Deadline of one InstallSnapshot chunk RPC, in ms (openraft `install_snapshot_timeout`,
/// default 200 ms). The last chunk returns only after the receiver verified and loaded the
/// whole snapshot into its store, which takes seconds per GB; with openraft's default every
/// large snapshot would time out and be sent again forever. A dead receiver fails fast with a
/// connection error instead, so the long deadline only bounds a receiver that hangs.
pub const INSTALL_SNAPSHOT_TIMEOUT_MS: u64 = 120_000;

/// The timers and timeouts of the cluster layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// openraft's timers ([`raft_timers`]).
    pub raft: RaftTimers,
    /// etcd's `--election-timeout`.
    pub election_timeout: std::time::Duration,
    /// etcd's request timeout: bounds every wait.
    pub request_timeout: std::time::Duration,
}

/// openraft timer settings, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RaftTimers {
    /// Leader heartbeat interval (etcd `--heartbeat-interval`).
    pub heartbeat_interval: u64,
    /// Lower bound of a member's randomized election timeout.
    pub election_timeout_min: u64,
    /// Upper bound of a member's randomized election timeout; also openraft's leader lease.
    pub election_timeout_max: u64,
}

/// Maps etcd's timers to openraft's (see the module docs). Keeps openraft's requirement
/// `heartbeat_interval < election_timeout_min < election_timeout_max` for any input.
pub fn raft_timers(heartbeat_ms: u64, election_timeout_ms: u64) -> RaftTimers {
    let heartbeat = heartbeat_ms.max(1);
    let min = (election_timeout_ms * 2 / 5).max(heartbeat + 1);
    let max = (election_timeout_ms * 3 / 5).max(min + 1);
    RaftTimers {
        heartbeat_interval: heartbeat,
        election_timeout_min: min,
        election_timeout_max: max,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_defaults_give_a_failover_between_one_and_one_point_two_election_timeouts() {
        let t = raft_timers(100, 1000);
        assert_eq!(
            t,
            RaftTimers {
                heartbeat_interval: 100,
                election_timeout_min: 400,
                election_timeout_max: 600
            }
        );
        // lease + [min, max)
        assert_eq!(t.election_timeout_max + t.election_timeout_min, 1000);
        assert_eq!(t.election_timeout_max * 2, 1200);
    }

    #[test]
    fn odd_inputs_still_satisfy_openraft() {
        for (hb, et) in [(100, 100), (0, 0), (50, 120), (500, 1000)] {
            let t = raft_timers(hb, et);
            assert!(t.heartbeat_interval < t.election_timeout_min, "{t:?}");
            assert!(t.election_timeout_min < t.election_timeout_max, "{t:?}");
            let cfg = openraft::Config {
                heartbeat_interval: t.heartbeat_interval,
                election_timeout_min: t.election_timeout_min,
                election_timeout_max: t.election_timeout_max,
                ..Default::default()
            };
            cfg.validate().expect("openraft accepts the timers");
        }
    }
}
