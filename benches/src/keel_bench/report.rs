//! Results of a run: latency histograms (hdrhistogram, µs), error counts by kind, and the
//! text and JSON reports (percentiles p50/p90/p95/p99/p99.9/max as etcd's `benchmark` and
//! the share of requests slower than 30 ms); `--hdr-out` writes the histogram as
//! HdrHistogram's percentile distribution text ([`percentile_distribution`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Requests slower than this count as slow in [`Summary::over_30ms_share`].
pub const SLOW: Duration = Duration::from_millis(30);

/// Latencies and errors of one worker or of a whole run.
#[derive(Debug, Clone)]
pub struct Recorder {
    /// Latency of successful requests, µs (1 µs .. 1 h, 3 significant digits).
    pub latency_us: Histogram<u64>,
    /// Failed requests by [`keel_client::ClientError::kind`].
    pub errors: BTreeMap<String, u64>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            latency_us: Histogram::new_with_bounds(1, 3_600_000_000, 3)
                .expect("valid histogram bounds"),
            errors: BTreeMap::new(),
        }
    }
}

impl Recorder {
    /// Records a successful request of `latency` (clamped to the histogram's range).
    pub fn ok(&mut self, latency: Duration) {
        let us = (latency.as_micros() as u64).clamp(1, self.latency_us.high());
        self.latency_us.saturating_record(us);
    }

    /// Records a failed request of error kind `kind`.
    pub fn error(&mut self, kind: String) {
        *self.errors.entry(kind).or_default() += 1;
    }

    /// Adds another recorder's counts.
    pub fn merge(&mut self, other: &Recorder) {
        // Both have the same bounds, so adding cannot fail.
        let _ = self.latency_us.add(&other.latency_us);
        for (k, n) in &other.errors {
            *self.errors.entry(k.clone()).or_default() += n;
        }
    }

    /// Successful requests.
    pub fn ok_count(&self) -> u64 {
        self.latency_us.len()
    }
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Latency {
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    pub p99_9: f64,
    pub max: f64,
}

impl Latency {
    /// Percentiles of a µs histogram, in ms.
    pub fn of(h: &Histogram<u64>) -> Latency {
        let ms = |us: u64| us as f64 / 1000.0;
        Latency {
            mean: h.mean() / 1000.0,
            p50: ms(h.value_at_quantile(0.50)),
            p90: ms(h.value_at_quantile(0.90)),
            p95: ms(h.value_at_quantile(0.95)),
            p99: ms(h.value_at_quantile(0.99)),
            p99_9: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
        }
    }
}

/// The report of one run (`--json` prints it as is).
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Workload name (`put`, `range`, ...).
    pub workload: String,
    pub endpoints: Vec<String>,
    pub clients: usize,
    pub conns: usize,
    /// Intended request rate (open loop), or `None` for a closed loop.
    pub rate: Option<f64>,
    /// Successful requests.
    pub ok: u64,
    /// Failed requests by error kind.
    pub errors: BTreeMap<String, u64>,
    /// Wall time of the run, seconds.
    pub elapsed_s: f64,
    /// Successful requests per second.
    pub requests_per_s: f64,
    /// Request latency, ms (from the intended send time when open loop).
    pub latency_ms: Latency,
    /// Share (0..1) of successful requests slower than 30 ms.
    pub over_30ms_share: f64,
    /// The watch workload: events received by all watchers and the latency from sending a
    /// put to each watcher receiving its event, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events: Option<EventSummary>,
}

/// Event delivery of the watch workload.
#[derive(Debug, Clone, Serialize)]
pub struct EventSummary {
    pub watchers: usize,
    /// Events received (ideally puts × watchers).
    pub received: u64,
    pub latency_ms: Latency,
    pub over_30ms_share: f64,
}

/// Share of the histogram's values above [`SLOW`].
pub fn over_slow_share(h: &Histogram<u64>) -> f64 {
    if h.is_empty() {
        return 0.0;
    }
    let slow = SLOW.as_micros() as u64;
    let at_most = h.count_between(0, slow);
    (h.len() - at_most) as f64 / h.len() as f64
}

impl Summary {
    /// The text report (etcd `benchmark` style).
    pub fn text(&self) -> String {
        let mut s = String::new();
        let errors: u64 = self.errors.values().sum();
        s += &format!(
            "Summary ({}, {} clients, {} conns over {} endpoints{}):\n",
            self.workload,
            self.clients,
            self.conns,
            self.endpoints.len(),
            self.rate
                .map(|r| format!(", open loop at {r} req/s"))
                .unwrap_or_default()
        );
        s += &format!("  Total:\t{:.4} s.\n", self.elapsed_s);
        s += &format!("  Requests/sec:\t{:.1}\n", self.requests_per_s);
        s += &format!("  OK:\t{}\n  Errors:\t{}\n", self.ok, errors);
        s += &latency_text("Latency", &self.latency_ms, self.over_30ms_share);
        if let Some(e) = &self.events {
            s += &format!(
                "\nWatch events: {} watchers, {} received\n",
                e.watchers, e.received
            );
            s += &latency_text("Event latency", &e.latency_ms, e.over_30ms_share);
        }
        if !self.errors.is_empty() {
            s += "\nError distribution:\n";
            for (k, n) in &self.errors {
                s += &format!("  [{n}]\t{k}\n");
            }
        }
        s
    }
}

fn latency_text(title: &str, l: &Latency, over: f64) -> String {
    format!(
        "\n{title} (ms):\n  mean\t{:.3}\n  p50\t{:.3}\n  p90\t{:.3}\n  p95\t{:.3}\n  p99\t{:.3}\n  p99.9\t{:.3}\n  max\t{:.3}\n  > 30 ms\t{:.3} %\n",
        l.mean,
        l.p50,
        l.p90,
        l.p95,
        l.p99,
        l.p99_9,
        l.max,
        over * 100.0
    )
}

/// Percentile steps per half distance to 100 % of [`percentile_distribution`] (HdrHistogram's
/// default: 0, 10, ..., 50, 55, ..., 75, 77.5, ... %).
const TICKS_PER_HALF_DISTANCE: u32 = 5;

/// `h` as HdrHistogram's percentile distribution text, the format of Java's
/// `Histogram.outputPercentileDistribution` (`.hgrm`, read by HdrHistogram's plotter and by
/// `scripts/bench-chart.py`): a header line `Value Percentile TotalCount 1/(1-Percentile)`, one
/// row per percentile step ([`TICKS_PER_HALF_DISTANCE`]) with the value (here µs, 3 decimals),
/// the percentile level as a fraction, the count of values at or below the value and
/// 1/(1-percentile), then `#[Mean ...]`, `#[Max ..., Total count ...]` and `#[Buckets ...]`.
pub fn percentile_distribution(h: &Histogram<u64>) -> String {
    let mut s = format!(
        "{:>12} {:>14} {:>10} {:>14}\n\n",
        "Value", "Percentile", "TotalCount", "1/(1-Percentile)"
    );
    let mut total = 0u64;
    for v in h.iter_quantiles(TICKS_PER_HALF_DISTANCE) {
        total += v.count_since_last_iteration();
        let level = v.quantile_iterated_to();
        let value = v.value_iterated_to() as f64;
        if level < 1.0 {
            let _ = writeln!(
                s,
                "{value:12.3} {level:2.12} {total:10} {:14.2}",
                1.0 / (1.0 - level)
            );
        } else {
            let _ = writeln!(s, "{value:12.3} {level:2.12} {total:10}");
        }
    }
    // HdrHistogram's sub-bucket count: the power of two covering 2 * 10^sigfig.
    let sub_buckets = (2 * 10u64.pow(u32::from(h.sigfig()))).next_power_of_two();
    let _ = writeln!(
        s,
        "#[Mean    = {:12.3}, StdDeviation   = {:12.3}]",
        h.mean(),
        h.stdev()
    );
    let _ = writeln!(
        s,
        "#[Max     = {:12.3}, Total count    = {:12}]",
        h.max() as f64,
        h.len()
    );
    let _ = writeln!(
        s,
        "#[Buckets = {:12}, SubBuckets     = {:12}]",
        h.buckets(),
        sub_buckets
    );
    s
}

/// Writes [`percentile_distribution`] of `h` to `path` (`--hdr-out`).
pub fn write_percentile_distribution(path: &Path, h: &Histogram<u64>) -> std::io::Result<()> {
    std::fs::write(path, percentile_distribution(h))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A percentile distribution read back from its text, as a plotting step reads it.
    #[derive(Debug, Clone, PartialEq)]
    struct PercentileRows {
        /// `(value, percentile level 0..=1, total count at or below the value)` per row.
        rows: Vec<(f64, f64, u64)>,
        /// `Total count` of the footer.
        total_count: u64,
        /// `Max` of the footer.
        max: f64,
        /// `Mean` of the footer.
        mean: f64,
    }

    impl PercentileRows {
        /// Parses the text of [`percentile_distribution`] (or of HdrHistogram's Java tools).
        fn parse(text: &str) -> Result<PercentileRows, String> {
            let mut rows = Vec::new();
            let (mut total_count, mut max, mut mean) = (None, None, None);
            for line in text.lines().map(str::trim) {
                if line.is_empty() || line.starts_with("Value") {
                    continue;
                }
                if let Some(footer) = line.strip_prefix("#[") {
                    for field in footer.trim_end_matches(']').split(',') {
                        let (name, value) = field.split_once('=').ok_or(line)?;
                        let value = value.trim();
                        match name.trim() {
                            "Mean" => mean = value.parse::<f64>().ok(),
                            "Max" => max = value.parse::<f64>().ok(),
                            "Total count" => total_count = value.parse::<u64>().ok(),
                            _ => {}
                        }
                    }
                    continue;
                }
                let cols: Vec<&str> = line.split_whitespace().collect();
                let bad = || format!("bad row {line:?}");
                if cols.len() < 3 {
                    return Err(bad());
                }
                rows.push((
                    cols[0].parse().map_err(|_| bad())?,
                    cols[1].parse().map_err(|_| bad())?,
                    cols[2].parse().map_err(|_| bad())?,
                ));
            }
            Ok(PercentileRows {
                rows,
                total_count: total_count.ok_or("no Total count")?,
                max: max.ok_or("no Max")?,
                mean: mean.ok_or("no Mean")?,
            })
        }

        /// The value at quantile `q` read as hdrhistogram's `value_at_quantile` finds it: the value
        /// of the first row whose total count reaches `ceil(q × count)`. Exact when that value's
        /// bucket has a row (always for the listed percentiles such as 0.5 and 0.9, and for few
        /// distinct values); otherwise the next row's value, at most one percentile step
        /// ([`TICKS_PER_HALF_DISTANCE`]) further.
        fn value_at_quantile(&self, q: f64) -> Option<f64> {
            let want = ((q.min(1.0) * self.total_count as f64).ceil() as u64).max(1);
            self.rows.iter().find(|r| r.2 >= want).map(|r| r.0)
        }
    }

    #[test]
    fn percentiles_and_slow_share() {
        let mut r = Recorder::default();
        for ms in 1..=100 {
            r.ok(Duration::from_millis(ms));
        }
        r.error("no_leader".into());
        let mut total = Recorder::default();
        total.merge(&r);
        total.merge(&r);
        assert_eq!(total.ok_count(), 200);
        assert_eq!(total.errors["no_leader"], 2);
        let l = Latency::of(&total.latency_us);
        assert!((l.p50 - 50.0).abs() < 0.1, "{l:?}");
        assert!((l.p99 - 99.0).abs() < 0.1, "{l:?}");
        assert!((l.max - 100.0).abs() < 0.1, "{l:?}");
        // 31..=100 ms are slow: 70 of 100.
        assert!((over_slow_share(&total.latency_us) - 0.70).abs() < 0.001);
        assert_eq!(over_slow_share(&Recorder::default().latency_us), 0.0);
    }

    #[test]
    fn hdr_out_file_reads_back_the_histogram() {
        // 1,000 latencies: 500 × 1 ms, 490 × 2 ms, 9 × 10 ms, 1 × 50 ms.
        let mut r = Recorder::default();
        for (ms, n) in [(1, 500), (2, 490), (10, 9), (50, 1)] {
            for _ in 0..n {
                r.ok(Duration::from_millis(ms));
            }
        }
        let h = &r.latency_us;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("put.hgrm");
        write_percentile_distribution(&path, h).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.starts_with("       Value     Percentile TotalCount 1/(1-Percentile)\n\n"),
            "{text}"
        );
        let file = PercentileRows::parse(&text).unwrap();
        assert_eq!(file.total_count, 1000);
        assert_eq!(file.rows.last().map(|r| (r.1, r.2)), Some((1.0, 1000)));
        assert_eq!(file.max, 50_015.0, "max µs, highest equivalent of 50 ms");
        assert_eq!(file.max, h.max() as f64);
        assert!(
            (file.mean - h.mean()).abs() < 0.001,
            "{} vs {}",
            file.mean,
            h.mean()
        );
        for (q, us) in [(0.5, 1_000), (0.99, 2_000), (0.999, 10_007), (1.0, 50_015)] {
            assert_eq!(h.value_at_quantile(q), us, "in memory, q {q}");
            assert_eq!(
                file.value_at_quantile(q),
                Some(us as f64),
                "from the file, q {q}"
            );
        }
        // 1 µs .. 1 h at 3 significant digits: 2,048 sub-buckets, 22 buckets (as Java's).
        assert!(
            text.ends_with("#[Buckets =           22, SubBuckets     =         2048]\n"),
            "{text}"
        );

        // A dense run: 1..=100,000 µs once each. Percentiles that are rows (p50, p90, max)
        // read back exactly; p99 and p99.9 fall between rows and read as the next row's value
        // (a bucket of 64 µs further here), within 0.2 %.
        let mut r = Recorder::default();
        for us in 1..=100_000 {
            r.ok(Duration::from_micros(us));
        }
        let h = &r.latency_us;
        let file = PercentileRows::parse(&percentile_distribution(h)).unwrap();
        assert_eq!(file.total_count, 100_000);
        for q in [0.5, 0.9, 1.0] {
            let mem = h.value_at_quantile(q) as f64;
            assert_eq!(file.value_at_quantile(q), Some(mem), "q {q}");
        }
        for q in [0.99, 0.999] {
            let mem = h.value_at_quantile(q) as f64;
            let from_file = file.value_at_quantile(q).unwrap();
            assert!(
                mem <= from_file && from_file <= mem * 1.002,
                "q {q}: {from_file} from the file, {mem} in memory"
            );
        }
        // An empty run still writes a readable file.
        let empty =
            PercentileRows::parse(&percentile_distribution(&Recorder::default().latency_us))
                .unwrap();
        assert_eq!((empty.rows.len(), empty.total_count), (0, 0));
    }
}
