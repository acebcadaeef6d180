//! Callbacks used by Storage API

use std::io;

use tokio::sync::mpsc;
use tokio::sync::oneshot;

use crate::async_runtime::AsyncOneshotSendExt;
use crate::core::notify::Notify;
use crate::raft_state::io_state::log_io_id::LogIOId;
use crate::type_config::alias::OneshotSenderOf;
use crate::LogId;
use crate::RaftTypeConfig;
use crate::StorageIOError;
use crate::Vote;

/// A oneshot callback for completion of log io operation.
pub struct LogFlushed<C>
where C: RaftTypeConfig
{
    log_io_id: LogIOId<C::NodeId>,
    tx: FlushedTx<C>,
}

/// Where a [`LogFlushed`] reports to.
///
/// Keel patch: `RaftCore` submits appends without waiting; their flush is reported to the
/// core as a [`Notify::LocalLogFlushed`], straight from the storage's callback, so the core
/// goes on (a leader replicates the entries at once) while the fsync runs.
enum FlushedTx<C>
where C: RaftTypeConfig
{
    /// Someone awaits the result (tests, `blocking_append`).
    Oneshot(OneshotSenderOf<C, Result<LogIOId<C::NodeId>, io::Error>>),
    /// An append of `RaftCore`: the core hears of the flush as a notification.
    Core {
        vote: Vote<C::NodeId>,
        last_log_id: LogId<C::NodeId>,
        seq: u64,
        tx: mpsc::UnboundedSender<Notify<C>>,
    },
}

impl<C> LogFlushed<C>
where C: RaftTypeConfig
{
    pub(crate) fn new(
        log_io_id: LogIOId<C::NodeId>,
        tx: OneshotSenderOf<C, Result<LogIOId<C::NodeId>, io::Error>>,
    ) -> Self {
        Self {
            log_io_id,
            tx: FlushedTx::Oneshot(tx),
        }
    }

    /// A callback for an append `RaftCore` submitted without waiting (sequence number `seq`,
    /// see `core::log_io`): its completion is sent to the core as [`Notify::LocalLogFlushed`]
    /// (Keel patch, see [`FlushedTx`]).
    pub(crate) fn to_core(
        vote: Vote<C::NodeId>,
        last_log_id: LogId<C::NodeId>,
        seq: u64,
        tx: mpsc::UnboundedSender<Notify<C>>,
    ) -> Self {
        Self {
            log_io_id: LogIOId::new(vote.clone(), Some(last_log_id.clone())),
            tx: FlushedTx::Core {
                vote,
                last_log_id,
                seq,
                tx,
            },
        }
    }

    /// Report log io completion event.
    ///
    /// It will be called when the log is successfully appended to the storage or an error occurs.
    pub fn log_io_completed(self, result: Result<(), io::Error>) {
        if let Err(e) = &result {
            tracing::error!("LogFlush error: {}, while flushing upto {}", e, self.log_io_id);
        }
        let sent = match self.tx {
            FlushedTx::Oneshot(tx) => tx.send(result.map(|_| self.log_io_id)).map_err(|e| format!("{:?}", e)),
            FlushedTx::Core {
                vote,
                last_log_id,
                seq,
                tx,
            } => tx
                .send(Notify::LocalLogFlushed {
                    vote,
                    last_log_id,
                    seq,
                    result,
                })
                .map_err(|_| "RaftCore stopped".to_string()),
        };

        if let Err(e) = sent {
            tracing::error!("failed to send log io completion event: {}", e);
        }
    }
}

/// A oneshot callback for completion of applying logs to state machine.
pub struct LogApplied<C>
where C: RaftTypeConfig
{
    last_log_id: LogId<C::NodeId>,
    tx: oneshot::Sender<Result<(LogId<C::NodeId>, Vec<C::R>), StorageIOError<C::NodeId>>>,
}

impl<C> LogApplied<C>
where C: RaftTypeConfig
{
    #[allow(dead_code)]
    pub(crate) fn new(
        last_log_id: LogId<C::NodeId>,
        tx: oneshot::Sender<Result<(LogId<C::NodeId>, Vec<C::R>), StorageIOError<C::NodeId>>>,
    ) -> Self {
        Self { last_log_id, tx }
    }

    /// Report apply io completion event.
    ///
    /// It will be called when the log is successfully applied to the state machine or an error
    /// occurs.
    pub fn completed(self, result: Result<Vec<C::R>, StorageIOError<C::NodeId>>) {
        let res = match result {
            Ok(x) => {
                tracing::debug!("LogApplied upto {}", self.last_log_id);
                let resp = (self.last_log_id.clone(), x);
                self.tx.send(Ok(resp))
            }
            Err(e) => {
                tracing::error!("LogApplied error: {}, while applying upto {}", e, self.last_log_id);
                self.tx.send(Err(e))
            }
        };

        if let Err(_e) = res {
            tracing::error!("failed to send apply complete event, last_log_id: {}", self.last_log_id);
        }
    }
}
