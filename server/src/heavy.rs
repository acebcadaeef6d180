//! Long synchronous work on the async runtime: a range over many keys, a range delete, a
//! compaction, a lease revoke.
//!
//! Tokio does not preempt a task: while one runs synchronous work, every other task queued
//! on its worker thread waits, raft heartbeats and the election watchdog included. A member
//! with one worker thread (members of a local cluster, docs/operations.md "Worker threads")
//! that deleted 200,000 keys in one request held its only worker for seconds; its followers,
//! stalled alike by their own apply, heard no leader meanwhile and started elections once
//! they ran again (5 leader changes; none with two workers). [`run`] hands the worker's other
//! tasks to another thread for the duration (`tokio::task::block_in_place`), so they keep
//! running.
//!
//! Costs a thread hand-off (tens of µs): for work known to be long, never per request.

use tokio::runtime::{Handle, RuntimeFlavor};

/// Range results above this many keys are read through [`run`] (at ≥ 1 µs per key, a
/// millisecond or more of work, against a hand-off of tens of µs).
pub const LONG_RANGE_KEYS: usize = 1_000;

/// Runs `f`, which may take long, without holding up the other tasks of this worker thread.
/// On a multi-thread runtime through `block_in_place`; elsewhere (a current-thread runtime
/// in tests, or outside any runtime) `f` just runs.
pub fn run<T>(f: impl FnOnce() -> T) -> T {
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// [`run`] when `long`, else `f` right here (no hand-off): for work whose length is known
/// beforehand (a range's key count, an entry's kind).
pub fn run_if<T>(long: bool, f: impl FnOnce() -> T) -> T {
    if long { run(f) } else { f() }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    use super::run;

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn other_tasks_of_a_single_worker_run_while_long_work_runs() {
        // Both tasks run on the runtime's only worker (the test body itself does not: it
        // runs in `block_on` on the test thread).
        let ticked = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&ticked);
        let long = tokio::spawn(async move {
            // Queued behind this task on the same worker: it runs only if the long work
            // gives the worker up.
            let ticker = tokio::spawn(async move { flag.store(true, Ordering::SeqCst) });
            let saw_tick = run(|| {
                let deadline = Instant::now() + Duration::from_secs(10);
                while Instant::now() < deadline {
                    if ticked.load(Ordering::SeqCst) {
                        return true;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                false
            });
            ticker.await.unwrap();
            saw_tick
        });
        assert!(
            long.await.unwrap(),
            "the spawned task waited for the long work"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn on_a_current_thread_runtime_the_work_just_runs() {
        assert_eq!(run(|| 7), 7);
    }

    #[test]
    fn outside_a_runtime_the_work_just_runs() {
        assert_eq!(run(|| "done"), "done");
    }
}
