//! The schedules and the loop on a fake clock: every sleep advances virtual time at once,
//! so hours of schedule run in microseconds. The fake member's revision is a function of
//! the virtual time (one write a second unless a test says otherwise).

use std::sync::{Arc, Mutex};

use super::*;

const S: Duration = Duration::from_secs(1);
const MIN: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);

struct FakeClock {
    start: Instant,
    elapsed: Mutex<Duration>,
}

impl FakeClock {
    fn new() -> Arc<FakeClock> {
        Arc::new(FakeClock {
            start: Instant::now(),
            elapsed: Mutex::new(Duration::ZERO),
        })
    }

    fn elapsed(&self) -> Duration {
        *self.elapsed.lock().unwrap()
    }
}

impl Clock for Arc<FakeClock> {
    fn now(&self) -> Instant {
        self.start + self.elapsed()
    }

    async fn sleep(&self, d: Duration) {
        *self.elapsed.lock().unwrap() += d;
    }
}

/// What the fake member saw: each compaction as (virtual time, revision).
#[derive(Default)]
struct Seen {
    compactions: Vec<(Duration, i64)>,
}

struct FakeMember {
    clock: Arc<FakeClock>,
    /// The loop ends once virtual time passes this.
    until: Duration,
    /// Revision at virtual time `t`.
    rev_at: fn(Duration) -> i64,
    /// Leader at virtual time `t`.
    leader_at: fn(Duration) -> bool,
    /// Answer to the compaction number `n` (0-based).
    answer: fn(usize) -> Result<(), EtcdError>,
    seen: Arc<Mutex<Seen>>,
}

impl Compactable for FakeMember {
    fn revision(&self) -> Option<i64> {
        let t = self.clock.elapsed();
        (t <= self.until).then(|| (self.rev_at)(t))
    }

    fn is_leader(&self) -> bool {
        (self.leader_at)(self.clock.elapsed())
    }

    async fn compact(&self, revision: i64) -> Result<(), EtcdError> {
        let mut seen = self.seen.lock().unwrap();
        let n = seen.compactions.len();
        seen.compactions.push((self.clock.elapsed(), revision));
        (self.answer)(n)
    }
}

fn one_write_a_second(t: Duration) -> i64 {
    100 + t.as_secs() as i64
}

fn always(_: Duration) -> bool {
    true
}

fn ok(_: usize) -> Result<(), EtcdError> {
    Ok(())
}

/// Runs `mode` for `until` of virtual time; returns every compaction.
fn simulate(
    mode: Mode,
    until: Duration,
    rev_at: fn(Duration) -> i64,
    leader_at: fn(Duration) -> bool,
    answer: fn(usize) -> Result<(), EtcdError>,
) -> Vec<(Duration, i64)> {
    let clock = FakeClock::new();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let member = FakeMember {
        clock: clock.clone(),
        until,
        rev_at,
        leader_at,
        answer,
        seen: seen.clone(),
    };
    futures::executor::block_on(run(mode, member, clock));
    let seen = seen.lock().unwrap();
    seen.compactions.clone()
}

#[test]
fn periodic_intervals_follow_etcd() {
    let p = Periodic::new(5 * S, Instant::now());
    assert_eq!(
        (p.compact_interval(), p.retry_interval(), p.retentions()),
        (5 * S, 500 * Duration::from_millis(1), 11)
    );
    let p = Periodic::new(HOUR, Instant::now());
    assert_eq!(
        (p.compact_interval(), p.retry_interval(), p.retentions()),
        (HOUR, 6 * MIN, 11)
    );
    // Above an hour: compact hourly, sample every 6 min, keep the whole retention.
    let p = Periodic::new(24 * HOUR, Instant::now());
    assert_eq!(
        (p.compact_interval(), p.retry_interval(), p.retentions()),
        (HOUR, 6 * MIN, 241)
    );
    let p = Periodic::new(59 * MIN, Instant::now());
    assert_eq!(p.retry_interval(), Duration::from_secs(354));
    assert_eq!(p.retentions(), 11);
    let p = Periodic::new(Duration::from_nanos(5), Instant::now());
    assert_eq!(p.retry_interval(), MIN_RETRY_INTERVAL, "no busy loop");
}

#[test]
fn periodic_compacts_to_the_revision_seen_one_retention_ago() {
    // 10 s retention, one write a second from revision 100: sampled every second; first
    // compaction after 10 s to the revision seen at start, then every 10 s to the oldest
    // of the 11 samples kept (seen 11 s earlier), as etcd's periodic.go.
    let got = simulate(
        Mode::Periodic(10 * S),
        45 * S,
        one_write_a_second,
        always,
        ok,
    );
    assert_eq!(
        got,
        [(10 * S, 100), (20 * S, 109), (30 * S, 119), (40 * S, 129)]
    );
}

#[test]
fn periodic_above_an_hour_compacts_hourly_keeping_the_whole_retention() {
    // 2 h retention: first compaction at 2 h to the start revision, then every hour to the
    // revision sampled 2 h 6 min earlier (21 samples, 6 min apart).
    let got = simulate(
        Mode::Periodic(2 * HOUR),
        4 * HOUR + MIN,
        one_write_a_second,
        always,
        ok,
    );
    let rev = |t: Duration| one_write_a_second(t);
    assert_eq!(
        got,
        [
            (2 * HOUR, rev(Duration::ZERO)),
            (3 * HOUR, rev(3 * HOUR - 2 * HOUR - 6 * MIN)),
            (4 * HOUR, rev(4 * HOUR - 2 * HOUR - 6 * MIN)),
        ]
    );
}

#[test]
fn periodic_pauses_on_a_follower_and_keeps_sampling() {
    // Leader only from 25 s: nothing before; the first round as leader compacts to the
    // oldest sample it kept while following (seen 11 s earlier).
    fn from_25s(t: Duration) -> bool {
        t >= 25 * S
    }
    let got = simulate(
        Mode::Periodic(10 * S),
        36 * S,
        one_write_a_second,
        from_25s,
        ok,
    );
    assert_eq!(got, [(25 * S, 114), (35 * S, 124)]);
    // Never leader: never compacts.
    fn never(_: Duration) -> bool {
        false
    }
    let got = simulate(Mode::Periodic(10 * S), HOUR, one_write_a_second, never, ok);
    assert_eq!(got, []);
}

#[test]
fn periodic_retries_a_failure_at_the_next_sample_and_takes_compacted_as_success() {
    // The first answer is "no leader": retried one sampling interval later, to the oldest
    // sample then (still the start's: 11 samples are kept). `Compacted` (the second
    // answer) counts as done.
    fn fail_first(n: usize) -> Result<(), EtcdError> {
        match n {
            0 => Err(EtcdError::NoLeader),
            1 => Err(EtcdError::Compacted),
            _ => Ok(()),
        }
    }
    let got = simulate(
        Mode::Periodic(10 * S),
        22 * S,
        one_write_a_second,
        always,
        fail_first,
    );
    assert_eq!(got, [(10 * S, 100), (11 * S, 100), (21 * S, 110)]);
    // A future revision is a failure too (etcd retries it): compacted again at once.
    fn future(_: usize) -> Result<(), EtcdError> {
        Err(EtcdError::FutureRev)
    }
    let got = simulate(
        Mode::Periodic(10 * S),
        12 * S,
        one_write_a_second,
        always,
        future,
    );
    assert_eq!(got, [(10 * S, 100), (11 * S, 100), (12 * S, 101)]);
}

#[test]
fn revision_mode_keeps_the_last_n_revisions_every_five_minutes() {
    // Retention 50, one write a second: every 5 min to current - 50.
    let mode = Mode::Revision {
        retention: 50,
        interval: REV_INTERVAL,
    };
    let got = simulate(mode, 16 * MIN, one_write_a_second, always, ok);
    assert_eq!(
        got,
        [
            (5 * MIN, 100 + 300 - 50),
            (10 * MIN, 100 + 600 - 50),
            (15 * MIN, 100 + 900 - 50)
        ]
    );
}

#[test]
fn revision_mode_skips_an_unchanged_revision_and_a_store_younger_than_the_retention() {
    fn idle(_: Duration) -> i64 {
        500
    }
    let mode = Mode::Revision {
        retention: 100,
        interval: REV_INTERVAL,
    };
    // No writes: compacted once, then the same revision is not compacted again.
    let got = simulate(mode, 30 * MIN, idle, always, ok);
    assert_eq!(got, [(5 * MIN, 400)]);
    // Fewer revisions than the retention: nothing to compact.
    let mode = Mode::Revision {
        retention: 1000,
        interval: REV_INTERVAL,
    };
    assert_eq!(simulate(mode, 30 * MIN, idle, always, ok), []);
    // A failure is retried at the next interval with the then current revision.
    fn fail_first(n: usize) -> Result<(), EtcdError> {
        if n == 0 {
            Err(EtcdError::Timeout)
        } else {
            Ok(())
        }
    }
    let mode = Mode::Revision {
        retention: 100,
        interval: REV_INTERVAL,
    };
    let got = simulate(mode, 11 * MIN, idle, always, fail_first);
    assert_eq!(got, [(5 * MIN, 400), (10 * MIN, 400)]);
}

#[test]
fn the_loop_ends_when_the_member_stops() {
    fn stopped(_: usize) -> Result<(), EtcdError> {
        Err(EtcdError::Stopped)
    }
    let got = simulate(Mode::Periodic(S), HOUR, one_write_a_second, always, stopped);
    assert_eq!(got, [(S, 100)], "no compaction after Stopped");
}
