//! Replication stream.

pub(crate) mod callbacks;
pub(crate) mod hint;
mod pipeline;
mod replication_session_id;
pub(crate) mod request;
pub(crate) mod request_id;
pub(crate) mod response;

use std::sync::Arc;
use std::time::Duration;

use anyerror::AnyError;
use futures::future::FutureExt;
use futures::StreamExt;
use pipeline::Done;
use pipeline::Pipeline;
use pipeline::Sent;
pub(crate) use replication_session_id::ReplicationSessionId;
use request::Data;
use request::DataWithId;
use request::Replicate;
use response::ReplicationResult;
pub(crate) use response::Response;
use tokio::select;
use tokio::sync::mpsc;
use tokio::sync::oneshot;
use tokio::sync::Mutex;
use tracing_futures::Instrument;

use crate::config::Config;
use crate::core::notify::Notify;
use crate::core::sm::handle::SnapshotReader;
use crate::display_ext::DisplayOptionExt;
use crate::error::decompose::DecomposeResult;
use crate::error::HigherVote;
use crate::error::PayloadTooLarge;
use crate::error::RPCError;
use crate::error::ReplicationClosed;
use crate::error::ReplicationError;
use crate::log_id::LogIdOptionExt;
use crate::log_id_range::LogIdRange;
use crate::network::Backoff;
use crate::network::RPCOption;
use crate::network::RPCTypes;
use crate::network::RaftNetwork;
use crate::network::RaftNetworkFactory;
use crate::raft::AppendEntriesRequest;
use crate::raft::AppendEntriesResponse;
use crate::replication::callbacks::SnapshotCallback;
use crate::replication::hint::ReplicationHint;
use crate::replication::request_id::RequestId;
use crate::storage::RaftLogReader;
use crate::storage::RaftLogStorage;
use crate::storage::Snapshot;
use crate::type_config::alias::InstantOf;
use crate::type_config::alias::JoinHandleOf;
use crate::type_config::alias::LogIdOf;
use crate::type_config::TypeConfigExt;
use crate::AsyncRuntime;
use crate::LogId;
use crate::MessageSummary;
use crate::RaftLogId;
use crate::RaftTypeConfig;
use crate::StorageError;
use crate::StorageIOError;
use crate::Vote;

/// The handle to a spawned replication stream.
pub(crate) struct ReplicationHandle<C>
where C: RaftTypeConfig
{
    /// The spawn handle the `ReplicationCore` task.
    pub(crate) join_handle: JoinHandleOf<C, Result<(), ReplicationClosed>>,

    /// The channel used for communicating with the replication task.
    pub(crate) tx_repl: mpsc::UnboundedSender<Replicate<C>>,
}

/// A task responsible for sending replication events to a target follower in the Raft cluster.
///
/// NOTE: we do not stack replication requests to targets because this could result in
/// out-of-order delivery. We always buffer until we receive a success response, then send the
/// next payload from the buffer.
pub(crate) struct ReplicationCore<C, N, LS>
where
    C: RaftTypeConfig,
    N: RaftNetworkFactory<C>,
    LS: RaftLogStorage<C>,
{
    /// The ID of the target Raft node which replication events are to be sent to.
    target: C::NodeId,

    /// Identifies which session this replication belongs to.
    session_id: ReplicationSessionId<C::NodeId>,

    /// A channel for sending events to the RaftCore.
    #[allow(clippy::type_complexity)]
    tx_raft_core: mpsc::UnboundedSender<Notify<C>>,

    /// A channel for receiving events from the RaftCore and snapshot transmitting task.
    rx_event: mpsc::UnboundedReceiver<Replicate<C>>,

    /// A weak reference to the Sender for the separate sending-snapshot task to send callback.
    ///
    /// Because 1) ReplicationCore replies on the `close` event to shutdown.
    /// 2) ReplicationCore holds this tx; It is made a weak so that when
    /// RaftCore drops the only non-weak tx, the Receiver `rx_repl` will be closed.
    weak_tx_event: mpsc::WeakUnboundedSender<Replicate<C>>,

    /// The `RaftNetwork` interface for replicating logs and heartbeat.
    /// Keel patch: the AppendEntries RPCs in flight and their network clients
    /// (`replication/pipeline.rs`).
    pipeline: Pipeline<C, N::Network>,

    /// Another `RaftNetwork` specific for snapshot replication.
    ///
    /// Snapshot transmitting is a long running task, and is processed in a separate task.
    snapshot_network: Arc<Mutex<N::Network>>,

    /// The current snapshot replication state.
    ///
    /// It includes a cancel signaler and the join handle of the snapshot replication task.
    /// When ReplicationCore is dropped, this Sender is dropped, the snapshot task will be notified
    /// to quit.
    snapshot_state: Option<(oneshot::Sender<()>, JoinHandleOf<C, ()>)>,

    /// The backoff policy if an [`Unreachable`](`crate::error::Unreachable`) error is returned.
    /// It will be reset to `None` when an successful response is received.
    backoff: Option<Backoff>,

    /// The `RaftLogReader` of a `RaftStorage` interface.
    log_reader: LS::LogReader,

    /// The handle to get a snapshot directly from state machine.
    snapshot_reader: SnapshotReader<C>,

    /// The Raft's runtime config.
    config: Arc<Config>,

    /// The log id of the highest log entry which is known to be committed in the cluster.
    committed: Option<LogId<C::NodeId>>,

    /// Last matching log id on a follower/learner
    matching: Option<LogId<C::NodeId>>,

    /// Next replication action to run.
    next_action: Option<Data<C>>,

    /// Appropriate number of entries to send.
    /// This is only used by AppendEntries RPC.
    entries_hint: ReplicationHint,
}

impl<C, N, LS> ReplicationCore<C, N, LS>
where
    C: RaftTypeConfig,
    N: RaftNetworkFactory<C>,
    LS: RaftLogStorage<C>,
{
    /// Spawn a new replication task for the target node.
    #[tracing::instrument(level = "trace", skip_all,fields(target=display(&target), session_id=display(&session_id)))]
    #[allow(clippy::type_complexity)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn spawn(
        target: C::NodeId,
        session_id: ReplicationSessionId<C::NodeId>,
        config: Arc<Config>,
        committed: Option<LogId<C::NodeId>>,
        matching: Option<LogId<C::NodeId>>,
        network: N::Network,
        pipeline_network: N::Network,
        snapshot_network: N::Network,
        log_reader: LS::LogReader,
        snapshot_reader: SnapshotReader<C>,
        tx_raft_core: mpsc::UnboundedSender<Notify<C>>,
        span: tracing::Span,
    ) -> ReplicationHandle<C> {
        tracing::debug!(
            session_id = display(&session_id),
            target = display(&target),
            committed = display(committed.summary()),
            matching = debug(&matching),
            "spawn replication"
        );

        // other component to ReplicationStream
        let (tx_event, rx_event) = mpsc::unbounded_channel();

        let this = Self {
            target,
            session_id,
            pipeline: Pipeline::new(vec![network, pipeline_network]),
            snapshot_network: Arc::new(Mutex::new(snapshot_network)),
            snapshot_state: None,
            backoff: None,
            log_reader,
            snapshot_reader,
            config,
            committed,
            matching,
            tx_raft_core,
            rx_event,
            weak_tx_event: tx_event.downgrade(),
            next_action: None,
            entries_hint: Default::default(),
        };

        let join_handle = C::AsyncRuntime::spawn(this.main().instrument(span));

        ReplicationHandle {
            join_handle,
            tx_repl: tx_event,
        }
    }

    #[tracing::instrument(level="debug", skip(self), fields(session=%self.session_id, target=display(&self.target), cluster=%self.config.cluster_name))]
    async fn main(mut self) -> Result<(), ReplicationClosed> {
        // Keel patch: pipelined AppendEntries (replication/pipeline.rs).
        loop {
            if self.pipeline.in_flight.is_empty() {
                // Nothing in flight: wait out a backoff, then for something to do.
                self.drain_events_with_backoff().await?;
            }

            if let Some(end) = self.start_actions().await {
                return end;
            }
            if self.pipeline.in_flight.is_empty() {
                continue;
            }

            let step = select! {
                done = self.pipeline.in_flight.next() => Step::Done(done),
                event = self.rx_event.recv() => Step::Event(event),
            };
            match step {
                Step::Done(Some(done)) => {
                    if let Some(end) = self.on_rpc_done(done) {
                        return end;
                    }
                }
                Step::Done(None) => {}
                Step::Event(event) => {
                    let event = event.ok_or(ReplicationClosed::new("RaftCore closed replication"))?;
                    self.process_event(event);
                    self.try_drain_events().await?;
                }
            }
        }
    }

    /// Starts the pending action while the pipeline has room; a snapshot only when nothing is
    /// in flight. Returns `Some` when the replication task must end with that result.
    async fn start_actions(&mut self) -> Option<Result<(), ReplicationClosed>> {
        while self.pipeline.has_room() {
            let Some(action) = self.next_action.take() else {
                break;
            };
            let request_id = action.request_id();
            tracing::debug!(replication_data = display(&action), "{} send replication RPC", func_name!());

            let snapshot = matches!(action, Data::Snapshot(_) | Data::SnapshotCallback(_));
            let res = match action {
                Data::Heartbeat if self.pipeline.logs_in_flight > 0 => {
                    // The logs in flight keep the leadership; the commit index goes with the next
                    // RPC (this heartbeat, once they are answered, unless logs replace it).
                    self.next_action = Some(Data::Heartbeat);
                    break;
                }
                Data::Heartbeat => {
                    self.start_heartbeat();
                    Ok(None)
                }
                Data::Logs(log) => self.start_logs(log).await.map(|_| None),
                Data::Snapshot(snap) if self.pipeline.in_flight.is_empty() => self.stream_snapshot(snap).await,
                Data::SnapshotCallback(resp) if self.pipeline.in_flight.is_empty() => {
                    self.handle_snapshot_callback(resp)
                }
                other => {
                    // Wait until the RPCs in flight are answered.
                    self.next_action = Some(other);
                    break;
                }
            };
            match res {
                Ok(next) => {
                    if snapshot {
                        // Reset the backoff at once when a snapshot step succeeds.
                        self.backoff = None;
                    }
                    if let Some(next) = next {
                        self.next_action = Some(next);
                    }
                }
                Err(err) => {
                    if let Some(end) = self.handle_error(request_id, err) {
                        return Some(end);
                    }
                }
            }
        }
        None
    }

    fn start_heartbeat(&mut self) {
        let payload = AppendEntriesRequest {
            vote: self.session_id.vote_ref().clone(),
            prev_log_id: self.matching.clone(),
            leader_commit: self.committed.clone(),
            entries: vec![],
        };
        self.send(
            Sent::Heartbeat {
                prev: self.matching.clone(),
            },
            payload,
        );
    }

    /// Reads the first entries of `log` (at most `max_payload_entries`, or the hint after a
    /// PayloadTooLarge) and sends them; what is left stays the next action.
    async fn start_logs(
        &mut self,
        log: DataWithId<LogIdRange<C::NodeId>>,
    ) -> Result<(), ReplicationError<C::NodeId, C::Node>> {
        let request_id = log.request_id();
        let rng = log.data().clone();
        let start = rng.prev.next_index();
        let mut end = std::cmp::min(rng.last.next_index(), start + self.config.max_payload_entries);
        if let Some(hint) = self.entries_hint.get() {
            end = std::cmp::min(end, start + hint);
        }

        // limited_get_log_entries will return logs smaller than the range [start, end).
        let logs = self.log_reader.limited_get_log_entries(start, end).await?;
        let Some(last) = logs.last().map(|x| x.get_log_id().clone()) else {
            // A store that returns nothing for a non-empty range violates the API contract;
            // retry a little later rather than spin.
            tracing::warn!(
                "limited_get_log_entries({}, {}) returned empty; retrying in 10 ms",
                start,
                end
            );
            C::sleep(Duration::from_millis(10)).await;
            self.next_action = Some(Data::Logs(log));
            return Ok(());
        };

        if Some(&last) < rng.last.as_ref() {
            self.next_action = Some(Data::new_logs(
                request_id,
                LogIdRange::new(Some(last.clone()), rng.last.clone()),
            ));
        }

        let head = self.pipeline.logs_in_flight == 0;
        let payload = AppendEntriesRequest {
            vote: self.session_id.vote_ref().clone(),
            prev_log_id: rng.prev.clone(),
            leader_commit: self.committed.clone(),
            entries: logs,
        };
        let sent = Sent::Logs {
            request_id,
            range: LogIdRange::new(rng.prev, Some(last)),
            head,
        };
        self.send(sent, payload);
        Ok(())
    }

    fn send(&mut self, sent: Sent<C>, payload: AppendEntriesRequest<C>) {
        tracing::debug!(payload=%payload.summary(), "start sending append_entries");
        // Keel patch: entries wait for the follower's fsync (and, pipelined, for the RPC in
        // front of them), which on a busy disk takes longer than a heartbeat interval. A
        // timeout cancels the RPC and replication starts again from `matching`, so with the
        // heartbeat interval as its timeout a follower behind by large entries was sent the
        // same entries again and again and never caught up. Raft's own patience with a busy
        // member is an election timeout. Heartbeats too: with the heartbeat interval as their
        // timeout, a peer round trip longer than it (a WAN link, a loaded host) timed every
        // heartbeat out, so the leader never saw a quorum acknowledge it and refused writes,
        // while the followers, still receiving the heartbeats, never elected another one.
        let timeout = Duration::from_millis(self.config.election_timeout_min);
        let leader = self.session_id.vote_ref().leader_id().voted_for().unwrap();
        self.pipeline.send(sent, payload, timeout, leader, self.target.clone());
    }

    /// Handles the response of the oldest RPC in flight. Returns `Some` when the replication
    /// task must end with that result.
    fn on_rpc_done(&mut self, done: Done<C, N::Network>) -> Option<Result<(), ReplicationClosed>> {
        let Done {
            network,
            generation,
            sent,
            leader_time,
            result,
        } = done;
        if !self.pipeline.answered(network, generation, &sent) {
            tracing::debug!(sent = debug(&sent), "dropping the response of a stale RPC");
            return None;
        }
        tracing::debug!(sent = debug(&sent), result = debug(&result), "append_entries resp");

        let request_id = match &sent {
            Sent::Heartbeat { .. } => RequestId::new_heartbeat(),
            Sent::Logs { request_id, .. } => *request_id,
        };
        let resp = match result {
            Ok(resp) => resp,
            Err(err) => return self.handle_error(request_id, ReplicationError::RPCError(err)),
        };
        // Reset the backoff at once when an RPC succeeds.
        self.backoff = None;

        if let AppendEntriesResponse::HigherVote(vote) = &resp {
            debug_assert!(
                vote > self.session_id.vote_ref(),
                "higher vote({}) should be greater than leader's vote({})",
                vote,
                self.session_id.vote_ref(),
            );
            tracing::debug!(%vote, "append entries failed. converting to follower");
            let err = ReplicationError::HigherVote(HigherVote {
                higher: vote.clone(),
                sender_vote: self.session_id.vote_ref().clone(),
            });
            return self.handle_error(request_id, err);
        }

        match sent {
            Sent::Heartbeat { prev } => match resp {
                AppendEntriesResponse::Conflict => {
                    // The follower lost entries it had acknowledged (as openraft 0.9.25 did).
                    if let Some(conflict) = prev {
                        self.report(request_id, ReplicationResult::new(leader_time, Err(conflict)));
                    }
                }
                _ => {
                    // Only the leader's clock moves: `matching` is not the heartbeat's business.
                    self.report(request_id, ReplicationResult::new(leader_time, Ok(self.matching.clone())));
                }
            },
            Sent::Logs { request_id, range, head } => match resp {
                AppendEntriesResponse::Success => {
                    self.send_progress(request_id, ReplicationResult::new(leader_time, Ok(range.last.clone())));
                }
                AppendEntriesResponse::PartialSuccess(matching) => {
                    debug_assert!(matching >= range.prev && matching <= range.last);
                    self.send_progress(request_id, ReplicationResult::new(leader_time, Ok(matching.clone())));
                    if matching < range.last {
                        self.restart_logs(request_id);
                    }
                }
                AppendEntriesResponse::Conflict if head => {
                    let conflict = range.prev.clone();
                    debug_assert!(conflict.is_some(), "prev_log_id=None never conflict");
                    self.send_progress(request_id, ReplicationResult::new(leader_time, Err(conflict.unwrap())));
                    self.end_logs(request_id);
                }
                AppendEntriesResponse::Conflict => {
                    // Sent behind another RPC: it may have reached the follower first.
                    self.restart_logs(request_id);
                }
                AppendEntriesResponse::HigherVote(_) => unreachable!("handled above"),
            },
        }
        None
    }

    /// Sends the logs of `request_id` again from the acknowledged `matching`, as the new head of
    /// the pipeline; what is in flight becomes stale.
    fn restart_logs(&mut self, request_id: RequestId) {
        self.pipeline.new_generation();
        let last = match &self.pipeline.logs {
            Some((id, last)) if *id == request_id => last.clone(),
            _ => None,
        };
        if self.matching < last {
            self.next_action = Some(Data::new_logs(request_id, LogIdRange::new(self.matching.clone(), last)));
        } else if matches!(self.next_action, Some(Data::Logs(_))) {
            self.next_action = None;
        }
    }

    /// Ends the logs request `request_id` after a conflict or an error was reported for it;
    /// `RaftCore` decides what to send next.
    fn end_logs(&mut self, request_id: RequestId) {
        self.pipeline.new_generation();
        self.pipeline.ended = Some(request_id);
        self.pipeline.logs = None;
        if matches!(self.next_action, Some(Data::Logs(_))) {
            self.next_action = None;
        }
    }

    /// Handles a failed action (as openraft 0.9.25's loop did) and ends the logs request it
    /// served. Returns `Some` when the replication task must end with that result.
    fn handle_error(
        &mut self,
        request_id: RequestId,
        err: ReplicationError<C::NodeId, C::Node>,
    ) -> Option<Result<(), ReplicationClosed>> {
        tracing::warn!(error=%err, "error replication to target={}", self.target);

        match err {
            ReplicationError::Closed(closed) => Some(Err(closed)),
            ReplicationError::HigherVote(h) => {
                let _ = self.tx_raft_core.send(Notify::Network {
                    response: Response::HigherVote {
                        target: self.target.clone(),
                        higher: h.higher,
                        sender_vote: self.session_id.vote_ref().clone(),
                    },
                });
                Some(Ok(()))
            }
            ReplicationError::StorageError(error) => {
                tracing::error!(error=%error, "error replication to target={}", self.target);
                let _ = self.tx_raft_core.send(Notify::Network {
                    response: Response::StorageError { error },
                });
                Some(Ok(()))
            }
            ReplicationError::RPCError(err) => {
                tracing::error!(err = display(&err), "RPCError");
                match &err {
                    RPCError::Unreachable(_unreachable) => {
                        // Back off for a while; a successful RPC resets it.
                        if self.backoff.is_none() {
                            self.backoff = self.pipeline.idle.last().map(|n| n.backoff());
                        }
                    }
                    RPCError::PayloadTooLarge(too_large) => {
                        self.update_hint(too_large);
                        if let RequestId::AppendEntries { .. } = request_id {
                            // Retry at once with fewer entries.
                            self.restart_logs(request_id);
                            return None;
                        }
                    }
                    _ => {}
                }
                self.send_progress_error(request_id, err);
                if let RequestId::AppendEntries { .. } = request_id {
                    self.end_logs(request_id);
                }
                None
            }
        }
    }

    /// Reports a result to `RaftCore` without touching `matching`.
    fn report(&mut self, request_id: RequestId, replication_result: ReplicationResult<C>) {
        let _ = self.tx_raft_core.send(Notify::Network {
            response: Response::Progress {
                session_id: self.session_id.clone(),
                request_id,
                target: self.target.clone(),
                result: Ok(replication_result),
            },
        });
    }

    async fn drain_events_with_backoff(&mut self) -> Result<(), ReplicationClosed> {
        if let Some(b) = &mut self.backoff {
            let duration = b.next().unwrap_or_else(|| {
                tracing::warn!("backoff exhausted, using default");
                Duration::from_millis(500)
            });

            self.backoff_drain_events(C::now() + duration).await?;
        }

        self.drain_events().await?;
        Ok(())
    }

    /// When a [`PayloadTooLarge`] error is received, update the hint for the next several RPC.
    fn update_hint(&mut self, too_large: &PayloadTooLarge) {
        const DEFAULT_ENTRIES_HINT_TTL: u64 = 10;

        match too_large.action() {
            RPCTypes::Vote => {
                unreachable!("Vote RPC should not be too large")
            }
            RPCTypes::AppendEntries => {
                self.entries_hint = ReplicationHint::new(too_large.entries_hint(), DEFAULT_ENTRIES_HINT_TTL);
                tracing::debug!(entries_hint = debug(&self.entries_hint), "updated entries hint");
            }
            RPCTypes::InstallSnapshot => {
                // TODO: handle too large
                tracing::error!("InstallSnapshot RPC is too large, but it is not supported yet");
            }
        }
    }

    /// Send the error result to RaftCore.
    /// RaftCore will then submit another replication command.
    fn send_progress_error(&mut self, request_id: RequestId, err: RPCError<C::NodeId, C::Node>) {
        let _ = self.tx_raft_core.send(Notify::Network {
            response: Response::Progress {
                target: self.target.clone(),
                request_id,
                result: Err(err.to_string()),
                session_id: self.session_id.clone(),
            },
        });
    }

    /// Send the success replication result(log matching or conflict) to RaftCore.
    fn send_progress(&mut self, request_id: RequestId, replication_result: ReplicationResult<C>) {
        tracing::debug!(
            request_id = display(request_id),
            target = display(&self.target),
            curr_matching = display(self.matching.display()),
            result = display(&replication_result),
            "{}",
            func_name!()
        );

        match &replication_result.result {
            Ok(matching) => {
                self.validate_matching(matching.clone());
                self.matching = matching.clone();
            }
            Err(_conflict) => {
                // Conflict is not allowed to be less than the current matching.
            }
        }

        let _ = self.tx_raft_core.send({
            Notify::Network {
                response: Response::Progress {
                    session_id: self.session_id.clone(),
                    request_id,
                    target: self.target.clone(),
                    result: Ok(replication_result),
                },
            }
        });
    }

    /// Validate the value for updating matching log id.
    ///
    /// If the matching log id is reverted to a smaller value:
    /// - log a warning message if [`loosen-follower-log-revert`] feature flag is enabled;
    /// - otherwise panic, consider it as a bug.
    ///
    /// [`loosen-follower-log-revert`]: crate::docs::feature_flags#feature-flag-loosen-follower-log-revert
    fn validate_matching(&self, matching: Option<LogId<C::NodeId>>) {
        if cfg!(feature = "loosen-follower-log-revert") {
            if self.matching > matching {
                tracing::warn!(
                    "follower log is reverted from {} to {}; with 'loosen-follower-log-revert' enabled, this is allowed",
                    self.matching.display(),
                    matching.display(),
                );
            }
        } else {
            debug_assert!(
                self.matching <= matching,
                "follower log is reverted from {} to {}",
                self.matching.display(),
                matching.display(),
            );
        }
    }

    /// Drain all events in the channel in backoff mode, i.e., there was an un-retry-able error and
    /// should not send out anything before backoff interval expired.
    ///
    /// In the backoff period, we should not send out any RPCs, but we should still receive events,
    /// in case the channel is closed, it should quit at once.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn backoff_drain_events(&mut self, until: InstantOf<C>) -> Result<(), ReplicationClosed> {
        let d = until - C::now();
        tracing::warn!(
            interval = debug(d),
            "{} backoff mode: drain events without processing them",
            func_name!()
        );

        loop {
            let sleep_duration = until - C::now();
            let sleep = C::sleep(sleep_duration);

            let recv = self.rx_event.recv();

            tracing::debug!("backoff timeout: {:?}", sleep_duration);

            select! {
                _ = sleep => {
                    tracing::debug!("backoff timeout");
                    return Ok(());
                }
                recv_res = recv => {
                    let event = recv_res.ok_or(ReplicationClosed::new("RaftCore closed replication"))?;
                    self.process_event(event);
                }
            }
        }
    }

    /// Receive and process events from RaftCore, until `next_action` is filled.
    ///
    /// It blocks until at least one event is received.
    #[tracing::instrument(level = "trace", skip_all)]
    pub async fn drain_events(&mut self) -> Result<(), ReplicationClosed> {
        tracing::debug!("drain_events");

        // If there is next action to run, do not block waiting for events,
        // instead, just try the best to drain all events.
        if self.next_action.is_none() {
            let event =
                self.rx_event.recv().await.ok_or(ReplicationClosed::new("rx_repl is closed in drain_event()"))?;
            self.process_event(event);
        }

        // Returning from process_event(), next_action is never None.

        self.try_drain_events().await?;

        Ok(())
    }

    #[tracing::instrument(level = "trace", skip(self))]
    pub async fn try_drain_events(&mut self) -> Result<(), ReplicationClosed> {
        tracing::debug!("{}", func_name!());

        // Just drain all events in the channel.
        // There should NOT be more than one `Replicate::Data` event in the channel.
        // Looping it just collect all commit events and heartbeat events.
        loop {
            let maybe_res = self.rx_event.recv().now_or_never();

            let Some(recv_res) = maybe_res else {
                // No more event found in self.repl_rx
                return Ok(());
            };

            let event = recv_res.ok_or(ReplicationClosed::new("rx_repl is closed in try_drain_event"))?;

            self.process_event(event);
        }
    }

    #[tracing::instrument(level = "trace", skip_all)]
    pub fn process_event(&mut self, event: Replicate<C>) {
        tracing::debug!(event=%event.summary(), "process_event");

        match event {
            Replicate::Committed(c) => {
                // RaftCore may send a committed equals to the initial value.
                debug_assert!(
                    c >= self.committed,
                    "expect new committed {} > self.committed {}",
                    c.summary(),
                    self.committed.summary()
                );

                self.committed = c;

                // If there is no action, fill in an heartbeat action to send committed index.
                if self.next_action.is_none() {
                    self.next_action = Some(Data::new_heartbeat());
                }
            }
            Replicate::Heartbeat => {
                // Never overwrite action with payload.
                if self.next_action.is_none() {
                    self.next_action = Some(Data::new_heartbeat());
                }
            }
            Replicate::Data(Data::Logs(log)) => self.accept_logs(log),
            Replicate::Data(d) => {
                if cfg!(debug_assertions) {
                    match &d {
                        Data::SnapshotCallback(_) => {
                            debug_assert!(
                                self.snapshot_state.is_some(),
                                "snapshot state must be Some to receive callback"
                            );
                        }
                        _ => {
                            debug_assert!(
                                self.snapshot_state.is_none(),
                                "can not send other data while sending snapshot"
                            );
                        }
                    }
                }

                self.next_action = Some(d);
            }
        }
    }

    /// Keel patch: a new logs request, or an extension `(old last, new last]` of the one being
    /// served (pipelining, `replication/pipeline.rs`), which joins its unsent part.
    fn accept_logs(&mut self, log: DataWithId<LogIdRange<C::NodeId>>) {
        debug_assert!(self.snapshot_state.is_none(), "can not send logs while sending snapshot");
        let request_id = log.request_id();
        if self.pipeline.ended == Some(request_id) {
            tracing::debug!(request_id = display(request_id), "dropping an extension of an ended request");
            return;
        }
        let rng = log.data().clone();
        match &mut self.pipeline.logs {
            Some((id, last)) if *id == request_id => {
                debug_assert_eq!(&rng.prev, last, "an extension starts where its request ended");
                *last = rng.last.clone();
                match &mut self.next_action {
                    Some(Data::Logs(pending)) if pending.request_id() == request_id => {
                        let prev = pending.data().prev.clone();
                        *pending = DataWithId::new(request_id, LogIdRange::new(prev, rng.last));
                    }
                    _ => self.next_action = Some(Data::Logs(log)),
                }
            }
            _ => {
                self.pipeline.logs = Some((request_id, rng.last.clone()));
                self.next_action = Some(Data::Logs(log));
            }
        }
    }

    #[tracing::instrument(level = "info", skip_all)]
    async fn stream_snapshot(
        &mut self,
        snapshot_req: DataWithId<Option<LogIdOf<C>>>,
    ) -> Result<Option<Data<C>>, ReplicationError<C::NodeId, C::Node>> {
        let request_id = snapshot_req.request_id();

        tracing::info!(request_id = display(request_id), "{}", func_name!());

        let snapshot = self.snapshot_reader.get_snapshot().await.map_err(|reason| {
            tracing::warn!(error = display(&reason), "failed to get snapshot from state machine");
            ReplicationClosed::new(reason)
        })?;

        tracing::info!(
            "received snapshot: request_id={}; meta:{}",
            request_id,
            snapshot.as_ref().map(|x| &x.meta).summary()
        );

        let snapshot = match snapshot {
            None => {
                let io_err = StorageIOError::read_snapshot(None, AnyError::error("snapshot not found"));
                let sto_err = StorageError::IO { source: io_err };
                return Err(ReplicationError::StorageError(sto_err));
            }
            Some(x) => x,
        };

        let mut option = RPCOption::new(self.config.install_snapshot_timeout());
        option.snapshot_chunk_size = Some(self.config.snapshot_max_chunk_size as usize);

        let (tx_cancel, rx_cancel) = oneshot::channel();

        let jh = C::spawn(Self::send_snapshot(
            request_id,
            self.snapshot_network.clone(),
            self.session_id.vote_ref().clone(),
            snapshot,
            option,
            rx_cancel,
            self.weak_tx_event.clone(),
        ));

        // When self.rx_event is dropped:
        // 1) ReplicationCore will return from the main loop;
        // 2) and tx_cancel is dropped;
        // 3) and the snapshot task will be notified.
        self.snapshot_state = Some((tx_cancel, jh));
        Ok(None)
    }

    async fn send_snapshot(
        request_id: RequestId,
        network: Arc<Mutex<N::Network>>,
        vote: Vote<C::NodeId>,
        snapshot: Snapshot<C>,
        option: RPCOption,
        cancel: oneshot::Receiver<()>,
        weak_tx: mpsc::WeakUnboundedSender<Replicate<C>>,
    ) {
        let meta = snapshot.meta.clone();

        let mut net = network.lock().await;

        let start_time = C::now();

        let cancel = async move {
            let _ = cancel.await;
            ReplicationClosed::new("ReplicationCore is dropped")
        };

        let res = net.full_snapshot(vote, snapshot, cancel, option).await;
        if let Err(e) = &res {
            tracing::warn!(error = display(e), "failed to send snapshot");
        }

        let res = res.decompose_infallible();

        if let Some(tx_noty) = weak_tx.upgrade() {
            let data = Data::new_snapshot_callback(request_id, start_time, meta, res);
            let send_res = tx_noty.send(Replicate::new_data(data));
            if send_res.is_err() {
                tracing::warn!("weak_tx failed to send snapshot result to ReplicationCore");
            }
        } else {
            tracing::warn!("weak_tx is dropped, no response is sent to ReplicationCore");
        }
    }

    fn handle_snapshot_callback(
        &mut self,
        callback: DataWithId<SnapshotCallback<C>>,
    ) -> Result<Option<Data<C>>, ReplicationError<C::NodeId, C::Node>> {
        tracing::debug!(
            request_id = debug(callback.request_id()),
            response = display(callback.data()),
            matching = display(self.matching.display()),
            "handle_snapshot_response"
        );

        self.snapshot_state = None;

        let request_id = callback.request_id();
        let SnapshotCallback {
            start_time,
            result,
            snapshot_meta,
        } = callback.into_data();

        let resp = result?;

        // Handle response conditions.
        let sender_vote = self.session_id.vote_ref().clone();
        if resp.vote > sender_vote {
            return Err(ReplicationError::HigherVote(HigherVote {
                higher: resp.vote,
                sender_vote,
            }));
        }

        self.send_progress(
            request_id,
            ReplicationResult::new(start_time, Ok(snapshot_meta.last_log_id)),
        );

        Ok(None)
    }
}

/// Keel patch: what woke the replication loop.
enum Step<C, Net>
where C: RaftTypeConfig
{
    Done(Option<Done<C, Net>>),
    Event(Option<Replicate<C>>),
}
