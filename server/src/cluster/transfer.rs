//! Leadership transfer (etcd `Maintenance.MoveLeader`), after the Raft thesis §3.10.
//!
//! openraft 0.9.25 has no transfer-leader API, and its followers reject votes while their
//! leader lease (`election_timeout_max` since the last message from the leader) runs. So the
//! leader hands over like this:
//!
//! 1. It checks that the target is a voter, and stops new client work: the [`TransferGate`]
//!    holds proposals and read-index rounds. Heartbeats go on.
//! 2. It waits, at most one election timeout, until the target's replicated log matches its
//!    own last log index and the target answered a raft RPC within two heartbeat intervals.
//! 3. It switches heartbeats off and has the voters' leader lease lifted, so that they will
//!    grant a vote: it asks them to waive it at once ([`super::leader_lease`]), or, when
//!    too few can, waits it out (counted from the last replication message). Their own
//!    election timers need another `election_timeout_min` to fire either way, which leaves
//!    the target a clear head start. Then it checks again that the target holds its whole
//!    log (writes accepted before the gate closed may have reached the log since step 2).
//! 4. It sends `keelpb.Peer/TimeoutNow`; the target calls `raft.trigger().elect()`.
//! 5. It waits, at most one election timeout, until the target is the leader it follows.
//!
//! Whatever the outcome, the gate reopens and heartbeats come back on at the end, and at
//! once should this member stop leading meanwhile (another member won an election). etcd
//! bounds a transfer by one election timeout too, and keeps heartbeating while the target
//! catches up; Keel used to wait for the request timeout (7 s) with heartbeats off, so a
//! target that did not answer held the leader's writes for 7 s while another member took
//! over (found by a fresh-user check).
//!
//! Errors follow etcd: `NotLeader` when not asked on the leader, `BadLeaderTransferee` for a
//! target that is not a voting member, `TimeoutLeaderTransfer` when leadership did not move in
//! time.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use keel_proto::keelpb::{
    ConfirmTransferRequest, ConfirmTransferResponse, TimeoutNowRequest, TimeoutNowResponse,
};
use tokio::sync::watch;
use tokio::time::Instant;

use super::Cluster;
use crate::error::EtcdError;
use crate::raft::Peers;
use crate::raft::peers::matched_index;
use crate::raft::types::{NodeId, Raft};

/// How often a transfer checks whether the target caught up.
const TRANSFER_POLL: Duration = Duration::from_millis(10);

/// Holds client proposals and read-index rounds on the leader while a transfer runs, and
/// keeps the offer a `TimeoutNow` carries. Cheap to clone; clones share the state.
#[derive(Clone)]
pub struct TransferGate {
    busy: Arc<watch::Sender<bool>>,
    offer: Arc<Mutex<Option<Offer>>>,
}

/// The handover a `TimeoutNow` in flight stands for: its ID, its target, and whether the
/// target has confirmed it (after which the leader waits for the election whatever became of
/// the `TimeoutNow` call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Offer {
    id: u64,
    target: NodeId,
    confirmed: bool,
}

impl Default for TransferGate {
    fn default() -> TransferGate {
        TransferGate {
            busy: Arc::new(watch::Sender::new(false)),
            offer: Arc::new(Mutex::new(None)),
        }
    }
}

impl TransferGate {
    /// Waits until no transfer runs; `false` if `deadline` passed first.
    pub async fn wait_idle(&self, deadline: Instant) -> bool {
        let mut rx = self.busy.subscribe();
        matches!(
            tokio::time::timeout_at(deadline, rx.wait_for(|busy| !*busy)).await,
            Ok(Ok(_))
        )
    }

    /// Closes the gate; `None` if a transfer already holds it.
    fn begin(&self, raft: &Raft) -> Option<TransferGuard> {
        let took = self
            .busy
            .send_if_modified(|busy| !std::mem::replace(busy, true));
        took.then(|| TransferGuard {
            gate: self.clone(),
            raft: raft.clone(),
        })
    }

    /// Whether a transfer runs now.
    pub fn is_busy(&self) -> bool {
        *self.busy.borrow()
    }

    /// The offer, locked for in-memory work only. Every write leaves it whole, so a poisoned
    /// lock still holds a valid offer.
    fn offer_slot(&self) -> MutexGuard<'_, Option<Offer>> {
        self.offer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Offers the handover to `target` and returns the offer's ID for `TimeoutNow`: random and
    /// nonzero, so a `TimeoutNow` from an earlier transfer, or an earlier run of this member,
    /// matches no later offer.
    fn offer(&self, target: NodeId) -> u64 {
        let id = rand::random::<u64>().max(1);
        *self.offer_slot() = Some(Offer {
            id,
            target,
            confirmed: false,
        });
        id
    }

    /// The target's `ConfirmTransfer`: `true`, and the offer becomes binding, while offer `id`
    /// to `target` stands; `false` once it was withdrawn, or for any other offer.
    pub fn confirm(&self, id: u64, target: NodeId) -> bool {
        let mut offer = self.offer_slot();
        match offer.as_mut() {
            Some(o) if o.id == id && o.target == target => {
                o.confirmed = true;
                true
            }
            _ => false,
        }
    }

    /// Ends the offer. Returns whether the target confirmed it first: then it campaigns, and
    /// the leader must wait for that election rather than report a failure.
    fn withdraw(&self) -> bool {
        self.offer_slot().take().is_some_and(|o| o.confirmed)
    }
}

/// Reopens the gate and turns heartbeats back on when dropped.
struct TransferGuard {
    gate: TransferGate,
    raft: Raft,
}

impl TransferGuard {
    /// Stops heartbeats until the guard is dropped.
    fn heartbeats_off(&self) {
        self.raft.runtime_config().heartbeat(false);
    }
}

impl Drop for TransferGuard {
    fn drop(&mut self) {
        // A transfer cancelled while its `TimeoutNow` was out leaves no offer behind.
        self.gate.withdraw();
        self.raft.runtime_config().heartbeat(true);
        self.gate.busy.send_replace(false);
    }
}

/// What a transfer needs to know about this member and its timers.
pub struct Transfer<'a> {
    /// This member.
    pub id: NodeId,
    /// Its raft handle.
    pub raft: &'a Raft,
    /// Its peer connections.
    pub peers: &'a Peers,
    /// Its gate.
    pub gate: &'a TransferGate,
    /// openraft's leader lease (`election_timeout_max`).
    pub lease: Duration,
    /// How long the voters disregard the lease once they waived it (`election_timeout_min`).
    pub waiver: Duration,
    /// Bound on the target's catching up and on the election after `TimeoutNow` (etcd's
    /// election timeout).
    pub election_timeout: Duration,
    /// Head start of the target over the followers' own election timers.
    pub margin: Duration,
    /// How recently the target must have answered a raft RPC for the handover to start
    /// (two heartbeat intervals).
    pub answered_within: Duration,
    /// Deadline of the `TimeoutNow` call: short enough that heartbeats resume before the
    /// other followers' election timers can fire should the target not answer.
    pub timeout_now_within: Duration,
    /// Bound on the whole transfer (etcd's request timeout).
    pub timeout: Duration,
}

impl Transfer<'_> {
    /// Moves leadership to `target`. See the module docs.
    pub async fn run(&self, target: NodeId) -> Result<(), EtcdError> {
        let deadline = Instant::now() + self.timeout;
        let (leader, term, is_voter, target_url) = {
            let m = self.raft.metrics();
            let m = m.borrow();
            let membership = m.membership_config.membership();
            let url = membership
                .get_node(&target)
                .and_then(|n| n.peer_url().cloned());
            (
                m.current_leader,
                m.current_term,
                membership.voter_ids().any(|v| v == target),
                url,
            )
        };
        if leader != Some(self.id) {
            return Err(EtcdError::NotLeader);
        }
        let (true, Some(url)) = (is_voter, target_url) else {
            return Err(EtcdError::BadLeaderTransferee);
        };
        if target == self.id {
            return Ok(());
        }
        let guard = loop {
            if let Some(g) = self.gate.begin(self.raft) {
                break g;
            }
            if !self.gate.wait_idle(deadline).await {
                return Err(EtcdError::TimeoutLeaderTransfer);
            }
        };

        // 2. The target must hold every entry we have, or the followers refuse to vote for
        //    it, and must be answering: heartbeats stop next, and a target that cannot take
        //    over would leave the cluster to an election.
        let step = (Instant::now() + self.election_timeout).min(deadline);
        if !self.caught_up(target, step).await? {
            return Err(EtcdError::TimeoutLeaderTransfer);
        }

        // 3. Lift the voters' leader lease: no heartbeat goes out from now on. Asked, they
        //    waive it at once; else it runs out.
        guard.heartbeats_off();
        let lapsed = (Instant::now() + self.lease + self.margin).min(deadline);
        let waived = super::leader_lease::waive_for_transfer(
            self.id,
            self.raft,
            self.peers,
            term,
            target,
            self.timeout_now_within,
            self.waiver,
        )
        .await;
        if waived {
            tracing::info!(
                target = format!("{target:x}"),
                "leadership transfer: a majority waived the leader lease"
            );
        } else {
            tracing::info!(
                target = format!("{target:x}"),
                "leadership transfer: waiting out the leader lease"
            );
            tokio::time::sleep_until(lapsed).await;
        }
        // Writes accepted before the gate closed may have reached the log since step 2; a
        // target without them would lose the election to the voters that have them.
        let settle = (Instant::now() + self.answered_within).min(deadline);
        if !self.caught_up(target, settle).await? {
            return Err(EtcdError::TimeoutLeaderTransfer);
        }

        // 4. TimeoutNow.
        let mut client = self
            .peers
            .client(&url)
            .map_err(|_| EtcdError::TimeoutLeaderTransfer)?;
        let mut request = tonic::Request::new(TimeoutNowRequest {
            leader_id: self.id,
            term,
            transfer_id: self.gate.offer(target),
        });
        request.set_timeout(self.timeout_now_within);
        let sent = tokio::time::timeout(self.timeout_now_within, client.timeout_now(request));
        let failure = match sent.await {
            Ok(Ok(_)) => None,
            Ok(Err(status)) => Some(status.to_string()),
            Err(_) => Some("not answered in time".to_string()),
        };
        // Withdrawn now, a late `TimeoutNow` finds no offer; confirmed before, the target
        // campaigns whatever became of its answer.
        let confirmed = self.gate.withdraw();
        if let Some(why) = failure {
            tracing::warn!(
                target = format!("{target:x}"),
                why,
                confirmed,
                "leadership transfer: TimeoutNow failed"
            );
            if !confirmed {
                return Err(EtcdError::TimeoutLeaderTransfer);
            }
        }
        let step = (Instant::now() + self.election_timeout).min(deadline);

        // 5. Done once we follow the target; another leader ends the wait too.
        let moved = self
            .raft
            .wait(Some(step.saturating_duration_since(Instant::now())))
            .metrics(
                |m| m.current_leader.is_some() && m.current_leader != Some(self.id),
                "leadership moved",
            )
            .await;
        match moved {
            Ok(m) if m.current_leader == Some(target) => Ok(()),
            _ => Err(EtcdError::TimeoutLeaderTransfer),
        }
    }

    /// Waits until `target`'s matched log reaches this leader's last log index and `target`
    /// answered a raft RPC within `answered_within`: `Ok(true)`; `Ok(false)` if `until`
    /// passed first.
    ///
    /// Errors: `NotLeader` once this member no longer leads.
    async fn caught_up(&self, target: NodeId, until: Instant) -> Result<bool, EtcdError> {
        loop {
            let (leading, matched, last) = {
                let m = self.raft.metrics();
                let m = m.borrow();
                let matched = matched_index(&m, target);
                (m.current_leader == Some(self.id), matched, m.last_log_index)
            };
            if !leading {
                return Err(EtcdError::NotLeader);
            }
            let answering = self.peers.answered_within(target, self.answered_within);
            if matched >= last && answering {
                return Ok(true);
            }
            if Instant::now() >= until {
                return Ok(false);
            }
            tokio::time::sleep(TRANSFER_POLL).await;
        }
    }
}

/// The target's head start over the other followers' election timers, in ms: one
/// heartbeat, at most a quarter of `election_timeout_min`.
fn margin_ms(timers: &crate::cluster::timing::RaftTimers) -> u64 {
    timers
        .heartbeat_interval
        .min(timers.election_timeout_min / 4)
}

/// How recently a target must have answered a raft RPC to be handed leadership: two
/// heartbeat intervals.
fn answered_within(timers: &crate::cluster::timing::RaftTimers) -> Duration {
    Duration::from_millis(2 * timers.heartbeat_interval)
}

/// How long the leader waits for the answer to `TimeoutNow`, and the target for the answer to
/// `ConfirmTransfer`: half of what is left of `election_timeout_min` after the target's head
/// start, so heartbeats resume before the other followers' election timers can fire.
fn timeout_now_within(timers: &crate::cluster::timing::RaftTimers) -> Duration {
    Duration::from_millis((timers.election_timeout_min - margin_ms(timers)) / 2)
}

/// etcd `MoveLeader` on this member: moves leadership to `target` (see the module docs).
///
/// Errors: `NotLeader`, `BadLeaderTransferee`, `TimeoutLeaderTransfer`.
pub async fn move_leader(cluster: &Cluster, target: NodeId) -> Result<(), EtcdError> {
    let timers = cluster.timing.raft;
    let transfer = Transfer {
        id: cluster.id,
        raft: &cluster.raft,
        peers: &cluster.peers,
        gate: &cluster.gate,
        lease: Duration::from_millis(timers.election_timeout_max),
        waiver: Duration::from_millis(timers.election_timeout_min),
        election_timeout: cluster.timing.election_timeout,
        answered_within: answered_within(&timers),
        timeout_now_within: timeout_now_within(&timers),
        margin: Duration::from_millis(margin_ms(&timers)),
        timeout: cluster.timing.request_timeout,
    };
    let started = Instant::now();
    let result = transfer.run(target).await;
    tracing::info!(
        target = format!("{target:x}"),
        elapsed_ms = started.elapsed().as_millis() as u64,
        ok = result.is_ok(),
        "leadership transfer finished"
    );
    result
}

/// etcd `EtcdServer.Stop` (`TransferLeadership`): a leader that stops hands leadership to the
/// voter it has been connected to longest (etcd's `longestConnected`, by
/// `Peers::active_since`) among those that answered a raft RPC within two heartbeat
/// intervals (Keel's addition: the target [`Transfer::run`] would accept) first, so the
/// cluster keeps a leader while this member drains and exits, instead of losing the writes
/// of the drain and an election timeout. Does nothing on a follower, or when no other voter
/// exists (etcd: "skipped leadership transfer for single voting member cluster"). A failed
/// transfer is logged (etcd's "leadership transfer failed") and the member stops anyway.
/// Bounded as [`move_leader`] (the request timeout).
pub async fn hand_over_on_stop(cluster: &Cluster) {
    let (leading, voters) = {
        let m = cluster.raft.metrics();
        let m = m.borrow();
        let voters: Vec<NodeId> = m
            .membership_config
            .membership()
            .voter_ids()
            .filter(|v| *v != cluster.id)
            .collect();
        (m.current_leader == Some(cluster.id), voters)
    };
    if !leading || voters.is_empty() {
        return;
    }
    // Only a voter that answered lately can take over: one connected longest but stalled
    // now (paused, overloaded) fails the transfer after an election timeout and holds the
    // writes meanwhile (found by a fresh-user check: 6 of 6 hand-overs picked a paused
    // member, and writes stalled 2.3 s instead of 0.75 s).
    let answered_within = answered_within(&cluster.timing.raft);
    let connected = voters
        .iter()
        .filter(|v| cluster.peers.answered_within(**v, answered_within))
        .filter_map(|v| cluster.peers.active_since(*v).map(|since| (since, *v)))
        .min();
    let Some((_, target)) = connected else {
        tracing::warn!("leadership transfer failed: no voter is connected and answering");
        return;
    };
    tracing::info!(
        target = format!("{target:x}"),
        "stopping the leader: transferring leadership first"
    );
    if let Err(e) = move_leader(cluster, target).await {
        tracing::warn!(error = %e, "leadership transfer failed");
    }
}

/// Handles `TimeoutNow` on the target: starts an election at once if the request comes from
/// the leader this member follows, in its current term, this member is a voter, and the
/// leader still stands by the offer (`ConfirmTransfer`, when the request carries a
/// `transfer_id`; a 0.1.0 leader sends none). The confirmation keeps a `TimeoutNow` that was
/// delivered late, after the leader gave up (this member was paused), from unseating a leader
/// that went back to work: a fresh-user check and CI saw exactly that.
///
/// Errors: `FailedPrecondition` status for a stale or misdirected request, or an offer the
/// leader withdrew; `Unavailable` when the leader could not be asked.
pub async fn on_timeout_now(
    cluster: &Arc<Cluster>,
    req: &TimeoutNowRequest,
) -> Result<TimeoutNowResponse, tonic::Status> {
    // Decided in a task of its own: whether this member campaigns rests on the leader's
    // answer to ConfirmTransfer, never on whether the leader's call was cancelled meanwhile.
    let (cluster, req) = (cluster.clone(), *req);
    let decided = tokio::spawn(async move {
        let answer = timeout_now(&cluster, &req).await;
        if let Err(status) = &answer {
            tracing::info!(
                from = format!("{:x}", req.leader_id),
                term = req.term,
                why = status.message(),
                "leadership transfer: TimeoutNow refused, no election"
            );
        }
        answer
    });
    decided
        .await
        .map_err(|e| tonic::Status::internal(format!("keel: TimeoutNow task failed: {e}")))?
}

/// [`on_timeout_now`] without the log line on refusal.
async fn timeout_now(
    cluster: &Cluster,
    req: &TimeoutNowRequest,
) -> Result<TimeoutNowResponse, tonic::Status> {
    let me = cluster.id;
    let (leader, term, is_voter, leader_url) = {
        let m = cluster.raft.metrics();
        let m = m.borrow();
        let membership = m.membership_config.membership();
        let is_voter = membership.voter_ids().any(|v| v == me);
        let url = membership
            .get_node(&req.leader_id)
            .and_then(|n| n.peer_url().cloned());
        (m.current_leader, m.current_term, is_voter, url)
    };
    if !is_voter || leader != Some(req.leader_id) || term != req.term {
        return Err(tonic::Status::failed_precondition(format!(
            "keel: TimeoutNow from {:x} in term {} does not match this member (voter: {is_voter}, leader: {:x?}, term {term})",
            req.leader_id, req.term, leader
        )));
    }
    if req.transfer_id != 0 {
        let url = leader_url.ok_or_else(|| {
            tonic::Status::failed_precondition("keel: TimeoutNow from a leader without a peer URL")
        })?;
        confirm_with_leader(cluster, &url, req).await?;
    }
    tracing::info!(
        from = format!("{:x}", req.leader_id),
        term,
        "leadership transfer: starting an election"
    );
    cluster
        .raft
        .trigger()
        .elect()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    Ok(TimeoutNowResponse {})
}

/// Asks the leader at `url` whether the transfer of `req` is still on; `Ok` only if it is.
async fn confirm_with_leader(
    cluster: &Cluster,
    url: &str,
    req: &TimeoutNowRequest,
) -> Result<(), tonic::Status> {
    let within = timeout_now_within(&cluster.timing.raft);
    let mut client = cluster
        .peers
        .client(url)
        .map_err(|e| tonic::Status::unavailable(format!("keel: cannot reach the leader: {e}")))?;
    let mut request = tonic::Request::new(ConfirmTransferRequest {
        transfer_id: req.transfer_id,
        target_id: cluster.id,
    });
    request.set_timeout(within);
    let answer = tokio::time::timeout(within, client.confirm_transfer(request))
        .await
        .map_err(|_| {
            tonic::Status::unavailable("keel: the leader did not confirm the transfer in time")
        })?
        .map_err(|s| {
            tonic::Status::unavailable(format!(
                "keel: the leader did not confirm the transfer: {s}"
            ))
        })?;
    if answer.into_inner().proceed {
        Ok(())
    } else {
        Err(tonic::Status::failed_precondition(
            "keel: the leader withdrew this leadership transfer",
        ))
    }
}

/// Handles `ConfirmTransfer` on the leader: whether the offer of a `TimeoutNow` still stands
/// ([`TransferGate::confirm`]).
pub fn on_confirm_transfer(
    gate: &TransferGate,
    req: &ConfirmTransferRequest,
) -> ConfirmTransferResponse {
    ConfirmTransferResponse {
        proceed: gate.confirm(req.transfer_id, req.target_id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn gate_waits_until_released() {
        let gate = TransferGate::default();
        assert!(
            gate.wait_idle(Instant::now()).await,
            "an idle gate never waits"
        );
        gate.busy.send_replace(true);
        assert!(gate.is_busy());
        let soon = Instant::now() + Duration::from_millis(30);
        assert!(!gate.wait_idle(soon).await, "a busy gate times out");
        let g2 = gate.clone();
        let waiter =
            tokio::spawn(
                async move { g2.wait_idle(Instant::now() + Duration::from_secs(5)).await },
            );
        tokio::time::sleep(Duration::from_millis(20)).await;
        gate.busy.send_replace(false);
        assert!(waiter.await.unwrap());
    }

    #[test]
    fn an_offer_binds_once_confirmed_and_a_withdrawn_one_is_refused() {
        let gate = TransferGate::default();
        assert!(!gate.confirm(7, 2), "no offer, no confirmation");

        let id = gate.offer(2);
        assert_ne!(id, 0, "0 means 'no confirmation asked' on the wire");
        assert!(!gate.confirm(id, 3), "another member cannot confirm it");
        assert!(!gate.confirm(id ^ 1, 2), "another offer's ID is refused");
        assert!(gate.confirm(id, 2));
        assert!(gate.withdraw(), "a confirmed offer binds the leader");

        let late = gate.offer(2);
        assert!(!gate.withdraw(), "unconfirmed: the leader may give up");
        assert!(
            !gate.confirm(late, 2),
            "a late TimeoutNow finds the offer withdrawn"
        );
        assert!(!gate.confirm(id, 2), "an earlier offer never comes back");
    }
}
