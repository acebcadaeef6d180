//! [`Lessor`]: the lease state every member holds (etcd `lease.lessor`), changed only by
//! apply, plus the leader-only [`Primary`] schedule inside it.
//!
//! Invariants:
//! - `leases` is exactly the set of `l` records in the store (apply stages each change in
//!   the entry's batch and publishes it here only after the batch committed).
//! - `owners[key] == id` iff `key ∈ leases[id].keys` iff the key exists in the MVCC store
//!   with `lease == id` at the current revision.
//! - `primary` is `Some` only between [`Lessor::promote`] and [`Lessor::demote`] (the
//!   member is leader), and then schedules exactly the leases of `leases`.
//!
//! Locking: one `std::sync::Mutex`, held only for in-memory work (never across I/O or an
//! `.await`). The applier is the only writer of `leases`/`owners`; keepalives and the
//! leader loop touch only `primary`.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use keel_proto::etcdserverpb::{DeleteRangeRequest, LeaseCheckpoint, LeaseGrantRequest};
use keel_proto::mvccpb::{Event, event::EventType};
use tokio::sync::{Notify, watch};

use super::primary::{Primary, PrimaryConfig, PrimaryRenewal};
use super::record::{self, LeaseRecord};
use super::{LeaseId, MAX_LEASE_TTL, NO_LEASE};
use crate::error::EtcdError;
use crate::mvcc::WriteTxn;

/// One lease as every member knows it.
#[derive(Debug, Default)]
struct Lease {
    ttl: i64,
    remaining_ttl: i64,
    /// Attached keys, in key order (revocation deletes them in this order, as etcd does).
    keys: BTreeSet<Arc<[u8]>>,
}

#[derive(Debug, Default)]
struct State {
    leases: HashMap<LeaseId, Lease>,
    owners: HashMap<Arc<[u8]>, LeaseId>,
    primary: Option<Primary>,
}

/// What one applied lease request changed; handed back to [`Lessor::publish`] once the
/// entry's batch committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApplyOutcome {
    /// A lease was granted.
    Granted(LeaseRecord),
    /// These leases were revoked (their keys are deleted in the same batch).
    Revoked(Vec<LeaseId>),
    /// These leases got a new remaining TTL.
    Checkpointed(Vec<LeaseRecord>),
}

/// A lease as `LeaseTimeToLive` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseInfo {
    /// Lease ID.
    pub id: LeaseId,
    /// Granted TTL in seconds.
    pub ttl: i64,
    /// Attached keys in key order (empty unless asked for).
    pub keys: Vec<Vec<u8>>,
}

/// The outcome of a keepalive on this member ([`Lessor::renew`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// Renewed for `ttl` seconds. If `clear_checkpoint`, the lease carries a checkpointed
    /// remaining TTL that a new leader would use: the caller must commit a checkpoint with
    /// remaining 0 before acknowledging (etcd `Renew`), or the lease could expire early
    /// after a leader change.
    Renewed {
        /// The lease's granted TTL in seconds.
        ttl: i64,
        /// Whether a clearing checkpoint must be committed first.
        clear_checkpoint: bool,
    },
    /// No such lease.
    NotFound,
    /// The lease expired and its revocation is pending: wait for it (see
    /// [`Lessor::changes`]) and answer "not found".
    Expired,
    /// This member holds no expiry schedule (it is not the leader, or not yet).
    NotPrimary,
}

/// The outcome of [`Lessor::remaining`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remaining {
    /// Whole seconds left.
    Secs(i64),
    /// No such lease.
    NotFound,
    /// This member holds no expiry schedule.
    NotPrimary,
}

/// The lease state of one member. See the module docs.
pub struct Lessor {
    state: Mutex<State>,
    /// Bumped after every applied revocation and on promote/demote: keepalives waiting for
    /// an expired lease's revocation (or for promotion) wake on it.
    changes: watch::Sender<u64>,
    /// Wakes the leader loop when a lease is scheduled earlier than everything else.
    wake: Notify,
}

impl Default for Lessor {
    fn default() -> Lessor {
        Lessor::new()
    }
}

impl Lessor {
    /// An empty lessor; [`Lessor::load`] fills it from a store.
    pub fn new() -> Lessor {
        Lessor {
            state: Mutex::new(State::default()),
            changes: watch::channel(0).0,
            wake: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("lessor lock")
    }

    /// (Re)loads the lease state: records from the `l` keys of `tree`, attachments from
    /// `leased_keys` = every live `(key, lease)` of the MVCC store (etcd `lessor.Recover`).
    /// Called at start-up and after a snapshot is installed. If this member is leader, its
    /// schedule is rebuilt for the new set of leases.
    ///
    /// Errors: sled I/O or an undecodable record ([`record::RecordError`]). A key attached to
    /// an unknown lease is logged and skipped (etcd does the same).
    pub fn load(
        &self,
        tree: &sled::Tree,
        leased_keys: Vec<(Vec<u8>, LeaseId)>,
    ) -> Result<(), record::RecordError> {
        let mut leases: HashMap<LeaseId, Lease> = record::load_all(tree)?
            .into_iter()
            .map(|r| {
                let lease = Lease {
                    ttl: r.ttl,
                    remaining_ttl: r.remaining_ttl,
                    keys: BTreeSet::new(),
                };
                (r.id, lease)
            })
            .collect();
        let mut owners = HashMap::new();
        for (key, id) in leased_keys {
            let key: Arc<[u8]> = key.into();
            match leases.get_mut(&id) {
                Some(l) => {
                    l.keys.insert(key.clone());
                    owners.insert(key, id);
                }
                None => {
                    tracing::warn!(lease = id, key = %key.escape_ascii(), "key attached to an unknown lease")
                }
            }
        }
        let mut st = self.lock();
        st.leases = leases;
        st.owners = owners;
        if let Some(p) = st.primary.take() {
            let config = p.config().clone();
            st.primary = Some(Self::schedule(&st.leases, config, Instant::now()));
        }
        drop(st);
        self.bump();
        Ok(())
    }

    fn schedule(leases: &HashMap<LeaseId, Lease>, config: PrimaryConfig, now: Instant) -> Primary {
        Primary::promote(
            config,
            leases.iter().map(|(id, l)| (*id, l.ttl, l.remaining_ttl)),
            now,
        )
    }

    fn bump(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    // ---------------------------------------------------------------- reads (any member)

    /// Whether lease `id` exists (applied grant, no applied revocation).
    pub fn contains(&self, id: LeaseId) -> bool {
        self.lock().leases.contains_key(&id)
    }

    /// Lease `id` with its keys (if `with_keys`), or `None`.
    pub fn info(&self, id: LeaseId, with_keys: bool) -> Option<LeaseInfo> {
        let st = self.lock();
        st.leases.get(&id).map(|l| LeaseInfo {
            id,
            ttl: l.ttl,
            keys: if with_keys {
                l.keys.iter().map(|k| k.to_vec()).collect()
            } else {
                Vec::new()
            },
        })
    }

    /// All lease IDs, in ascending order.
    pub fn ids(&self) -> Vec<LeaseId> {
        let mut ids: Vec<_> = self.lock().leases.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Number of leases.
    pub fn len(&self) -> usize {
        self.lock().leases.len()
    }

    /// True when there is no lease.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The lease `key` is attached to, if any.
    pub fn owner(&self, key: &[u8]) -> Option<LeaseId> {
        self.lock().owners.get(key).copied()
    }

    /// A receiver that changes after every applied revocation and on promote/demote.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    // ---------------------------------------------------------------- apply (every member)

    /// Applies a `LeaseGrant` (etcd `lessor.Grant`): stages the record into `w`'s batch.
    /// The TTL is taken as proposed: the proposer already raised it to the minimum TTL, so
    /// the result does not depend on this member's flags.
    ///
    /// Errors: ID 0 → `LeaseNotFound` (etcd), TTL above [`MAX_LEASE_TTL`] →
    /// `LeaseTtlTooLarge`, an existing ID → `LeaseExist`. Nothing is staged on error.
    pub fn apply_grant(
        &self,
        w: &mut WriteTxn<'_>,
        req: &LeaseGrantRequest,
    ) -> Result<ApplyOutcome, EtcdError> {
        if req.id == NO_LEASE {
            return Err(EtcdError::LeaseNotFound);
        }
        if req.ttl > MAX_LEASE_TTL {
            return Err(EtcdError::LeaseTtlTooLarge);
        }
        if self.contains(req.id) {
            return Err(EtcdError::LeaseExist);
        }
        let r = LeaseRecord {
            id: req.id,
            ttl: req.ttl,
            remaining_ttl: 0,
        };
        record::stage_put(w.batch_mut(), &r);
        Ok(ApplyOutcome::Granted(r))
    }

    /// Applies a revocation of `ids` (etcd `lessor.Revoke`): deletes every attached key
    /// through `w` (one revision for the whole entry, one delete event per key, keys in
    /// order) and stages the removal of the records.
    ///
    /// With `missing_is_error` (a client's `LeaseRevoke`) an unknown ID fails the request
    /// with `LeaseNotFound` and nothing is staged; without it (a leader's `LeaseExpire`
    /// batch, which may race with a client's revoke) unknown IDs are skipped.
    ///
    /// Errors: `LeaseNotFound` as above; `Internal` on a storage failure while deleting.
    pub fn apply_revoke(
        &self,
        w: &mut WriteTxn<'_>,
        ids: &[LeaseId],
        missing_is_error: bool,
    ) -> Result<ApplyOutcome, EtcdError> {
        let mut seen = HashSet::with_capacity(ids.len());
        let mut keys: Vec<Arc<[u8]>> = Vec::new();
        let mut revoked = Vec::with_capacity(ids.len());
        {
            let st = self.lock();
            for &id in ids {
                match st.leases.get(&id) {
                    Some(l) if seen.insert(id) => {
                        keys.extend(l.keys.iter().cloned());
                        revoked.push(id);
                    }
                    Some(_) => {}
                    None if missing_is_error => return Err(EtcdError::LeaseNotFound),
                    None => {}
                }
            }
        }
        for key in &keys {
            let req = DeleteRangeRequest {
                key: key.to_vec(),
                ..Default::default()
            };
            let resp = w.delete_range(&req)?;
            debug_assert_eq!(resp.deleted, 1, "an attached key exists in the store");
        }
        for &id in &revoked {
            record::stage_remove(w.batch_mut(), id);
        }
        Ok(ApplyOutcome::Revoked(revoked))
    }

    /// Applies a `LeaseCheckpoint` batch (etcd `lessor.Checkpoint`): records each existing
    /// lease's remaining TTL (unknown leases are skipped: they were revoked meanwhile).
    pub fn apply_checkpoint(
        &self,
        w: &mut WriteTxn<'_>,
        checkpoints: &[LeaseCheckpoint],
    ) -> ApplyOutcome {
        let st = self.lock();
        let mut changed = Vec::with_capacity(checkpoints.len());
        for cp in checkpoints {
            if let Some(l) = st.leases.get(&cp.id) {
                let r = LeaseRecord {
                    id: cp.id,
                    ttl: l.ttl,
                    remaining_ttl: cp.remaining_ttl.max(0),
                };
                record::stage_put(w.batch_mut(), &r);
                changed.push(r);
            }
        }
        ApplyOutcome::Checkpointed(changed)
    }

    /// Publishes a committed entry: its lease outcome, then the key attachments implied by
    /// its MVCC `events` (a PUT moves the key to `kv.lease`, a DELETE detaches it).
    pub fn publish(&self, outcome: Option<ApplyOutcome>, events: &[Event]) {
        let now = Instant::now();
        let mut st = self.lock();
        let mut revoked_any = false;
        let mut wake = false;
        match outcome {
            Some(ApplyOutcome::Granted(r)) => {
                let lease = Lease {
                    ttl: r.ttl,
                    remaining_ttl: r.remaining_ttl,
                    keys: BTreeSet::new(),
                };
                st.leases.insert(r.id, lease);
                if let Some(p) = st.primary.as_mut() {
                    let before = p.next_due();
                    p.granted(r.id, r.ttl, now);
                    wake = p.next_due() != before;
                }
            }
            Some(ApplyOutcome::Revoked(ids)) => {
                for id in ids {
                    if let Some(l) = st.leases.remove(&id) {
                        for k in &l.keys {
                            st.owners.remove(k);
                        }
                    }
                    if let Some(p) = st.primary.as_mut() {
                        p.revoked(id);
                    }
                    revoked_any = true;
                }
                shrink_if_sparse(&mut st.leases);
                shrink_if_sparse(&mut st.owners);
            }
            Some(ApplyOutcome::Checkpointed(records)) => {
                for r in records {
                    if let Some(l) = st.leases.get_mut(&r.id) {
                        l.remaining_ttl = r.remaining_ttl;
                    }
                    if let Some(p) = st.primary.as_mut() {
                        p.checkpointed(r.id, r.ttl, r.remaining_ttl, now);
                    }
                }
            }
            None => {}
        }
        if !events.is_empty() {
            Self::attach_from_events(&mut st, events);
        }
        drop(st);
        if revoked_any {
            self.bump();
        }
        if wake {
            self.wake.notify_one();
        }
    }

    fn attach_from_events(st: &mut State, events: &[Event]) {
        for ev in events {
            let Some(kv) = &ev.kv else { continue };
            let new_owner = if ev.r#type == EventType::Put as i32 {
                kv.lease
            } else {
                NO_LEASE
            };
            let old_owner = st
                .owners
                .get(kv.key.as_slice())
                .copied()
                .unwrap_or(NO_LEASE);
            if old_owner == new_owner {
                continue;
            }
            let key: Arc<[u8]> = match st.owners.remove_entry(kv.key.as_slice()) {
                Some((k, _)) => k,
                None => kv.key.as_slice().into(),
            };
            if let Some(l) = st.leases.get_mut(&old_owner) {
                l.keys.remove(&key);
            }
            if new_owner != NO_LEASE {
                match st.leases.get_mut(&new_owner) {
                    Some(l) => {
                        l.keys.insert(key.clone());
                        st.owners.insert(key, new_owner);
                    }
                    // Apply checks leases before writing; reaching this is a bug upstream.
                    None => {
                        tracing::error!(lease = new_owner, "put attached a key to an unknown lease")
                    }
                }
            }
        }
    }

    // ---------------------------------------------------------------- leader only

    /// Builds the expiry schedule: this member became leader and applied every entry of
    /// earlier terms. Idempotent.
    pub fn promote(&self, config: PrimaryConfig) {
        let mut st = self.lock();
        if st.primary.is_none() {
            st.primary = Some(Self::schedule(&st.leases, config, Instant::now()));
        }
        drop(st);
        self.bump();
        self.wake.notify_one();
    }

    /// Drops the expiry schedule (step-down). Pending keepalives wake and are answered
    /// "not leader" by their caller.
    pub fn demote(&self) {
        let dropped = self.lock().primary.take();
        drop(dropped);
        self.bump();
    }

    /// Whether this member holds the expiry schedule.
    pub fn is_primary(&self) -> bool {
        self.lock().primary.is_some()
    }

    /// A keepalive of lease `id` on this member (etcd `lessor.Renew`).
    pub fn renew(&self, id: LeaseId) -> Renewal {
        let mut st = self.lock();
        let State {
            leases, primary, ..
        } = &mut *st;
        let Some(p) = primary.as_mut() else {
            return Renewal::NotPrimary;
        };
        let Some(l) = leases.get(&id) else {
            return Renewal::NotFound;
        };
        match p.renew(id, l.ttl, Instant::now()) {
            PrimaryRenewal::Expired => Renewal::Expired,
            PrimaryRenewal::Renewed => Renewal::Renewed {
                ttl: l.ttl,
                clear_checkpoint: l.remaining_ttl > 0 && p.config().checkpoint_interval.is_some(),
            },
        }
    }

    /// Whole seconds until `id` expires, from the leader's schedule (etcd
    /// `Lease.Remaining`, rounded down).
    pub fn remaining(&self, id: LeaseId) -> Remaining {
        let st = self.lock();
        let Some(p) = st.primary.as_ref() else {
            return Remaining::NotPrimary;
        };
        match st.leases.get(&id) {
            None => Remaining::NotFound,
            Some(l) => Remaining::Secs(p.remaining(id, Instant::now()).unwrap_or(l.ttl)),
        }
    }

    /// Leader loop: takes up to `max` expired leases to revoke (empty if not primary).
    pub fn take_expired(&self, max: usize) -> Vec<LeaseId> {
        let mut st = self.lock();
        st.primary
            .as_mut()
            .map_or_else(Vec::new, |p| p.take_expired(Instant::now(), max))
    }

    /// Leader loop: takes up to `max` due checkpoints (empty if not primary).
    pub fn take_checkpoints(&self, max: usize) -> Vec<LeaseCheckpoint> {
        let mut st = self.lock();
        let Some(p) = st.primary.as_mut() else {
            return Vec::new();
        };
        p.take_checkpoints(Instant::now(), max)
            .into_iter()
            .map(|(id, remaining_ttl)| LeaseCheckpoint { id, remaining_ttl })
            .collect()
    }

    /// Leader loop: when the next expiry or checkpoint is due, and when the next expiry
    /// alone is due.
    pub fn next_due(&self) -> (Option<Instant>, Option<Instant>) {
        let st = self.lock();
        st.primary
            .as_ref()
            .map_or((None, None), |p| (p.next_due(), p.next_expiry()))
    }

    /// Leader loop: resolves when a lease was scheduled earlier than all others, or on
    /// promotion.
    pub async fn woken(&self) {
        self.wake.notified().await
    }

    /// Sizes for tests and memory reports.
    pub fn stats(&self) -> LessorStats {
        let st = self.lock();
        let primary = st.primary.as_ref().map(|p| p.stats());
        LessorStats {
            leases: st.leases.len(),
            attached_keys: st.owners.len(),
            slots: st.leases.capacity() + st.owners.capacity(),
            primary_expiry: primary.map(|s| s.0),
            primary_checkpoints: primary.map(|s| s.1),
            primary_revoking: primary.map(|s| s.2),
            primary_heap_bytes: primary.map(|s| s.3),
        }
    }
}

/// Gives memory back after a storm: a map below a quarter of its capacity shrinks, so the
/// lessor's memory follows the live leases, not the peak.
fn shrink_if_sparse<K: std::hash::Hash + Eq, V>(map: &mut HashMap<K, V>) {
    const MIN_CAPACITY: usize = 1024;
    if map.capacity() >= MIN_CAPACITY && map.len() < map.capacity() / 4 {
        map.shrink_to(map.len() * 2);
    }
}

/// Sizes of a lessor ([`Lessor::stats`]). The `primary_*` fields are `None` on a member
/// that holds no expiry schedule (every follower).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LessorStats {
    /// Live leases.
    pub leases: usize,
    /// Keys attached to them.
    pub attached_keys: usize,
    /// Allocated slots of the lease and attachment maps (capacity, not length): what the
    /// maps hold on to after a storm.
    pub slots: usize,
    /// Scheduled expiries (leader only).
    pub primary_expiry: Option<usize>,
    /// Scheduled checkpoints (leader only).
    pub primary_checkpoints: Option<usize>,
    /// Revocations in flight (leader only).
    pub primary_revoking: Option<usize>,
    /// Bytes held by the leader's heaps.
    pub primary_heap_bytes: Option<usize>,
}
