//! [`WriteTxn`]: the changes of one committed raft entry (etcd's `storeTxnWrite`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use keel_proto::etcdserverpb::{
    DeleteRangeRequest, DeleteRangeResponse, PutRequest, PutResponse, RangeRequest, RangeResponse,
    ResponseHeader, TxnRequest, TxnResponse,
};
use keel_proto::mvccpb::event::EventType;
use keel_proto::mvccpb::{Event, KeyValue};

use super::codec;
use super::compactor::Job;
use super::index::{Index, KeyRange};
use super::key_index::RevInfo;
use super::range::{ReadView, ValueSource};
use super::revision::{Revision, record_key};
use super::store::{MvccStore, View};
use super::{MvccError, txn};
use crate::backend::{Batch, schema};
use crate::error::EtcdError;

/// What one committed entry did to the store.
#[derive(Debug, Clone, PartialEq)]
pub struct Committed {
    /// Store revision after the entry (unchanged if the entry changed no key).
    pub revision: i64,
    /// The changes in order, for watchers: a PUT event carries the new `KeyValue`; a DELETE
    /// event carries `{key, mod_revision = deletion revision}` (etcd). `prev_kv` is unset.
    pub events: Vec<Event>,
}

/// The write view of one raft entry.
///
/// Every write through one `WriteTxn` gets main revision `current + 1` and sub revisions
/// 0, 1, 2, ... in call order (etcd's write txn); reads through it see its own earlier
/// writes, and those of the txns staged before it in the same apply group. Nothing reaches
/// sled or readers until the group is flushed: [`WriteTxn::stage`] adds the txn to the group
/// (MVCC records, MVCC meta, and whatever other modules put in [`WriteTxn::batch_mut`]),
/// [`MvccStore::flush`] publishes the whole group (its sled writes join the store's pending
/// batch, see unpersisted.rs); [`WriteTxn::commit`] does both. Dropping a `WriteTxn` without staging it discards
/// everything it did.
pub struct WriteTxn<'a> {
    store: &'a MvccStore,
    /// The view this txn starts from: the last staged txn's, or the published one.
    base: Arc<View>,
    /// Revision of the published view: records above it are staged, not published.
    published_rev: i64,
    /// `base` is the apply group's staged view, which this txn holds exclusively.
    from_staged: bool,
    /// Set by [`WriteTxn::stage`]; `Drop` handles a txn that was not staged.
    staged: bool,
    /// Copy-on-write working index; `None` until the first change.
    index: Option<Index>,
    compact_rev: i64,
    compacted: bool,
    /// Removals of this txn's compaction left for the background compactor.
    compaction_job: Option<Job>,
    batch: Batch,
    /// One event per change; `events[sub]` is the change with sub revision `sub`.
    events: Vec<Event>,
}

impl<'a> WriteTxn<'a> {
    pub(super) fn begin(
        store: &'a MvccStore,
        base: Arc<View>,
        published_rev: i64,
        from_staged: bool,
    ) -> WriteTxn<'a> {
        WriteTxn {
            store,
            compact_rev: base.compact_rev,
            base,
            published_rev,
            from_staged,
            staged: false,
            index: None,
            compacted: false,
            compaction_job: None,
            batch: Batch::default(),
            events: Vec::new(),
        }
    }

    /// Store revision before this entry.
    fn begin_rev(&self) -> i64 {
        self.base.rev
    }

    /// The revision this txn's reads see: `begin + 1` once it changed something.
    pub(super) fn view_rev(&self) -> i64 {
        self.begin_rev() + i64::from(!self.events.is_empty())
    }

    fn index(&self) -> &Index {
        self.index.as_ref().unwrap_or(&self.base.index)
    }

    fn index_mut(&mut self) -> &mut Index {
        if self.index.is_none() {
            let owned = if self.from_staged {
                // Nobody else holds a staged view: take its index and change it in place.
                Arc::get_mut(&mut self.base).map(|v| std::mem::take(&mut v.index))
            } else {
                None
            };
            self.index = Some(owned.unwrap_or_else(|| self.base.index.clone()));
        }
        self.index.as_mut().expect("set above")
    }

    pub(super) fn read_view(&self) -> ReadView<'_> {
        ReadView {
            index: self.index(),
            rev: self.view_rev(),
            compact_rev: self.compact_rev,
            values: self,
        }
    }

    /// A range read that sees this txn's earlier writes (etcd `storeTxnWrite.Range`).
    /// Header revision: `current + 1` once this txn changed something, else `current`.
    ///
    /// Errors: as [`MvccStore::range`].
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse, EtcdError> {
        self.read_view().range(req)
    }

    /// etcd `Put` (applierV3backend.Put): writes `key` with a new revision; `prev_kv`
    /// returns the previous pair; `ignore_value` / `ignore_lease` keep the current value /
    /// lease. The lease id is stored as given: the caller checks that it exists
    /// (`LeaseNotFound`) before calling, as etcd's applier does.
    ///
    /// Errors: `EmptyKey` (the API rejects it before proposing; checked again here because a
    /// record with an empty key could not be rebuilt); `KeyNotFound` when `ignore_value` or
    /// `ignore_lease` is set and the key does not exist; `Internal` on storage failure.
    pub fn put(&mut self, req: &PutRequest) -> Result<PutResponse, EtcdError> {
        if req.key.is_empty() {
            return Err(EtcdError::EmptyKey);
        }
        let prev = if req.prev_kv || req.ignore_value || req.ignore_lease {
            self.current_kv(&req.key)?
        } else {
            None
        };
        if (req.ignore_value || req.ignore_lease) && prev.is_none() {
            return Err(EtcdError::KeyNotFound);
        }
        let value = match (&prev, req.ignore_value) {
            (Some(p), true) => p.value.clone(),
            _ => req.value.clone(),
        };
        let lease = match (&prev, req.ignore_lease) {
            (Some(p), true) => p.lease,
            _ => req.lease,
        };
        let revision = self.put_kv(&req.key, value, lease);
        Ok(PutResponse {
            header: Some(header(revision)),
            prev_kv: if req.prev_kv { prev } else { None },
        })
    }

    /// etcd `DeleteRange`: deletes every key of the range (same `key`/`range_end` rules as
    /// Range) that exists now, each with its own sub revision; `prev_kv` returns the deleted
    /// pairs. Header revision: `current + 1` if this txn changed anything, else `current`.
    ///
    /// Errors: `Internal` on storage failure.
    pub fn delete_range(
        &mut self,
        req: &DeleteRangeRequest,
    ) -> Result<DeleteRangeResponse, EtcdError> {
        let (keys, prev_kvs) = {
            let view = self.read_view();
            let range = KeyRange::from_request(&req.key, &req.range_end);
            let hits: Vec<_> = view.hits(&range, view.rev).collect();
            let prev_kvs = if req.prev_kv {
                hits.iter()
                    .map(|h| view.read(h, view.rev))
                    .collect::<Result<Vec<_>, _>>()?
            } else {
                Vec::new()
            };
            (
                hits.iter().map(|h| h.key.to_vec()).collect::<Vec<_>>(),
                prev_kvs,
            )
        };
        for key in &keys {
            self.tombstone(key);
        }
        Ok(DeleteRangeResponse {
            header: Some(header(self.view_rev())),
            deleted: keys.len() as i64,
            prev_kvs,
        })
    }

    /// etcd `Txn` (see `txn.rs`), with every lease id considered to exist.
    ///
    /// Errors: `KeyNotFound` (a put with `ignore_*` on an absent key), `FutureRev` /
    /// `Compacted` (a range op at such a revision); nothing is written on error.
    pub fn txn(&mut self, req: &TxnRequest) -> Result<TxnResponse, EtcdError> {
        txn::apply(self, req, &|_| true)
    }

    /// etcd `Txn` with the lessor's view of which leases exist: a put in the taken branches
    /// with an unknown non-zero lease fails the txn with `LeaseNotFound` (etcd `checkPut`).
    ///
    /// Errors: as [`WriteTxn::txn`], plus `LeaseNotFound`.
    pub fn txn_with_lease_check(
        &mut self,
        req: &TxnRequest,
        lease_exists: &dyn Fn(i64) -> bool,
    ) -> Result<TxnResponse, EtcdError> {
        txn::apply(self, req, lease_exists)
    }

    /// The backend batch of this txn: other components (consistent index, lease, auth,
    /// membership) stage their writes here, committed atomically with this entry's MVCC
    /// changes. Their keys are theirs in [`crate::backend::schema`], never MVCC's (`k`, `m`).
    pub fn batch_mut(&mut self) -> &mut Batch {
        &mut self.batch
    }

    /// The changes this txn made so far, in order (the events [`WriteTxn::commit`] returns).
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// Adds this txn to the store's apply group: the next [`MvccStore::write`] sees its
    /// changes, readers do not until [`MvccStore::flush`] (see `staged.rs` for why the apply
    /// loop groups the requests of an entry), which returns them for watchers. Returns the
    /// store revision after the txn (unchanged if it changed no key); read
    /// [`WriteTxn::events`] first for its changes: they move into the group, uncopied.
    pub fn stage(mut self) -> i64 {
        let revision = self.view_rev();
        let store = self.store;
        let mut staged = store.staged();
        if self.compacted {
            let floor = staged.compact_floor.unwrap_or(self.compact_rev);
            staged.compact_floor = Some(floor.max(self.compact_rev));
        }
        staged.batch.append(std::mem::take(&mut self.batch));
        if let Some(index) = self.index.take() {
            staged.view = Some(Arc::new(View {
                index,
                rev: revision,
                compact_rev: self.compact_rev,
            }));
        } else if self.from_staged {
            staged.view = Some(self.base.clone());
        }
        self.staged = true;
        if !self.events.is_empty() {
            staged
                .records
                .insert(revision, std::mem::take(&mut self.events));
        }
        if let Some(job) = self.compaction_job.take() {
            staged.jobs.push(job);
        }
        revision
    }

    /// Stages this txn and flushes the group: one sled `apply_batch` (no fsync: durability
    /// comes from the raft WAL and the consistent index), then the new index is published.
    ///
    /// Errors: sled I/O; then nothing is published and the store keeps its previous state.
    pub fn commit(self) -> Result<Committed, MvccError> {
        let store = self.store;
        let changed = !self.events.is_empty();
        let revision = self.stage();
        let changes = store.flush()?;
        // A txn that changed nothing has the revision of the last one that did: none are its.
        let events = if changed {
            changes.into_iter().find(|(r, _)| *r == revision)
        } else {
            None
        };
        Ok(Committed {
            revision,
            events: events.map(|(_, events)| events).unwrap_or_default(),
        })
    }

    /// The pair `key` holds now (in this txn's view), read from its record.
    fn current_kv(&self, key: &[u8]) -> Result<Option<KeyValue>, EtcdError> {
        let rev = self.view_rev();
        match self.index().get(key).and_then(|h| h.visible_at(rev)) {
            Some(r) => self.value(key, r, rev).map(Some),
            None => Ok(None),
        }
    }

    fn next_revision(&self) -> Revision {
        Revision::new(self.begin_rev() + 1, self.events.len() as i64)
    }

    /// Writes a put record; returns its main revision.
    fn put_kv(&mut self, key: &[u8], value: Vec<u8>, lease: i64) -> i64 {
        let rev = self.next_revision();
        let info = self.index_mut().push_with(key, |latest| match latest {
            Some(l) if !l.tombstone => RevInfo::put(rev, l.create, l.version + 1, lease),
            _ => RevInfo::put(rev, rev.main, 1, lease),
        });
        let (create, version) = (info.create, info.version);
        let kv = KeyValue {
            key: key.to_vec(),
            create_revision: create,
            mod_revision: rev.main,
            version,
            value,
            lease,
        };
        self.batch
            .insert(record_key(rev, false), codec::encode_put(&kv));
        self.events.push(Event {
            r#type: EventType::Put as i32,
            kv: Some(kv),
            prev_kv: None,
        });
        rev.main
    }

    /// Writes a tombstone record for a key that exists now.
    fn tombstone(&mut self, key: &[u8]) {
        let rev = self.next_revision();
        self.batch
            .insert(record_key(rev, true), codec::encode_tombstone(key));
        self.index_mut().push(key, RevInfo::tombstone(rev));
        self.events.push(Event {
            r#type: EventType::Delete as i32,
            kv: Some(KeyValue {
                key: key.to_vec(),
                mod_revision: rev.main,
                ..Default::default()
            }),
            prev_kv: None,
        });
    }

    /// Compaction state, for `compact.rs`.
    pub(super) fn compact_rev(&self) -> i64 {
        self.compact_rev
    }

    /// Applies a validated compaction at `rev`: compacts the working index, removes up to
    /// [`super::INLINE_REMOVALS`] records in this batch (only when no background removal is pending,
    /// to keep removals in ascending order) and leaves the rest to the compactor.
    pub(super) fn apply_compaction(&mut self, rev: i64) {
        let mut removed = Vec::new();
        self.index_mut().compact(rev, &mut removed);
        let mut records: Vec<(Revision, bool)> = removed
            .iter()
            .map(|r| (r.revision(), r.tombstone))
            .collect();
        records.sort_unstable();
        let total = records.len();
        let mut job = self.compaction_job.take().unwrap_or(Job {
            revision: rev,
            records: Vec::new(),
            hash: None,
        });
        // A compaction staged earlier in this group has not reached the compactor yet.
        let idle = self.store.compactor.idle() && self.store.staged().jobs.is_empty();
        let inline = if job.records.is_empty() && idle {
            total.min(self.store.inline_removals.load(Ordering::Relaxed))
        } else {
            0
        };
        for &(r, tombstone) in &records[..inline] {
            self.batch.remove(record_key(r, tombstone));
        }
        job.revision = rev;
        job.records.extend_from_slice(&records[inline..]);
        job.records.sort_unstable();
        self.compaction_job = Some(job);
        self.batch
            .insert(schema::MVCC_COMPACT, &codec::encode_i64(rev));
        self.compact_rev = rev;
        self.compacted = true;
        tracing::debug!(revision = rev, removed = total, inline, "mvcc: compacted");
    }
}

impl ValueSource for WriteTxn<'_> {
    fn value(&self, key: &[u8], rev: &RevInfo, read_rev: i64) -> Result<KeyValue, EtcdError> {
        if rev.main == self.begin_rev() + 1 {
            // Written by this txn: not published yet.
            return self
                .events
                .get(rev.sub as usize)
                .and_then(|e| e.kv.clone())
                .filter(|kv| kv.key == key)
                .ok_or_else(|| {
                    EtcdError::Internal(format!(
                        "mvcc: pending change {} is missing",
                        rev.revision()
                    ))
                });
        }
        if rev.main > self.published_rev {
            // Written by an earlier txn of this apply group: not published yet either.
            return self
                .store
                .staged()
                .event(rev.main, rev.sub)
                .and_then(|e| e.kv.clone())
                .filter(|kv| kv.key == key)
                .ok_or_else(|| {
                    EtcdError::Internal(format!(
                        "mvcc: staged change {} is missing",
                        rev.revision()
                    ))
                });
        }
        self.store.read_value(key, rev, read_rev)
    }
}

impl Drop for WriteTxn<'_> {
    fn drop(&mut self) {
        if !self.staged && self.from_staged {
            let mut staged = self.store.staged();
            if self.index.is_none() {
                // Unchanged: the group's view goes back as it was.
                staged.view = Some(self.base.clone());
            } else {
                // The group's index was changed in place and cannot be rolled back.
                staged.abandoned = Some(format!(
                    "a write txn at revision {} changed the index and was dropped",
                    self.begin_rev() + 1
                ));
            }
        }
        self.store.end_write();
    }
}

/// A response header carrying only a revision (the API fills the member fields).
pub(super) fn header(revision: i64) -> ResponseHeader {
    ResponseHeader {
        revision,
        ..Default::default()
    }
}
