//! The voters' leader lease during a leadership transfer (Raft thesis §3.10: an election that
//! `TimeoutNow` starts disregards the lease).
//!
//! An openraft voter refuses to vote while its leader lease runs (`leader_lease`, etcd's
//! election timeout × 0.6, counted from the leader's last message). A transfer used to wait
//! the lease out with heartbeats off: 0.7 s of a ~0.75 s transfer, during which the leader
//! takes no writes. Instead, the leader now asks the voters to waive the lease they hold for
//! it (`keelpb.Peer/WaiveLeaderLease`, openraft patch `Trigger::waive_leader_lease`), itself
//! included, and sends `TimeoutNow` as soon as enough have done so for the target to win: a
//! majority of the voters, the target counting for itself. Should too few answer in time (a
//! paused voter, members of 0.1.0, which do not serve the call), the leader waits the lease
//! out as before.
//!
//! A waiver is not an expiry: it lifts the lease for vote requests only, for the voter's
//! `election_timeout_min`, and only while the voter's vote is still the leader's. An
//! AppendEntries that arrives after it (replication goes on while heartbeats are off) does
//! not undo it, and the voter's own election timer still counts from the leader's last
//! message, so a transfer that fails does not make the followers campaign early. (A first
//! form backdated the lease instead: late AppendEntries renewed it on some voters, and 1 in
//! 25–40 transfers under load with five members failed, followed by elections 0.45–0.65 s
//! later; found by a fresh-user check.)
//!
//! Safety does not rest on the lease: votes and terms keep one leader per term. The lease only
//! keeps a member that lost touch from disrupting a working leader, and a transfer lifts it
//! for a moment on purpose, as the wait did.

use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use keel_proto::keelpb::{WaiveLeaderLeaseRequest, WaiveLeaderLeaseResponse};
use tokio::time::Instant;

use super::Cluster;
use crate::raft::Peers;
use crate::raft::types::{NodeId, Raft};

/// Has this leader (`me`, leading in `term`) and the other voters but `target` waive the
/// leader lease for `waiver` (this member) or their own `election_timeout_min` (the others),
/// until a majority of the voters, `target` counted, has; gives up on the voters that did not
/// answer within `within`.
///
/// Returns whether that majority was reached (else the caller waits the lease out).
pub async fn waive_for_transfer(
    me: NodeId,
    raft: &Raft,
    peers: &Peers,
    term: u64,
    target: NodeId,
    within: Duration,
    waiver: Duration,
) -> bool {
    let others: Vec<Option<String>> = {
        let m = raft.metrics();
        let m = m.borrow();
        let membership = m.membership_config.membership();
        membership
            .voter_ids()
            .filter(|v| *v != me && *v != target)
            .map(|v| membership.get_node(&v).and_then(|n| n.peer_url().cloned()))
            .collect()
    };
    // Voters: this leader, the target and the others.
    let needed = (others.len() + 2) / 2 + 1;
    let mut waived = 1; // the target votes for itself
    if raft.trigger().waive_leader_lease(me, waiver).await.is_ok() {
        waived += 1;
    }
    let deadline = Instant::now() + within;
    let mut calls: FuturesUnordered<_> = others
        .into_iter()
        .filter_map(|url| peers.client(url.as_deref()?).ok())
        .map(|mut client| async move {
            let mut request = tonic::Request::new(WaiveLeaderLeaseRequest {
                leader_id: me,
                term,
            });
            request.set_timeout(within);
            client
                .waive_leader_lease(request)
                .await
                .is_ok_and(|r| r.into_inner().waived)
        })
        .collect();
    while waived < needed {
        match tokio::time::timeout_at(deadline, calls.next()).await {
            Ok(Some(true)) => waived += 1,
            Ok(Some(false)) => {}
            Ok(None) | Err(_) => break,
        }
    }
    waived >= needed
}

/// Handles `WaiveLeaderLease` on a voter: waives the lease it holds for the leader, for its
/// `election_timeout_min`, if it follows that leader in that term.
pub async fn on_waive_leader_lease(
    cluster: &Cluster,
    req: &WaiveLeaderLeaseRequest,
) -> WaiveLeaderLeaseResponse {
    let (leader, term) = {
        let m = cluster.raft.metrics();
        let m = m.borrow();
        (m.current_leader, m.current_term)
    };
    let follows = leader == Some(req.leader_id) && term == req.term && leader != Some(cluster.id);
    let within = Duration::from_millis(cluster.timing.raft.election_timeout_min);
    // openraft checks again, against its committed vote, when it runs the command.
    let waived = follows
        && cluster
            .raft
            .trigger()
            .waive_leader_lease(req.leader_id, within)
            .await
            .is_ok();
    if waived {
        tracing::info!(
            leader = format!("{:x}", req.leader_id),
            term,
            "leadership transfer: leader lease waived"
        );
    }
    WaiveLeaderLeaseResponse { waived }
}
