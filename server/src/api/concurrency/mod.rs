//! What the Lock and Election services are built on: etcd's `client/v3/concurrency` package
//! (sessions, the `<name>/<lease hex>` keys, waiting for the deletion of older keys), run
//! inside the member.
//!
//! etcd's `v3lock` and `v3election` servers run that client package on an in-process client
//! carrying the caller's context. Keel does the same: every read and write goes through
//! the member's own KV and Lease services with the caller's metadata ([`caller::Caller`]), so
//! it gets the same validation, QoS admission, quota and permission checks as a client's
//! own Txn or Range (READ and WRITE on the lock keys, etcd's behaviour). Waiting uses the
//! member's watch hub directly ([`wait`]); the Range that precedes each wait already checked
//! READ on the prefix the watched keys are in.
//!
//! Invariants:
//! - a lock or election key is `<name>/` followed by the owner's lease ID in lowercase hex
//!   (Go's `%x`), so one lease holds at most one key per name;
//! - the owner is the key with the lowest create revision under `<name>/`;
//! - unlike etcd (#11456), Lock and Campaign answer success only after a linearizable read
//!   showed the caller's own key still there with the create revision and lease it was
//!   created with ([`wait::recheck`]); otherwise they answer [`ConcurrencyError::SessionExpired`].

pub mod caller;
pub mod ops;
pub mod wait;

use keel_proto::etcdserverpb::{
    RangeRequest,
    range_request::{SortOrder, SortTarget},
};
use tonic::{Code, Status};

/// TTL in seconds of the lease a Lock or Campaign without a lease gets (etcd
/// `concurrency.defaultSessionTTL`). Nobody keeps it alive: the server orphans the session,
/// as etcd's does, so such a lock silently expires after this long.
pub const SESSION_TTL: i64 = 60;

/// Lease ID meaning "no lease": Lock and Campaign grant a [`SESSION_TTL`] lease for it
/// (etcd `clientv3.NoLease`).
pub const NO_LEASE: i64 = 0;

/// Errors of the concurrency recipes that are not etcd server errors. etcd returns them as
/// plain Go errors, which gRPC sends with code `Unknown` and the error's text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConcurrencyError {
    /// The caller's key (or its lease) vanished while it waited: etcd 3.5's
    /// `concurrency.ErrSessionExpired`, which Keel also answers for Campaign.
    #[error("mutex: session is expired")]
    SessionExpired,
    /// Proclaim on a key that no longer has the leader's create revision (etcd
    /// `concurrency.ErrElectionNotLeader`).
    #[error("election: not leader")]
    NotLeader,
    /// Leader on an election without candidates (etcd `concurrency.ErrElectionNoLeader`).
    #[error("election: no leader")]
    NoLeader,
    /// Proclaim or Resign without `leader` (etcd `v3election.ErrMissingLeaderKey`).
    #[error("\"leader\" field must be provided")]
    MissingLeaderKey,
    /// A watch ended without the event it waited for (etcd `waitDelete`).
    #[error("lost watcher waiting for delete")]
    LostWatcher,
}

impl From<ConcurrencyError> for Status {
    fn from(e: ConcurrencyError) -> Status {
        Status::new(Code::Unknown, e.to_string())
    }
}

/// `<name>/`: the prefix every key of the lock or election `name` lives under (etcd
/// `NewMutex`, `NewElection`).
pub fn prefix_of(name: &[u8]) -> Vec<u8> {
    let mut prefix = name.to_vec();
    prefix.push(b'/');
    prefix
}

/// The key `lease` owns under `prefix`: `<prefix><lease in lowercase hex>` (etcd
/// `fmt.Sprintf("%s%x", pfx, lease)`).
pub fn owner_key(prefix: &[u8], lease: i64) -> Vec<u8> {
    let mut key = prefix.to_vec();
    key.extend_from_slice(format!("{lease:x}").as_bytes());
    key
}

/// The end of the range of keys starting with `prefix` (etcd `GetPrefixRangeEnd`): the
/// last byte below 0xff incremented, what follows it cut; `"\0"` (every key) if none is.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    match prefix.iter().rposition(|&b| b < 0xff) {
        Some(i) => {
            let mut end = prefix[..=i].to_vec();
            end[i] += 1;
            end
        }
        None => vec![0],
    }
}

/// The oldest key under `prefix`: the owner (etcd `WithFirstCreate`: prefix, sorted by
/// create revision ascending, limit 1).
pub fn first_created(prefix: &[u8]) -> RangeRequest {
    RangeRequest {
        key: prefix.to_vec(),
        range_end: prefix_end(prefix),
        sort_target: SortTarget::Create as i32,
        sort_order: SortOrder::Ascend as i32,
        limit: 1,
        ..Default::default()
    }
}

/// The newest key under `prefix` created at or before `max_create_revision` (etcd
/// `WithLastCreate` + `WithMaxCreateRev`): the one a waiter waits for next.
pub fn last_created_before(prefix: &[u8], max_create_revision: i64) -> RangeRequest {
    RangeRequest {
        sort_order: SortOrder::Descend as i32,
        max_create_revision,
        ..first_created(prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_name_slash_lease_hex() {
        assert_eq!(prefix_of(b"L"), b"L/");
        assert_eq!(
            owner_key(b"L/", 0x694d_7a1b_2c3d_4e5f),
            b"L/694d7a1b2c3d4e5f"
        );
        assert_eq!(owner_key(b"E/", 10), b"E/a");
    }

    #[test]
    fn prefix_end_is_etcds() {
        assert_eq!(prefix_end(b"L/"), b"L0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"\0");
    }

    #[test]
    fn errors_are_unknown_with_etcds_texts() {
        let s: Status = ConcurrencyError::SessionExpired.into();
        assert_eq!(s.code(), Code::Unknown);
        assert_eq!(s.message(), "mutex: session is expired");
        let s: Status = ConcurrencyError::MissingLeaderKey.into();
        assert_eq!(s.message(), "\"leader\" field must be provided");
    }
}
