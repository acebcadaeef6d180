//! The voters' leader lease during a leadership transfer (Raft thesis §3.10: an election that
//! `TimeoutNow` starts disregards the lease).
//!
//! An openraft voter refuses to vote while its leader lease runs (`leader_lease`, etcd's
//! election timeout × 0.6, counted from the leader's last message). A transfer used to wait
//! the lease out with heartbeats off, 0.7 s of a ~0.75 s transfer during which the leader
//! takes no writes. Instead, the leader now asks the voters to let the lease they hold for it
//! lapse at once (`keelpb.Peer/ExpireLeaderLease`, openraft patch
//! `Trigger::expire_leader_lease`), itself included, and sends `TimeoutNow` as soon as enough
//! have done so for the target to win: a majority of the voters, the target counting for
//! itself. Should too few answer in time (a paused voter, members of 0.1.0, which do not
//! serve the call), the leader waits the lease out as before.
//!
//! Safety does not rest on the lease: votes and terms keep one leader per term. The lease only
//! keeps a member that lost touch from disrupting a working leader, and a transfer lifts it
//! for a moment on purpose, as the wait did. A voter's own election timer still runs a whole
//! election timeout after the expiry (the openraft patch backdates the lease by exactly its
//! length), so the target keeps its head start.

use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use keel_proto::keelpb::{ExpireLeaderLeaseRequest, ExpireLeaderLeaseResponse};
use tokio::time::Instant;

use super::Cluster;
use crate::raft::Peers;
use crate::raft::types::{NodeId, Raft};

/// Lets the leader lease lapse on this leader (`me`, leading in `term`) and on the other
/// voters but `target`, until a majority of the voters, `target` counted, no longer hold it;
/// gives up on the voters that did not answer within `within`.
///
/// Returns whether that majority was reached (else the caller waits the lease out).
pub async fn expire_for_transfer(
    me: NodeId,
    raft: &Raft,
    peers: &Peers,
    term: u64,
    target: NodeId,
    within: Duration,
) -> bool {
    let others: Vec<(NodeId, Option<String>)> = {
        let m = raft.metrics();
        let m = m.borrow();
        let membership = m.membership_config.membership();
        membership
            .voter_ids()
            .filter(|v| *v != me && *v != target)
            .map(|v| {
                (
                    v,
                    membership.get_node(&v).and_then(|n| n.peer_url().cloned()),
                )
            })
            .collect()
    };
    // Voters: this leader, the target and the others.
    let needed = (others.len() + 2) / 2 + 1;
    let mut expired = 1; // the target votes for itself
    if raft.trigger().expire_leader_lease(me).await.is_ok() {
        expired += 1;
    }
    let deadline = Instant::now() + within;
    let mut calls: FuturesUnordered<_> = others
        .into_iter()
        .filter_map(|(_, url)| peers.client(url.as_deref()?).ok())
        .map(|mut client| async move {
            let mut request = tonic::Request::new(ExpireLeaderLeaseRequest {
                leader_id: me,
                term,
            });
            request.set_timeout(within);
            client
                .expire_leader_lease(request)
                .await
                .is_ok_and(|r| r.into_inner().expired)
        })
        .collect();
    while expired < needed {
        match tokio::time::timeout_at(deadline, calls.next()).await {
            Ok(Some(true)) => expired += 1,
            Ok(Some(false)) => {}
            Ok(None) | Err(_) => break,
        }
    }
    expired >= needed
}

/// Handles `ExpireLeaderLease` on a voter: lets the lease it holds for the leader lapse, if
/// it follows that leader in that term.
pub async fn on_expire_leader_lease(
    cluster: &Cluster,
    req: &ExpireLeaderLeaseRequest,
) -> ExpireLeaderLeaseResponse {
    let (leader, term) = {
        let m = cluster.raft.metrics();
        let m = m.borrow();
        (m.current_leader, m.current_term)
    };
    let follows = leader == Some(req.leader_id) && term == req.term && leader != Some(cluster.id);
    // openraft checks again, against its committed vote, when it runs the command.
    let expired = follows
        && cluster
            .raft
            .trigger()
            .expire_leader_lease(req.leader_id)
            .await
            .is_ok();
    if expired {
        tracing::info!(
            leader = format!("{:x}", req.leader_id),
            term,
            "leadership transfer: leader lease expired"
        );
    }
    ExpireLeaderLeaseResponse { expired }
}
