//! A key's older revisions (all but the newest), shared between versions of the key index.
//!
//! The index is copy-on-write (`index.rs`): a put copies its key's block, and with it each
//! key's history *handle*, then appends to its key's history while the previously published
//! index (and any reader holding it) still refers to the old history. A history kept as one
//! shared vector was therefore copied whole on every put: a key updated once per second
//! without compaction holds 86,400 revisions after a day, and every put to it copied 3.4 MB
//! (measured: 149 µs per put at 10,000 revisions, 1.6 ms at 100,000; docs/mvcc.md).
//!
//! # Layout
//! ```text
//! Older { runs: Arc<Vec<Arc<[RevInfo]>>> (each exactly RUN revisions), tail: Vec<RevInfo> }
//! ```
//! Revisions are in ascending order: every run, then the tail. A version that appends
//! shares every sealed run with the version it came from and copies only the tail (at most
//! `RUN - 1` revisions). When the tail fills, it becomes a new run and the run list is copied
//! (one pointer per run, so `len / RUN` reference counts once every `RUN` appends). A put thus
//! costs O(`RUN` + `len / RUN²`) amortized, not O(`len`); lookups by position stay O(1) and
//! searches O(log `len`).
//!
//! # Invariants
//! - every run holds exactly `RUN` revisions; the tail holds fewer than `RUN`;
//! - a version is never changed once shared: appends go to a unique copy
//!   (`Arc::make_mut`-style), so readers of an older index see exactly what it held.

use std::sync::Arc;

use super::key_index::RevInfo;

/// Revisions per sealed run: a put copies at most `RUN - 1` revisions of the tail (40 bytes
/// each), and a full tail seals into a run that later versions share.
const RUN: usize = 32;

/// The older revisions of one key, oldest first (32 bytes). A clone costs one reference
/// count and a copy of the tail.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Older {
    /// Sealed runs of exactly [`RUN`] revisions, oldest first; `None` while there are none.
    /// A thin pointer (8 bytes; `Arc<[_]>` would be 16): every key with history has one.
    #[allow(clippy::rc_buffer)]
    runs: Option<Arc<Vec<Arc<[RevInfo]>>>>,
    /// The newest older revisions, fewer than [`RUN`].
    tail: Vec<RevInfo>,
}

impl Older {
    /// Older revisions from `revs` (ascending order, as a history holds them).
    pub fn from_vec(mut revs: Vec<RevInfo>) -> Older {
        let sealed = revs.len() / RUN * RUN;
        let mut tail = revs.split_off(sealed);
        // `split_off(0)` hands back the caller's buffer: a rebuilt index holds millions.
        tail.shrink_to_fit();
        let runs = (sealed > 0).then(|| Arc::new(revs.chunks(RUN).map(Arc::from).collect()));
        Older { runs, tail }
    }

    /// Number of revisions held.
    pub fn len(&self) -> usize {
        self.sealed() + self.tail.len()
    }

    /// Revision `i` (0 = oldest), if `i < len`.
    pub fn get(&self, i: usize) -> Option<&RevInfo> {
        let sealed = self.sealed();
        if i < sealed {
            let runs = self.runs.as_deref()?;
            Some(&runs[i / RUN][i % RUN])
        } else {
            self.tail.get(i - sealed)
        }
    }

    /// All revisions, oldest first.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &RevInfo> {
        self.runs
            .as_deref()
            .map_or(&[][..], Vec::as_slice)
            .iter()
            .flat_map(|run| run.iter())
            .chain(self.tail.iter())
    }

    /// The number of leading revisions for which `pred` holds (`pred` must hold for a prefix
    /// and fail for the rest, as for `slice::partition_point`).
    pub fn partition_point(&self, mut pred: impl FnMut(&RevInfo) -> bool) -> usize {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if pred(self.get(mid).expect("mid < len")) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// Revisions `from..`, oldest first, as a new (unshared) value; `None` when empty.
    pub fn suffix(&self, from: usize) -> Option<Older> {
        (from < self.len()).then(|| Older::from_vec(self.iter().skip(from).copied().collect()))
    }

    /// Appends `rev` (newer than every revision held) to the history behind `this`, copying
    /// only what another version still shares (see the module docs).
    pub fn push(this: &mut Arc<Older>, rev: RevInfo) {
        match Arc::get_mut(this) {
            Some(own) => own.push_unique(rev),
            None => *this = Arc::new(this.appended(rev)),
        }
    }

    /// Appends to a value no other version shares.
    fn push_unique(&mut self, rev: RevInfo) {
        if self.tail.len() + 1 == RUN {
            self.tail.push(rev);
            let run: Arc<[RevInfo]> = Arc::from(std::mem::take(&mut self.tail));
            self.runs = Some(with_run(self.runs.as_deref().map(Vec::as_slice), run));
            return;
        }
        if self.tail.len() == self.tail.capacity() {
            // Grow by half (exact while small): most keys keep 1-2 older revisions between
            // compactions, and `Vec`'s default first allocation would hold 4.
            self.tail.reserve_exact((self.tail.len() / 2).max(1));
        }
        self.tail.push(rev);
    }

    /// A new value holding these revisions and `rev`; shares every sealed run.
    fn appended(&self, rev: RevInfo) -> Older {
        // Exactly sized: the next put copies this tail again while an index shares it.
        let mut tail = Vec::with_capacity(self.tail.len() + 1);
        tail.extend_from_slice(&self.tail);
        let mut next = Older {
            runs: self.runs.clone(),
            tail,
        };
        next.push_unique(rev);
        next
    }

    /// Approximate heap bytes owned (excluding the `Older` itself); shared runs are counted
    /// once per holder, so this is an upper bound.
    pub fn heap_bytes(&self) -> usize {
        let word = std::mem::size_of::<usize>();
        let rev = std::mem::size_of::<RevInfo>();
        let runs = self.runs.as_deref().map_or(0, |runs| {
            2 * word + runs.capacity() * 2 * word + runs.len() * (2 * word + RUN * rev)
        });
        runs + self.tail.capacity() * rev
    }

    /// Revisions held in sealed runs.
    fn sealed(&self) -> usize {
        self.runs.as_deref().map_or(0, |r| r.len() * RUN)
    }

    /// Whether this value and `other` share sealed run `i` (tests: appends must not copy).
    #[cfg(test)]
    pub(crate) fn shares_run(&self, other: &Older, i: usize) -> bool {
        match (self.runs.as_deref(), other.runs.as_deref()) {
            (Some(a), Some(b)) => Arc::ptr_eq(&a[i], &b[i]),
            _ => false,
        }
    }
}

/// The run list `runs` followed by `run`: a new list of pointers (the runs themselves are
/// shared, never copied).
#[allow(clippy::rc_buffer)]
fn with_run(runs: Option<&[Arc<[RevInfo]>]>, run: Arc<[RevInfo]>) -> Arc<Vec<Arc<[RevInfo]>>> {
    assert_eq!(
        run.len(),
        RUN,
        "mvcc history: a sealed run must hold {RUN} revisions"
    );
    let runs = runs.unwrap_or(&[]);
    let mut all = Vec::with_capacity(runs.len() + 1);
    all.extend(runs.iter().cloned());
    all.push(run);
    Arc::new(all)
}

#[cfg(test)]
#[path = "older_tests.rs"]
mod tests;
