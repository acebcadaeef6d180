//! Waiting until this member's state machine has applied a log index: the second half of a
//! linearizable read (after ReadIndex) and of a forwarded write (after the leader committed it).
//!
//! It watches openraft's metrics (`last_applied`, set once the state machine reported the
//! entry applied) directly rather than through openraft's `Wait`, which clones the whole
//! `RaftMetrics` and formats a message on every call: under 64-client linearizable reads
//! that was 7 % of the request tasks' CPU, for a wait that nearly always finds the index
//! applied already.

use std::time::Duration;

use super::types::Raft;
use crate::error::EtcdError;

/// Waits until `raft` has applied log entry `index`, for at most `timeout`; `why` names the
/// wait in the debug log of a timeout.
///
/// Errors: `Timeout` when `timeout` passes first, `Stopped` when raft shuts down.
pub async fn wait_applied(
    raft: &Raft,
    index: u64,
    timeout: Duration,
    why: &str,
) -> Result<(), EtcdError> {
    let mut metrics = raft.metrics();
    let applied = |m: &openraft::RaftMetrics<_, _>| m.last_applied.map_or(0, |l| l.index) >= index;
    // Checked before a timer is armed: the usual case costs one read of the watch.
    if applied(&metrics.borrow_and_update()) {
        return Ok(());
    }
    match tokio::time::timeout(timeout, metrics.wait_for(applied)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(_)) => Err(EtcdError::Stopped),
        Err(_) => {
            tracing::debug!(
                why,
                index,
                "raft: timed out waiting for the entry to be applied"
            );
            Err(EtcdError::Timeout)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use openraft::EntryPayload;

    use super::*;
    use crate::raft::types::MemberNode;
    use crate::raft::{LogStore, PeerNetwork};
    use crate::wal::{Wal, WalOptions};

    /// A lone voter that leads, on a real log and state machine.
    async fn lone_leader(dir: &std::path::Path) -> Raft {
        let wal = Arc::new(Wal::open(&dir.join("wal"), WalOptions::default()).unwrap());
        let (sm, _shared) = crate::raft::test_support::state_machine(dir);
        let config = Arc::new(openraft::Config::default().validate().unwrap());
        let raft = Raft::new(1, config, PeerNetwork::default(), LogStore::new(wal), sm)
            .await
            .unwrap();
        let node = MemberNode {
            name: "n1".into(),
            peer_urls: vec!["http://127.0.0.1:1".into()],
        };
        raft.initialize(BTreeMap::from([(1, node)])).await.unwrap();
        raft.wait(Some(Duration::from_secs(10)))
            .current_leader(1, "the lone voter leads")
            .await
            .unwrap();
        raft.wait(Some(Duration::from_secs(10)))
            .applied_index_at_least(Some(1), "the leader's blank entry is applied")
            .await
            .unwrap();
        raft
    }

    fn applied(raft: &Raft) -> u64 {
        raft.metrics().borrow().last_applied.map_or(0, |l| l.index)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waits_for_the_index_and_reports_timeouts_and_shutdown() {
        let dir = tempfile::tempdir().unwrap();
        let raft = lone_leader(dir.path()).await;
        let done = applied(&raft);
        assert!(done >= 1, "the leader applied its first entries");
        // Applied already: answers at once, even with no time to wait.
        wait_applied(&raft, done, Duration::ZERO, "test")
            .await
            .unwrap();
        // Nothing proposed: the next index does not come.
        let next = done + 1;
        let err = wait_applied(&raft, next, Duration::from_millis(200), "test").await;
        assert!(matches!(err, Err(EtcdError::Timeout)), "{err:?}");
        // A write makes it come while a waiter waits.
        let waiter = {
            let raft = raft.clone();
            tokio::spawn(
                async move { wait_applied(&raft, next, Duration::from_secs(10), "test").await },
            )
        };
        let EntryPayload::Normal(request) =
            crate::raft::test_support::put_entry(openraft::LogId::default(), 1).payload
        else {
            unreachable!("put_entry makes a normal entry")
        };
        let written = raft.client_write(request).await.unwrap();
        assert_eq!(written.log_id.index, next);
        waiter.await.unwrap().unwrap();
        assert!(applied(&raft) >= next);
        // A waiter of an index that never comes ends when raft stops.
        let waiter = {
            let raft = raft.clone();
            tokio::spawn(async move {
                wait_applied(&raft, next + 100, Duration::from_secs(30), "test").await
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        raft.shutdown().await.unwrap();
        let err = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(err, Err(EtcdError::Stopped)), "{err:?}");
    }
}
