//! Property tests against a simple in-memory model of the log:
//! 1. random append/truncate/purge/meta sequences with reopens match the model;
//! 2. a crash (the last segment cut at a random offset, or a random byte flipped in its tail)
//!    recovers the model state after some prefix of the records that includes every
//!    acknowledged one, or reports corruption exactly when a sync point proves the damaged
//!    bytes were durable;
//! 3. random garbage in the preallocated tail and stale bytes of recycled segments never
//!    validate;
//! 4. corruption before the tail is an error naming the segment and offset.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;

use proptest::prelude::*;
use proptest::test_runner::Config;

use super::data;
use super::recovery::{FrameKind, frames, segment_paths};
use crate::wal::record::{self, Identity, Record};
use crate::wal::segment::HEADER_LEN;
use crate::wal::{Wal, WalError, WalOptions};

/// The log as a plain value: what the WAL must show.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Model {
    /// Log index of `entries[0]`; 0 when there are no entries.
    first: u64,
    entries: Vec<Vec<u8>>,
    purged: Option<u64>,
    meta: BTreeMap<u8, Vec<u8>>,
}

const META_KEYS: u8 = 4;

impl Model {
    fn last(&self) -> Option<u64> {
        (!self.entries.is_empty()).then(|| self.first + self.entries.len() as u64 - 1)
    }

    fn next_append(&self, gap: u64) -> u64 {
        match self.last() {
            Some(last) => last + 1,
            None => self.purged.map_or(1, |p| p + 1) + gap,
        }
    }

    fn append(&mut self, index: u64, bytes: Vec<u8>) {
        if self.entries.is_empty() {
            self.first = index;
        }
        assert_eq!(
            Some(index),
            self.last().map_or(Some(index), |l| Some(l + 1))
        );
        self.entries.push(bytes);
    }

    fn truncate_from(&mut self, index: u64) {
        let keep = index
            .saturating_sub(self.first)
            .min(self.entries.len() as u64);
        self.entries.truncate(keep as usize);
        self.normalize();
    }

    fn purge_to(&mut self, index: u64) {
        self.purged = Some(index);
        let drop = (index + 1)
            .saturating_sub(self.first)
            .min(self.entries.len() as u64);
        self.entries.drain(..drop as usize);
        self.first += drop;
        self.normalize();
    }

    fn normalize(&mut self) {
        if self.entries.is_empty() {
            self.first = 0;
        }
    }
}

/// Reads the whole visible state of `wal`, checking the accessors agree with each other.
fn observe(wal: &Wal) -> Model {
    let all = wal.read_range(0, u64::MAX).unwrap();
    assert_eq!(wal.first_index(), all.first().map(|e| e.0));
    assert_eq!(wal.last_index(), all.last().map(|e| e.0));
    let mut m = Model {
        first: all.first().map_or(0, |e| e.0),
        entries: all.into_iter().map(|e| e.1).collect(),
        purged: wal.purged_index(),
        meta: BTreeMap::new(),
    };
    for key in 0..META_KEYS {
        if let Some(v) = wal.meta(key) {
            m.meta.insert(key, v);
        }
    }
    m.normalize();
    m
}

#[derive(Clone, Debug)]
enum Op {
    /// `count` entries of `len` bytes; on an empty log, `gap` indexes above the purge point.
    Append {
        count: usize,
        len: usize,
        gap: u64,
    },
    /// `set_meta`, or `set_meta_lazy` when `lazy` (no sync round of its own).
    Meta {
        key: u8,
        len: usize,
        lazy: bool,
    },
    /// truncate_from(last + 1 - back)
    Truncate {
        back: u64,
    },
    /// purge_to(first - 1 + ahead) (or above the purge point when empty)
    Purge {
        ahead: u64,
    },
    Sync,
    Reopen,
}

fn op(with_reopen: bool) -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (1usize..4, 0usize..200, 0u64..3).prop_map(|(count, len, gap)| Op::Append { count, len, gap }),
        2 => (0..META_KEYS, 0usize..40, any::<bool>()).prop_map(|(key, len, lazy)| Op::Meta { key, len, lazy }),
        1 => (0u64..6).prop_map(|back| Op::Truncate { back }),
        1 => (0u64..10).prop_map(|ahead| Op::Purge { ahead }),
        1 => Just(Op::Sync),
        (u32::from(with_reopen)) => Just(Op::Reopen),
    ]
}

/// One record written by an op: the model state after it and its payload length.
struct Written {
    state: Model,
    payload_len: usize,
}

/// Runs `op` on both the WAL and the model; returns the records written (Reopen is handled
/// by the caller).
fn run(wal: &Wal, model: &mut Model, op: &Op, salt: u64) -> Vec<Written> {
    let mut out = Vec::new();
    match *op {
        Op::Append { count, len, gap } => {
            let first = model.next_append(gap);
            let owned: Vec<(u64, Vec<u8>)> = (first..first + count as u64)
                .map(|i| (i, data(i ^ salt, len)))
                .collect();
            let refs: Vec<(u64, &[u8])> = owned.iter().map(|(i, d)| (*i, d.as_slice())).collect();
            wal.append(&refs).unwrap();
            for (i, d) in owned {
                model.append(i, d);
                out.push(Written {
                    state: model.clone(),
                    payload_len: 8 + len,
                });
            }
        }
        Op::Meta { key, len, lazy } => {
            let value = data(salt.wrapping_mul(13) + u64::from(key), len);
            match lazy {
                true => wal.set_meta_lazy(key, &value).unwrap(),
                false => wal.set_meta(key, &value).unwrap(),
            };
            model.meta.insert(key, value);
            out.push(Written {
                state: model.clone(),
                payload_len: 1 + len,
            });
        }
        Op::Truncate { back } => {
            if let Some(last) = model.last() {
                let from = (last + 1).saturating_sub(back);
                wal.truncate_from(from).unwrap();
                if from <= last {
                    model.truncate_from(from);
                    out.push(Written {
                        state: model.clone(),
                        payload_len: 8,
                    });
                }
            }
        }
        Op::Purge { ahead } => {
            let base = match (model.last(), model.purged) {
                (Some(_), _) => model.first.saturating_sub(1),
                (None, Some(p)) => p,
                (None, None) => 0,
            };
            let to = base + ahead;
            wal.purge_to(to).unwrap();
            if model.purged.is_none_or(|p| p < to) {
                model.purge_to(to);
                out.push(Written {
                    state: model.clone(),
                    payload_len: 8,
                });
            }
        }
        Op::Sync => wal.sync().unwrap(),
        Op::Reopen => unreachable!("handled by the caller"),
    }
    out
}

fn config(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: None,
        max_shrink_time: 30_000,
        timeout: 20_000,
        ..Config::default()
    }
}

fn wal_options(segment_bytes: u64, recycle: usize, preallocate: bool) -> WalOptions {
    WalOptions {
        segment_bytes,
        preallocate,
        recycle_segments: recycle,
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

fn seq_of(path: &Path) -> u64 {
    let name = path.file_name().unwrap().to_str().unwrap();
    u64::from_str_radix(&name[..16], 16).unwrap()
}

proptest! {
    #![proptest_config(config(128))]

    /// (1) Random sequences with reopens match the model after every step.
    #[test]
    fn random_operations_with_reopen_match_the_model(
        ops in prop::collection::vec(op(true), 1..60),
        segment_bytes in 300u64..4096,
        recycle in 0usize..3,
        preallocate in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let o = wal_options(segment_bytes, recycle, preallocate);
        let mut wal = Wal::open(dir.path(), o.clone()).unwrap();
        let mut model = Model::default();
        for (n, op) in ops.iter().enumerate() {
            if let Op::Reopen = op {
                drop(wal);
                wal = Wal::open(dir.path(), o.clone()).unwrap();
            } else {
                run(&wal, &mut model, op, n as u64);
            }
            prop_assert_eq!(&observe(&wal), &model, "after op {} {:?}", n, op);
        }
        drop(wal);
        let wal = Wal::open(dir.path(), o).unwrap();
        prop_assert_eq!(&observe(&wal), &model);
    }
}

#[derive(Clone, Debug)]
enum Damage {
    /// Cut the file at this fraction of the allowed range.
    Cut(f64),
    /// XOR the byte at this fraction of the allowed range with a non-zero mask.
    Flip(f64, u8),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        (0.0f64..=1.0).prop_map(Damage::Cut),
        (0.0f64..1.0, 1u8..=255).prop_map(|(at, mask)| Damage::Flip(at, mask)),
    ]
}

proptest! {
    #![proptest_config(config(192))]

    /// (2) Crash at a random byte of the last segment's tail.
    #[test]
    fn crash_recovers_a_prefix_including_every_acknowledged_record(
        ops in prop::collection::vec(op(false), 1..40),
        segment_bytes in 400u64..3000,
        ack_at in 0.0f64..1.0,
        damage in damage(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let opts = wal_options(segment_bytes, 1, true);
        let wal = Wal::open(dir.path(), opts.clone()).unwrap();
        let mut model = Model::default();
        // states[k] = model after the first k records; ends[k-1] = (segment, end) of record k.
        let mut states = vec![Model::default()];
        let mut ends: Vec<(u64, u64)> = Vec::new();
        let ack_op = (ack_at * ops.len() as f64) as usize;
        let (mut acked, mut ack_pos) = (0usize, (0u64, 0u64));
        for (n, op) in ops.iter().enumerate() {
            let written = run(&wal, &mut model, op, n as u64);
            if !written.is_empty() {
                let (seq, batch_end) = wal.last_write_end();
                let total: u64 = written.iter().map(|w| record::frame_len(w.payload_len) as u64).sum();
                let mut at = batch_end - total;
                for w in written {
                    ends.push((seq, at + 12 + w.payload_len as u64));
                    at += record::frame_len(w.payload_len) as u64;
                    states.push(w.state);
                }
            }
            if n == ack_op {
                wal.sync().unwrap();
                acked = states.len() - 1;
                ack_pos = wal.last_write_end();
            }
        }
        drop(wal);

        let crash = tempfile::tempdir().unwrap();
        copy_dir(dir.path(), crash.path());
        let last = segment_paths(crash.path()).pop().unwrap();
        let last_seq = seq_of(&last);
        let (_, fr) = frames(&last);
        let file_len = std::fs::metadata(&last).unwrap().len();
        // A crash only loses bytes that were not durable yet: never the metadata snapshot of a
        // named segment, an acknowledged record, or a purge that already deleted segments.
        let mut lo = HEADER_LEN;
        if last_seq > 1 {
            lo = fr
                .iter()
                .take_while(|f| matches!(f.kind, FrameKind::Meta | FrameKind::Purge))
                .last()
                .map_or(lo, |f| f.padded_end);
        }
        if ack_pos.0 == last_seq {
            lo = lo.max(ack_pos.1);
        }
        if let Some(p) = fr.iter().rev().find(|f| f.kind == FrameKind::Purge) {
            lo = lo.max(p.padded_end);
        }
        let data_end = fr.last().map_or(HEADER_LEN, |f| f.padded_end);
        let file = OpenOptions::new().read(true).write(true).open(&last).unwrap();
        let span = file_len.saturating_sub(lo);
        // `cut`: where recovery must meet the first invalid record; `survives(i)`: frame i is
        // still valid after the damage.
        let (cut, broken, is_cut) = match damage {
            Damage::Cut(at) => {
                let c = lo + (at * span as f64) as u64;
                file.set_len(c).unwrap();
                let i = fr.iter().position(|f| f.end > c);
                (i.map_or(data_end, |i| fr[i].start), i, true)
            }
            Damage::Flip(at, mask) => {
                prop_assume!(span > 0);
                let p = (lo + (at * span as f64) as u64).min(file_len - 1);
                let mut b = [0u8];
                file.read_exact_at(&mut b, p).unwrap();
                file.write_all_at(&[b[0] ^ mask], p).unwrap();
                let i = fr.iter().position(|f| f.start <= p && p < f.end);
                (i.map_or(data_end, |i| fr[i].start), i, false)
            }
        };
        drop(file);
        let survives = |i: usize| if is_cut { broken.is_none_or(|b| i < b) } else { Some(i) != broken };
        let claim = fr
            .iter()
            .enumerate()
            .filter(|(i, _)| survives(*i))
            .filter_map(|(_, f)| match f.kind {
                FrameKind::SyncPoint(x) => Some(x),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        let opened = Wal::open(crash.path(), opts.clone());
        if claim > cut {
            match opened {
                Err(WalError::Corrupt { segment, offset, .. }) => {
                    prop_assert_eq!(segment, last.clone());
                    prop_assert_eq!(offset, cut);
                }
                other => prop_assert!(false, "expected Corrupt at {}, got {:?}", cut, other.map(|_| ())),
            }
            return Ok(());
        }
        let wal = opened.unwrap();
        let bytes = std::fs::read(&last).unwrap();
        prop_assert!(
            bytes.get(cut as usize..).unwrap_or_default().iter().all(|&b| b == 0),
            "bytes after the cut at {} were not erased", cut
        );
        let k = ends.iter().filter(|(seq, end)| *seq < last_seq || *end <= cut).count();
        prop_assert!(k >= acked, "lost acknowledged records: kept {} of {}", k, acked);
        prop_assert_eq!(&observe(&wal), &states[k], "kept {} records, cut at {}", k, cut);

        // Appending after recovery never resurrects bytes from before the crash.
        let mut after = states[k].clone();
        let next = after.next_append(0);
        wal.append(&[(next, b"after the crash")]).unwrap();
        after.append(next, b"after the crash".to_vec());
        drop(wal);
        let wal = Wal::open(crash.path(), opts).unwrap();
        prop_assert_eq!(&observe(&wal), &after);
    }
}

/// Runs `ops`, then makes everything durable and closes the WAL; returns the model.
fn run_all(dir: &Path, opts: &WalOptions, ops: &[Op]) -> Model {
    let wal = Wal::open(dir, opts.clone()).unwrap();
    let mut model = Model::default();
    for (n, op) in ops.iter().enumerate() {
        run(&wal, &mut model, op, n as u64);
    }
    wal.sync().unwrap();
    model
}

proptest! {
    #![proptest_config(config(128))]

    /// (3) Random garbage after the last record, frames of other segments or of an earlier
    /// incarnation of the same file, and stale records of recycled files never validate: the
    /// log recovers exactly, and the garbage is erased.
    #[test]
    fn garbage_in_the_tail_or_recycled_files_never_validates(
        ops in prop::collection::vec(op(false), 1..60),
        segment_bytes in 400u64..2000,
        recycle in 1usize..3,
        garbage in prop::collection::vec(any::<u8>(), 1..300),
        at in 0.0f64..1.0,
        foreign in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let opts = wal_options(segment_bytes, recycle, true);
        let model = run_all(dir.path(), &opts, &ops);
        let paths = segment_paths(dir.path());
        let last = paths.last().unwrap().clone();
        let (id, fr) = frames(&last);
        let data_end = fr.last().map_or(HEADER_LEN, |f| f.padded_end);
        let file_len = std::fs::metadata(&last).unwrap().len();
        prop_assume!(file_len > data_end + 64);
        let file = OpenOptions::new().read(true).write(true).open(&last).unwrap();
        let room = file_len - data_end;
        let pos = data_end + (at * room as f64) as u64;
        let len = garbage.len().min((file_len - pos) as usize);
        file.write_all_at(&garbage[..len], pos).unwrap();
        if foreign {
            // Frames that are valid elsewhere: an earlier incarnation of this file, and the
            // first segment of the directory; one claims everything was durable.
            let mut frames_buf = Vec::new();
            let stale = Identity { nonce: id.nonce ^ 0x9e37, ..id };
            let other = Identity { seq: id.seq + 1, ..id };
            for who in [stale, other] {
                record::encode(who, &Record::SyncPoint { durable_through: u64::MAX }, &mut frames_buf);
                record::encode(who, &Record::Entry { index: 1, data: b"stale" }, &mut frames_buf);
            }
            if data_end + frames_buf.len() as u64 <= file_len {
                file.write_all_at(&frames_buf, data_end).unwrap();
            }
        }
        drop(file);
        let wal = Wal::open(dir.path(), opts).unwrap();
        prop_assert_eq!(&observe(&wal), &model);
        let bytes = std::fs::read(&last).unwrap();
        prop_assert!(bytes[data_end as usize..].iter().all(|&b| b == 0), "garbage not erased");
    }

    /// (4) Damage to a sealed segment, to a segment header, or to the last segment before its
    /// last sync point is reported as corruption at the damaged record.
    #[test]
    fn corruption_before_the_tail_is_an_error(
        ops in prop::collection::vec(op(false), 1..50),
        segment_bytes in 400u64..3000,
        pick_segment in 0.0f64..1.0,
        pick_frame in 0.0f64..1.0,
        pick_byte in 0.0f64..1.0,
        mask in 1u8..=255,
        in_header in prop::bool::weighted(0.15),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let opts = wal_options(segment_bytes, 1, true);
        let mut ops = ops;
        ops.extend([Op::Append { count: 1, len: 10, gap: 0 }, Op::Sync, Op::Append { count: 1, len: 10, gap: 0 }]);
        run_all(dir.path(), &opts, &ops);
        let paths = segment_paths(dir.path());
        let target = paths[((pick_segment * paths.len() as f64) as usize).min(paths.len() - 1)].clone();
        let is_last = &target == paths.last().unwrap();
        let (offset, at) = if in_header {
            (0, (pick_byte * 44.0) as u64)
        } else {
            let (_, fr) = frames(&target);
            let claim_without = |skip: usize| {
                fr.iter()
                    .enumerate()
                    .filter(|(i, _)| *i != skip)
                    .filter_map(|(_, f)| match f.kind {
                        FrameKind::SyncPoint(x) => Some(x),
                        _ => None,
                    })
                    .max()
                    .unwrap_or(0)
            };
            let eligible: Vec<usize> =
                (0..fr.len()).filter(|&i| !is_last || claim_without(i) > fr[i].start).collect();
            prop_assume!(!eligible.is_empty());
            let f = &fr[eligible[((pick_frame * eligible.len() as f64) as usize).min(eligible.len() - 1)]];
            (f.start, f.start + ((pick_byte * (f.end - f.start) as f64) as u64).min(f.end - f.start - 1))
        };
        let file = OpenOptions::new().read(true).write(true).open(&target).unwrap();
        let mut b = [0u8];
        file.read_exact_at(&mut b, at).unwrap();
        file.write_all_at(&[b[0] ^ mask], at).unwrap();
        drop(file);
        match Wal::open(dir.path(), opts) {
            Err(WalError::Corrupt { segment, offset: got, .. }) => {
                prop_assert_eq!(segment, target);
                prop_assert_eq!(got, offset);
            }
            other => prop_assert!(false, "expected Corrupt at {}, got {:?}", offset, other.map(|_| ())),
        }
    }
}
