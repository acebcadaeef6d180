//! `Range`: etcd's read of a key range at a revision, over one index view.
//!
//! Semantics follow etcd 3.4–3.6 (`applierV3backend.Range` + `storeTxnRead.rangeKeys`):
//! - `revision > current` → `FutureRev`; `revision <= 0` reads the current revision;
//!   `revision < compact revision` → `Compacted` (reading at the compact revision works);
//! - `count` is the number of keys in the range at that revision, before the min/max
//!   mod/create filters and regardless of `limit`; `count_only` returns it with no kvs;
//! - the filters prune, then results are sorted, then cut to `limit` (> 0); `more` says the
//!   cut dropped something;
//! - a non-KEY `sort_target` with `sort_order` NONE sorts ascending (etcd quirk);
//! - equal sort keys keep key order (etcd uses Go's `sort.Sort`, which is stable for the
//!   small inputs where it matters and unspecified beyond; Keel is always stable);
//! - the response header carries only `revision` = the view's current revision.
//!
//! Cost: the index answers `count`, `limit`, `keys_only`, the filters and sorting by
//! KEY/VERSION/CREATE/MOD; values are read only for the kvs returned (all kvs in range
//! when sorting by VALUE, as in etcd).

use std::cmp::Ordering;

use keel_proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use keel_proto::etcdserverpb::{RangeRequest, RangeResponse, ResponseHeader};
use keel_proto::mvccpb::KeyValue;

use super::index::{Index, KeyRange};
use super::key_index::RevInfo;
use crate::error::EtcdError;

/// Reads the value record of one revision.
pub trait ValueSource {
    /// The stored `KeyValue` of put revision `rev` of `key`, read for a request at
    /// `read_rev`. A record missing because a concurrent compaction passed `read_rev` is
    /// `Compacted`; any other missing record is an internal error.
    fn value(&self, key: &[u8], rev: &RevInfo, read_rev: i64) -> Result<KeyValue, EtcdError>;
}

/// A consistent view to read from: an index, its revision and compact revision, and where
/// values live.
pub struct ReadView<'a> {
    /// The index as of `rev`.
    pub index: &'a Index,
    /// The current revision of this view.
    pub rev: i64,
    /// The compact revision (-1 = never compacted).
    pub compact_rev: i64,
    /// Record reader.
    pub values: &'a dyn ValueSource,
}

/// One key visible at the read revision.
#[derive(Clone, Copy)]
pub struct Hit<'a> {
    /// The key.
    pub key: &'a [u8],
    /// Its revision visible at the read revision (a put).
    pub rev: &'a RevInfo,
}

impl Hit<'_> {
    /// The `KeyValue` of this hit without its value, built from the index alone.
    pub fn kv_without_value(&self) -> KeyValue {
        KeyValue {
            key: self.key.to_vec(),
            create_revision: self.rev.create,
            mod_revision: self.rev.main,
            version: self.rev.version,
            value: Vec::new(),
            lease: self.rev.lease,
        }
    }
}

impl ReadView<'_> {
    /// The revision a request for `requested` reads: validates it against this view.
    pub fn resolve(&self, requested: i64) -> Result<i64, EtcdError> {
        if requested > self.rev {
            return Err(EtcdError::FutureRev);
        }
        let rev = if requested <= 0 { self.rev } else { requested };
        if rev < self.compact_rev {
            return Err(EtcdError::Compacted);
        }
        Ok(rev)
    }

    /// Keys of `range` visible at `rev`, ascending.
    pub fn hits<'s>(
        &'s self,
        range: &'s KeyRange<'s>,
        rev: i64,
    ) -> impl DoubleEndedIterator<Item = Hit<'s>> + 's {
        self.index
            .iter(range)
            .filter_map(move |(key, h)| h.visible_at(rev).map(|r| Hit { key, rev: r }))
    }

    /// The full `KeyValue` of a hit (reads the record).
    pub fn read(&self, hit: &Hit<'_>, read_rev: i64) -> Result<KeyValue, EtcdError> {
        self.values.value(hit.key, hit.rev, read_rev)
    }

    /// Serves a `RangeRequest` (see the module docs).
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse, EtcdError> {
        let rev = self.resolve(req.revision)?;
        let range = KeyRange::from_request(&req.key, &req.range_end);
        if let KeyRange::Single(key) = range {
            return self.get(req, key, rev);
        }
        let count = self.index.count(&range, rev);
        let mut resp = self.response(count as i64);
        if req.count_only || count == 0 {
            return Ok(resp);
        }
        let limit = usize::try_from(req.limit).ok().filter(|&l| l > 0);
        let target = SortTarget::try_from(req.sort_target).unwrap_or(SortTarget::Key);
        let mut order = SortOrder::try_from(req.sort_order).unwrap_or(SortOrder::None);
        if target != SortTarget::Key && order == SortOrder::None {
            order = SortOrder::Ascend;
        }
        let filtered = req.min_mod_revision != 0
            || req.max_mod_revision != 0
            || req.min_create_revision != 0
            || req.max_create_revision != 0;

        let (hits, values, total) = if !filtered && target == SortTarget::Key {
            // Key order straight from the index: walk only as far as `limit`.
            let take = limit.unwrap_or(usize::MAX);
            let hits: Vec<Hit<'_>> = if order == SortOrder::Descend {
                self.hits(&range, rev).rev().take(take).collect()
            } else {
                self.hits(&range, rev).take(take).collect()
            };
            (hits, None, count)
        } else {
            let mut hits: Vec<Hit<'_>> = self
                .hits(&range, rev)
                .filter(|h| passes_filters(req, h.rev))
                .collect();
            let total = hits.len();
            let values = if target == SortTarget::Value {
                let vals = hits
                    .iter()
                    .map(|h| self.read(h, rev))
                    .collect::<Result<Vec<_>, _>>()?;
                let (h, v) = sort_by_value(hits, vals, order, limit);
                hits = h;
                Some(v)
            } else {
                sort_hits(&mut hits, target, order, limit);
                None
            };
            (hits, values, total)
        };

        resp.more = limit.is_some_and(|l| total > l);
        resp.kvs = match values {
            Some(mut vals) => {
                if req.keys_only {
                    vals.iter_mut().for_each(|kv| kv.value.clear());
                }
                vals
            }
            None if req.keys_only => hits.iter().map(Hit::kv_without_value).collect(),
            None => hits
                .iter()
                .map(|h| self.read(h, rev))
                .collect::<Result<_, _>>()?,
        };
        Ok(resp)
    }
}

impl ReadView<'_> {
    /// An empty response counting `count` keys, with this view's revision in its header.
    fn response(&self, count: i64) -> RangeResponse {
        RangeResponse {
            header: Some(ResponseHeader {
                revision: self.rev,
                ..Default::default()
            }),
            kvs: Vec::new(),
            more: false,
            count,
        }
    }

    /// [`ReadView::range`] of the single key `key` at `rev`: one index lookup, where a
    /// range counts, then walks (the most common read: a get). With one key at most, sorting,
    /// `limit` and `more` change nothing; `count` is 1 when the key exists at `rev`, even if
    /// the revision filters drop it (etcd counts before `pruneKVs`).
    fn get(&self, req: &RangeRequest, key: &[u8], rev: i64) -> Result<RangeResponse, EtcdError> {
        let hit = self
            .index
            .get(key)
            .and_then(|h| h.visible_at(rev))
            .map(|r| Hit { key, rev: r });
        let mut resp = self.response(i64::from(hit.is_some()));
        if req.count_only {
            return Ok(resp);
        }
        if let Some(hit) = hit.filter(|h| passes_filters(req, h.rev)) {
            resp.kvs.push(if req.keys_only {
                hit.kv_without_value()
            } else {
                self.read(&hit, rev)?
            });
        }
        Ok(resp)
    }

    /// One chunk of a `RangeStream` (etcd 3.7): up to `limit` (≥ 1) keys of `req`'s range
    /// visible at `req.revision`, in key order, values dropped with `keys_only`; the rest of
    /// `req` (sorting, filters, `limit`, `count_only`) is the caller's. Unlike
    /// [`ReadView::range`] it neither counts the range nor walks past the chunk, so a
    /// stream over N keys costs O(N) in all. Returns the kvs and whether keys remain after
    /// the last one.
    ///
    /// Errors: as [`ReadView::range`] for the revision.
    pub fn chunk(
        &self,
        req: &RangeRequest,
        limit: usize,
    ) -> Result<(Vec<KeyValue>, bool), EtcdError> {
        let rev = self.resolve(req.revision)?;
        let range = KeyRange::from_request(&req.key, &req.range_end);
        let limit = limit.max(1);
        let mut hits: Vec<Hit<'_>> = self.hits(&range, rev).take(limit + 1).collect();
        let rest = hits.len() > limit;
        hits.truncate(limit);
        let kvs = if req.keys_only {
            hits.iter().map(Hit::kv_without_value).collect()
        } else {
            hits.iter()
                .map(|h| self.read(h, rev))
                .collect::<Result<_, _>>()?
        };
        Ok((kvs, rest))
    }
}

/// etcd's `pruneKVs` with the request's min/max mod/create revision bounds (0 = unset).
fn passes_filters(req: &RangeRequest, r: &RevInfo) -> bool {
    !(req.max_mod_revision != 0 && r.main > req.max_mod_revision
        || req.min_mod_revision != 0 && r.main < req.min_mod_revision
        || req.max_create_revision != 0 && r.create > req.max_create_revision
        || req.min_create_revision != 0 && r.create < req.min_create_revision)
}

/// Sorts `hits` (given in key order) by `target` in `order`, keeping key order among equal
/// targets, and keeps the first `limit`.
fn sort_hits(hits: &mut Vec<Hit<'_>>, target: SortTarget, order: SortOrder, limit: Option<usize>) {
    let field = |h: &Hit<'_>| -> i64 {
        match target {
            SortTarget::Version => h.rev.version,
            SortTarget::Create => h.rev.create,
            SortTarget::Mod => h.rev.main,
            SortTarget::Key | SortTarget::Value => 0,
        }
    };
    match (target, order) {
        (_, SortOrder::None) | (SortTarget::Key, SortOrder::Ascend) => {}
        (SortTarget::Key, SortOrder::Descend) => hits.reverse(),
        _ => {
            // Tag each hit with its key-order position so the order is total: equal targets
            // stay in key order, and a partial selection gives the same prefix a full stable
            // sort would.
            let mut tagged: Vec<(i64, usize, Hit<'_>)> = hits
                .drain(..)
                .enumerate()
                .map(|(i, h)| (field(&h), i, h))
                .collect();
            let desc = order == SortOrder::Descend;
            let cmp = |a: &(i64, usize, Hit<'_>), b: &(i64, usize, Hit<'_>)| {
                let by_field = if desc { b.0.cmp(&a.0) } else { a.0.cmp(&b.0) };
                by_field.then(a.1.cmp(&b.1))
            };
            sort_prefix(&mut tagged, limit, cmp);
            hits.extend(tagged.into_iter().map(|(_, _, h)| h));
        }
    }
    if let Some(l) = limit {
        hits.truncate(l);
    }
}

/// Like [`sort_hits`] for VALUE, carrying the read values along.
fn sort_by_value<'a>(
    hits: Vec<Hit<'a>>,
    vals: Vec<KeyValue>,
    order: SortOrder,
    limit: Option<usize>,
) -> (Vec<Hit<'a>>, Vec<KeyValue>) {
    let mut tagged: Vec<(usize, Hit<'a>, KeyValue)> = hits
        .into_iter()
        .zip(vals)
        .enumerate()
        .map(|(i, (h, v))| (i, h, v))
        .collect();
    if order != SortOrder::None {
        let desc = order == SortOrder::Descend;
        let cmp = |a: &(usize, Hit<'a>, KeyValue), b: &(usize, Hit<'a>, KeyValue)| {
            let by_value = if desc {
                b.2.value.cmp(&a.2.value)
            } else {
                a.2.value.cmp(&b.2.value)
            };
            by_value.then(a.0.cmp(&b.0))
        };
        sort_prefix(&mut tagged, limit, cmp);
    }
    if let Some(l) = limit {
        tagged.truncate(l);
    }
    tagged.into_iter().map(|(_, h, v)| (h, v)).unzip()
}

/// Sorts `v` by the total order `cmp`, or only its first `limit` elements when a limit cuts
/// it (selection, then a sort of the prefix).
fn sort_prefix<T>(v: &mut [T], limit: Option<usize>, cmp: impl Fn(&T, &T) -> Ordering) {
    match limit {
        Some(l) if l < v.len() => {
            v.select_nth_unstable_by(l, &cmp);
            v[..l].sort_unstable_by(&cmp);
        }
        _ => v.sort_unstable_by(&cmp),
    }
}
