//! Drives workers: `--clients` concurrent request loops until `--total` requests were sent or
//! `--duration` passed, closed loop or open loop (`--rate`).
//!
//! Open loop: request number `k` (over all workers) is due at `start + k / rate`. A worker
//! takes the next number, sleeps until it is due, sends, and records the latency from the due
//! time, not from when it got around to sending. When the server stalls, the requests that
//! should have been sent meanwhile show the stall in their latency instead of silently not
//! being sent (the "coordinated omission" of closed-loop tools, Gil Tene / wrk2).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use keel_client::ClientError;
use tokio::time::Instant;

use super::report::Recorder;

/// When a run ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// After this many requests (successful or not).
    Total(u64),
    /// After this much time (no request starts later).
    Duration(Duration),
}

/// How to drive the workers.
#[derive(Debug, Clone)]
pub struct Plan {
    pub stop: Stop,
    /// Open-loop request rate over all workers, requests/s; `None` = closed loop.
    pub rate: Option<f64>,
    /// Draw a progress bar on stderr.
    pub progress: bool,
}

/// One request loop: sends one request per call.
pub trait Worker: Send + 'static {
    /// Sends one request and waits for its answer.
    fn request(&mut self) -> impl Future<Output = Result<(), ClientError>> + Send;
}

/// Result of a run.
pub struct Outcome {
    pub recorder: Recorder,
    /// From the start to the last answer.
    pub elapsed: Duration,
}

/// Runs `workers` (one task each) per `plan` and merges their recordings.
pub async fn run<W: Worker>(plan: &Plan, workers: Vec<W>) -> Outcome {
    let start = Instant::now();
    let issued = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let bar = progress_bar(plan);
    let ticker = {
        let (bar, done, stop) = (bar.clone(), done.clone(), plan.stop);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            loop {
                tick.tick().await;
                match stop {
                    Stop::Total(_) => bar.set_position(done.load(Ordering::Relaxed)),
                    Stop::Duration(_) => {
                        bar.set_position(start.elapsed().as_millis() as u64);
                        bar.set_message(format!("{} requests", done.load(Ordering::Relaxed)));
                    }
                }
            }
        })
    };
    let tasks: Vec<_> = workers
        .into_iter()
        .map(|mut w| {
            let (issued, done, plan) = (issued.clone(), done.clone(), plan.clone());
            tokio::spawn(async move {
                let mut rec = Recorder::default();
                while let Some(due) = next_due(&plan, start, &issued) {
                    if plan.rate.is_some() {
                        tokio::time::sleep_until(due).await;
                    }
                    let result = w.request().await;
                    match result {
                        Ok(()) => rec.ok(due.elapsed()),
                        Err(e) => rec.error(e.kind()),
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
                rec
            })
        })
        .collect();
    let mut recorder = Recorder::default();
    for t in tasks {
        match t.await {
            Ok(r) => recorder.merge(&r),
            Err(e) => recorder.error(format!("worker_panicked: {e}")),
        }
    }
    let elapsed = start.elapsed();
    ticker.abort();
    bar.finish_and_clear();
    Outcome { recorder, elapsed }
}

/// The due time of the next request, or `None` when the run is over.
fn next_due(plan: &Plan, start: Instant, issued: &AtomicU64) -> Option<Instant> {
    let k = issued.fetch_add(1, Ordering::Relaxed);
    if let Stop::Total(n) = plan.stop
        && k >= n
    {
        return None;
    }
    let due = match plan.rate {
        Some(rate) => start + Duration::from_secs_f64(k as f64 / rate),
        None => Instant::now(),
    };
    if let Stop::Duration(d) = plan.stop
        && due >= start + d
    {
        return None;
    }
    Some(due)
}

fn progress_bar(plan: &Plan) -> ProgressBar {
    if !plan.progress {
        return ProgressBar::hidden();
    }
    let (len, template) = match plan.stop {
        Stop::Total(n) => (n, "{bar:40} {pos}/{len} requests {elapsed}"),
        Stop::Duration(d) => (d.as_millis() as u64, "{bar:40} {elapsed} {msg}"),
    };
    let bar = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Sleeper {
        every: u32,
        n: u32,
        stall: Duration,
    }

    impl Worker for Sleeper {
        async fn request(&mut self) -> Result<(), ClientError> {
            self.n += 1;
            if self.n.is_multiple_of(self.every) {
                tokio::time::sleep(self.stall).await;
                return Err(ClientError::DeadlineExceeded {
                    message: "stalled".into(),
                });
            }
            Ok(())
        }
    }

    #[tokio::test]
    async fn total_counts_every_request_once() {
        let plan = Plan {
            stop: Stop::Total(100),
            rate: None,
            progress: false,
        };
        let workers = (0..4)
            .map(|_| Sleeper {
                every: 10,
                n: 0,
                stall: Duration::from_millis(1),
            })
            .collect();
        let out = run(&plan, workers).await;
        let errors: u64 = out.recorder.errors.values().sum();
        assert_eq!(out.recorder.ok_count() + errors, 100);
        assert_eq!(out.recorder.errors["deadline_exceeded"], errors);
    }

    #[tokio::test]
    async fn open_loop_charges_a_stall_to_the_requests_due_during_it() {
        // One worker at 200 req/s; every 5th request stalls 100 ms (and fails). The requests
        // due during a stall are sent late, and their latency counts from when they were due.
        let plan = Plan {
            stop: Stop::Total(20),
            rate: Some(200.0),
            progress: false,
        };
        let out = run(
            &plan,
            vec![Sleeper {
                every: 5,
                n: 0,
                stall: Duration::from_millis(100),
            }],
        )
        .await;
        let h = &out.recorder.latency_us;
        assert_eq!(out.recorder.ok_count(), 16);
        // Request 5 (due at 20 ms) stalls until 120 ms; request 6, due at 25 ms, is sent
        // then: its latency is at least 95 ms although the server answered it at once.
        assert!(h.max() >= 95_000, "max {} µs", h.max());
        assert!(
            out.elapsed >= Duration::from_millis(400),
            "four stalls of 100 ms"
        );
    }

    #[tokio::test]
    async fn duration_stops_the_run() {
        let plan = Plan {
            stop: Stop::Duration(Duration::from_millis(100)),
            rate: Some(1000.0),
            progress: false,
        };
        let out = run(
            &plan,
            vec![Sleeper {
                every: u32::MAX,
                n: 0,
                stall: Duration::ZERO,
            }],
        )
        .await;
        assert_eq!(out.recorder.ok_count(), 100, "due at 0, 1, ..., 99 ms");
    }
}
