//! Auto-compaction (etcd `server/etcdserver/api/v3compactor`, issue 15 part 6): the leader
//! compacts the store through raft on etcd's schedule.
//!
//! - **periodic** (`--auto-compaction-mode periodic`, retention = a duration `P`; etcd
//!   `periodic.go`): every `min(P, 1h) / 10` ([`Periodic::retry_interval`]) the loop samples
//!   the store revision and keeps the last `P / interval + 1` samples, so the oldest sample
//!   is the revision seen `P` ago. The first compaction comes `P` after start, later ones
//!   `min(P, 1h)` after the last success, each to the oldest sample. A failed compaction is
//!   retried one sampling interval later.
//! - **revision** (retention = `N` revisions; etcd `revision.go`): every [`REV_INTERVAL`]
//!   (5 min) the loop compacts to `current - N`, unless that is ≤ 0 or the revision it
//!   compacted last time.
//!
//! Only the leader compacts. On a follower the schedule is paused (etcd's `Pause`/`Resume`
//! on leadership changes): a tick that finds this member not leading does nothing, while
//! periodic sampling goes on, as in etcd, so a new leader already has its own samples. The
//! compaction is an ordinary `Compaction` request proposed through raft (issued by the
//! server itself, so it applies with root authority), so every member compacts at the same
//! log position and a follower never compacts by itself. `Compacted` (the revision is
//! already compacted) counts as success, as etcd's `err == nil || err == mvcc.ErrCompacted`;
//! any other answer (a future revision, no leader, a timeout) is logged and the schedule
//! goes on.
//!
//! The schedules ([`Periodic`], [`Revision`]) are plain state driven by the times and
//! revisions given to them; [`run`] drives one with a [`Clock`], so tests run it on a fake
//! clock without sleeping.

use std::collections::VecDeque;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::EtcdError;

/// `--auto-compaction-mode` for time-based retention (etcd `CompactorModePeriodic`).
pub const MODE_PERIODIC: &str = "periodic";
/// `--auto-compaction-mode` for revision-count retention (etcd `CompactorModeRevision`).
pub const MODE_REVISION: &str = "revision";
/// etcd's `revInterval`: how often revision mode compacts.
pub const REV_INTERVAL: Duration = Duration::from_secs(300);
/// etcd caps the periodic compaction interval at an hour (`getCompactInterval`).
pub const MAX_COMPACT_INTERVAL: Duration = Duration::from_secs(3600);
/// etcd's `retryDivisor`: samples per compaction interval.
pub const RETRY_DIVISOR: u32 = 10;
/// Keel's floor under the sampling interval, so a retention of a few nanoseconds cannot
/// spin (etcd would divide by zero below 10 ns).
pub const MIN_RETRY_INTERVAL: Duration = Duration::from_millis(1);

/// What the flags ask for (`MaintenanceFlags::auto_compaction` in `config/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Keep this much history (time).
    Periodic(Duration),
    /// Keep `retention` revisions, compacting every `interval` ([`REV_INTERVAL`] unless a
    /// test shortens it).
    Revision {
        /// Revisions kept below the current one.
        retention: i64,
        /// Time between two compactions.
        interval: Duration,
    },
}

/// etcd's periodic compactor state (module docs).
#[derive(Debug, Clone)]
pub struct Periodic {
    period: Duration,
    /// Revisions sampled every retry interval, oldest first, at most `retentions()`.
    revs: VecDeque<i64>,
    last_success: Instant,
    /// `period` until the first compaction, then the compact interval.
    base_interval: Duration,
}

impl Periodic {
    /// A schedule keeping `period` of history, started at `now`.
    pub fn new(period: Duration, now: Instant) -> Periodic {
        Periodic {
            period,
            revs: VecDeque::new(),
            last_success: now,
            base_interval: period,
        }
    }

    /// Time between two compactions after the first: `min(period, 1h)`.
    pub fn compact_interval(&self) -> Duration {
        self.period.min(MAX_COMPACT_INTERVAL)
    }

    /// Time between two samples (and two checks): a tenth of the compact interval.
    pub fn retry_interval(&self) -> Duration {
        (self.compact_interval() / RETRY_DIVISOR).max(MIN_RETRY_INTERVAL)
    }

    /// Samples kept: `period / retry interval + 1`, so the oldest is `period` old.
    pub fn retentions(&self) -> usize {
        (self.period.as_nanos() / self.retry_interval().as_nanos()) as usize + 1
    }

    /// Records the store revision at the start of a round.
    pub fn sample(&mut self, revision: i64) {
        self.revs.push_back(revision);
        while self.revs.len() > self.retentions() {
            self.revs.pop_front();
        }
    }

    /// The revision to compact at `now` (after a retry interval), if it is time.
    pub fn due(&mut self, now: Instant, paused: bool) -> Option<i64> {
        if paused || now.duration_since(self.last_success) < self.base_interval {
            return None;
        }
        // After waiting the whole period once, compact every compact interval.
        if self.base_interval == self.period {
            self.base_interval = self.compact_interval();
        }
        self.revs.front().copied()
    }

    /// The outcome of the compaction [`Periodic::due`] asked for.
    pub fn finished(&mut self, now: Instant, ok: bool) {
        if ok {
            self.last_success = now;
        }
    }
}

/// etcd's revision compactor state (module docs).
#[derive(Debug, Clone)]
pub struct Revision {
    retention: i64,
    interval: Duration,
    /// The revision last compacted successfully (0: none).
    prev: i64,
}

impl Revision {
    /// A schedule keeping `retention` revisions, compacting every `interval`.
    pub fn new(retention: i64, interval: Duration) -> Revision {
        Revision {
            retention,
            interval: interval.max(MIN_RETRY_INTERVAL),
            prev: 0,
        }
    }

    /// The revision to compact now that the store is at `current`, if any.
    pub fn due(&self, paused: bool, current: i64) -> Option<i64> {
        let rev = current - self.retention;
        (!paused && rev > 0 && rev != self.prev).then_some(rev)
    }

    /// The outcome of compacting `revision`.
    pub fn finished(&mut self, revision: i64, ok: bool) {
        if ok {
            self.prev = revision;
        }
    }
}

/// One of the two schedules.
#[derive(Debug, Clone)]
pub enum Schedule {
    /// `--auto-compaction-mode periodic`.
    Periodic(Periodic),
    /// `--auto-compaction-mode revision`.
    Revision(Revision),
}

impl Schedule {
    /// The schedule of `mode`, started at `now`.
    pub fn new(mode: Mode, now: Instant) -> Schedule {
        match mode {
            Mode::Periodic(period) => Schedule::Periodic(Periodic::new(period, now)),
            Mode::Revision {
                retention,
                interval,
            } => Schedule::Revision(Revision::new(retention, interval)),
        }
    }

    /// Time between two rounds.
    pub fn interval(&self) -> Duration {
        match self {
            Schedule::Periodic(p) => p.retry_interval(),
            Schedule::Revision(r) => r.interval,
        }
    }

    /// Start of a round: periodic mode samples the revision (revision mode reads it later).
    pub fn sample(&mut self, revision: i64) {
        if let Schedule::Periodic(p) = self {
            p.sample(revision);
        }
    }

    /// End of a round's wait: the revision to compact, if it is time.
    pub fn due(&mut self, now: Instant, paused: bool, current: i64) -> Option<i64> {
        match self {
            Schedule::Periodic(p) => p.due(now, paused),
            Schedule::Revision(r) => r.due(paused, current),
        }
    }

    /// The outcome of compacting `revision`.
    pub fn finished(&mut self, now: Instant, revision: i64, ok: bool) {
        match self {
            Schedule::Periodic(p) => p.finished(now, ok),
            Schedule::Revision(r) => r.finished(revision, ok),
        }
    }
}

/// The member the compactor works for (etcd's `RevGetter` + `Compactable`); `node.rs`
/// implements it, tests use a fake.
pub trait Compactable: Send + Sync + 'static {
    /// The store revision now; `None` once the member is gone (the loop ends).
    fn revision(&self) -> Option<i64>;
    /// Whether this member leads (the schedule runs only then).
    fn is_leader(&self) -> bool;
    /// Proposes a compaction at `revision` through raft and waits until it applied here.
    fn compact(&self, revision: i64) -> impl Future<Output = Result<(), EtcdError>> + Send;
}

/// The time source of [`run`]: tokio's clock, or a fake one in tests.
pub trait Clock: Send + Sync {
    /// Now.
    fn now(&self) -> Instant;
    /// Waits `d`.
    fn sleep(&self, d: Duration) -> impl Future<Output = ()> + Send;
}

/// Tokio's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioClock;

impl Clock for TokioClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    async fn sleep(&self, d: Duration) {
        tokio::time::sleep(d).await
    }
}

/// Runs the auto-compactor of `mode` for `target` until the member is gone. See the
/// module docs.
pub async fn run<T: Compactable, C: Clock>(mode: Mode, target: T, clock: C) {
    let mut schedule = Schedule::new(mode, clock.now());
    let (kind, retention) = match mode {
        Mode::Periodic(p) => (MODE_PERIODIC, format!("{p:?}")),
        Mode::Revision { retention, .. } => (MODE_REVISION, retention.to_string()),
    };
    tracing::info!(
        mode = kind,
        retention = %retention,
        interval = ?schedule.interval(),
        "auto-compaction enabled (the leader compacts)"
    );
    loop {
        let Some(rev) = target.revision() else { return };
        schedule.sample(rev);
        clock.sleep(schedule.interval()).await;
        let Some(current) = target.revision() else {
            return;
        };
        let Some(rev) = schedule.due(clock.now(), !target.is_leader(), current) else {
            continue;
        };
        log_start(mode, rev);
        let started = clock.now();
        let result = target.compact(rev).await;
        let took = clock.now().duration_since(started);
        let ok = matches!(result, Ok(()) | Err(EtcdError::Compacted));
        schedule.finished(clock.now(), rev, ok);
        match result {
            Err(EtcdError::Stopped) => return,
            Err(e) if !ok => log_failure(mode, rev, schedule.interval(), &e),
            _ => log_done(mode, rev, took),
        }
    }
}

// etcd's zap messages (3.4.23 and 3.5 alike), with Keel's snake_case fields.
fn log_start(mode: Mode, revision: i64) {
    match mode {
        Mode::Periodic(p) => tracing::info!(
            revision,
            compact_period = ?p,
            "starting auto periodic compaction"
        ),
        Mode::Revision { retention, .. } => tracing::info!(
            revision,
            revision_compaction_retention = retention,
            "starting auto revision compaction"
        ),
    }
}

fn log_done(mode: Mode, revision: i64, took: Duration) {
    match mode {
        Mode::Periodic(p) => tracing::info!(
            revision,
            compact_period = ?p,
            took = ?took,
            "completed auto periodic compaction"
        ),
        Mode::Revision { retention, .. } => tracing::info!(
            revision,
            revision_compaction_retention = retention,
            took = ?took,
            "completed auto revision compaction"
        ),
    }
}

fn log_failure(mode: Mode, revision: i64, retry: Duration, error: &EtcdError) {
    match mode {
        Mode::Periodic(p) => tracing::warn!(
            revision,
            compact_period = ?p,
            retry_interval = ?retry,
            %error,
            "failed auto periodic compaction"
        ),
        Mode::Revision { retention, .. } => tracing::warn!(
            revision,
            revision_compaction_retention = retention,
            retry_interval = ?retry,
            %error,
            "failed auto revision compaction"
        ),
    }
}

#[cfg(test)]
mod tests;
