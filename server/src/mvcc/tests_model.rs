//! Property test: the store against a simple model (`BTreeMap` of key → full history) over
//! random puts, deletes, txns (compares, nested ops), compactions and reopens, checking
//! Range at random revisions with every option, HashKV, events, and index invariants; with
//! every group going to sled at once, and with groups pending in the overlay.

use std::collections::{BTreeMap, HashMap};

use keel_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use keel_proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use keel_proto::etcdserverpb::request_op::Request;
use keel_proto::etcdserverpb::{
    Compare, DeleteRangeRequest, PutRequest, RangeRequest, RangeResponse, RequestOp,
    ResponseHeader, TxnRequest,
};
use keel_proto::mvccpb::event::EventType;
use keel_proto::mvccpb::{Event, KeyValue};
use proptest::prelude::*;
use prost::Message;

use super::PersistPolicy;
use super::index::KeyRange;
use super::revision::{Revision, etcd_rev_bytes};
use super::tests_scenarios::{Fixture, fixture};
use crate::error::EtcdError;

const KEYS: &[&str] = &["a", "a/1", "a/2", "b", "c", "c/x", "d"];

#[derive(Debug, Clone)]
enum Write {
    Put { key: usize, value: u8, lease: i64 },
    Delete { key: usize, end: Option<usize> },
}

#[derive(Debug, Clone)]
enum Op {
    Write(Write),
    /// `version(key) == version ? success : failure`.
    Txn {
        key: usize,
        version: i64,
        success: Vec<Write>,
        failure: Vec<Write>,
    },
    /// Compact at `compact + 1 + (pick % (current - compact))`.
    Compact {
        pick: u32,
    },
    Reopen,
}

#[derive(Debug, Clone)]
struct Read {
    key: usize,
    /// 0: single key, 1: prefix, 2: [key, key+2), 3: from key.
    shape: u8,
    /// 0: current, else picks a revision (may be compacted or in the future).
    rev_pick: u32,
    limit: i64,
    sort_target: i32,
    sort_order: i32,
    keys_only: bool,
    count_only: bool,
    min_mod: i64,
    max_create: i64,
}

fn write_strategy() -> impl Strategy<Value = Write> {
    prop_oneof![
        3 => (0..KEYS.len(), any::<u8>(), prop_oneof![Just(0i64), Just(7i64)])
            .prop_map(|(key, value, lease)| Write::Put { key, value: value % 4, lease }),
        1 => (0..KEYS.len(), proptest::option::of(0..KEYS.len()))
            .prop_map(|(key, end)| Write::Delete { key, end }),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => write_strategy().prop_map(Op::Write),
        2 => (
            0..KEYS.len(),
            0i64..3,
            proptest::collection::vec(write_strategy(), 0..4),
            proptest::collection::vec(write_strategy(), 0..3),
        )
            .prop_map(|(key, version, success, failure)| Op::Txn { key, version, success, failure }),
        1 => any::<u32>().prop_map(|pick| Op::Compact { pick }),
        1 => Just(Op::Reopen),
    ]
}

fn read_strategy() -> impl Strategy<Value = Read> {
    (
        (
            0..KEYS.len(),
            0u8..4,
            any::<u32>(),
            prop_oneof![Just(0i64), Just(1), Just(2), Just(5), Just(-1)],
        ),
        (0i32..5, 0i32..3, any::<bool>(), prop::bool::weighted(0.15)),
        (
            prop_oneof![3 => Just(0i64), 1 => 1i64..30],
            prop_oneof![3 => Just(0i64), 1 => 1i64..30],
        ),
    )
        .prop_map(
            |(
                (key, shape, rev_pick, limit),
                (sort_target, sort_order, keys_only, count_only),
                (min_mod, max_create),
            )| Read {
                key,
                shape,
                rev_pick,
                limit,
                sort_target,
                sort_order,
                keys_only,
                count_only,
                min_mod,
                max_create,
            },
        )
}

/// The reference: every revision of every key, and nothing clever.
#[derive(Default)]
struct Model {
    rev: i64,
    compact: i64,
    /// key → [(revision, Some(kv) for a put / None for a delete)]
    hist: BTreeMap<Vec<u8>, Vec<(Revision, Option<KeyValue>)>>,
    /// Hash observed at each revision: must never change.
    hashes: HashMap<i64, u32>,
}

impl Model {
    fn new() -> Model {
        Model {
            rev: 1,
            compact: -1,
            ..Default::default()
        }
    }

    fn at(&self, key: &[u8], rev: i64) -> Option<&KeyValue> {
        self.hist
            .get(key)?
            .iter()
            .rev()
            .find(|(r, _)| r.main <= rev)?
            .1
            .as_ref()
    }

    fn state(&self, rev: i64) -> Vec<KeyValue> {
        self.hist
            .keys()
            .filter_map(|k| self.at(k, rev).cloned())
            .collect()
    }

    /// Applies writes as one entry (one main revision); returns the events.
    fn apply(&mut self, writes: &[Write]) -> Vec<Event> {
        let main = self.rev + 1;
        let mut events = Vec::new();
        for w in writes {
            match w {
                Write::Put { key, value, lease } => {
                    let k = KEYS[*key].as_bytes().to_vec();
                    let view = self.rev + i64::from(!events.is_empty());
                    let (create, version) = match self.at(&k, view.max(main)) {
                        Some(kv) => (kv.create_revision, kv.version + 1),
                        None => (main, 1),
                    };
                    let kv = KeyValue {
                        key: k.clone(),
                        create_revision: create,
                        mod_revision: main,
                        version,
                        value: vec![b'0' + value],
                        lease: *lease,
                    };
                    let rev = Revision::new(main, events.len() as i64);
                    self.hist
                        .entry(k)
                        .or_default()
                        .push((rev, Some(kv.clone())));
                    events.push(Event {
                        r#type: EventType::Put as i32,
                        kv: Some(kv),
                        prev_kv: None,
                    });
                }
                Write::Delete { key, end } => {
                    let (start, end_bytes) = delete_bounds(*key, *end);
                    let range = KeyRange::from_request(start.as_bytes(), &end_bytes);
                    let doomed: Vec<Vec<u8>> = self
                        .hist
                        .keys()
                        .filter(|k| range.contains(k) && self.at(k, main).is_some())
                        .cloned()
                        .collect();
                    for k in doomed {
                        let rev = Revision::new(main, events.len() as i64);
                        self.hist.get_mut(&k).unwrap().push((rev, None));
                        let kv = KeyValue {
                            key: k,
                            mod_revision: main,
                            ..Default::default()
                        };
                        events.push(Event {
                            r#type: EventType::Delete as i32,
                            kv: Some(kv),
                            prev_kv: None,
                        });
                    }
                }
            }
        }
        if !events.is_empty() {
            self.rev = main;
        }
        events
    }

    fn range(&self, req: &RangeRequest) -> Result<RangeResponse, EtcdError> {
        if req.revision > self.rev {
            return Err(EtcdError::FutureRev);
        }
        let rev = if req.revision <= 0 {
            self.rev
        } else {
            req.revision
        };
        if rev < self.compact {
            return Err(EtcdError::Compacted);
        }
        let range = KeyRange::from_request(&req.key, &req.range_end);
        let mut kvs: Vec<KeyValue> = self
            .state(rev)
            .into_iter()
            .filter(|kv| range.contains(&kv.key))
            .collect();
        let count = kvs.len() as i64;
        let header = Some(ResponseHeader {
            revision: self.rev,
            ..Default::default()
        });
        if req.count_only {
            return Ok(RangeResponse {
                header,
                kvs: vec![],
                more: false,
                count,
            });
        }
        kvs.retain(|kv| {
            !(req.max_mod_revision != 0 && kv.mod_revision > req.max_mod_revision
                || req.min_mod_revision != 0 && kv.mod_revision < req.min_mod_revision
                || req.max_create_revision != 0 && kv.create_revision > req.max_create_revision
                || req.min_create_revision != 0 && kv.create_revision < req.min_create_revision)
        });
        let mut order = req.sort_order;
        if req.sort_target != SortTarget::Key as i32 && order == SortOrder::None as i32 {
            order = SortOrder::Ascend as i32;
        }
        let field = |kv: &KeyValue| -> (Vec<u8>, i64) {
            match SortTarget::try_from(req.sort_target).unwrap() {
                SortTarget::Key => (kv.key.clone(), 0),
                SortTarget::Version => (vec![], kv.version),
                SortTarget::Create => (vec![], kv.create_revision),
                SortTarget::Mod => (vec![], kv.mod_revision),
                SortTarget::Value => (kv.value.clone(), 0),
            }
        };
        if order == SortOrder::Ascend as i32 {
            kvs.sort_by_key(|a| field(a));
        } else if order == SortOrder::Descend as i32 {
            kvs.sort_by_key(|a| std::cmp::Reverse(field(a)));
        }
        let mut more = false;
        if req.limit > 0 && kvs.len() > req.limit as usize {
            kvs.truncate(req.limit as usize);
            more = true;
        }
        if req.keys_only {
            kvs.iter_mut().for_each(|kv| kv.value.clear());
        }
        Ok(RangeResponse {
            header,
            kvs,
            more,
            count,
        })
    }

    /// Keel's HashKV definition over the model.
    fn hash(&self, rev: i64) -> u32 {
        let mut visible: Vec<(Revision, Vec<u8>)> = self
            .hist
            .values()
            .filter_map(|h| {
                let (r, kv) = h.iter().rev().find(|(r, _)| r.main <= rev)?;
                kv.as_ref().map(|kv| (*r, kv.encode_to_vec()))
            })
            .collect();
        visible.sort();
        let mut bytes = b"key".to_vec();
        for (r, v) in visible {
            bytes.extend_from_slice(&etcd_rev_bytes(r, false));
            bytes.extend_from_slice(&v);
        }
        super::crc32c(&bytes)
    }

    fn events_after(&self, from: i64) -> Vec<Event> {
        let mut all: Vec<(Revision, Event)> = Vec::new();
        for (k, h) in &self.hist {
            for (r, kv) in h.iter().filter(|(r, _)| r.main >= from) {
                let (t, kv) = match kv {
                    Some(kv) => (EventType::Put, kv.clone()),
                    None => (
                        EventType::Delete,
                        KeyValue {
                            key: k.clone(),
                            mod_revision: r.main,
                            ..Default::default()
                        },
                    ),
                };
                all.push((
                    *r,
                    Event {
                        r#type: t as i32,
                        kv: Some(kv),
                        prev_kv: None,
                    },
                ));
            }
        }
        all.sort_by_key(|(r, _)| *r);
        all.into_iter().map(|(_, e)| e).collect()
    }
}

fn delete_bounds(key: usize, end: Option<usize>) -> (String, Vec<u8>) {
    let start = KEYS[key].to_string();
    let end = match end {
        None => vec![],
        Some(e) if e == key => vec![0],
        Some(e) => KEYS[e].as_bytes().to_vec(),
    };
    (start, end)
}

fn request_op(w: &Write) -> RequestOp {
    match w {
        Write::Put { key, value, lease } => RequestOp {
            request: Some(Request::RequestPut(PutRequest {
                key: KEYS[*key].into(),
                value: vec![b'0' + value],
                lease: *lease,
                ..Default::default()
            })),
        },
        Write::Delete { key, end } => {
            let (start, end) = delete_bounds(*key, *end);
            RequestOp {
                request: Some(Request::RequestDeleteRange(DeleteRangeRequest {
                    key: start.into_bytes(),
                    range_end: end,
                    prev_kv: false,
                })),
            }
        }
    }
}

fn range_request(m: &Model, r: &Read) -> RangeRequest {
    let key = KEYS[r.key].as_bytes().to_vec();
    let range_end = match r.shape {
        0 => vec![],
        1 => {
            let mut e = key.clone();
            *e.last_mut().unwrap() += 1;
            e
        }
        2 => KEYS[(r.key + 2).min(KEYS.len() - 1)].as_bytes().to_vec(),
        _ => vec![0],
    };
    // Revisions from 1 to current + 2: some compacted, some in the future.
    let revision = if r.rev_pick.is_multiple_of(4) {
        0
    } else {
        1 + (r.rev_pick as i64 % (m.rev + 2))
    };
    RangeRequest {
        key,
        range_end,
        limit: r.limit,
        revision,
        sort_order: r.sort_order,
        sort_target: r.sort_target,
        serializable: false,
        keys_only: r.keys_only,
        count_only: r.count_only,
        min_mod_revision: r.min_mod,
        max_mod_revision: 0,
        min_create_revision: 0,
        max_create_revision: r.max_create,
    }
}

fn check(f: &Fixture, m: &mut Model, reads: &[Read]) -> Result<(), TestCaseError> {
    prop_assert_eq!(f.store.current_revision(), m.rev);
    prop_assert_eq!(f.store.compact_revision(), m.compact.max(0));
    f.store.view().index.check_invariants();
    for r in reads {
        let req = range_request(m, r);
        prop_assert_eq!(f.store.range(&req), m.range(&req), "request {:?}", req);
    }
    // HashKV at every readable revision equals the model's and never changes.
    for rev in m.compact.max(1)..=m.rev {
        let h = f
            .store
            .hash_kv(rev)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(h.hash, m.hash(rev), "hash at {}", rev);
        let seen = *m.hashes.entry(rev).or_insert(h.hash);
        prop_assert_eq!(seen, h.hash, "hash at {} changed", rev);
    }
    let from = m.compact + 1;
    let events = f
        .store
        .events(from, i64::MAX, 0)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(events.events, m.events_after(from.max(1)));
    Ok(())
}

/// The store's persist policy: `max_writes` (0: every group to sled at once), committed in
/// apply or on the background thread.
fn policy((max_writes, background): (usize, bool)) -> PersistPolicy {
    PersistPolicy {
        max_writes,
        max_bytes: u64::MAX,
        max_age: std::time::Duration::from_secs(3600),
        background,
    }
}

fn run(
    ops: Vec<Op>,
    reads: Vec<Read>,
    inline: usize,
    persist: (usize, bool),
) -> Result<(), TestCaseError> {
    let mut f = fixture();
    f.store.set_inline_removals(inline);
    f.store.set_persist_policy(policy(persist)).unwrap();
    let mut m = Model::new();
    for (i, op) in ops.into_iter().enumerate() {
        match op {
            Op::Write(w) => {
                let mut txn = f.store.write();
                match &w {
                    Write::Put { .. } => match request_op(&w).request {
                        Some(Request::RequestPut(p)) => drop(txn.put(&p).unwrap()),
                        _ => unreachable!(),
                    },
                    Write::Delete { .. } => match request_op(&w).request {
                        Some(Request::RequestDeleteRange(d)) => drop(txn.delete_range(&d).unwrap()),
                        _ => unreachable!(),
                    },
                }
                let committed = txn.commit().unwrap();
                let events = m.apply(std::slice::from_ref(&w));
                prop_assert_eq!(committed.revision, m.rev);
                prop_assert_eq!(committed.events, events);
            }
            Op::Txn {
                key,
                version,
                success,
                failure,
            } => {
                let holds = m.at(KEYS[key].as_bytes(), m.rev).map_or(0, |kv| kv.version) == version;
                let req = TxnRequest {
                    compare: vec![Compare {
                        result: CompareResult::Equal as i32,
                        target: CompareTarget::Version as i32,
                        key: KEYS[key].into(),
                        target_union: Some(TargetUnion::Version(version)),
                        range_end: vec![],
                    }],
                    success: success.iter().map(request_op).collect(),
                    failure: failure.iter().map(request_op).collect(),
                };
                let mut txn = f.store.write();
                let resp = txn.txn(&req).unwrap();
                let committed = txn.commit().unwrap();
                let events = m.apply(if holds { &success } else { &failure });
                prop_assert_eq!(resp.succeeded, holds);
                prop_assert_eq!(resp.header.unwrap().revision, m.rev);
                prop_assert_eq!(committed.events, events);
            }
            Op::Compact { pick } => {
                let span = m.rev - m.compact.max(0);
                if span > 0 {
                    let at = m.compact.max(0) + 1 + (pick as i64 % span);
                    let mut txn = f.store.write();
                    txn.compact(at).unwrap();
                    txn.commit().unwrap();
                    m.compact = at;
                }
            }
            Op::Reopen => {
                f = f.reopen();
                f.store.set_inline_removals(inline);
                f.store.set_persist_policy(policy(persist)).unwrap();
            }
        }
        let start = (i * 3) % reads.len().max(1);
        let picked: Vec<Read> = reads
            .iter()
            .cycle()
            .skip(start)
            .take(3.min(reads.len()))
            .cloned()
            .collect();
        check(&f, &mut m, &picked)?;
    }
    let f = f.reopen();
    check(&f, &mut m, &reads)?;
    // Every compacted record eventually leaves sled; nothing else does.
    if m.compact >= 0 {
        prop_assert!(
            f.store
                .wait_physical_compaction(m.compact, std::time::Duration::from_secs(20))
        );
    }
    let records = f.db.open_tree("keel").unwrap().scan_prefix(b"k").count();
    let indexed: usize = f.store.view().index.iter_all().map(|(_, h)| h.len()).sum();
    prop_assert_eq!(records, indexed);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, max_shrink_iters: 200, ..ProptestConfig::default() })]

    #[test]
    fn store_matches_model(
        ops in proptest::collection::vec(op_strategy(), 1..40),
        reads in proptest::collection::vec(read_strategy(), 1..24),
        inline in prop_oneof![Just(usize::MAX), Just(0usize), Just(2usize)],
        // Every group to sled at once, or groups pending (read from the overlay) until
        // 3 or 1,000 writes gather (committed in apply), or 2 (committed in the
        // background), a read scans sled, a compaction or a reopen.
        persist in prop_oneof![
            Just((0usize, false)),
            Just((3usize, false)),
            Just((1_000usize, false)),
            Just((2usize, true)),
        ],
    ) {
        run(ops, reads, inline, persist)?;
    }
}
