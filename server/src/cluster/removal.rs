//! Cluster info for peers (`keelpb.Peer/ClusterInfo`) and detection of this member's own
//! removal, after which it stops, as etcd does ("the member has been permanently removed
//! from the cluster").
//!
//! A removed member usually never receives the entry that removes it: the leader stops
//! replicating to it. So it looks in two places, and trusts only **committed** membership
//! configs (an uncommitted one may still be truncated):
//!
//! - locally: a committed config without this member, after one that had it (member IDs are
//!   never reused, so the order proves a removal; a member catching up from the log passes
//!   through older configs without itself first, which is why having been a member is
//!   required);
//! - remotely, when it has heard from no leader for [`ORPHAN_AFTER`] election timeout (a
//!   removed learner, which never campaigns, still names its old leader): a peer that follows
//!   a leader reports a committed config, newer than this member's, without this member.

use std::time::Duration;

use keel_proto::keelpb::{ClusterInfoRequest, ClusterInfoResponse};
use openraft::Membership;

use super::Cluster;
use super::members::member_list;
use crate::raft::types::{LogId, MemberNode, NodeId};

/// How many election timeouts without a message from a leader make a member ask its peers
/// whether it was removed. One: a follower that hears nothing for that long is about to
/// campaign anyway, and the peers' answer is proof either way (a committed config), so
/// asking early costs a few RPCs per election and nothing else.
pub const ORPHAN_AFTER: u32 = 1;
/// How often the watch looks.
const CHECK_EVERY: Duration = Duration::from_millis(250);
/// Time left to in-flight responses (e.g. the `MemberRemove` reply of a leader removing
/// itself) before the member stops.
const GRACE: Duration = Duration::from_millis(500);

/// This member's committed membership config and its log id.
async fn committed_membership(
    cluster: &Cluster,
) -> Option<(Option<LogId>, Membership<NodeId, MemberNode>)> {
    cluster
        .raft
        .with_raft_state(|st| {
            let c = st.membership_state.committed();
            (*c.log_id(), c.membership().clone())
        })
        .await
        .ok()
}

/// Answers `ClusterInfo`: the cluster ID, this member's ID, its committed members and their
/// log index, and the leader it follows.
pub async fn cluster_info(cluster: &Cluster, _req: ClusterInfoRequest) -> ClusterInfoResponse {
    let (log_id, membership) = committed_membership(cluster)
        .await
        .unwrap_or_else(|| (None, cluster.membership()));
    ClusterInfoResponse {
        cluster_id: cluster.cluster_id,
        member_id: cluster.id,
        members: member_list(&membership, &cluster.attributes),
        membership_index: log_id.map_or(0, |l| l.index),
        leader: cluster.raft.metrics().borrow().current_leader.unwrap_or(0),
    }
}

/// Watches for this member's removal and resolves once it happened (after a short grace
/// period). Runs until then; cancel it by dropping the future.
pub async fn removed(cluster: &Cluster) {
    let orphan_after = cluster.timing.election_timeout * ORPHAN_AFTER;
    let mut was_member = false;
    loop {
        tokio::time::sleep(CHECK_EVERY).await;
        let Some((log_id, membership)) = committed_membership(cluster).await else {
            return std::future::pending().await;
        };
        let is_member = membership.get_node(&cluster.id).is_some();
        if is_member {
            was_member = true;
        } else if was_member && log_id.is_some() {
            tracing::warn!(
                member_id = format!("{:x}", cluster.id),
                "this member has been permanently removed from the cluster"
            );
            tokio::time::sleep(GRACE).await;
            return;
        }
        // Silence, not the metrics' `current_leader`: a learner never campaigns, so it keeps
        // naming the leader that stopped replicating to it when it was removed.
        if cluster.is_leader() || cluster.leader_contact.silence() < orphan_after {
            continue;
        }
        if removed_remotely(cluster, &membership, log_id).await {
            tracing::warn!(
                member_id = format!("{:x}", cluster.id),
                "peers report that this member has been permanently removed from the cluster"
            );
            return;
        }
    }
}

/// Asks the members of `membership` whether a newer committed config dropped this member.
async fn removed_remotely(
    cluster: &Cluster,
    membership: &Membership<NodeId, MemberNode>,
    mine: Option<LogId>,
) -> bool {
    let my_index = mine.map_or(0, |l| l.index);
    for (id, member) in membership.nodes() {
        if *id == cluster.id {
            continue;
        }
        let Some(url) = member.peer_url() else {
            continue;
        };
        let Ok(mut client) = cluster.peers.client(url) else {
            continue;
        };
        let mut request = tonic::Request::new(ClusterInfoRequest {});
        request.set_timeout(Duration::from_secs(1));
        let Ok(resp) = client.cluster_info(request).await else {
            continue;
        };
        let info = resp.into_inner();
        if info.cluster_id == cluster.cluster_id
            && info.leader != 0
            && info.membership_index > my_index
            && !info.members.iter().any(|m| m.id == cluster.id)
        {
            return true;
        }
    }
    false
}
