//! What the soak's resource samples ([`super::resources`]) say, per member: RSS at the end of
//! the warm-up, max RSS, the RSS growth rate after the warm-up, max fds and max bytes on disk;
//! and which of the run's bounds (`--max-rss-growth-mib-per-min`, `--max-fds`,
//! `--max-disk-mib`) they exceed.
//!
//! The growth rate is the least-squares slope of RSS over time with one intercept per
//! process (the pooled within-process slope: Σ (t − t̄ₚ)(y − ȳₚ) / Σ (t − t̄ₚ)² summed over
//! processes p), so a restart, which starts a fresh small process, never reads as a drop and
//! a process's growth is never diluted by another's level. Only samples at or after the
//! warm-up cut count.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

use super::resources::Sample;

/// How long the warm-up is when `--soak-warmup` is not given: 5 minutes, or a sixth of a
/// shorter run.
pub fn default_warmup(run: Duration) -> Duration {
    (run / 6).min(Duration::from_secs(300))
}

/// The bounds a run must stay under (`None`: not checked).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ResourceBounds {
    /// RSS growth after the warm-up, MiB per minute, per member.
    pub max_rss_growth_mib_per_min: Option<f64>,
    /// Open fds of any member process at any sample.
    pub max_fds: Option<u64>,
    /// WAL + snap + db of any member at any sample, MiB.
    pub max_disk_mib: Option<f64>,
}

/// The summary of one member's samples.
#[derive(Clone, Debug, PartialEq)]
pub struct MemberResources {
    pub member: String,
    /// Samples taken (all, including the warm-up).
    pub samples: usize,
    /// Processes seen (1 + restarts that were sampled).
    pub processes: usize,
    /// RSS of the first sample at or after the warm-up cut, MiB (`None`: no such sample).
    pub rss_warmup_mib: Option<f64>,
    /// Max RSS over all samples, MiB.
    pub rss_max_mib: f64,
    /// Pooled within-process least-squares slope of RSS after the warm-up, MiB/min (`None`:
    /// no process has two samples after the cut at different times).
    pub rss_slope_mib_per_min: Option<f64>,
    /// Seconds of post-warm-up time the slope rests on (sum over processes of last − first).
    pub slope_span_secs: f64,
    pub fds_max: u64,
    pub wal_max_bytes: u64,
    pub snap_max_bytes: u64,
    pub db_max_bytes: u64,
    /// Max of wal + snap + db at one sample.
    pub disk_max_bytes: u64,
}

/// The whole summary.
#[derive(Clone, Debug, PartialEq)]
pub struct ResourceReport {
    /// The warm-up cut, seconds since the workload started.
    pub warmup_secs: f64,
    pub members: Vec<MemberResources>,
    /// One line per exceeded bound.
    pub violations: Vec<String>,
}

const KIB_PER_MIB: f64 = 1024.0;
const BYTES_PER_MIB: f64 = 1024.0 * 1024.0;

/// Pooled within-group least-squares slope of `(x, y)` points grouped by key: `None` when
/// no group has two distinct x.
pub fn pooled_slope<K: Ord>(points: impl IntoIterator<Item = (K, f64, f64)>) -> Option<f64> {
    let mut groups: BTreeMap<K, Vec<(f64, f64)>> = BTreeMap::new();
    for (k, x, y) in points {
        groups.entry(k).or_default().push((x, y));
    }
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for pts in groups.values() {
        let n = pts.len() as f64;
        let mx = pts.iter().map(|p| p.0).sum::<f64>() / n;
        let my = pts.iter().map(|p| p.1).sum::<f64>() / n;
        for (x, y) in pts {
            sxy += (x - mx) * (y - my);
            sxx += (x - mx) * (x - mx);
        }
    }
    (sxx > 0.0).then(|| sxy / sxx)
}

/// Summarises `samples` with the warm-up cut at `warmup` and checks `bounds`.
pub fn summarise(samples: &[Sample], warmup: Duration, bounds: &ResourceBounds) -> ResourceReport {
    let cut = warmup.as_secs_f64();
    let mut by_member: BTreeMap<&str, Vec<&Sample>> = BTreeMap::new();
    for s in samples {
        by_member.entry(&s.member).or_default().push(s);
    }
    let mut members = Vec::new();
    for (name, mut ss) in by_member {
        ss.sort_by(|a, b| a.t_secs.total_cmp(&b.t_secs));
        let steady: Vec<&&Sample> = ss.iter().filter(|s| s.t_secs >= cut).collect();
        let mut spans: BTreeMap<(u32, u32), (f64, f64)> = BTreeMap::new();
        for s in &steady {
            let span = spans
                .entry((s.epoch, s.pid))
                .or_insert((s.t_secs, s.t_secs));
            span.1 = s.t_secs;
        }
        let processes: std::collections::BTreeSet<(u32, u32)> =
            ss.iter().map(|s| (s.epoch, s.pid)).collect();
        members.push(MemberResources {
            member: name.to_string(),
            samples: ss.len(),
            processes: processes.len(),
            rss_warmup_mib: steady.first().map(|s| s.rss_kib as f64 / KIB_PER_MIB),
            rss_max_mib: ss.iter().map(|s| s.rss_kib).max().unwrap_or(0) as f64 / KIB_PER_MIB,
            rss_slope_mib_per_min: pooled_slope(steady.iter().map(|s| {
                (
                    (s.epoch, s.pid),
                    s.t_secs / 60.0,
                    s.rss_kib as f64 / KIB_PER_MIB,
                )
            })),
            slope_span_secs: spans.values().map(|(a, b)| b - a).sum(),
            fds_max: ss.iter().map(|s| s.fds).max().unwrap_or(0),
            wal_max_bytes: ss.iter().map(|s| s.wal_bytes).max().unwrap_or(0),
            snap_max_bytes: ss.iter().map(|s| s.snap_bytes).max().unwrap_or(0),
            db_max_bytes: ss.iter().map(|s| s.db_bytes).max().unwrap_or(0),
            disk_max_bytes: ss
                .iter()
                .map(|s| s.wal_bytes + s.snap_bytes + s.db_bytes)
                .max()
                .unwrap_or(0),
        });
    }
    let violations = check_bounds(&members, bounds);
    ResourceReport {
        warmup_secs: cut,
        members,
        violations,
    }
}

fn check_bounds(members: &[MemberResources], bounds: &ResourceBounds) -> Vec<String> {
    let mut out = Vec::new();
    for m in members {
        if let (Some(max), Some(slope)) =
            (bounds.max_rss_growth_mib_per_min, m.rss_slope_mib_per_min)
            && slope > max
        {
            out.push(format!(
                "{}: RSS grows {slope:.3} MiB/min after the warm-up, bound {max} MiB/min",
                m.member
            ));
        }
        if let Some(max) = bounds.max_fds
            && m.fds_max > max
        {
            out.push(format!("{}: {} open fds, bound {max}", m.member, m.fds_max));
        }
        if let Some(max) = bounds.max_disk_mib {
            let mib = m.disk_max_bytes as f64 / BYTES_PER_MIB;
            if mib > max {
                out.push(format!(
                    "{}: {mib:.1} MiB on disk (wal + snap + db), bound {max} MiB",
                    m.member
                ));
            }
        }
    }
    out
}

/// The report's `resources` section (one line per member, then the exceeded bounds).
pub fn render(report: &ResourceReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "resources (warm-up {:.0}s; RSS MiB, slope MiB/min over same-process samples after it):",
        report.warmup_secs
    );
    let mib = |b: u64| b as f64 / BYTES_PER_MIB;
    for m in &report.members {
        let _ = writeln!(
            out,
            "  {} samples {} processes {} rss warm-up {} max {:.1} slope {} (over {:.0}s) fds max {} \
             wal max {:.1} MiB snap max {:.2} MiB db max {:.1} MiB disk max {:.1} MiB",
            m.member,
            m.samples,
            m.processes,
            m.rss_warmup_mib
                .map_or_else(|| "-".to_string(), |r| format!("{r:.1}")),
            m.rss_max_mib,
            m.rss_slope_mib_per_min
                .map_or_else(|| "-".to_string(), |s| format!("{s:+.3}")),
            m.slope_span_secs,
            m.fds_max,
            mib(m.wal_max_bytes),
            mib(m.snap_max_bytes),
            mib(m.db_max_bytes),
            mib(m.disk_max_bytes),
        );
    }
    for v in &report.violations {
        let _ = writeln!(out, "resource bound exceeded: {v}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(member: &str, epoch: u32, t_secs: f64, rss_mib: u64, fds: u64) -> Sample {
        Sample {
            t_secs,
            member: member.into(),
            epoch,
            pid: 1000 + epoch,
            rss_kib: rss_mib * 1024,
            fds,
            wal_bytes: 1 << 20,
            snap_bytes: 0,
            db_bytes: 2 << 20,
        }
    }

    #[test]
    fn the_default_warm_up_is_five_minutes_or_a_sixth_of_the_run() {
        assert_eq!(
            default_warmup(Duration::from_secs(1800)),
            Duration::from_secs(300)
        );
        assert_eq!(
            default_warmup(Duration::from_secs(60)),
            Duration::from_secs(10)
        );
    }

    #[test]
    fn the_slope_of_a_line_is_its_gradient() {
        let pts = (0..5).map(|i| ((), f64::from(i), 3.0 + 2.0 * f64::from(i)));
        assert_eq!(pooled_slope(pts), Some(2.0));
        // One point, or all at one x: no slope.
        assert_eq!(pooled_slope([((), 1.0, 5.0)]), None);
        assert_eq!(pooled_slope([((), 1.0, 5.0), ((), 1.0, 9.0)]), None);
    }

    #[test]
    fn a_restart_is_not_read_as_a_drop() {
        // Process 1 grows 1 MiB/min from 100 MiB, process 2 restarts at 40 MiB and grows
        // 1 MiB/min: a plain fit over both would give a negative slope.
        let mut pts = Vec::new();
        for m in 0..5 {
            pts.push((1, f64::from(m), 100.0 + f64::from(m)));
            pts.push((2, f64::from(m + 5), 40.0 + f64::from(m)));
        }
        let slope = pooled_slope(pts).unwrap();
        assert!((slope - 1.0).abs() < 1e-12, "{slope}");
    }

    #[test]
    fn the_warm_up_is_cut_and_restarts_are_counted() {
        // m1: RSS climbs 50 -> 100 MiB in the first 60 s (warm-up), then one process stays
        // flat at 100 for 60 s, is killed, and the next one holds 80 MiB with a 0.5 MiB/min
        // creep over 4 min.
        let mut samples = Vec::new();
        for i in 0..6u32 {
            samples.push(sample(
                "m1",
                1,
                f64::from(i) * 10.0,
                50 + 10 * u64::from(i),
                20,
            ));
        }
        for i in 0..7 {
            samples.push(sample("m1", 1, 60.0 + f64::from(i) * 10.0, 100, 25));
        }
        for i in 0..5 {
            samples.push(sample("m1", 2, 140.0 + f64::from(i) * 60.0, 80, 30));
        }
        // The creep: +0.5 MiB per minute on the second process (KiB granularity).
        for (i, s) in samples.iter_mut().filter(|s| s.epoch == 2).enumerate() {
            s.rss_kib += 512 * i as u64;
        }
        samples.push(sample("m2", 1, 70.0, 90, 40));
        let r = summarise(
            &samples,
            Duration::from_secs(60),
            &ResourceBounds::default(),
        );
        assert_eq!(r.warmup_secs, 60.0);
        assert_eq!(r.members.len(), 2);
        let m1 = &r.members[0];
        assert_eq!(
            (m1.member.as_str(), m1.samples, m1.processes),
            ("m1", 18, 2)
        );
        assert_eq!(m1.rss_warmup_mib, Some(100.0));
        assert_eq!(m1.rss_max_mib, 100.0);
        // Pooled: process 1 is flat over 60 s (sxx = 0.0389 min²), process 2 grows 0.5 over
        // 4 min (sxx = 10 min², sxy = 5): 5 / 10.0389 MiB/min.
        let slope = m1.rss_slope_mib_per_min.unwrap();
        let sxx1: f64 = (0..7)
            .map(|i| (f64::from(i) / 6.0 - 0.5).powi(2))
            .sum::<f64>();
        assert!((slope - 5.0 / (10.0 + sxx1)).abs() < 1e-9, "{slope}");
        assert_eq!(m1.slope_span_secs, 60.0 + 240.0);
        assert_eq!(m1.fds_max, 30);
        assert_eq!(m1.disk_max_bytes, 3 << 20);
        let m2 = &r.members[1];
        assert_eq!((m2.samples, m2.processes), (1, 1));
        assert_eq!(m2.rss_warmup_mib, Some(90.0));
        assert_eq!(m2.rss_slope_mib_per_min, None);
        assert!(r.violations.is_empty());
    }

    #[test]
    fn exceeded_bounds_are_named() {
        let samples: Vec<Sample> = (0..10u32)
            .map(|i| sample("m3", 1, f64::from(i) * 60.0, 100 + 2 * u64::from(i), 500))
            .collect();
        let bounds = ResourceBounds {
            max_rss_growth_mib_per_min: Some(1.0),
            max_fds: Some(400),
            max_disk_mib: Some(2.5),
        };
        let r = summarise(&samples, Duration::ZERO, &bounds);
        let slope = r.members[0].rss_slope_mib_per_min.unwrap();
        assert!((slope - 2.0).abs() < 1e-9, "{slope}");
        assert_eq!(
            r.violations,
            vec![
                "m3: RSS grows 2.000 MiB/min after the warm-up, bound 1 MiB/min".to_string(),
                "m3: 500 open fds, bound 400".to_string(),
                "m3: 3.0 MiB on disk (wal + snap + db), bound 2.5 MiB".to_string(),
            ]
        );
        let loose = ResourceBounds {
            max_rss_growth_mib_per_min: Some(2.5),
            max_fds: Some(500),
            max_disk_mib: Some(3.0),
        };
        assert!(
            summarise(&samples, Duration::ZERO, &loose)
                .violations
                .is_empty()
        );
    }
}
