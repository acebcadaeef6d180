//! Corruption checks (etcd `server/etcdserver/corrupt.go`; issue 15 part 5): compare this
//! member's HashKV with every other member's at the same revision.
//!
//! HashKV at a revision depends only on the applied history up to it (docs/mvcc.md), so two
//! members that applied the same log agree at every revision both still hold. A peer whose
//! hash at our revision differs while its compact revision equals ours holds different data:
//! one of the two is corrupt. Different compact revisions prove nothing (etcd's rule), and a
//! peer that cannot answer (down, or the revision compacted there) is skipped.
//!
//! - periodic (`--experimental-corrupt-check-time`): the leader runs [`find_mismatches`] and
//!   raises CORRUPT for each follower that differs (node.rs proposes the alarm);
//! - initial (`--experimental-initial-corrupt-check`): a starting member runs it and refuses
//!   to serve when any peer differs;
//! - compact-hash (`--experimental-compact-hash-check-enabled`): [`super::compact_hash`],
//!   on the hashes kept at compaction revisions, over the same peer RPC ([`peer_hashes`]).

use std::time::Duration;

use keel_proto::etcdserverpb::{HashKvRequest, HashKvResponse};

use super::Cluster;
use crate::error::EtcdError;
use crate::mvcc::HashKv;
use crate::raft::types::NodeId;

/// How long the initial check waits for each peer: a peer that is down must not hold a
/// restarting member back for etcd's whole request timeout.
pub const INITIAL_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// A peer whose hash differs from this member's at the same revision and compact revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// The peer's member ID.
    pub member: NodeId,
    /// The revision both hashed.
    pub revision: i64,
    /// This member's hash.
    pub local: u32,
    /// The peer's hash.
    pub peer: u32,
}

/// This member's HashKV at its current revision (off the async runtime: it walks the store).
///
/// Errors: `Internal` on storage failure.
pub async fn local_hash(cluster: &Cluster) -> Result<HashKv, EtcdError> {
    let store = cluster.store.get();
    tokio::task::spawn_blocking(move || store.hash_kv(0))
        .await
        .map_err(|e| EtcdError::Internal(format!("hash task: {e}")))?
}

/// Asks every other member of the raft membership for its HashKV at `local.hash_revision`
/// (all at once, each bounded by `timeout`) and returns those that differ. Unreachable peers and
/// peers that compacted past the revision are skipped (logged).
pub async fn find_mismatches(
    cluster: &Cluster,
    local: &HashKv,
    timeout: Duration,
) -> Vec<Mismatch> {
    let mut found = Vec::new();
    for (id, answer) in peer_hashes(cluster, local.hash_revision, timeout).await {
        match answer {
            Ok(peer) => found.extend(compare(id, local, &peer)),
            Err(why) => {
                tracing::warn!(peer = %format!("{id:x}"), error = %why, "corruption check: cannot get the peer's hash; skipped")
            }
        }
    }
    found
}

/// Every other member's answer to `keelpb.Peer/HashKv` at `revision` (all asked at once, each
/// bounded by `timeout`), or why there is none (unreachable, timed out, the revision
/// compacted there). A peer answers from its compaction hashes when it keeps one for
/// `revision` (`MvccStore::hash_at_compaction`).
pub async fn peer_hashes(
    cluster: &Cluster,
    revision: i64,
    timeout: Duration,
) -> Vec<(NodeId, Result<HashKvResponse, String>)> {
    let membership = cluster.membership();
    let asks = membership
        .nodes()
        .filter(|(id, _)| **id != cluster.id)
        .filter_map(|(id, node)| Some((*id, node.peer_url()?.clone())))
        .map(|(id, url)| async move {
            let answer = match cluster.peers.client(&url) {
                Ok(mut c) => {
                    let call = c.hash_kv(HashKvRequest { revision });
                    match tokio::time::timeout(timeout, call).await {
                        Ok(Ok(r)) => Ok(r.into_inner()),
                        Ok(Err(s)) => Err(s.message().to_string()),
                        Err(_) => Err("timed out".to_string()),
                    }
                }
                Err(e) => Err(e.to_string()),
            };
            (id, answer)
        });
    futures::future::join_all(asks).await
}

/// etcd's rule: a mismatch only when both compact revisions are equal.
fn compare(member: NodeId, local: &HashKv, peer: &HashKvResponse) -> Option<Mismatch> {
    (peer.compact_revision == local.compact_revision && peer.hash != local.hash).then_some(
        Mismatch {
            member,
            revision: local.hash_revision,
            local: local.hash,
            peer: peer.hash,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local() -> HashKv {
        HashKv {
            hash: 7,
            compact_revision: 3,
            hash_revision: 10,
            current_revision: 10,
        }
    }

    fn peer(hash: u32, compact_revision: i64) -> HashKvResponse {
        HashKvResponse {
            hash,
            compact_revision,
            ..Default::default()
        }
    }

    #[test]
    fn only_a_different_hash_at_the_same_compact_revision_is_a_mismatch() {
        assert_eq!(compare(2, &local(), &peer(7, 3)), None);
        assert_eq!(compare(2, &local(), &peer(8, 5)), None, "compacted further");
        assert_eq!(
            compare(2, &local(), &peer(8, 3)),
            Some(Mismatch {
                member: 2,
                revision: 10,
                local: 7,
                peer: 8
            })
        );
    }
}
