//! Round batching: many concurrent callers share one execution of an expensive operation
//! (a read-index quorum round).
//!
//! Rule that keeps batched read indexes linearizable (Raft thesis §6.4): a caller joins the
//! **next** round that starts after it arrived, never a round already in flight, because a
//! round that began earlier may have confirmed leadership and read the commit index before
//! the caller's read began.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::error::EtcdError;

type Waiter = oneshot::Sender<Result<u64, EtcdError>>;

/// Shares rounds of one operation among concurrent callers. See the module docs.
#[derive(Default)]
pub struct Batcher {
    state: Mutex<State>,
    rounds: AtomicU64,
}

#[derive(Default)]
struct State {
    waiting: Vec<Waiter>,
    running: bool,
}

impl Batcher {
    /// Waits for the result of the next round of `round`. At most one round runs at a time,
    /// on a task of its own, so a caller that gives up (a cancelled request) never stalls the
    /// others. Every caller waiting when a round starts gets that round's result.
    ///
    /// Errors: whatever the round returns; `Stopped` if the runtime drops the round task.
    pub async fn join<F, Fut>(self: &Arc<Self>, round: F) -> Result<u64, EtcdError>
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<u64, EtcdError>> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut s = self.state.lock().expect("batch lock");
            s.waiting.push(tx);
            !std::mem::replace(&mut s.running, true)
        };
        if start {
            let me = self.clone();
            tokio::spawn(async move { me.run(round).await });
        }
        rx.await.unwrap_or(Err(EtcdError::Stopped))
    }

    /// How many rounds ran so far.
    pub fn rounds(&self) -> u64 {
        self.rounds.load(Ordering::Relaxed)
    }

    async fn run<F, Fut>(&self, round: F)
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<u64, EtcdError>>,
    {
        loop {
            let batch = {
                let mut s = self.state.lock().expect("batch lock");
                if s.waiting.is_empty() {
                    s.running = false;
                    return;
                }
                std::mem::take(&mut s.waiting)
            };
            self.rounds.fetch_add(1, Ordering::Relaxed);
            let result = round().await;
            for w in batch {
                let _ = w.send(result.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_callers_share_rounds() {
        let batcher = Arc::new(Batcher::default());
        let counter = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for _ in 0..200 {
            let (b, c) = (batcher.clone(), counter.clone());
            tasks.push(tokio::spawn(async move {
                b.join(move || {
                    let c = c.clone();
                    async move {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Ok(c.fetch_add(1, Ordering::SeqCst) + 1)
                    }
                })
                .await
            }));
        }
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.unwrap().unwrap());
        }
        // All 200 callers were queued within far less than one round (50 ms): one round for
        // the first caller, one for everybody who queued behind it, maybe a third on a slow box.
        assert!(batcher.rounds() <= 3, "rounds = {}", batcher.rounds());
        assert_eq!(counter.load(Ordering::SeqCst), batcher.rounds());
        assert!(results.iter().all(|r| *r >= 1 && *r <= batcher.rounds()));
    }

    #[tokio::test]
    async fn a_caller_never_gets_a_round_that_started_before_it() {
        let batcher = Arc::new(Batcher::default());
        let started = Arc::new(AtomicU64::new(0));
        let round = {
            let started = started.clone();
            move || {
                let started = started.clone();
                async move {
                    let n = started.fetch_add(1, Ordering::SeqCst) + 1;
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    Ok(n)
                }
            }
        };
        let first = {
            let (b, r) = (batcher.clone(), round.clone());
            tokio::spawn(async move { b.join(r).await })
        };
        // Wait until round 1 is running, then join: we must get round 2.
        while started.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let second = batcher.join(round).await.unwrap();
        assert_eq!(first.await.unwrap().unwrap(), 1);
        assert_eq!(second, 2);
    }

    #[tokio::test]
    async fn errors_reach_every_caller_of_the_round() {
        let batcher = Arc::new(Batcher::default());
        let r = batcher.join(|| async { Err(EtcdError::NoLeader) }).await;
        assert_eq!(r, Err(EtcdError::NoLeader));
        // The batcher is idle again and runs the next round.
        assert_eq!(batcher.join(|| async { Ok(5) }).await, Ok(5));
        assert_eq!(batcher.rounds(), 2);
    }
}
