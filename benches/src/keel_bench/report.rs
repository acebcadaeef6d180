//! Results of a run: latency histograms (hdrhistogram, µs), error counts by kind, and the
//! text and JSON reports (percentiles p50/p90/p95/p99/p99.9/max as etcd's `benchmark` and
//! the share of requests slower than 30 ms).

use std::collections::BTreeMap;
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
