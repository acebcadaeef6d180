//! Shared builders for the checker tests: terse operations and a generator of histories from a
//! sequential etcd model with random overlapping timings.
#![allow(dead_code)]

use std::collections::HashMap;

use keel_chaos::check::{CheckOptions, CheckReport, Checker, check_history};
use keel_chaos::history::{
    EventKind, History, Input, Operation, Outcome, Output, WatchEvent, WatchRecord,
    WatchResponseRecord,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Asserts that a checker's message names `needle`, printing the message when it does not.
#[track_caller]
pub fn assert_mentions(message: &str, needle: &str) {
    assert!(
        message.contains(needle),
        "{message:?} does not mention {needle:?}"
    );
}

pub fn get(key: &str) -> Input {
    Input::Get {
        key: key.into(),
        linearizable: true,
    }
}
pub fn sget(key: &str) -> Input {
    Input::Get {
        key: key.into(),
        linearizable: false,
    }
}
pub fn put(key: &str, value: &str) -> Input {
    Input::Put {
        key: key.into(),
        value: value.into(),
    }
}
pub fn del(key: &str) -> Input {
    Input::Delete { key: key.into() }
}
pub fn cas(key: &str, expect: Option<&str>, value: &str) -> Input {
    Input::Cas {
        key: key.into(),
        expect: expect.map(Into::into),
        value: value.into(),
    }
}

pub fn got(kv: Option<(&str, i64)>, revision: i64) -> Outcome {
    Outcome::Ok(Output::Get {
        kv: kv.map(|(v, r)| (v.into(), r)),
        revision,
    })
}
pub fn put_ok(revision: i64) -> Outcome {
    Outcome::Ok(Output::Put { revision })
}
pub fn del_ok(deleted: i64, revision: i64) -> Outcome {
    Outcome::Ok(Output::Delete { deleted, revision })
}
pub fn cas_ok(succeeded: bool, revision: i64) -> Outcome {
    Outcome::Ok(Output::Cas {
        succeeded,
        revision,
    })
}
pub fn unknown() -> Outcome {
    Outcome::Unknown("deadline exceeded".into())
}
pub fn failed() -> Outcome {
    Outcome::Failed("connection refused".into())
}

/// An operation by `client` on member 0, from `invoke` to `ret` (ns).
pub fn op(client: u32, invoke: u64, ret: u64, input: Input, outcome: Outcome) -> Operation {
    Operation {
        client,
        member: 0,
        input,
        outcome,
        invoke_ns: invoke,
        return_ns: ret,
    }
}

/// Checks a history made of `ops` only.
pub fn check_ops(ops: Vec<Operation>) -> CheckReport {
    check_history(
        &History {
            operations: ops,
            ..History::default()
        },
        &CheckOptions::default(),
    )
}

/// The violations of one checker.
pub fn of(report: &CheckReport, checker: Checker) -> Vec<String> {
    report
        .violations
        .iter()
        .filter(|v| v.checker == checker)
        .map(|v| v.to_string())
        .collect()
}

pub fn put_event(key: &str, value: &str, rev: i64, create: i64, version: i64) -> WatchEvent {
    WatchEvent {
        kind: EventKind::Put,
        key: key.into(),
        value: value.into(),
        mod_revision: rev,
        create_revision: create,
        version,
    }
}
pub fn del_event(key: &str, rev: i64) -> WatchEvent {
    WatchEvent {
        kind: EventKind::Delete,
        key: key.into(),
        value: String::new(),
        mod_revision: rev,
        create_revision: 0,
        version: 0,
    }
}
pub fn response(at_ns: u64, header_revision: i64, events: Vec<WatchEvent>) -> WatchResponseRecord {
    WatchResponseRecord {
        at_ns,
        header_revision,
        events,
        compact_revision: 0,
    }
}
/// A watch on the single key `key` from `start_revision` (0 = now, created at `created`).
pub fn watch(
    key: &str,
    start_revision: i64,
    created: i64,
    responses: Vec<WatchResponseRecord>,
) -> WatchRecord {
    WatchRecord {
        watcher: 1,
        member: 0,
        key: key.into(),
        range_end: String::new(),
        start_revision,
        created_revision: created,
        responses,
        ended: None,
    }
}

/// Shape of a generated history.
#[derive(Clone, Copy, Debug)]
pub struct GenConfig {
    pub clients: u32,
    pub keys: usize,
    pub ops: usize,
    /// Probability (0..1) that an operation's outcome is unknown.
    pub unknown: f64,
    /// Probability that an operation fails (and certainly did not take effect).
    pub failed: f64,
}

/// One client operation before its output is known.
struct Planned {
    client: u32,
    input: Input,
    invoke: u64,
    ret: u64,
    /// When it takes effect; `None` when it never does.
    point: Option<u64>,
    outcome: Option<Outcome>,
}

/// A history produced by running a sequential etcd model: each client issues operations one at
/// a time with random durations; each operation takes effect at a random instant inside its
/// interval (unknown ones maybe never, or after the client gave up). Also records one watch
/// over every key that receives every change, in responses of random sizes with progress
/// notifications. Such a history satisfies every checked guarantee by construction.
pub fn generate(seed: u64, cfg: GenConfig) -> History {
    let mut rng = StdRng::seed_from_u64(seed);
    let keys: Vec<String> = (0..cfg.keys).map(|k| format!("k{k}")).collect();
    let mut clock = vec![0u64; cfg.clients as usize];
    let mut written: HashMap<String, Vec<String>> = HashMap::new();
    let mut planned = Vec::with_capacity(cfg.ops);
    for seq in 0..cfg.ops {
        let client = rng.gen_range(0..cfg.clients);
        let key = keys[rng.gen_range(0..keys.len())].clone();
        let value = format!("c{client}-{seq}");
        let input = match rng.gen_range(0..10) {
            0..=3 => put(&key, &value),
            4..=5 => get(&key),
            6 => sget(&key),
            7 => del(&key),
            _ => {
                let known = written
                    .get(&key)
                    .filter(|v| !v.is_empty() && rng.gen_bool(0.7));
                let expect = known.map(|v| v[rng.gen_range(0..v.len())].clone());
                cas(&key, expect.as_deref(), &value)
            }
        };
        if let Input::Put { value, .. } | Input::Cas { value, .. } = &input {
            written.entry(key.clone()).or_default().push(value.clone());
        }
        let invoke = clock[client as usize] + rng.gen_range(0..2_000);
        let ret = invoke + rng.gen_range(1..20_000);
        clock[client as usize] = ret;
        let roll: f64 = rng.r#gen();
        let (point, outcome) = if roll < cfg.failed {
            (None, Some(failed()))
        } else if roll < cfg.failed + cfg.unknown {
            let point = rng.gen_bool(0.5).then(|| invoke + rng.gen_range(0..60_000));
            (point, Some(unknown()))
        } else {
            (Some(rng.gen_range(invoke..=ret)), None)
        };
        planned.push(Planned {
            client,
            input,
            invoke,
            ret,
            point,
            outcome,
        });
    }

    // Apply in linearization order, filling in outputs and the watch's events.
    let mut order: Vec<usize> = (0..planned.len())
        .filter(|&i| planned[i].point.is_some())
        .collect();
    order.sort_by_key(|&i| planned[i].point);
    let mut revision = 1i64;
    let mut store: HashMap<String, (String, i64, i64, i64)> = HashMap::new(); // value, mod, create, version
    let mut changes: Vec<(u64, WatchEvent)> = Vec::new();
    for i in order {
        let point = planned[i].point.unwrap_or_default();
        let key = planned[i].input.key().to_string();
        let current = store.get(&key).cloned();
        let mut write = |store: &mut HashMap<_, _>, value: &str, revision: i64| {
            let (create, version) = match &current {
                Some((_, _, create, version)) => (*create, version + 1),
                None => (revision, 1),
            };
            store.insert(key.clone(), (value.to_string(), revision, create, version));
            changes.push((point, put_event(&key, value, revision, create, version)));
        };
        let output = match planned[i].input.clone() {
            Input::Get { .. } => Output::Get {
                kv: current.as_ref().map(|(v, m, _, _)| (v.clone(), *m)),
                revision,
            },
            Input::Put { value, .. } => {
                revision += 1;
                write(&mut store, &value, revision);
                Output::Put { revision }
            }
            Input::Delete { .. } => {
                if current.is_some() {
                    revision += 1;
                    store.remove(&key);
                    changes.push((point, del_event(&key, revision)));
                    Output::Delete {
                        deleted: 1,
                        revision,
                    }
                } else {
                    Output::Delete {
                        deleted: 0,
                        revision,
                    }
                }
            }
            Input::Cas { expect, value, .. } => {
                if current.as_ref().map(|(v, _, _, _)| v) == expect.as_ref() {
                    revision += 1;
                    write(&mut store, &value, revision);
                    Output::Cas {
                        succeeded: true,
                        revision,
                    }
                } else {
                    Output::Cas {
                        succeeded: false,
                        revision,
                    }
                }
            }
        };
        if planned[i].outcome.is_none() {
            planned[i].outcome = Some(Outcome::Ok(output));
        }
    }
    let operations = planned
        .into_iter()
        .map(|p| Operation {
            client: p.client,
            member: (p.client % 3) as usize,
            input: p.input,
            outcome: p.outcome.unwrap_or_else(unknown),
            invoke_ns: p.invoke,
            return_ns: p.ret,
        })
        .collect();

    // One watch over all keys from revision 1 ("from now" at creation), delivering every change.
    let mut responses = Vec::new();
    let mut at = 0u64;
    let mut pending = changes.into_iter().peekable();
    while pending.peek().is_some() {
        let batch: Vec<(u64, WatchEvent)> = (0..rng.gen_range(1..4))
            .filter_map(|_| pending.next())
            .collect();
        let last = batch
            .last()
            .map(|(p, e)| (*p, e.mod_revision))
            .unwrap_or_default();
        at = at.max(last.0) + rng.gen_range(1..1_000);
        responses.push(response(
            at,
            last.1,
            batch.into_iter().map(|(_, e)| e).collect(),
        ));
        if rng.gen_bool(0.2) {
            at += 1;
            responses.push(response(at, last.1, Vec::new()));
        }
    }
    let watch = WatchRecord {
        watcher: 0,
        member: 0,
        key: "k".into(),
        range_end: "\0".into(),
        start_revision: 0,
        created_revision: 1,
        responses,
        ended: None,
    };
    History {
        operations,
        watches: vec![watch],
        finals: Vec::new(),
        member_revisions: Vec::new(),
    }
}
