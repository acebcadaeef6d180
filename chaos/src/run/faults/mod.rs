//! Faults: what the chaos monkey does to the cluster, one at a time, each bounded in time.
//!
//! The scheduler ([`run_faults`]) alternates a quiet period (0.5-2 s) with one fault picked
//! from the enabled kinds by a seeded RNG; a fault holds for a random 1-5 s (clamped to the
//! run's end) and is then healed (links pass again, processes resumed or restarted, members
//! re-added), so the cluster always comes back. Each fault is recorded as a [`FaultRecord`].

mod admin;
mod disk;
mod network;
mod process;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::time::Instant;

use super::cluster::Cluster;

/// A fault type (`--faults kill,pause,...`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// SIGKILL the leader or a random member, then restart it.
    Kill,
    /// SIGSTOP the leader or a random member, then SIGCONT.
    Pause,
    /// Drop the links between the leader or a minority and the rest (symmetric or one-way).
    Partition,
    /// Delay every chunk on the links of one member or of all members.
    Latency,
    /// Maintenance.MoveLeader to a random follower.
    Transfer,
    /// MemberRemove a follower, wipe its data dir, MemberAdd it back, restart it.
    Member,
    /// Compact at (latest revision - a little), many times in a row.
    Compact,
    /// Restart a member with a crash failpoint armed, then restart it normally.
    Failpoint,
    /// Restart the leader or a random member with a 100-500 ms delay before each WAL
    /// fdatasync (failpoint `wal_slow_fsync`), keep it leading if it led, then heal.
    SlowFsync,
}

impl FaultKind {
    /// Every kind, in `--faults all` order.
    pub const ALL: [FaultKind; 9] = [
        FaultKind::Kill,
        FaultKind::Pause,
        FaultKind::Partition,
        FaultKind::Latency,
        FaultKind::Transfer,
        FaultKind::Member,
        FaultKind::Compact,
        FaultKind::Failpoint,
        FaultKind::SlowFsync,
    ];

    /// The `--faults` name.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill",
            FaultKind::Pause => "pause",
            FaultKind::Partition => "partition",
            FaultKind::Latency => "latency",
            FaultKind::Transfer => "transfer",
            FaultKind::Member => "member",
            FaultKind::Compact => "compact",
            FaultKind::Failpoint => "failpoint",
            FaultKind::SlowFsync => "slow-fsync",
        }
    }

    /// Parses a comma-separated list (`all` = every kind; `none` or empty = no faults).
    ///
    /// Errors: an unknown name, listing the known ones.
    pub fn parse_list(s: &str) -> Result<Vec<FaultKind>, String> {
        if s.trim().is_empty() {
            return Err("empty fault list (use `none` for a run without faults)".into());
        }
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if part == "all" {
                out.extend(FaultKind::ALL);
                continue;
            }
            if part == "none" {
                continue;
            }
            let kind = FaultKind::ALL
                .into_iter()
                .find(|k| k.name() == part)
                .ok_or_else(|| {
                    let known: Vec<&str> = FaultKind::ALL.iter().map(|k| k.name()).collect();
                    format!(
                        "unknown fault {part:?} (known: all, none, {})",
                        known.join(", ")
                    )
                })?;
            out.push(kind);
        }
        out.dedup();
        let mut seen = Vec::new();
        out.retain(|k| {
            let new = !seen.contains(k);
            seen.push(*k);
            new
        });
        Ok(out)
    }
}

/// One injected fault.
#[derive(Clone, Debug, Serialize)]
pub struct FaultRecord {
    pub kind: FaultKind,
    /// What exactly was done (members, links, failpoint, ...).
    pub detail: String,
    /// Injection and heal times (ns since run start).
    pub start_ns: u64,
    pub end_ns: u64,
    /// Set when the fault could not be injected or healed as planned.
    pub error: Option<String>,
}

/// Scheduler settings.
#[derive(Clone, Debug)]
pub struct FaultPlan {
    pub kinds: Vec<FaultKind>,
    pub seed: u64,
    /// Shortest and longest hold of one fault.
    pub hold: (Duration, Duration),
    /// Partitions are symmetric only (`--inject stale-read` wants the isolated member cut off
    /// from the leader's appends).
    pub symmetric_partitions_only: bool,
}

/// A fault that would hold shorter than this before the run's end is not started.
const MIN_HOLD: Duration = Duration::from_millis(500);
/// Quiet time between faults.
const QUIET: (Duration, Duration) = (Duration::from_millis(500), Duration::from_millis(2000));

/// Injects faults until `until` (a fault's hold is clamped so it heals by then) or until
/// `stop` is set, and returns what it did. `t0` is the run's time origin.
pub async fn run_faults(
    cluster: Arc<Cluster>,
    plan: FaultPlan,
    t0: Instant,
    until: Instant,
    stop: Arc<AtomicBool>,
) -> Vec<FaultRecord> {
    let mut rng = StdRng::seed_from_u64(plan.seed);
    let mut records = Vec::new();
    if plan.kinds.is_empty() {
        return records;
    }
    loop {
        let quiet = rng.gen_range(QUIET.0..=QUIET.1);
        if sleep_unless_stopped(quiet, &stop).await {
            return records;
        }
        let kind = plan.kinds[rng.gen_range(0..plan.kinds.len())];
        let hold = rng
            .gen_range(plan.hold.0..=plan.hold.1)
            .min(until.saturating_duration_since(Instant::now()));
        if hold < MIN_HOLD {
            return records;
        }
        let start_ns = t0.elapsed().as_nanos() as u64;
        let result = inject(&cluster, kind, hold, &mut rng, &plan).await;
        let end_ns = t0.elapsed().as_nanos() as u64;
        let (detail, error) = match result {
            Ok(detail) => (detail, None),
            Err(e) => (String::new(), Some(format!("{e:#}"))),
        };
        let record = FaultRecord {
            kind,
            detail,
            start_ns,
            end_ns,
            error,
        };
        eprintln!("chaos: {}", describe(&record));
        records.push(record);
    }
}

/// One line for a fault record.
pub fn describe(r: &FaultRecord) -> String {
    let mut s = format!(
        "fault {:>9} {:>8.3}s..{:>8.3}s {}",
        r.kind.name(),
        r.start_ns as f64 / 1e9,
        r.end_ns as f64 / 1e9,
        r.detail
    );
    if let Some(e) = &r.error {
        s.push_str(&format!(" [error: {e}]"));
    }
    s
}

async fn inject(
    cluster: &Cluster,
    kind: FaultKind,
    hold: Duration,
    rng: &mut StdRng,
    plan: &FaultPlan,
) -> anyhow::Result<String> {
    match kind {
        FaultKind::Kill => process::kill(cluster, hold, rng).await,
        FaultKind::Pause => process::pause(cluster, hold, rng).await,
        FaultKind::Failpoint => process::failpoint_crash(cluster, hold, rng).await,
        FaultKind::SlowFsync => disk::slow_fsync(cluster, hold, rng).await,
        FaultKind::Partition => {
            network::partition(cluster, hold, rng, plan.symmetric_partitions_only).await
        }
        FaultKind::Latency => network::latency(cluster, hold, rng).await,
        FaultKind::Transfer => admin::transfer(cluster, rng).await,
        FaultKind::Compact => admin::compaction_storm(cluster, hold, rng).await,
        FaultKind::Member => admin::remove_and_readd(cluster, hold, rng).await,
    }
}

/// The leader (half the time, when known) or a random member.
async fn pick_target(cluster: &Cluster, rng: &mut StdRng) -> (usize, &'static str) {
    if rng.gen_bool(0.5)
        && let Some(l) = cluster.leader().await
    {
        return (l, "leader");
    }
    (rng.gen_range(0..cluster.len()), "random")
}

/// Sleeps `d` in short steps; returns true (early) once `stop` is set.
async fn sleep_unless_stopped(d: Duration, stop: &AtomicBool) -> bool {
    let until = Instant::now() + d;
    while Instant::now() < until {
        if stop.load(Ordering::SeqCst) {
            return true;
        }
        let step = (until - Instant::now()).min(Duration::from_millis(50));
        tokio::time::sleep(step).await;
    }
    stop.load(Ordering::SeqCst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fault_lists() {
        assert_eq!(
            FaultKind::parse_list("kill,pause,partition").unwrap(),
            vec![FaultKind::Kill, FaultKind::Pause, FaultKind::Partition]
        );
        assert_eq!(
            FaultKind::parse_list("all").unwrap(),
            FaultKind::ALL.to_vec()
        );
        assert_eq!(
            FaultKind::parse_list("kill,all").unwrap(),
            FaultKind::ALL.to_vec()
        );
        assert!(FaultKind::parse_list("none").unwrap().is_empty());
        assert_eq!(
            FaultKind::parse_list("slow-fsync,kill").unwrap(),
            vec![FaultKind::SlowFsync, FaultKind::Kill]
        );
        assert_eq!(FaultKind::SlowFsync.name(), "slow-fsync");
        assert!(
            FaultKind::parse_list("")
                .unwrap_err()
                .contains("empty fault list")
        );
        let err = FaultKind::parse_list("kill,nuke").unwrap_err();
        assert!(err.contains("nuke") && err.contains("partition"), "{err}");
    }
}
