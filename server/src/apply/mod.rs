//! The single place where committed raft entries change state.
//!
//! For each entry, apply writes the MVCC changes, the member attributes and lease changes
//! together with the consistent index in **one atomic sled batch** (DESIGN.md "Path of a
//! write", step 3): the requests of a batch entry are staged one by one (each sees the
//! previous ones' changes) and the entry's group is published once, at its end
//! (mvcc/staged.rs says why). Published groups reach sled together, in one batch whose last
//! consistent index accounts for all of them, by the store's persist policy
//! (mvcc/unpersisted.rs, etcd's backend batch transaction). Watchers hear of the entry's
//! revisions only after the flush.
//! Entries at or below the stored consistent index are skipped, so replay after a crash
//! never applies an entry twice.
//!
//! Apply results depend only on the entry and the state (never on wall-clock time, local
//! flags or which member applies), so every member computes the same store and the same
//! `HashKV`.
//!
//! Invariants, asserted (a break would apply an entry twice, skip one, or write a consistent
//! index that does not describe the store; toyDB asserts its apply index the same way):
//! - log indices strictly increase: the consistent index only moves forward
//!   ([`ConsistentIndex::precedes`], checked on every change); an entry at or below it is a
//!   replay that changes nothing, and at the applied index it must be the applied entry;
//! - a partial consistent index names the entry `applied + 1` ([`cindex::stage`]), and that
//!   entry is the next one applied (its remaining requests, not another entry's).
//!
//! [`Applier`] is the state the raft state machine drives ([`AppliedState`]): raft knows only
//! that trait, so this module sits above raft and raft never imports it.

// openraft's `StorageError` (the error type its storage traits require) is large by design;
// it only travels on the rare failure path.
#![allow(clippy::result_large_err)]

use std::io;
use std::sync::Arc;

use keel_proto::keelpb::{
    self, AuthHeader, RaftRequest, RaftResponse, ResponseBatch, raft_request, raft_response,
};
use openraft::{EntryPayload, StorageIOError, StoredMembership};

use crate::alarm::{AlarmError, Alarms};
use crate::auth::storage::StorageError as AuthStorageError;
use crate::auth::{AuthRequest, AuthState, AuthStore, TokenProvider};
use crate::backend::{Batch, LiveTree, schema};
use crate::cindex::{self, CindexError, ConsistentIndex};
use crate::error::EtcdError;
use crate::lease::record::RecordError;
use crate::lease::{ApplyOutcome, Lessor};
use crate::membership::{Attributes, MembershipError};
use crate::mvcc::{MvccError, MvccStore, SharedStore};
use crate::qos::{Admission, RuleError, RuleSet};
use crate::raft::state_machine::AppliedState;
use crate::raft::types::{Entry, LogId, MemberNode, NodeId, Response, StorageError};
use crate::version::{ClusterVersion, ClusterVersionError, Downgrade, Version, gates};
use crate::watch::WatchHub;

mod auth;
mod qos_rules;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_auth;
#[cfg(test)]
mod tests_version;

/// The applied state could not be loaded from the store: fatal, the member does not start.
/// (Not `keelpb::ApplyError`, the etcd error a response carries. Messages carry their cause;
/// none is chained as a `source`, so `{:#}` does not print it twice.)
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// sled failed.
    #[error(transparent)]
    Storage(#[from] sled::Error),
    /// The consistent index is unreadable.
    #[error(transparent)]
    Cindex(#[from] CindexError),
    /// The stored raft membership config does not decode.
    #[error("membership: {0}")]
    Membership(bincode::Error),
    /// Stored member attributes are unreadable.
    #[error(transparent)]
    Attributes(#[from] MembershipError),
    /// The MVCC store does not open.
    #[error(transparent)]
    Mvcc(#[from] MvccError),
    /// The lease records are unreadable.
    #[error(transparent)]
    Lease(#[from] RecordError),
    /// The stored QoS rule set does not decode.
    #[error("qos rules: {0}")]
    Qos(RuleError),
    /// The auth records are unreadable.
    #[error(transparent)]
    Auth(#[from] AuthStorageError),
    /// The alarm keys are unreadable.
    #[error(transparent)]
    Alarm(#[from] AlarmError),
    /// The stored cluster version is unreadable.
    #[error(transparent)]
    ClusterVersion(#[from] ClusterVersionError),
}

/// Applies committed entries to the store. Owned by the raft state machine: exactly one
/// applier runs per member, in log order.
pub struct Applier {
    /// The member tree of the current database generation (the store's: an online
    /// defragment switches both at once).
    tree: LiveTree,
    store: Arc<MvccStore>,
    /// What readers use; swapped to the new store when a snapshot is installed.
    shared: Arc<SharedStore>,
    attributes: Arc<Attributes>,
    lessor: Arc<Lessor>,
    /// The raised alarms, kept in step with the store (loaded with the applied state).
    alarms: Arc<Alarms>,
    ci: ConsistentIndex,
    membership: StoredMembership<NodeId, MemberNode>,
    /// Receives the events of every committed revision (watchers on this member), after
    /// their group is published (a watcher that catches up from the store finds them: the
    /// store persists pending groups before it reads history from sled).
    watch: Option<Arc<WatchHub>>,
    /// The QoS rules of the applied state (`qos_rule_change` entries).
    qos: qos_rules::QosRules,
    /// Users, roles, permissions and tokens: changed only here, read by the API.
    auth: Arc<AuthState>,
    /// The applied cluster version: gates every request (`version::gates`).
    cluster_version: Arc<ClusterVersion>,
    /// The applied downgrade job (its target, if enabled).
    downgrade: Arc<Downgrade>,
}

impl Applier {
    /// Loads the applied state (consistent index, membership) from `tree`, with a lessor
    /// of its own (tests and tools; a member shares its lessor through
    /// [`Applier::open_with_lessor`]).
    ///
    /// Errors: sled I/O or an undecodable stored value.
    pub fn open(
        tree: sled::Tree,
        store: Arc<MvccStore>,
        attributes: Arc<Attributes>,
    ) -> Result<Applier, ApplyError> {
        Applier::open_with_lessor(tree, store, attributes, Arc::new(Lessor::new()))
    }

    /// Loads the applied state (consistent index, membership) from `tree` and (re)loads
    /// `lessor` from the same tree and store, so it matches the consistent index.
    ///
    /// Errors: sled I/O or an undecodable stored value.
    pub fn open_with_lessor(
        tree: sled::Tree,
        store: Arc<MvccStore>,
        attributes: Arc<Attributes>,
        lessor: Arc<Lessor>,
    ) -> Result<Applier, ApplyError> {
        let (ci, membership) = load(&tree, &store, &lessor)?;
        let qos = qos_rules::QosRules::load(&tree)?;
        // No tokens until the member hands over its provider (`set_token_provider`).
        let auth = Arc::new(AuthState::new(AuthStore::load(&tree)?, TokenProvider::Nop));
        let alarms = Arc::new(Alarms::load(&tree)?);
        let cluster_version = Arc::new(ClusterVersion::load(&tree)?);
        let downgrade = Arc::new(Downgrade::load(&tree)?);
        Ok(Applier {
            tree: store.live_tree().clone(),
            shared: Arc::new(SharedStore::new(store.clone())),
            store,
            attributes,
            lessor,
            alarms,
            ci,
            membership,
            watch: None,
            qos,
            auth,
            cluster_version,
            downgrade,
        })
    }

    /// The downgrade job this applier keeps in step with the log.
    pub fn downgrade(&self) -> &Arc<Downgrade> {
        &self.downgrade
    }

    /// The cluster version this applier keeps in step with the log.
    pub fn cluster_version(&self) -> &Arc<ClusterVersion> {
        &self.cluster_version
    }

    /// Puts the applied QoS rules in force in `admission`, now and after every rule change,
    /// restart and snapshot install, and reports the applied index to its load gauge
    /// (overload protection reads the apply lag there).
    pub fn set_admission(&mut self, admission: Arc<Admission>) {
        if let Some(a) = self.ci.applied {
            admission.load().set_applied(a.index);
        }
        self.qos.set_admission(admission);
    }

    /// The QoS rules of the applied state.
    pub fn qos_rules(&self) -> &RuleSet {
        self.qos.rules()
    }

    /// Issues and judges tokens with `tokens` (the member's `--auth-token`) from now on.
    /// Call before sharing [`Applier::auth`]: the shared state is replaced.
    pub fn set_token_provider(&mut self, tokens: TokenProvider) {
        let store = self.auth.read().clone();
        self.auth = Arc::new(AuthState::new(store, tokens));
    }

    /// The auth state this applier keeps in step with the log (the API reads it).
    pub fn auth(&self) -> &Arc<AuthState> {
        &self.auth
    }

    /// The handle readers (API, watch catch-up) get the current store from; it follows a
    /// snapshot install.
    pub fn shared_store(&self) -> &Arc<SharedStore> {
        &self.shared
    }

    /// The lessor this applier keeps in step with the store.
    pub fn lessor(&self) -> &Arc<Lessor> {
        &self.lessor
    }

    /// The raised alarms this applier keeps in step with the store (Status, quota checks).
    pub fn alarms(&self) -> &Arc<Alarms> {
        &self.alarms
    }

    /// The last log entry whose every request is applied (openraft's last applied).
    pub fn last_applied(&self) -> Option<LogId> {
        self.ci.applied
    }

    /// The last applied membership config.
    pub fn membership(&self) -> &StoredMembership<NodeId, MemberNode> {
        &self.membership
    }

    /// The MVCC store this applier writes to.
    pub fn store(&self) -> &Arc<MvccStore> {
        &self.store
    }

    /// Hands the events of every committed revision to `hub` from now on.
    pub fn set_watch_hub(&mut self, hub: Arc<WatchHub>) {
        self.watch = Some(hub);
    }

    /// The watch hub this applier feeds, if any.
    pub fn watch_hub(&self) -> Option<&Arc<WatchHub>> {
        self.watch.as_ref()
    }

    /// The sled tree holding all member state (of the current database generation).
    pub fn tree(&self) -> sled::Tree {
        self.tree.tree()
    }

    /// Replaces the consistent index with `next`, which must move forward.
    fn advance(&mut self, next: ConsistentIndex) {
        assert!(
            self.ci.precedes(&next),
            "apply: the consistent index would move from {:?} to {next:?}",
            self.ci
        );
        self.ci = next;
        if let (Some(a), Some(applied)) = (self.qos.admission(), next.applied) {
            a.load().set_applied(applied.index);
        }
    }

    /// Applies one committed entry, publishes it and returns its result
    /// ([`Applier::stage`] then [`Applier::flush`]).
    ///
    /// Errors: only storage failures (sled I/O), which are fatal for the member. etcd-level
    /// failures (a compacted revision, an empty txn branch...) are results, carried in the
    /// response as `ApplyError`, and still advance the consistent index.
    pub fn apply(&mut self, entry: &Entry) -> Result<Response, StorageError> {
        let response = self.stage(entry)?;
        self.flush()?;
        Ok(response)
    }

    /// Applies one committed entry into the current apply group and returns its result.
    /// Later entries see its changes; readers, watchers and sled do not until
    /// [`Applier::flush`]. The raft state machine stages every entry openraft hands it in
    /// one call and flushes once, so the group grows when apply falls behind.
    ///
    /// Errors: as [`Applier::apply`].
    pub fn stage(&mut self, entry: &Entry) -> Result<Response, StorageError> {
        let log_id = entry.log_id;
        if self.ci.covers(log_id.index) {
            // Replay of an entry whose effects are already in the store. At the applied
            // index it must be the applied entry itself: another term there means the log
            // and the store disagree.
            if let Some(applied) = self.ci.applied.filter(|a| a.index == log_id.index) {
                assert_eq!(
                    applied, log_id,
                    "apply: the log holds {log_id} where the store applied {applied}"
                );
            }
            return Ok(Response(self.replayed()));
        }
        if let Some((partial, done)) = self.ci.partial {
            // A batch entry applied part-way must be finished before anything else.
            assert_eq!(
                partial, log_id,
                "apply: entry {log_id} arrived while {done} requests of {partial} are applied"
            );
        }
        let done = ConsistentIndex {
            applied: Some(log_id),
            partial: None,
        };
        let response = match &entry.payload {
            EntryPayload::Blank => self.commit_only(done, |_| {})?,
            EntryPayload::Membership(m) => {
                let stored = StoredMembership::new(Some(log_id), m.clone());
                let bytes =
                    bincode::serialize(&stored).map_err(|e| StorageIOError::apply(log_id, &e))?;
                let resp = self.commit_only(done, |b| b.insert(schema::RAFT_MEMBERSHIP, bytes))?;
                self.membership = stored;
                resp
            }
            EntryPayload::Normal(req) => match &req.request {
                Some(raft_request::Request::Batch(batch)) => {
                    self.apply_batch(&log_id, &batch.requests)?
                }
                other => self.apply_request(
                    other.as_ref(),
                    req.auth_header.as_ref(),
                    log_id.index,
                    done,
                )?,
            },
        };
        Ok(Response(response))
    }

    /// Publishes the staged group (its writes, consistent index included, join the store's
    /// pending sled batch, which reaches sled whole by the persist policy), then tells
    /// watchers about its revisions. A no-op when nothing is staged.
    ///
    /// Errors: sled I/O, fatal for the member (openraft stops it).
    pub fn flush(&mut self) -> Result<(), StorageError> {
        // Crash with the group's changes staged but not written with their consistent index.
        crate::failpoint::crash_point!("apply_before_cindex");
        let changes = self
            .store
            .flush()
            .map_err(|e| StorageIOError::write_state_machine(&e))?;
        if let Some(hub) = &self.watch {
            for (revision, events) in changes {
                // Never blocks: slow watchers fall behind and catch up from the store.
                hub.notify(revision, events);
            }
        }
        Ok(())
    }

    /// Applies the requests of a batch entry in order into one apply group. Each request
    /// stages the consistent index as "applied up to request k of this entry"; the last one
    /// wins in the group's batch, so the stored index says the whole entry is applied.
    /// (Stores written by Keel versions that committed each request on its own may hold a
    /// partial index: a restart then resumes at the first request not yet applied.)
    fn apply_batch(
        &mut self,
        log_id: &LogId,
        requests: &[RaftRequest],
    ) -> Result<RaftResponse, StorageError> {
        let n = requests.len() as u32;
        let already = self.ci.done_in(log_id);
        let mut responses = Vec::with_capacity(requests.len());
        for (k, req) in requests.iter().enumerate() {
            let k = k as u32;
            if k < already {
                responses.push(self.replayed());
                continue;
            }
            let next = if k + 1 == n {
                ConsistentIndex {
                    applied: Some(*log_id),
                    partial: None,
                }
            } else {
                ConsistentIndex {
                    applied: self.ci.applied,
                    partial: Some((*log_id, k + 1)),
                }
            };
            responses.push(self.apply_request(
                req.request.as_ref(),
                req.auth_header.as_ref(),
                log_id.index,
                next,
            )?);
        }
        if n == 0 {
            let done = ConsistentIndex {
                applied: Some(*log_id),
                partial: None,
            };
            self.commit_only(done, |_| {})?;
        }
        Ok(RaftResponse {
            revision: self.store.staged_revision(),
            response: Some(raft_response::Response::Batch(ResponseBatch { responses })),
        })
    }

    /// The response for work a replay skips (its proposer is gone after a restart).
    fn replayed(&self) -> RaftResponse {
        RaftResponse {
            revision: self.store.current_revision(),
            response: None,
        }
    }

    /// Applies one request of log entry `index`, proposed as `header` (none: by the server),
    /// and stages `next` as the consistent index in the same sled batch.
    fn apply_request(
        &mut self,
        req: Option<&raft_request::Request>,
        header: Option<&AuthHeader>,
        index: u64,
        next: ConsistentIndex,
    ) -> Result<RaftResponse, StorageError> {
        use raft_request::Request as Rq;
        use raft_response::Response as Rs;
        let ai = auth::authority(header);
        let denied = match (req, &ai) {
            (Some(r), Some(ai)) => {
                auth::check_request(&self.auth.read(), ai, r, &self.lessor).err()
            }
            _ => None,
        };
        let mut w = self.store.write();
        let lessor = self.lessor.clone();
        let alarms = self.alarms.clone();
        let mut lease_outcome: Option<ApplyOutcome> = None;
        let mut qos_rules: Option<RuleSet> = None;
        let mut cluster_version: Option<Version> = None;
        let mut downgrade: Option<Option<Version>> = None;
        // A request the applied cluster version does not allow is refused first: the value
        // is replicated, so an entry proposed while the version was changing is refused (or
        // applied) alike on every member. Then, an active alarm refuses writes before they touch anything (etcd's capped and
        // corrupt appliers, which wrap the auth applier); the alarm set is replicated, so
        // every member refuses alike. Then the permission check of the entry's header.
        let gated = req.and_then(|r| gates::check(self.cluster_version.get(), r).err());
        let refused = gated
            .map(EtcdError::from)
            .or_else(|| req.and_then(|r| alarms.refusal(r)));
        let outcome: Result<Option<Rs>, EtcdError> = if let Some(e) = refused {
            Err(e)
        } else if let Some(e) = denied {
            Err(e.into())
        } else {
            match req {
                Some(Rq::Put(r)) => lessor
                    .check_put(r)
                    .and_then(|()| w.put(r))
                    .map(|x| Some(Rs::Put(x))),
                Some(Rq::DeleteRange(r)) => w.delete_range(r).map(|x| Some(Rs::DeleteRange(x))),
                Some(Rq::Txn(r)) => w
                    .txn_with_lease_check(r, &|id| lessor.contains(id))
                    .map(|x| Some(Rs::Txn(x))),
                Some(Rq::Compaction(r)) => w.compact(r.revision).map(|x| Some(Rs::Compaction(x))),
                Some(Rq::MemberAttributes(a)) => {
                    Attributes::stage(w.batch_mut(), a);
                    Ok(None)
                }
                Some(Rq::Alarm(a)) => Ok(Some(Rs::Alarm(alarms.apply(w.batch_mut(), a)))),
                Some(Rq::ClusterVersionSet(c)) => c
                    .version
                    .parse::<Version>()
                    .map_err(|e| EtcdError::InvalidArgument(e.to_string()))
                    .map(|v| {
                        // Only ever raised (a stale leader's lower value changes nothing),
                        // except to the target of an enabled downgrade; every member holds
                        // the same values here, so all skip alike.
                        let lowering_to_target = self.downgrade.target() == Some(v);
                        if lowering_to_target
                            || self.cluster_version.decided().is_none_or(|c| v >= c)
                        {
                            ClusterVersion::stage(w.batch_mut(), v);
                            cluster_version = Some(v);
                        }
                        None
                    }),
                Some(
                    r @ (Rq::LeaseGrant(_)
                    | Rq::LeaseRevoke(_)
                    | Rq::LeaseCheckpoint(_)
                    | Rq::LeaseExpire(_)),
                ) => lessor.apply_request(&mut w, r).map(|(resp, changed)| {
                    lease_outcome = Some(changed);
                    Some(resp)
                }),
                Some(Rq::QosRuleChange(c)) => {
                    self.qos.stage(w.batch_mut(), &c.change).map(|next| {
                        let version = next.version();
                        qos_rules = Some(next);
                        Some(Rs::QosRuleChange(keelpb::QosRuleChangeResponse { version }))
                    })
                }
                Some(Rq::DowngradeInfoSet(d)) => {
                    let target = if d.enabled {
                        d.version
                            .parse::<Version>()
                            .map(Some)
                            .map_err(|e| EtcdError::InvalidArgument(e.to_string()))
                    } else {
                        Ok(None)
                    };
                    target.map(|t| {
                        Downgrade::stage(w.batch_mut(), t);
                        downgrade = Some(t);
                        None
                    })
                }
                Some(Rq::Batch(_)) => Err(EtcdError::Internal(
                    "keel: nested request batches are not allowed".into(),
                )),
                Some(other) => match AuthRequest::from_raft(other) {
                    Some(a) => auth::apply_entry(&self.auth, ai.as_ref(), index, &a, w.batch_mut())
                        .map(Some)
                        .map_err(EtcdError::from),
                    None => Err(EtcdError::Internal(format!(
                        "keel: no apply rule for {other:?}"
                    ))),
                },
                None => Ok(None),
            }
        };
        match outcome {
            Ok(response) => {
                cindex::stage(w.batch_mut(), &next);
                lessor.publish(lease_outcome, w.events());
                let revision = w.stage();
                self.advance(next);
                if let Some(rules) = qos_rules {
                    self.qos.publish(rules);
                }
                if let Some(t) = downgrade {
                    tracing::info!(target = ?t.map(|v| v.to_string()), index, "downgrade job set");
                    self.downgrade.publish(t);
                }
                if let Some(v) = cluster_version {
                    tracing::info!(cluster_version = %v, index, "cluster version set");
                    self.cluster_version.publish(v);
                }
                if let Some(Rq::MemberAttributes(a)) = req {
                    self.attributes.publish(a.clone());
                }
                Ok(RaftResponse { revision, response })
            }
            Err(e) => {
                // Nothing of the failed request is written; it still counts as applied.
                drop(w);
                let error = Rs::Error(keelpb::ApplyError {
                    code: e.code() as i32,
                    message: e.to_string(),
                });
                let mut resp = self.commit_only(next, |_| {})?;
                resp.response = Some(error);
                Ok(resp)
            }
        }
    }

    /// Stages only the consistent index `next` plus `extra` writes.
    fn commit_only(
        &mut self,
        next: ConsistentIndex,
        extra: impl FnOnce(&mut Batch),
    ) -> Result<RaftResponse, StorageError> {
        let mut w = self.store.write();
        extra(w.batch_mut());
        cindex::stage(w.batch_mut(), &next);
        let revision = w.stage();
        self.advance(next);
        Ok(RaftResponse {
            revision,
            response: None,
        })
    }
}

/// Loads the applied state from `tree`: the consistent index, the last applied raft
/// membership config, and the lessor's leases (so they match the consistent index).
fn load(
    tree: &sled::Tree,
    store: &MvccStore,
    lessor: &Lessor,
) -> Result<(ConsistentIndex, StoredMembership<NodeId, MemberNode>), ApplyError> {
    let ci = cindex::load(tree)?;
    let membership = match tree.get(schema::RAFT_MEMBERSHIP)? {
        Some(v) => bincode::deserialize(&v).map_err(ApplyError::Membership)?,
        None => StoredMembership::default(),
    };
    lessor.load(tree, store.leased_keys())?;
    Ok((ci, membership))
}

impl AppliedState for Applier {
    fn last_applied(&self) -> Option<LogId> {
        Applier::last_applied(self)
    }

    fn membership(&self) -> &StoredMembership<NodeId, MemberNode> {
        Applier::membership(self)
    }

    fn stage(&mut self, entry: &Entry) -> Result<Response, StorageError> {
        Applier::stage(self, entry)
    }

    fn flush(&mut self) -> Result<(), StorageError> {
        Applier::flush(self)
    }

    fn persist(&mut self) -> io::Result<()> {
        self.store.persist().map_err(io::Error::other)
    }

    fn tree(&self) -> sled::Tree {
        self.tree.tree()
    }

    fn revision(&self) -> i64 {
        self.store.current_revision()
    }

    fn begin_install(&mut self) {
        if let Some(hub) = &self.watch {
            // History reads from here on would see a half-replaced store.
            hub.begin_install();
        }
    }

    /// Reopens the MVCC store on the replaced tree, publishes the attributes of the
    /// snapshot's members, reloads the lessor and the applied state, and points readers and
    /// watchers at the new store.
    fn finish_install(&mut self, members: &StoredMembership<NodeId, MemberNode>) -> io::Result<()> {
        let store = Arc::new(MvccStore::open_live(self.tree.clone()).map_err(io::Error::other)?);
        let tree = self.tree.tree();
        let attributes = Attributes::load(&tree).map_err(io::Error::other)?;
        for id in members.membership().nodes().map(|(id, _)| *id) {
            if let Some(a) = attributes.get(id) {
                self.attributes.publish(a);
            }
        }
        let (ci, membership) = load(&tree, &store, &self.lessor).map_err(io::Error::other)?;
        // The permission cache is rebuilt from the snapshot's users and roles (etcd #14571).
        self.auth
            .replace(AuthStore::load(&tree).map_err(io::Error::other)?);
        self.alarms.reload(&tree).map_err(io::Error::other)?;
        self.cluster_version
            .reload(&tree)
            .map_err(io::Error::other)?;
        self.downgrade.reload(&tree).map_err(io::Error::other)?;
        // A snapshot may move the applied state anywhere (usually ahead): not an advance.
        self.ci = ci;
        self.membership = membership;
        self.qos.reload(&tree).map_err(io::Error::other)?;
        if let (Some(a), Some(applied)) = (self.qos.admission(), ci.applied) {
            a.load().set_applied(applied.index);
        }
        // The bytes in use count from the last scan plus what apply inserted since; an
        // install replaced the tree under both, so it is measured again (one more walk of a
        // tree the install just wrote whole).
        self.tree.measure_in_use().map_err(io::Error::other)?;
        // The new store hashes its compactions if the old one did (compact-hash check), and
        // batches its sled writes as the old one did.
        store.set_compact_hashing(self.store.compact_hashing());
        store
            .set_persist_policy(self.store.persist_policy())
            .map_err(io::Error::other)?;
        self.store = store.clone();
        self.shared.set(store);
        if let Some(hub) = &self.watch {
            // Every watcher catches up from the new store (or is canceled as compacted).
            hub.finish_install();
        }
        Ok(())
    }
}
