//! The compact-hash corruption check (etcd 3.5 `--experimental-compact-hash-check-enabled`,
//! `corruptionChecker.CompactHashCheck` in `server/etcdserver/corrupt.go`; issue 15 part 5c).
//!
//! Every member with the check on keeps HashKV at its last [`crate::mvcc::COMPACT_HASHES_KEPT`]
//! compaction revisions (`MvccStore::set_compact_hashing`; `mvcc/compactor.rs` says why they
//! are computed in the background and kept in memory rather than written with the
//! compaction). Every `--experimental-compact-hash-check-time` the leader takes its hashes
//! newer than the last revision it checked, newest first, and for each asks every peer for
//! its hash at that revision over the peer HashKv RPC (a peer answers from its own kept
//! hashes, or computes the hash while it still holds the revision):
//!
//! - every peer answers with the leader's hash: the cluster is consistent up to that
//!   revision; it is remembered as checked and the round ends;
//! - some hashes differ: the members outside the majority hash (counting the leader) are
//!   corrupt and the node raises CORRUPT for each; with no majority it cannot tell which and
//!   raises CORRUPT for member 0 (etcd's rule); the round ends;
//! - some peers could not answer (down, or the revision is neither kept nor held there): the
//!   revision is skipped and the next older hash is tried.
//!
//! Unlike etcd, answers are not required to carry the leader's compact revision: etcd's hash
//! covers the revisions between the previous compaction and this one, so it only compares
//! equal ranges, while Keel's HashKV at a revision depends on nothing but the history up to
//! it (`mvcc/hash.rs`); a peer's answer counts when it is for the asked revision.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{Cluster, corrupt};
use crate::mvcc::CompactHash;
use crate::raft::types::NodeId;

/// One peer's answer at a compaction revision: its hash, or `None` when it could not tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAnswer {
    /// The peer's member ID.
    pub member: NodeId,
    /// The peer's hash at the asked revision.
    pub hash: Option<u32>,
}

/// What one revision's answers say (etcd `checkPeerHashes`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every peer answered with the leader's hash.
    Consistent,
    /// The hashes that answered agree, but some peers did not answer: try an older revision.
    Incomplete {
        /// Peers that answered.
        checked: usize,
    },
    /// Hashes differ. `corrupt` lists the members to raise CORRUPT for: those outside the
    /// majority hash, or `[0]` when no hash has a majority of the members.
    Mismatch {
        /// Members to raise CORRUPT for (0 = the cluster, etcd's unknown member).
        corrupt: Vec<NodeId>,
        /// Every hash seen, with the members that reported it (the leader included).
        hashes: BTreeMap<u32, Vec<NodeId>>,
    },
}

/// Judges the answers of every peer (`answers`, one per other member) at `leader_hash`'s
/// revision against the leader's own hash.
pub fn judge(leader: NodeId, leader_hash: &CompactHash, answers: &[PeerAnswer]) -> Verdict {
    let mut hashes: BTreeMap<u32, Vec<NodeId>> = BTreeMap::new();
    hashes.entry(leader_hash.hash).or_default().push(leader);
    let mut checked = 0;
    for a in answers {
        if let Some(h) = a.hash {
            checked += 1;
            hashes.entry(h).or_default().push(a.member);
        }
    }
    if hashes.len() == 1 {
        return if checked == answers.len() {
            Verdict::Consistent
        } else {
            Verdict::Incomplete { checked }
        };
    }
    // etcd: the majority of all members (answering or not) is trusted.
    let members = answers.len() + 1;
    let quorum = members / 2 + 1;
    let majority = hashes
        .iter()
        .find(|(_, members)| members.len() >= quorum)
        .map(|(h, _)| *h);
    let corrupt = match majority {
        Some(good) => hashes
            .iter()
            .filter(|(h, _)| **h != good)
            .flat_map(|(_, members)| members.iter().copied())
            .collect(),
        None => vec![0],
    };
    Verdict::Mismatch { corrupt, hashes }
}

/// The leader's check state: the newest revision found consistent on the whole cluster
/// (etcd's `latestRevisionChecked`).
#[derive(Debug, Default)]
pub struct Checker {
    latest_checked: i64,
}

impl Checker {
    /// One round of the check (module docs) on the leader; returns the members to raise
    /// CORRUPT for (empty when nothing was found). Peers are asked with `timeout` each.
    pub async fn check(&mut self, cluster: &Cluster, timeout: Duration) -> Vec<NodeId> {
        let hashes: Vec<CompactHash> = cluster
            .store
            .get()
            .compact_hashes()
            .into_iter()
            .filter(|h| h.revision > self.latest_checked)
            .collect();
        tracing::info!(
            local_member_id = %format!("{:x}", cluster.id),
            timeout = ?timeout,
            "starting compact hash check"
        );
        for (i, h) in hashes.iter().enumerate() {
            let answers: Vec<PeerAnswer> = corrupt::peer_hashes(cluster, h.revision, timeout)
                .await
                .into_iter()
                .map(|(member, answer)| {
                    let hash = match answer {
                        Ok(r) if r.hash_revision == h.revision => Some(r.hash),
                        Ok(r) => {
                            skipped(member, &format!("hashed revision {}", r.hash_revision));
                            None
                        }
                        Err(why) => {
                            skipped(member, &why);
                            None
                        }
                    };
                    PeerAnswer { member, hash }
                })
                .collect();
            if answers.is_empty() {
                continue;
            }
            match judge(cluster.id, h, &answers) {
                Verdict::Consistent => {
                    tracing::info!(
                        number_of_peers_checked = answers.len(),
                        revision = h.revision,
                        "successfully checked hash on whole cluster"
                    );
                    self.latest_checked = self.latest_checked.max(h.revision);
                    tracing::info!(
                        number_of_hashes_checked = i + 1,
                        "finished compaction hash check"
                    );
                    return Vec::new();
                }
                Verdict::Incomplete { checked } => tracing::warn!(
                    number_of_peers_checked = checked,
                    number_of_peers = answers.len(),
                    revision = h.revision,
                    "skipped revision in compaction hash check; was not able to check all peers"
                ),
                Verdict::Mismatch { corrupt, hashes } => {
                    for (hash, members) in &hashes {
                        let members: Vec<String> =
                            members.iter().map(|m| format!("{m:x}")).collect();
                        tracing::error!(
                            leader_id = %format!("{:x}", cluster.id),
                            leader_revision = h.revision,
                            leader_hash = h.hash,
                            peer_hash = hash,
                            peer_member_ids = ?members,
                            "Detected compaction hash mismatch"
                        );
                    }
                    return corrupt;
                }
            }
        }
        tracing::info!(
            number_of_hashes_checked = hashes.len(),
            "finished compaction hash check"
        );
        Vec::new()
    }
}

fn skipped(member: NodeId, reason: &str) {
    tracing::warn!(peer_id = %format!("{member:x}"), reason, "Skipped peer's hash");
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEADER: NodeId = 1;

    fn at(hash: u32) -> CompactHash {
        CompactHash { revision: 10, hash }
    }

    fn peer(member: NodeId, hash: Option<u32>) -> PeerAnswer {
        PeerAnswer { member, hash }
    }

    #[test]
    fn every_peer_with_the_leaders_hash_is_consistent() {
        let answers = [peer(2, Some(7)), peer(3, Some(7))];
        assert_eq!(judge(LEADER, &at(7), &answers), Verdict::Consistent);
    }

    #[test]
    fn a_peer_that_cannot_answer_makes_the_revision_incomplete() {
        let answers = [peer(2, Some(7)), peer(3, None)];
        assert_eq!(
            judge(LEADER, &at(7), &answers),
            Verdict::Incomplete { checked: 1 }
        );
    }

    #[test]
    fn the_member_outside_the_majority_is_corrupt() {
        let answers = [peer(2, Some(7)), peer(3, Some(9))];
        let Verdict::Mismatch { corrupt, hashes } = judge(LEADER, &at(7), &answers) else {
            panic!("a mismatch")
        };
        assert_eq!(corrupt, [3]);
        assert_eq!(hashes[&7], [1, 2]);
        assert_eq!(hashes[&9], [3]);
        // The leader itself can be the odd one out.
        let answers = [peer(2, Some(9)), peer(3, Some(9))];
        assert!(matches!(
            judge(LEADER, &at(7), &answers),
            Verdict::Mismatch { corrupt, .. } if corrupt == [LEADER]
        ));
        // A silent peer adds no hash, but the majority is of all members: 3 of 5 agreeing
        // (the leader and two peers) names the odd one.
        let answers = [
            peer(2, Some(9)),
            peer(3, None),
            peer(4, Some(7)),
            peer(5, Some(7)),
        ];
        assert!(matches!(
            judge(LEADER, &at(7), &answers),
            Verdict::Mismatch { corrupt, .. } if corrupt == [2]
        ));
    }

    #[test]
    fn without_a_majority_member_zero_is_raised() {
        // 2 members: 1 vs 1. 3 members: three different hashes.
        assert!(matches!(
            judge(LEADER, &at(7), &[peer(2, Some(9))]),
            Verdict::Mismatch { corrupt, .. } if corrupt == [0]
        ));
        assert!(matches!(
            judge(LEADER, &at(7), &[peer(2, Some(8)), peer(3, Some(9))]),
            Verdict::Mismatch { corrupt, .. } if corrupt == [0]
        ));
        // Compare: 5 members, two peers agree with the leader, one silent: a majority.
        let answers = [
            peer(2, Some(7)),
            peer(3, Some(7)),
            peer(4, Some(9)),
            peer(5, None),
        ];
        assert!(matches!(
            judge(LEADER, &at(7), &answers),
            Verdict::Mismatch { corrupt, .. } if corrupt == [4]
        ));
        // 5 members, 2 vs 2 with one silent: no majority.
        let answers = [
            peer(2, Some(7)),
            peer(3, Some(9)),
            peer(4, Some(9)),
            peer(5, None),
        ];
        assert!(matches!(
            judge(LEADER, &at(7), &answers),
            Verdict::Mismatch { corrupt, .. } if corrupt == [0]
        ));
    }
}
