//! Election backstop: starts an election when a voter has heard from no leader, and granted
//! no vote, for longer than openraft's own election timer can take, unless openraft is
//! holding the member back with its "seen a greater log" penalty.
//!
//! openraft 0.9.25 delays a member's next election by `2 × election_timeout_max` once a member
//! with a longer log refused its vote, and clears that flag only when the member next
//! campaigns from its own timer. A member that lost the first election at bootstrap, or
//! restarted behind the others, keeps the flag while it follows a leader for hours; when that
//! leader crashes it waits 1.2 election timeouts longer than it should. With two such
//! followers, failovers of 2.3–2.8 s instead of 1.0–1.2 s (ET = 1 s) were measured.
//!
//! openraft's timer fires at most `leader_lease + election_timeout_max + one tick` after the
//! last message from a leader (`0.6·ET + 0.6·ET + 1.5 × heartbeat` = 1.35 s with etcd's
//! defaults). This backstop fires a little later, at that point plus a random
//! `[0, heartbeat)`, measured from the last AppendEntries/InstallSnapshot received or the last
//! vote this member granted to another candidate (an election in progress is not cut short). So it only acts when openraft
//! held the member back, and the member campaigns ~1.4 s after a crash instead of ~2.4 s.
//! Only followers get the backstop; candidates retry on openraft's timer. Tried and dropped:
//! replacing openraft's timer completely (`enable_elect = false`), or backing up candidates
//! too, let a candidate with a stale log out-campaign the up-to-date member again and again,
//! which is what the penalty prevents; a second timer inside openraft's own window caused
//! split votes.
//!
//! The backstop campaigns as openraft's timer does (`Trigger::campaign`): with `--pre-vote`,
//! a pre-vote round first, so a member cut off by a partition does not raise its term from
//! here either (docs/raft.md, "Pre-vote").
//!
//! A member that was not running (SIGSTOP, a paused VM, a stalled runtime) measures its own
//! stop as silence from the leader. Campaigning at once on resume would raise the term and
//! depose a healthy leader (found by a fresh-user check: SIGSTOP a follower for 5 s, SIGCONT).
//! So a tick that comes more than half the patience after the previous one counts leader
//! contact from now: the leader gets a whole patience window to reach the member again.

use std::sync::Weak;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use openraft::ServerState;

use super::Cluster;
use super::timing::RaftTimers;

/// When this member last heard from a leader, as milliseconds since `epoch`.
pub struct LeaderContact {
    epoch: Instant,
    last_ms: AtomicU64,
}

impl Default for LeaderContact {
    fn default() -> LeaderContact {
        LeaderContact {
            epoch: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }
}

impl LeaderContact {
    /// Records a message from a leader (an AppendEntries or InstallSnapshot RPC), now.
    pub fn touch(&self) {
        let ms = self.epoch.elapsed().as_millis() as u64;
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// Time since the last message from a leader (or since start).
    pub fn silence(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.epoch.elapsed().saturating_sub(last)
    }
}

/// A small xorshift generator: the watchdog needs spread, not cryptographic randomness.
struct Jitter(u64);

impl Jitter {
    fn new(seed: u64) -> Jitter {
        Jitter(seed | 1)
    }

    /// A value in `[lo, hi)` (or `lo` if the range is empty).
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        if hi <= lo {
            lo
        } else {
            lo + self.0 % (hi - lo)
        }
    }
}

/// How long a voter in `state` may go without leader contact or a granted vote before the
/// backstop starts an election (see the module docs); `None` for leaders and learners.
fn patience(state: ServerState, timers: &RaftTimers, jitter_ms: u64) -> Option<Duration> {
    match state {
        ServerState::Follower => Some(Duration::from_millis(
            2 * timers.election_timeout_max + timers.heartbeat_interval * 3 / 2 + jitter_ms,
        )),
        // A candidate's retries are openraft's: they keep the greater-log penalty, so a member
        // with a stale log cannot out-campaign an up-to-date one.
        ServerState::Candidate
        | ServerState::Leader
        | ServerState::Learner
        | ServerState::Shutdown => None,
    }
}

/// What the backstop does on one tick.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// The leader (or an election) may still be heard from.
    Wait,
    /// The member was not running since the previous tick: count leader contact from now.
    Resumed,
    /// Silent for longer than the patience: start an election.
    Elect,
}

/// The decision for a tick `gap` after the previous one, `silence` after the last leader
/// contact, with patience `wait` (see the module docs).
fn step(gap: Duration, silence: Duration, wait: Duration) -> Step {
    if gap > wait / 2 {
        Step::Resumed
    } else if silence < wait {
        Step::Wait
    } else {
        Step::Elect
    }
}

/// Runs the election backstop of the member whose cluster state is `cluster`, until that
/// state is dropped (with its node) or the member starts to stop (`Cluster::stop_elections`).
pub async fn run(cluster: Weak<Cluster>) {
    let (seed, timers) = {
        let Some(c) = cluster.upgrade() else { return };
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        (
            c.id ^ nanos ^ (u64::from(std::process::id()) << 32),
            c.timing.raft,
        )
    };
    let mut jitter = Jitter::new(seed);
    let mut extra = jitter.between(0, timers.heartbeat_interval);
    let mut last_vote = None;
    let mut tick = tokio::time::interval(Duration::from_millis(
        (timers.heartbeat_interval / 4).max(10),
    ));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_tick = Instant::now();
    loop {
        tick.tick().await;
        let gap = last_tick.elapsed();
        last_tick = Instant::now();
        let Some(member) = cluster.upgrade() else {
            return;
        };
        if member.is_stopping() {
            return;
        }
        let contact = &member.leader_contact;
        let (state, vote, is_voter) = {
            let m = member.raft.metrics();
            let m = m.borrow();
            let is_voter = m
                .membership_config
                .membership()
                .voter_ids()
                .any(|v| v == member.id);
            (m.state, m.vote, is_voter)
        };
        if last_vote != Some(vote) {
            last_vote = Some(vote);
            // This member granted its vote to another candidate (or follows a new leader):
            // that election is under way, give it time. A vote request refused because the
            // candidate's log is stale does not count.
            if vote.leader_id().voted_for().is_some_and(|v| v != member.id) {
                contact.touch();
                continue;
            }
        }
        let Some(wait) = patience(state, &timers, extra) else {
            continue;
        };
        if !is_voter {
            continue;
        }
        match step(gap, contact.silence(), wait) {
            Step::Wait => continue,
            Step::Resumed => {
                tracing::info!(
                    gap_ms = gap.as_millis() as u64,
                    "the member was not running: counting leader contact from now"
                );
                contact.touch();
                continue;
            }
            Step::Elect => {}
        }
        tracing::info!(
            silence_ms = contact.silence().as_millis() as u64,
            ?state,
            "no leader heard from: starting an election"
        );
        let _ = member.raft.trigger().campaign().await;
        contact.touch();
        extra = jitter.between(0, timers.heartbeat_interval);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_in_range_and_spreads() {
        let mut j = Jitter::new(42);
        let values: Vec<u64> = (0..1000).map(|_| j.between(400, 600)).collect();
        assert!(values.iter().all(|v| (400..600).contains(v)));
        let distinct: std::collections::BTreeSet<_> = values.iter().collect();
        assert!(distinct.len() > 150, "{} distinct values", distinct.len());
        assert_eq!(Jitter::new(1).between(5, 5), 5);
    }

    #[test]
    fn the_backstop_waits_past_openrafts_own_timer() {
        let t = super::super::timing::raft_timers(100, 1000);
        // openraft fires at most lease (600) + timeout (< 600) + one tick (150) after contact.
        let p = patience(ServerState::Follower, &t, 0).unwrap();
        assert_eq!(p, Duration::from_millis(1350));
        assert_eq!(
            patience(ServerState::Follower, &t, 99),
            Some(Duration::from_millis(1449))
        );
        assert_eq!(patience(ServerState::Candidate, &t, 0), None);
        assert_eq!(patience(ServerState::Leader, &t, 0), None);
        assert_eq!(patience(ServerState::Learner, &t, 0), None);
    }

    #[test]
    fn a_stopped_member_does_not_campaign_on_resume() {
        let ms = Duration::from_millis;
        let wait = ms(1350);
        assert_eq!(step(ms(25), ms(1000), wait), Step::Wait);
        assert_eq!(step(ms(25), ms(1400), wait), Step::Elect);
        // SIGSTOP for 5 s: the first tick after SIGCONT sees the whole stop as silence.
        assert_eq!(step(ms(5000), ms(5025), wait), Step::Resumed);
        // A tick delayed by load, but less than half the patience, still counts.
        assert_eq!(step(ms(600), ms(1400), wait), Step::Elect);
        assert_eq!(step(ms(700), ms(1400), wait), Step::Resumed);
    }

    #[test]
    fn contact_resets_the_silence() {
        let c = LeaderContact::default();
        std::thread::sleep(Duration::from_millis(30));
        assert!(c.silence() >= Duration::from_millis(30));
        c.touch();
        assert!(c.silence() < Duration::from_millis(30));
    }
}
