//! Membership changes (etcd `Cluster.MemberAdd/MemberRemove/MemberUpdate/MemberPromote`),
//! run on the leader with etcd's strict reconfiguration checks and etcd's errors.
//!
//! A member that is not the leader forwards the request to the leader
//! (`keelpb.Peer/Member*`), as etcd forwards `MemberPromote`; requests are retried only
//! while no leader is known or the asked member is no longer the leader, i.e. before anything
//! was proposed. Changes are serialized on the leader and proposed through openraft's joint
//! consensus (`change_membership`): adding a voter first adds it as a learner, then promotes
//! it, answering once the promotion is durable on a quorum of the old voters (`add_voter`).
//!
//! Checks, in etcd's order (`server/etcdserver/server.go` `mayAddMember`, `mayRemoveMember`,
//! `mayPromoteMember`, and the apply-time `ValidateConfigurationChange`):
//!
//! | request | refused with |
//! |---|---|
//! | add/update with malformed peer URLs | `MemberBadUrls` |
//! | add a voter when the started voters would not be a quorum | `MemberNotEnoughStarted` |
//! | add while the leader is not connected to every voter for 5 s | `Unhealthy` |
//! | add/update with a peer URL another member has | `PeerUrlExist` |
//! | add a second learner | `TooManyLearners` |
//! | remove/update/promote an unknown ID | `MemberNotFound` |
//! | remove a voter so that the started voters are no quorum | `MemberNotEnoughStarted` |
//! | remove a reachable voter while fewer than a quorum stays connected | `Unhealthy` |
//! | promote a voter | `MemberNotLearner` |
//! | promote a learner whose log is below 90 % of the leader's | `LearnerNotReady` |
//!
//! A refused request changes nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use keel_proto::etcdserverpb::{
    Member, MemberAddRequest, MemberAddResponse, MemberPromoteRequest, MemberPromoteResponse,
    MemberRemoveRequest, MemberRemoveResponse, MemberUpdateRequest, MemberUpdateResponse,
};

use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::{ChangeMembers, Membership};
use tokio::time::Instant;

use super::Cluster;
use super::members::{
    added_member_id, member_list, ready_to_add_voter, ready_to_promote, ready_to_remove_voter,
    to_member, validate_peer_urls,
};
use crate::error::EtcdError;
use crate::raft::peers::{PeerFailure, PeerRpcClient, classify, is_transport_failure, leader_url};
use crate::raft::types::{MemberNode, NodeId};

/// etcd's `HealthInterval`: a voter counts as connected if it answered continuously for this
/// long.
pub const HEALTH_INTERVAL: Duration = Duration::from_secs(5);
/// etcd's default `--experimental-max-learners`.
pub const MAX_LEARNERS: usize = 1;
/// etcd's `readyPercent`: a learner may be promoted once its log reaches this share of the
/// leader's.
pub const LEARNER_READY_PERCENT: f64 = 0.9;
/// Pause between retries while no leader is known or a change is still in progress.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

type Result<T> = std::result::Result<T, EtcdError>;

/// `MemberAdd` on any member.
pub async fn member_add(cluster: &Cluster, req: MemberAddRequest) -> Result<MemberAddResponse> {
    validate_peer_urls(&req.peer_ur_ls)?;
    let local = |r| add_on_leader(cluster, r);
    route(cluster, req, local, |mut c, r| async move {
        c.member_add(r).await
    })
    .await
}

/// `MemberRemove` on any member.
pub async fn member_remove(
    cluster: &Cluster,
    req: MemberRemoveRequest,
) -> Result<MemberRemoveResponse> {
    let local = |r| remove_on_leader(cluster, r);
    route(cluster, req, local, |mut c, r| async move {
        c.member_remove(r).await
    })
    .await
}

/// `MemberUpdate` on any member.
pub async fn member_update(
    cluster: &Cluster,
    req: MemberUpdateRequest,
) -> Result<MemberUpdateResponse> {
    validate_peer_urls(&req.peer_ur_ls)?;
    let local = |r| update_on_leader(cluster, r);
    route(cluster, req, local, |mut c, r| async move {
        c.member_update(r).await
    })
    .await
}

/// `MemberPromote` on any member.
pub async fn member_promote(
    cluster: &Cluster,
    req: MemberPromoteRequest,
) -> Result<MemberPromoteResponse> {
    let local = |r| promote_on_leader(cluster, r);
    route(cluster, req, local, |mut c, r| async move {
        c.member_promote(r).await
    })
    .await
}

/// `MemberAdd` on the leader. Errors: `NotLeader` on another member; see the module table.
pub async fn add_on_leader(cluster: &Cluster, req: MemberAddRequest) -> Result<MemberAddResponse> {
    let urls = validate_peer_urls(&req.peer_ur_ls)?;
    let _serial = cluster.reconfig_lock().await;
    let membership = leader_membership(cluster)?;
    let voters: Vec<NodeId> = membership.voter_ids().collect();
    if !req.is_learner {
        let started = voters.iter().filter(|v| is_started(cluster, **v)).count();
        if !ready_to_add_voter(voters.len(), started) {
            return Err(EtcdError::MemberNotEnoughStarted);
        }
    }
    if !connected_fully(cluster, &voters) {
        return Err(EtcdError::Unhealthy);
    }
    if membership
        .nodes()
        .any(|(_, n)| n.peer_urls.iter().any(|u| urls.contains(u)))
    {
        return Err(EtcdError::PeerUrlExist);
    }
    if req.is_learner && membership.learner_ids().count() >= MAX_LEARNERS {
        return Err(EtcdError::TooManyLearners);
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let id = added_member_id(&urls, now);
    if membership.get_node(&id).is_some() {
        return Err(EtcdError::MemberExist);
    }
    let new_node = MemberNode {
        name: String::new(),
        peer_urls: urls,
    };
    tracing::info!(member_id = format!("{id:x}"), learner = req.is_learner, urls = ?new_node.peer_urls, "adding member");
    let mut after = change(
        cluster,
        ChangeMembers::AddNodes(BTreeMap::from([(id, new_node.clone())])),
    )
    .await?;
    if !req.is_learner {
        after = add_voter(cluster, id, &voters).await?;
    }
    Ok(MemberAddResponse {
        header: Some(header(cluster)),
        member: Some(to_member(
            id,
            &new_node,
            req.is_learner,
            &cluster.attributes,
        )),
        members: member_list(&after, &cluster.attributes),
    })
}

/// `MemberRemove` on the leader. Errors: `NotLeader` on another member; see the module table.
pub async fn remove_on_leader(
    cluster: &Cluster,
    req: MemberRemoveRequest,
) -> Result<MemberRemoveResponse> {
    let id = req.id;
    let _serial = cluster.reconfig_lock().await;
    let membership = leader_membership(cluster)?;
    if membership.get_node(&id).is_none() {
        return Err(EtcdError::MemberNotFound);
    }
    let is_learner = membership.learner_ids().any(|l| l == id);
    if !is_learner {
        let voters: Vec<NodeId> = membership.voter_ids().collect();
        let remaining: Vec<NodeId> = voters.iter().copied().filter(|v| *v != id).collect();
        let started = remaining
            .iter()
            .filter(|v| is_started(cluster, **v))
            .count();
        if !ready_to_remove_voter(remaining.len(), started) {
            return Err(EtcdError::MemberNotEnoughStarted);
        }
        // A member that is down is not part of the active quorum: removing it is safe.
        let down = id != cluster.id && cluster.peers.active_since(id).is_none();
        if !down {
            let since = health_since();
            let active = voters
                .iter()
                .filter(|v| **v == cluster.id || cluster.peers.connected_since(**v, since))
                .count();
            if active < 1 + 1 + (voters.len() - 1) / 2 {
                return Err(EtcdError::Unhealthy);
            }
        }
    }
    tracing::info!(
        member_id = format!("{id:x}"),
        learner = is_learner,
        "removing member"
    );
    let changes = if is_learner {
        ChangeMembers::RemoveNodes(BTreeSet::from([id]))
    } else {
        ChangeMembers::RemoveVoters(BTreeSet::from([id]))
    };
    let after = change(cluster, changes).await?;
    Ok(MemberRemoveResponse {
        header: Some(header(cluster)),
        members: member_list(&after, &cluster.attributes),
    })
}

/// `MemberUpdate` on the leader: new peer URLs for a member. Errors: `NotLeader` on another
/// member; see the module table.
pub async fn update_on_leader(
    cluster: &Cluster,
    req: MemberUpdateRequest,
) -> Result<MemberUpdateResponse> {
    let urls = validate_peer_urls(&req.peer_ur_ls)?;
    let _serial = cluster.reconfig_lock().await;
    let membership = leader_membership(cluster)?;
    let Some(current) = membership.get_node(&req.id).cloned() else {
        return Err(EtcdError::MemberNotFound);
    };
    if membership
        .nodes()
        .any(|(id, n)| *id != req.id && n.peer_urls.iter().any(|u| urls.contains(u)))
    {
        return Err(EtcdError::PeerUrlExist);
    }
    let updated = MemberNode {
        name: current.name,
        peer_urls: urls,
    };
    tracing::info!(member_id = format!("{:x}", req.id), urls = ?updated.peer_urls, "updating member");
    let after = change(
        cluster,
        ChangeMembers::SetNodes(BTreeMap::from([(req.id, updated)])),
    )
    .await?;
    Ok(MemberUpdateResponse {
        header: Some(header(cluster)),
        members: member_list(&after, &cluster.attributes),
    })
}

/// `MemberPromote` on the leader. Errors: `NotLeader` on another member; see the module
/// table.
pub async fn promote_on_leader(
    cluster: &Cluster,
    req: MemberPromoteRequest,
) -> Result<MemberPromoteResponse> {
    let id = req.id;
    let _serial = cluster.reconfig_lock().await;
    let membership = leader_membership(cluster)?;
    if membership.get_node(&id).is_none() {
        return Err(EtcdError::MemberNotFound);
    }
    if !membership.learner_ids().any(|l| l == id) {
        return Err(EtcdError::MemberNotLearner);
    }
    let (leader_index, learner_index) = {
        let m = cluster.raft.metrics();
        let m = m.borrow();
        let matched = crate::raft::peers::matched_index(&m, id).unwrap_or(0);
        (m.last_log_index.unwrap_or(0), matched)
    };
    if (learner_index as f64) < (leader_index as f64) * LEARNER_READY_PERCENT {
        return Err(EtcdError::LearnerNotReady);
    }
    let voters: Vec<NodeId> = membership.voter_ids().collect();
    let started = voters.iter().filter(|v| is_started(cluster, **v)).count();
    if !ready_to_promote(voters.len(), started) {
        return Err(EtcdError::MemberNotEnoughStarted);
    }
    tracing::info!(member_id = format!("{id:x}"), "promoting learner");
    let after = change(cluster, ChangeMembers::AddVoterIds(BTreeSet::from([id]))).await?;
    Ok(MemberPromoteResponse {
        header: Some(header(cluster)),
        members: member_list(&after, &cluster.attributes),
    })
}

/// Runs `local(req)` if this member leads, else `remote` (a `keelpb.Peer` call) with `req`
/// and the remaining request timeout against the leader; retries (until the request
/// timeout) only while no leader is known or the asked member does not lead.
async fn route<Q, T, L, LF, R, RF>(cluster: &Cluster, req: Q, local: L, remote: R) -> Result<T>
where
    Q: Clone,
    L: Fn(Q) -> LF,
    LF: Future<Output = Result<T>>,
    R: Fn(PeerRpcClient, tonic::Request<Q>) -> RF,
    RF: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
{
    let deadline = Instant::now() + cluster.timing.request_timeout;
    loop {
        let (leader, url) = leader_url(&cluster.raft);
        let attempt = match (leader, url) {
            (Some(l), _) if l == cluster.id => local(req.clone()).await,
            (Some(_), Some(url)) => match cluster.peers.client(&url) {
                Ok(client) => {
                    let timeout = deadline.saturating_duration_since(Instant::now());
                    remote(client, timed(req.clone(), timeout))
                        .await
                        .map(tonic::Response::into_inner)
                        .map_err(|s| {
                            if is_transport_failure(&s) {
                                cluster.peers.reset(&url);
                            }
                            match classify(&s) {
                                // Never sent: as good as asking while no leader is known.
                                PeerFailure::NotDelivered => EtcdError::NoLeader,
                                PeerFailure::Ambiguous => EtcdError::TimeoutDueToLeaderFail,
                                PeerFailure::Answer(e) => e,
                            }
                        })
                }
                Err(_) => Err(EtcdError::NoLeader),
            },
            _ => Err(EtcdError::NoLeader),
        };
        match attempt {
            Err(EtcdError::NotLeader | EtcdError::NoLeader)
                if Instant::now() + RETRY_PAUSE < deadline =>
            {
                let mut metrics = cluster.raft.metrics();
                let _ = tokio::time::timeout(RETRY_PAUSE, metrics.changed()).await;
            }
            other => return other,
        }
    }
}

fn timed<T>(msg: T, timeout: Duration) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(timeout);
    r
}

/// The effective membership, if this member is the leader.
fn leader_membership(cluster: &Cluster) -> Result<Membership<NodeId, MemberNode>> {
    let m = cluster.raft.metrics();
    let m = m.borrow();
    if m.current_leader != Some(cluster.id) {
        return Err(EtcdError::NotLeader);
    }
    Ok(m.membership_config.membership().clone())
}

/// etcd's `IsStarted`: the member published its name and client URLs.
fn is_started(cluster: &Cluster, id: NodeId) -> bool {
    cluster.attributes.get(id).is_some()
}

/// etcd's `isConnectedFullySince(now - HealthInterval)` over `voters` (self always counts).
fn connected_fully(cluster: &Cluster, voters: &[NodeId]) -> bool {
    let since = health_since();
    voters
        .iter()
        .all(|v| *v == cluster.id || cluster.peers.connected_since(*v, since))
}

/// `now - HEALTH_INTERVAL` (or now, in the first seconds after boot).
fn health_since() -> std::time::Instant {
    let now = std::time::Instant::now();
    now.checked_sub(HEALTH_INTERVAL).unwrap_or(now)
}

/// Proposes one membership change and returns the membership it produced. Waits (bounded)
/// while a previous change is still in progress.
async fn change(
    cluster: &Cluster,
    changes: ChangeMembers<NodeId, MemberNode>,
) -> Result<Membership<NodeId, MemberNode>> {
    change_on(&cluster.raft, cluster.timing.request_timeout, changes)
        .await
        .map(|m| m.unwrap_or_else(|| cluster.membership()))
}

/// Makes the learner `id`, just added, a voter; `old_voters` are the voters before.
///
/// Answers once the joint configuration that adds `id` is durable on a quorum of
/// `old_voters` (the leader's replication progress), or once the change completes. That is
/// when etcd answers: its single-step ConfChange commits under the old configuration. The
/// joint configuration itself commits only with a quorum of the new one too, which may
/// need `id`: a new member that has not started yet (one member adding a second, or a
/// cluster with a voter down). Waiting for that would time out (`etcdctl member add`:
/// "context deadline exceeded") though the member is added. The change therefore runs on
/// its own task, which finishes it (joint, then uniform configuration) once `id` answers,
/// whatever happens to the request.
///
/// Errors: those of [`change`]; `Timeout` if neither happens within the request timeout.
async fn add_voter(
    cluster: &Cluster,
    id: NodeId,
    old_voters: &[NodeId],
) -> Result<Membership<NodeId, MemberNode>> {
    let timeout = cluster.timing.request_timeout;
    let raft = cluster.raft.clone();
    let mut task = tokio::spawn(async move {
        let result = change_on(
            &raft,
            timeout,
            ChangeMembers::AddVoterIds(BTreeSet::from([id])),
        )
        .await;
        if let Err(e) = &result {
            tracing::warn!(member_id = format!("{id:x}"), error = %e, "promoting the added member failed");
        }
        result
    });
    let mut metrics = cluster.raft.metrics();
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(joint) = durable_on_old_quorum(&metrics.borrow(), id, old_voters) {
            return Ok(joint);
        }
        tokio::select! {
            done = &mut task => {
                let done = done.map_err(|e| EtcdError::Internal(format!("keel: member add task: {e}")))?;
                return done.map(|m| m.unwrap_or_else(|| cluster.membership()));
            }
            changed = metrics.changed() => if changed.is_err() {
                return Err(EtcdError::Stopped);
            },
            () = tokio::time::sleep_until(deadline) => return Err(EtcdError::Timeout),
        }
    }
}

/// The effective membership, if it has `id` as a voter and its log entry is durable on a
/// quorum of `old_voters` (matched log ids in the leader's replication metrics; the
/// leader's own counts once flushed).
fn durable_on_old_quorum(
    metrics: &openraft::RaftMetrics<NodeId, MemberNode>,
    id: NodeId,
    old_voters: &[NodeId],
) -> Option<Membership<NodeId, MemberNode>> {
    let stored = &metrics.membership_config;
    if !stored.membership().voter_ids().any(|v| v == id) {
        return None;
    }
    let entry = stored.log_id().as_ref()?;
    let matched = metrics.replication.as_ref()?;
    let durable = old_voters
        .iter()
        .filter(|v| matched.get(v).is_some_and(|m| m.as_ref() >= Some(entry)))
        .count();
    (durable > old_voters.len() / 2).then(|| stored.membership().clone())
}

/// `change_membership` with retries while another change is in progress, until `timeout`.
/// Returns the resulting membership, if openraft reports one.
async fn change_on(
    raft: &crate::raft::types::Raft,
    timeout: Duration,
    changes: ChangeMembers<NodeId, MemberNode>,
) -> Result<Option<Membership<NodeId, MemberNode>>> {
    let deadline = Instant::now() + timeout;
    loop {
        match raft.change_membership(changes.clone(), false).await {
            Ok(resp) => return Ok(resp.membership),
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(
                ChangeMembershipError::InProgress(_),
            ))) if Instant::now() + RETRY_PAUSE < deadline => {
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
                return Err(match e {
                    ChangeMembershipError::InProgress(_) => EtcdError::Timeout,
                    ChangeMembershipError::LearnerNotFound(_) => EtcdError::MemberNotFound,
                    ChangeMembershipError::EmptyMembership(_) => EtcdError::MemberNotEnoughStarted,
                });
            }
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => {
                return Err(EtcdError::NotLeader);
            }
            Err(RaftError::Fatal(_)) => return Err(EtcdError::Stopped),
        }
    }
}

/// The header of a Cluster RPC: cluster ID, member ID and raft term, no revision (etcd
/// `ClusterServer.header`; checked by e2e `response_shapes`).
fn header(cluster: &Cluster) -> keel_proto::etcdserverpb::ResponseHeader {
    cluster.header(0)
}

/// The etcd member list of this member's current (effective) membership.
pub fn current_members(cluster: &Cluster) -> Vec<Member> {
    member_list(&cluster.membership(), &cluster.attributes)
}
