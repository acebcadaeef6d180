//! Waiting until this member's state machine has applied a log index: the second half of a
//! linearizable read (after ReadIndex) and of a forwarded write (after the leader committed it).

use std::time::Duration;

use super::types::Raft;
use crate::error::EtcdError;

/// Waits until `raft` has applied log entry `index`, for at most `timeout`; `why` names the
/// wait in openraft's logs.
///
/// Errors: `Timeout` when `timeout` passes first, `Stopped` when raft shuts down.
pub async fn wait_applied(
    raft: &Raft,
    index: u64,
    timeout: Duration,
    why: &str,
) -> Result<(), EtcdError> {
    raft.wait(Some(timeout))
        .applied_index_at_least(Some(index), why)
        .await
        .map(|_| ())
        .map_err(|e| match e {
            openraft::metrics::WaitError::Timeout(..) => EtcdError::Timeout,
            openraft::metrics::WaitError::ShuttingDown => EtcdError::Stopped,
        })
}
