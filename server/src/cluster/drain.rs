//! A stopping member's drain of the leader calls other members sent it
//! (`keelpb.Peer/LeaderCalls`, `api::peer_calls`).
//!
//! A leader that stops hands leadership over first (`transfer::hand_over_on_stop`). Writes
//! other members forwarded to it just before are in its log and commit under the new leader;
//! it learns their outcome, and answers them, only by hearing from the new leader as a
//! follower. So it stops in two steps: the drain begins (the call streams answer what they
//! run, refuse new calls with `etcdserver: not leader`, and end when nothing runs) while the
//! peer server keeps serving raft; once every call stream ended, or the drain's time is up,
//! the peer server stops too. Before, the peer listener closed as soon as the hand-over ended,
//! and such writes failed with `request timed out, possibly due to previous leader failure`.
//!
//! Invariant: a call stream counts as open from the moment it is served until its pump is
//! dropped, so [`CallDrain::wait_idle`] never returns while one may still answer a call.

use tokio::sync::watch;

/// The drain state of one member. See the module docs.
#[derive(Debug)]
pub struct CallDrain {
    stopping: watch::Sender<bool>,
    open: watch::Sender<usize>,
}

impl Default for CallDrain {
    fn default() -> CallDrain {
        CallDrain {
            stopping: watch::Sender::new(false),
            open: watch::Sender::new(0),
        }
    }
}

/// Counts one open call stream until dropped.
#[derive(Debug)]
pub struct OpenStream {
    open: watch::Sender<usize>,
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.open.send_modify(|n| *n -= 1);
    }
}

impl CallDrain {
    /// Starts the drain: every call stream answers what it runs and then ends.
    pub fn begin(&self) {
        self.stopping.send_replace(true);
    }

    /// `true` once the drain began.
    pub fn stopping(&self) -> watch::Receiver<bool> {
        self.stopping.subscribe()
    }

    /// Registers a call stream being served; it counts as open until the guard drops.
    pub fn open(&self) -> OpenStream {
        self.open.send_modify(|n| *n += 1);
        OpenStream {
            open: self.open.clone(),
        }
    }

    /// Call streams open now.
    pub fn open_streams(&self) -> usize {
        *self.open.borrow()
    }

    /// Waits until no call stream is open.
    pub async fn wait_idle(&self) {
        let mut rx = self.open.subscribe();
        let _ = rx.wait_for(|n| *n == 0).await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn the_drain_is_idle_once_every_stream_dropped() {
        let drain = CallDrain::default();
        let mut stopping = drain.stopping();
        assert!(!*stopping.borrow_and_update());
        let (a, b) = (drain.open(), drain.open());
        assert_eq!(drain.open_streams(), 2);
        drain.begin();
        assert!(*stopping.borrow_and_update());
        drop(a);
        let waited = tokio::time::timeout(Duration::from_millis(50), drain.wait_idle()).await;
        assert!(waited.is_err(), "a stream is still open");
        drop(b);
        tokio::time::timeout(Duration::from_secs(1), drain.wait_idle())
            .await
            .expect("idle once both dropped");
        assert_eq!(drain.open_streams(), 0);
    }
}
