//! Group-commit throughput (ignored; run in release):
//!
//! `cargo test --release -p keel-server wal::tests::bench -- --ignored --nocapture`
//!
//! N appender threads (default 64) each append one 300-byte entry, wait until it is durable,
//! and repeat, for a fixed time (default 5 s). Reports appends/s, entries per fdatasync, the
//! mean fdatasync time and append-to-durable latency percentiles. Environment overrides:
//! `WAL_BENCH_THREADS`, `WAL_BENCH_SECS`, `WAL_BENCH_DIR` (default: the system temp dir).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::wal::{Wal, WalOptions};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Outcome {
    appends: u64,
    elapsed: Duration,
    latencies_us: Vec<u64>,
}

fn run(wal: &Arc<Wal>, threads: usize, secs: f64, record: usize) -> Outcome {
    // Raft appends in log order; the bench hands out indexes under a mutex held across the
    // (non-blocking) append, so each thread's entry continues the log.
    let next = Arc::new(Mutex::new(wal.last_index().map_or(1, |l| l + 1)));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (wal, next, stop) = (Arc::clone(wal), Arc::clone(&next), Arc::clone(&stop));
            std::thread::spawn(move || {
                let payload = vec![t as u8; record];
                let mut latencies = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let began = Instant::now();
                    let lsn = {
                        let mut n = next.lock().unwrap();
                        let lsn = wal.append(&[(*n, &payload)]).expect("append");
                        *n += 1;
                        lsn
                    };
                    wal.wait_durable(lsn).expect("durable");
                    latencies.push(began.elapsed().as_micros() as u64);
                }
                latencies
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    let mut latencies_us: Vec<u64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let elapsed = start.elapsed();
    latencies_us.sort_unstable();
    Outcome {
        appends: latencies_us.len() as u64,
        elapsed,
        latencies_us,
    }
}

fn report(label: &str, wal: &Wal, o: &Outcome) {
    let s = wal.stats();
    let pct = |p: f64| o.latencies_us[((o.latencies_us.len() - 1) as f64 * p) as usize];
    println!(
        "{label}: {} appends in {:.2} s = {:.0} appends/s; {} sync rounds, {} fdatasyncs ({:.0}/s), \
         {:.1} entries/fdatasync, mean fdatasync {:.0} us; latency p50 {} us p99 {} us max {} us",
        o.appends,
        o.elapsed.as_secs_f64(),
        o.appends as f64 / o.elapsed.as_secs_f64(),
        s.sync_rounds,
        s.fdatasyncs,
        s.fdatasyncs as f64 / o.elapsed.as_secs_f64(),
        s.entries as f64 / s.fdatasyncs.max(1) as f64,
        s.sync_time.as_micros() as f64 / s.sync_rounds.max(1) as f64,
        pct(0.5),
        pct(0.99),
        pct(1.0),
    );
}

#[test]
#[ignore = "throughput measurement; run in release with --ignored --nocapture"]
fn group_commit_throughput() {
    let threads = env_or("WAL_BENCH_THREADS", 64usize);
    let secs = env_or("WAL_BENCH_SECS", 5.0f64);
    let base = std::env::var("WAL_BENCH_DIR").map_or_else(|_| std::env::temp_dir(), Into::into);
    for (label, opts) in [
        ("preallocated (fallocate)", WalOptions::default()),
        (
            "not preallocated",
            WalOptions {
                preallocate: false,
                ..WalOptions::default()
            },
        ),
    ] {
        let dir = tempfile::tempdir_in(&base).unwrap();
        let wal = Arc::new(Wal::open(dir.path(), opts).unwrap());
        let outcome = run(&wal, threads, secs, 300);
        report(
            &format!("{threads} threads, 300 B, {label}"),
            &wal,
            &outcome,
        );
        assert!(outcome.appends > 0);
        assert_eq!(wal.last_index(), Some(outcome.appends));
    }
}
