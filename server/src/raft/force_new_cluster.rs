//! `--force-new-cluster`: restart a member as a one-member cluster that keeps all its data,
//! its cluster ID and its member ID (etcd `restartAsStandaloneNode`, etcd
//! `server/etcdserver/raft.go`), after the rest of the cluster is lost.
//!
//! Runs on the WAL before openraft starts. It saves a vote for itself in a new term, then
//! appends one membership entry of that term whose only voter is this member (its node record
//! kept as it was), and waits until both are fdatasync'ed. openraft then loads that
//! entry as the effective membership (the last membership entry in the log wins), the member
//! is the only voter, elects itself, and commits the entry with its first blank entry, which
//! also stores the one-member list in the applied state (the `MemberList` source).
//!
//! Difference from etcd, on purpose: etcd discards the entries after its persisted commit
//! index. Keel's committed log id is a hint written without waiting (`log_store.rs`), and a
//! follower learns the commit index one heartbeat after the leader acknowledged a write, so
//! entries above it may be acknowledged writes; Keel keeps them and the new term commits them
//! (Raft §5.4.2: a leader commits earlier terms' entries with one of its own).
//!
//! Invariants: the new entry's log id is above every entry in the log, its term is above the
//! stored vote and the last entry's term (so the log stays ordered by leader id), and nothing
//! already in the log is changed.

use std::collections::{BTreeMap, BTreeSet};

use openraft::{CommittedLeaderId, EntryPayload, Membership, StoredMembership, Vote};

use super::log_store::{META_PURGED, META_VOTE};
use super::types::{Entry, LogId, MemberNode, NodeId};
use crate::wal::{Wal, WalError};

/// Why the log could not be rewritten.
#[derive(Debug, thiserror::Error)]
pub enum ForceNewClusterError {
    /// The WAL failed.
    #[error("force-new-cluster: {0}")]
    Wal(#[from] WalError),
    /// A stored entry or metadata value does not decode.
    #[error("force-new-cluster: cannot decode the raft log: {0}")]
    Decode(#[from] bincode::Error),
    /// The member's effective membership does not list it (it was removed, or never joined).
    #[error("force-new-cluster: member {0:x} is not in its own membership config")]
    NotAMember(NodeId),
}

/// What [`force_new_cluster`] did, for the start-up log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forced {
    /// The membership entry written (`None`: the member already was the only voter).
    pub entry: Option<LogId>,
    /// Members removed from the configuration (voters and learners).
    pub removed: Vec<NodeId>,
    /// Index of the last entry before the rewrite (0: empty log).
    pub last_index: u64,
}

/// Makes `id` the only voter of the raft log in `wal` (see the module docs). `applied` is the
/// membership of the applied state, used when the log holds no later membership entry.
///
/// Errors: WAL I/O, undecodable entries, or `id` missing from the effective membership.
pub fn force_new_cluster(
    wal: &Wal,
    id: NodeId,
    applied: &StoredMembership<NodeId, MemberNode>,
) -> Result<Forced, ForceNewClusterError> {
    let last = last_entry(wal)?;
    let effective = match last_membership_in_log(wal)? {
        Some(m) => m,
        None => applied.membership().clone(),
    };
    if last.is_none() && effective.nodes().next().is_none() {
        // A new data dir: nothing to recover, the start bootstraps as usual (etcd applies the
        // flag only when a WAL exists).
        return Ok(Forced {
            entry: None,
            removed: Vec::new(),
            last_index: 0,
        });
    }
    let me = effective
        .get_node(&id)
        .cloned()
        .ok_or(ForceNewClusterError::NotAMember(id))?;
    let removed: Vec<NodeId> = effective
        .nodes()
        .map(|(n, _)| *n)
        .filter(|n| *n != id)
        .collect();
    let last_index = last.map_or(0, |l| l.index);
    let voters: Vec<NodeId> = effective.voter_ids().collect();
    if removed.is_empty() && voters == [id] {
        return Ok(Forced {
            entry: None,
            removed,
            last_index,
        });
    }

    let vote: Vote<NodeId> = match wal.meta(META_VOTE) {
        Some(b) => bincode::deserialize(&b)?,
        None => Vote::default(),
    };
    let term = vote
        .leader_id
        .term
        .max(last.map_or(0, |l| l.leader_id.term))
        + 1;
    let log_id = LogId::new(CommittedLeaderId::new(term, id), next_index(wal, last)?);
    let entry = Entry {
        log_id,
        payload: EntryPayload::Membership(Membership::new(
            vec![BTreeSet::from([id])],
            BTreeMap::from([(id, me)]),
        )),
    };
    let bytes = bincode::serialize(&entry)?;
    // The vote first (voted for itself in the new term; its election then wins alone): a crash
    // between the two writes leaves either a higher vote alone, and a rerun picks a higher
    // term, or both. Never an entry above the vote's term.
    wal.set_meta(META_VOTE, &bincode::serialize(&Vote::new(term, id))?)?;
    let lsn = wal.append(&[(log_id.index, bytes.as_slice())])?;
    // Lsns become durable in order: this covers the vote too.
    wal.wait_durable(lsn)?;
    Ok(Forced {
        entry: Some(log_id),
        removed,
        last_index,
    })
}

/// The log id of the last entry, or the purge point when the log holds none.
fn last_entry(wal: &Wal) -> Result<Option<LogId>, ForceNewClusterError> {
    if let Some(i) = wal.last_index()
        && let Some(bytes) = wal.read(i)?
    {
        return Ok(Some(bincode::deserialize::<Entry>(&bytes)?.log_id));
    }
    purged(wal)
}

fn purged(wal: &Wal) -> Result<Option<LogId>, ForceNewClusterError> {
    Ok(match wal.meta(META_PURGED) {
        Some(b) => Some(bincode::deserialize(&b)?),
        None => None,
    })
}

/// The index the new entry gets: after the last entry or the purge point (openraft's first
/// entry has index 0).
fn next_index(wal: &Wal, last: Option<LogId>) -> Result<u64, ForceNewClusterError> {
    Ok(match (wal.last_index(), last) {
        (Some(i), _) => i + 1,
        (None, Some(p)) => p.index + 1,
        (None, None) => 0,
    })
}

/// The newest membership entry still in the log, scanning back 64 entries at a time.
fn last_membership_in_log(
    wal: &Wal,
) -> Result<Option<Membership<NodeId, MemberNode>>, ForceNewClusterError> {
    let (Some(first), Some(last)) = (wal.first_index(), wal.last_index()) else {
        return Ok(None);
    };
    let mut end = last + 1;
    while end > first {
        let start = end.saturating_sub(64).max(first);
        for (_, bytes) in wal.read_range(start, end)?.iter().rev() {
            if let EntryPayload::Membership(m) = bincode::deserialize::<Entry>(bytes)?.payload {
                return Ok(Some(m));
            }
        }
        end = start;
    }
    Ok(None)
}

/// [`force_new_cluster`] at start-up, logged as etcd logs it ("forcing restart member").
///
/// Errors: as [`force_new_cluster`].
pub fn restart_as_standalone(
    wal: &Wal,
    id: NodeId,
    cluster_id: u64,
    applied: &StoredMembership<NodeId, MemberNode>,
) -> Result<Forced, ForceNewClusterError> {
    let forced = tokio::task::block_in_place(|| force_new_cluster(wal, id, applied))?;
    let committed: Option<Option<LogId>> = wal
        .meta(super::log_store::META_COMMITTED)
        .map(|b| bincode::deserialize(&b))
        .transpose()?;
    let removed: Vec<String> = forced.removed.iter().map(|m| format!("{m:x}")).collect();
    if forced.entry.is_none() {
        tracing::info!(
            local_member_id = %format!("{id:x}"),
            last_index = forced.last_index,
            "--force-new-cluster: nothing to change (a new data dir, or already the only member)"
        );
    } else {
        tracing::info!(
            cluster_id = %format!("{cluster_id:x}"),
            local_member_id = %format!("{id:x}"),
            commit_index = committed.flatten().map_or(0, |c| c.index),
            last_index = forced.last_index,
            removed_members = ?removed,
            new_term = forced.entry.map_or(0, |l| l.leader_id.term),
            membership_index = forced.entry.map_or(0, |l| l.index),
            "forcing restart member"
        );
    }
    tracing::warn!(
        "--force-new-cluster is set: remove it once the cluster is recovered, or every later \
         start removes the members added since"
    );
    Ok(forced)
}
