//! Apply groups that are published but not yet in sled (etcd's backend batch transaction:
//! `--backend-batch-interval` 100 ms, `--backend-batch-limit` 10,000).
//!
//! Why: every sled `apply_batch` rolls sled's I/O buffer twice, and each roll is a small
//! `pwrite` plus `sync_file_range` (backend/batch.rs). At one apply group per millisecond
//! (one client) that was 0.2 ms of every put and a fifth of a member's CPU per put
//! (docs/benchmarks.md, "Deferred sled commits"). So apply publishes each group at once and
//! [`Unpersisted`] gathers the groups' sled writes into one batch that goes to sled when a
//! [`PersistPolicy`] bound is reached, or when something is about to read sled directly.
//!
//! A member commits in the background ([`PersistPolicy::BATCHED`]): a commit of a few
//! hundred writes took 4–30 ms on a loaded 2-core box, which apply then spent waiting.
//!
//! Nothing here is about durability: sled is never fsynced on apply, the raft WAL holds
//! every entry, and the consistent index travels in the same sled batch as the effects it
//! accounts for, so after a crash a member re-applies from whatever consistent index sled
//! holds. The one rule the rest of the member keeps: the raft log is purged only below a
//! snapshot, and a snapshot persists (and flushes) first.
//!
//! Invariants:
//! - every record of a published revision is in the [`Overlay`] or in sled (or removed by a
//!   compaction of its revision): a group's records join the overlay before its view is
//!   published, and leave it only after the batch holding them reached sled;
//! - the overlay's groups hold strictly increasing record keys (revisions only grow), which
//!   lookups rely on; asserted when a group joins;
//! - batches reach sled in the order their groups were published: one commit at a time
//!   (`committing`), each taking everything pending.

use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, Weak};
use std::time::{Duration, Instant};

use sled::IVec;

use super::MvccError;
use crate::backend::schema::RECORD_PREFIX;
use crate::backend::{Batch, LiveTree};

/// When the published groups' sled writes are committed to sled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PersistPolicy {
    /// Commit once this many writes (puts, removals, meta keys) are pending; 0 = after every
    /// group. etcd `--backend-batch-limit` (default 10,000).
    pub max_writes: usize,
    /// Commit once this many bytes of keys and values are pending.
    pub max_bytes: u64,
    /// Commit once the oldest pending group is this old (checked when a group is
    /// published). etcd `--backend-batch-interval` (default 100 ms).
    pub max_age: Duration,
    /// Commit on a thread of the store's own instead of in apply (the group that reaches a
    /// bound is published at once and committed right after).
    pub background: bool,
}

impl PersistPolicy {
    /// Every group goes to sled before it is published (tools and most tests).
    pub const EVERY_GROUP: PersistPolicy = PersistPolicy {
        max_writes: 0,
        max_bytes: 0,
        max_age: Duration::ZERO,
        background: false,
    };

    /// A member's store: etcd's backend batch defaults, and at most 4 MiB pending.
    pub const BATCHED: PersistPolicy = PersistPolicy {
        max_writes: 10_000,
        max_bytes: 4 << 20,
        max_age: Duration::from_millis(100),
        background: true,
    };
}

/// When the pending writes go to sled, after a push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Commit {
    /// Under every bound.
    Later,
    /// A bound is reached: commit (on the background thread, if there is one).
    Due,
    /// Four times a bound: the background commits do not keep up; commit before going on,
    /// so what is pending stays bounded.
    Now,
}

/// One published group's records (`k` keys → encoded `mvccpb.KeyValue`), sorted by key.
type GroupRecords = Arc<[(IVec, IVec)]>;

/// The records of the published groups not yet in sled, for readers. Immutable: a new
/// group or a commit replaces the whole overlay (a `Vec` of `Arc`s, one per group).
#[derive(Debug, Default)]
pub(super) struct Overlay {
    groups: Vec<GroupRecords>,
}

impl Overlay {
    /// The encoded record at sled key `rkey`, if a pending group holds it.
    pub fn get(&self, rkey: &[u8]) -> Option<IVec> {
        // Groups are in key order: the candidate is the first whose last key is >= rkey.
        let at = self
            .groups
            .partition_point(|g| g.last().is_some_and(|(k, _)| k.as_ref() < rkey));
        let group = self.groups.get(at)?;
        let i = group.binary_search_by(|(k, _)| k.as_ref().cmp(rkey)).ok()?;
        Some(group[i].1.clone())
    }

    /// This overlay plus `records` (sorted, keys above every key held).
    fn with(&self, records: GroupRecords) -> Overlay {
        if let (Some(last), Some(first)) =
            (self.groups.last().and_then(|g| g.last()), records.first())
        {
            assert!(
                last.0 < first.0,
                "mvcc: a published group's records ({:?}) do not follow the pending ones ({:?})",
                first.0,
                last.0
            );
        }
        let mut groups = Vec::with_capacity(self.groups.len() + 1);
        groups.extend(self.groups.iter().cloned());
        groups.push(records);
        Overlay { groups }
    }

    /// This overlay without its `n` oldest groups (committed to sled).
    fn without_oldest(&self, n: usize) -> Overlay {
        Overlay {
            groups: self.groups[n.min(self.groups.len())..].to_vec(),
        }
    }

    /// Number of pending groups with records.
    #[cfg(test)]
    pub fn groups(&self) -> usize {
        self.groups.len()
    }
}

/// The sled writes of published groups, gathered into one batch (only the apply loop adds;
/// anyone may commit, under the store's mutex).
#[derive(Debug, Default)]
pub(super) struct Unpersisted {
    /// Every pending group's writes, in apply order.
    pub batch: Batch,
    /// When the oldest pending group was published.
    since: Option<Instant>,
    /// Bytes of keys and values `batch` inserts.
    bytes: u64,
    /// Groups of `batch` that joined the overlay (those with records).
    overlay_groups: usize,
}

impl Unpersisted {
    /// Adds a published group's writes; returns the overlay that must be current before
    /// the group's view is published (`overlay` plus the group's records).
    pub fn push(&mut self, group: Batch, overlay: &Overlay) -> Option<Overlay> {
        let records = sorted_records(&group);
        self.bytes += group.inserted_bytes();
        self.batch.append(group);
        self.since.get_or_insert_with(Instant::now);
        if records.is_empty() {
            return None;
        }
        self.overlay_groups += 1;
        Some(overlay.with(records))
    }

    /// True when `policy` says the pending writes go to sled now.
    pub fn due(&self, policy: &PersistPolicy) -> bool {
        !self.batch.is_empty()
            && (self.batch.len() >= policy.max_writes
                || self.bytes >= policy.max_bytes
                || self.since.is_some_and(|t| t.elapsed() >= policy.max_age))
    }

    /// True when four times a bound of `policy` is pending (a background committer that
    /// does not keep up).
    pub fn overfull(&self, policy: &PersistPolicy) -> bool {
        !self.batch.is_empty()
            && (self.batch.len() >= policy.max_writes.saturating_mul(4)
                || self.bytes >= policy.max_bytes.saturating_mul(4))
    }

    /// Takes every pending write, their inserted bytes and how many overlay groups they
    /// hold, leaving nothing pending.
    pub fn take(&mut self) -> (Batch, u64, usize) {
        self.since = None;
        // The next interval likely stages as many writes as this one: reserving them now
        // spares the pending batch its doublings, each a copy into fresh, page-faulted
        // memory (a 256-client put profile had 0.9 % of the members' CPU there).
        let next = Batch::with_capacity(self.batch.len());
        (
            std::mem::replace(&mut self.batch, next),
            std::mem::take(&mut self.bytes),
            std::mem::take(&mut self.overlay_groups),
        )
    }
}

/// The published groups not yet in sled, their overlay, and the commits that take them to
/// sled. Shared by the store and its background thread (which holds it weakly).
#[derive(Debug)]
pub(super) struct Persister {
    tree: LiveTree,
    pending: Mutex<Unpersisted>,
    overlay: RwLock<Arc<Overlay>>,
    /// Held for a whole commit: commits run one at a time, in publish order.
    committing: Mutex<()>,
    policy: Mutex<PersistPolicy>,
    /// Set when a background commit failed; the next flush reports it (fatal).
    failed: Mutex<Option<String>>,
}

impl Persister {
    /// Nothing pending; every group goes to sled at once ([`PersistPolicy::EVERY_GROUP`]).
    pub fn new(tree: LiveTree) -> Persister {
        Persister {
            tree,
            pending: Mutex::default(),
            overlay: RwLock::default(),
            committing: Mutex::new(()),
            policy: Mutex::new(PersistPolicy::EVERY_GROUP),
            failed: Mutex::new(None),
        }
    }

    /// The current overlay (an `Arc` clone).
    pub fn overlay(&self) -> Arc<Overlay> {
        self.overlay
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// When pending writes go to sled.
    pub fn policy(&self) -> PersistPolicy {
        *lock(&self.policy)
    }

    /// Sets when pending writes go to sled (the caller commits what is pending first).
    pub fn set_policy(&self, policy: PersistPolicy) {
        *lock(&self.policy) = policy;
    }

    /// Adds a published group's writes (before its view is published); returns when the
    /// policy says the pending writes go to sled.
    ///
    /// Errors: an earlier background commit failed.
    pub fn push(&self, group: Batch) -> Result<Commit, MvccError> {
        if let Some(why) = lock(&self.failed).clone() {
            return Err(MvccError::Background(why));
        }
        let mut pending = lock(&self.pending);
        let before = pending.bytes;
        if let Some(next) = pending.push(group, &self.overlay()) {
            *self.overlay.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(next);
        }
        // The group's inserted bytes, counted once by `Unpersisted::push`.
        self.tree.note_pending(pending.bytes - before);
        let policy = self.policy();
        Ok(if pending.overfull(&policy) {
            Commit::Now
        } else if pending.due(&policy) {
            Commit::Due
        } else {
            Commit::Later
        })
    }

    /// Commits every pending write to sled as one batch (no fsync), after any commit in
    /// progress, then drops the committed groups from the overlay. Blocking (sled I/O).
    ///
    /// Errors: sled I/O, fatal for the member.
    pub fn commit(&self) -> Result<(), MvccError> {
        let _one = lock(&self.committing);
        // After a failed commit, sled may hold part of that batch and is missing the rest;
        // a later batch carries a newer consistent index, so committing it would make the
        // lost records' loss durable (a restart would not re-apply them). Nothing more goes.
        if let Some(why) = lock(&self.failed).clone() {
            return Err(MvccError::Background(why));
        }
        let (batch, inserted, groups) = lock(&self.pending).take();
        if batch.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        if let Err(e) = batch.commit(self.tree.get().tree()) {
            let why = e.to_string();
            // sled may recover part of this batch (backend/damage.rs): the next start must
            // rebuild the tree rather than trust its consistent index.
            self.tree.mark_damaged(&why);
            *lock(&self.failed) = Some(why);
            return Err(e.into());
        }
        self.tree.note_inserted(inserted, true);
        {
            // Under `pending`, so no group joins the overlay between the read and the write.
            let _pending = lock(&self.pending);
            let rest = self.overlay().without_oldest(groups);
            *self.overlay.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(rest);
        }
        crate::metrics::disk().observe_backend_commit(started.elapsed());
        Ok(())
    }

    /// Starts the background committer: it commits whenever woken through the returned
    /// sender, and ends when the sender is dropped (or the persister is gone).
    ///
    /// Errors: no thread could be spawned.
    pub fn start(self: &Arc<Persister>) -> std::io::Result<SyncSender<()>> {
        let (wake, woken) = sync_channel(1);
        let weak = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("keel-mvcc-persist".into())
            .spawn(move || committer(weak, woken))?;
        Ok(wake)
    }
}

fn committer(persister: Weak<Persister>, woken: Receiver<()>) {
    while woken.recv().is_ok() {
        let Some(p) = persister.upgrade() else { return };
        if let Err(e) = p.commit() {
            // `commit` poisoned the persister: the next flush (and every commit) fails.
            tracing::error!(error = %e, "mvcc: background commit to sled failed");
            return;
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The record inserts of `group`, sorted by key, the last write of a key winning.
fn sorted_records(group: &Batch) -> GroupRecords {
    let mut records: Vec<(IVec, IVec)> = group
        .inserts()
        .filter(|(k, _)| k.first() == Some(&RECORD_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    // Usually sorted already (sub revisions in order); the sort is stable, so equal keys
    // keep their write order and the dedup below keeps the last.
    records.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out: Vec<(IVec, IVec)> = Vec::with_capacity(records.len());
    for r in records {
        match out.last_mut() {
            Some(last) if last.0 == r.0 => *last = r,
            _ => out.push(r),
        }
    }
    out.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rkey(main: u64, sub: u64) -> Vec<u8> {
        let mut k = vec![RECORD_PREFIX];
        k.extend_from_slice(&main.to_be_bytes());
        k.extend_from_slice(&sub.to_be_bytes());
        k
    }

    fn group(writes: &[(Vec<u8>, &str)]) -> Batch {
        let mut b = Batch::default();
        for (k, v) in writes {
            b.insert(k.clone(), v.as_bytes());
        }
        b
    }

    #[test]
    fn the_overlay_finds_records_of_every_pending_group_and_nothing_else() {
        let mut pending = Unpersisted::default();
        let mut overlay = Overlay::default();
        let g1 = group(&[
            (rkey(2, 0), "a2"),
            (b"c/consistent_index".to_vec(), "ci"),
            (rkey(2, 1), "b2"),
        ]);
        overlay = pending.push(g1, &overlay).unwrap();
        // A group without records (a blank entry's consistent index) keeps the overlay.
        assert!(
            pending
                .push(group(&[(b"c/consistent_index".to_vec(), "ci")]), &overlay)
                .is_none()
        );
        // Out of order within a group (sorted on push), and a key written twice: last wins.
        let g3 = group(&[(rkey(4, 1), "y"), (rkey(4, 0), "x"), (rkey(4, 1), "z")]);
        overlay = pending.push(g3, &overlay).unwrap();
        assert_eq!(overlay.groups(), 2);
        assert_eq!(overlay.get(&rkey(2, 0)).unwrap(), b"a2");
        assert_eq!(overlay.get(&rkey(2, 1)).unwrap(), b"b2");
        assert_eq!(overlay.get(&rkey(4, 0)).unwrap(), b"x");
        assert_eq!(overlay.get(&rkey(4, 1)).unwrap(), b"z");
        for absent in [rkey(1, 0), rkey(3, 0), rkey(4, 2), rkey(5, 0)] {
            assert_eq!(overlay.get(&absent), None);
        }
        assert_eq!(overlay.get(b"c/consistent_index"), None);
        assert_eq!(pending.batch.len(), 7);
        let (batch, bytes, groups) = pending.take();
        assert_eq!(batch.len(), 7);
        assert_eq!(groups, 2);
        assert_eq!(bytes, batch.inserted_bytes());
        assert!(pending.batch.is_empty());
    }

    #[test]
    #[should_panic(expected = "do not follow the pending ones")]
    fn a_group_below_the_pending_records_is_refused() {
        let mut pending = Unpersisted::default();
        let overlay = pending
            .push(group(&[(rkey(5, 0), "a")]), &Overlay::default())
            .unwrap();
        pending.push(group(&[(rkey(4, 0), "b")]), &overlay);
    }

    #[test]
    fn the_policy_commits_by_writes_bytes_or_age() {
        let mut pending = Unpersisted::default();
        let policy = PersistPolicy {
            max_writes: 3,
            max_bytes: 1_000,
            max_age: Duration::from_secs(3600),
            background: false,
        };
        assert!(!pending.due(&policy), "nothing pending is never due");
        assert!(
            !pending.due(&PersistPolicy::EVERY_GROUP),
            "nothing pending is never due"
        );
        pending.push(group(&[(rkey(2, 0), "v")]), &Overlay::default());
        assert!(pending.due(&PersistPolicy::EVERY_GROUP));
        assert!(!pending.due(&policy));
        pending.push(
            group(&[(rkey(3, 0), "v"), (rkey(3, 1), "v")]),
            &Overlay::default(),
        );
        assert!(pending.due(&policy), "3 writes");
        assert!(!pending.overfull(&policy));
        let many: Vec<_> = (0..9).map(|s| (rkey(4, s), "v")).collect();
        pending.push(group(&many), &Overlay::default());
        assert!(pending.overfull(&policy), "12 writes: 4 times the bound");
        pending.take();
        pending.push(
            group(&[(rkey(4, 0), &"v".repeat(1_000))]),
            &Overlay::default(),
        );
        assert!(pending.due(&policy), "1,017 bytes");
        pending.take();
        pending.push(group(&[(rkey(5, 0), "v")]), &Overlay::default());
        let aged = PersistPolicy {
            max_age: Duration::from_millis(20),
            ..policy
        };
        assert!(!pending.due(&aged));
        std::thread::sleep(Duration::from_millis(25));
        assert!(pending.due(&aged), "older than max_age");
    }
}
