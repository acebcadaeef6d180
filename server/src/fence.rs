//! Fencing after a disk failure (issue 18; docs/wal.md, "Disk full and I/O errors").
//!
//! A member whose WAL write or fdatasync failed, or whose backend write failed, must not go
//! on: after a failed fdatasync the kernel may have dropped the dirty pages (PostgreSQL's
//! "fsyncgate"), so a retry could report success for data that is gone. The WAL therefore
//! refuses every write from its first failure on and fails every waiter (nothing later is
//! acknowledged), and openraft stops its core on the storage error. This module notices
//! either and turns it into a stop of the process, as etcd does (`lg.Fatal` in its raft
//! loop and backend commit):
//!
//! 1. if the OS error was ENOSPC, this member raises NOSPACE for itself through the current
//!    leader (bounded by [`RAISE_FOR`]; its own raft is stopped, so it asks its peers who
//!    leads and forwards the `Alarm` request there);
//! 2. [`fenced`] resolves and `main` exits at once with status 1, without the graceful
//!    shutdown (its store flush would hit the failed disk).
//!
//! A restart runs WAL recovery (a torn tail is cut) with every acknowledged write, and the
//! member catches up from the leader. A raised NOSPACE stays until `etcdctl alarm disarm`, as
//! etcd documents for a full disk.
//!
//! Invariant: nothing is acknowledged by this member after the failure (the WAL's sticky
//! failure, `WalError::Failed`); fencing only ends a process that already stopped writing.

use std::time::Duration;

use keel_proto::etcdserverpb::alarm_request::AlarmAction;
use keel_proto::etcdserverpb::{AlarmRequest, AlarmType};
use keel_proto::keelpb::ClusterInfoRequest;
use keel_proto::keelpb::raft_request::Request as Rq;

use crate::node::Node;

/// How often the member looks for a failure.
const CHECK_EVERY: Duration = Duration::from_millis(100);
/// How long a fencing member tries to raise NOSPACE before it stops anyway.
pub const RAISE_FOR: Duration = Duration::from_secs(3);

/// Why a member fenced itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    /// The failure, in words (the WAL's first failure or openraft's fatal error).
    pub reason: String,
    /// Whether the disk was full (ENOSPC).
    pub no_space: bool,
}

/// Resolves once this member hit a WAL or backend failure (see the module docs), after it
/// tried to raise NOSPACE for an ENOSPC. Runs until then; cancel it by dropping the future.
pub async fn fenced(node: &Node) -> Fence {
    let fence = loop {
        tokio::time::sleep(CHECK_EVERY).await;
        if let Some(f) = failure(node) {
            break f;
        }
    };
    tracing::error!(reason = %fence.reason, no_space = fence.no_space, "disk failure: fencing this member");
    if fence.no_space
        && node
            .cluster
            .membership()
            .nodes()
            .any(|(id, _)| *id != node.id)
    {
        raise_nospace(node).await;
    }
    fence
}

/// The WAL's sticky failure, else openraft's fatal error (a backend write failed in apply, or
/// the log store reported one), else `None`. A deliberate shutdown is not a failure.
fn failure(node: &Node) -> Option<Fence> {
    if let Some(f) = node.wal.failure() {
        return Some(Fence {
            reason: f.reason,
            no_space: f.no_space,
        });
    }
    match &node.raft.metrics().borrow().running_state {
        Err(openraft::error::Fatal::Stopped) | Ok(()) => None,
        Err(fatal) => {
            let reason = fatal.to_string();
            // openraft keeps only the text of a storage error; the OS error's text ends with
            // `(os error N)`.
            let no_space = reason.contains(&format!("(os error {})", libc::ENOSPC));
            Some(Fence { reason, no_space })
        }
    }
}

/// Raises NOSPACE for this member through the leader its peers name, retrying until it is
/// applied or [`RAISE_FOR`] passed (a fencing leader waits for its successor).
async fn raise_nospace(node: &Node) {
    let deadline = tokio::time::Instant::now() + RAISE_FOR;
    let raise = Rq::Alarm(AlarmRequest {
        action: AlarmAction::Activate as i32,
        member_id: node.id,
        alarm: AlarmType::Nospace as i32,
    });
    while tokio::time::Instant::now() < deadline {
        if let Some(leader) = leader_named_by_peers(node).await {
            match node.forward_request(&leader, raise.clone(), deadline).await {
                Ok(_) => {
                    tracing::warn!("raised the NOSPACE alarm through the leader");
                    return;
                }
                Err(e) => tracing::warn!("raising the NOSPACE alarm: {e}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tracing::error!("could not raise the NOSPACE alarm: no leader reachable");
}

/// The peer URL of a leader other than this member that one of its peers follows.
async fn leader_named_by_peers(node: &Node) -> Option<crate::raft::types::MemberNode> {
    let membership = node.cluster.membership();
    for (id, member) in membership.nodes() {
        if *id == node.id {
            continue;
        }
        let Some(url) = member.peer_url() else {
            continue;
        };
        let Ok(mut client) = node.cluster.peers.client(url) else {
            continue;
        };
        let mut request = tonic::Request::new(ClusterInfoRequest {});
        request.set_timeout(Duration::from_secs(1));
        let Ok(info) = client.cluster_info(request).await else {
            continue;
        };
        let leader = info.into_inner().leader;
        if leader != 0 && leader != node.id {
            return membership.get_node(&leader).cloned();
        }
    }
    None
}
