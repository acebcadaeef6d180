//! Criterion: the in-memory key index (`keel_server::mvcc::index`) under apply groups, the
//! way a member applies puts: each group clones the published index, appends a revision to
//! `GROUPS` random keys (every key already has older revisions, as under a steady put load)
//! and publishes the result, dropping the previous index. The copy-on-write cost of a put is
//! the chunk and block copies its key's path needs (docs/mvcc.md, "Key index").
//!
//! A second group puts to one hot key with a long history: the cost of a put must not grow
//! with the number of revisions the key holds.
//!
//! ```sh
//! cargo bench -p keel-benches --bench index -- --sample-size 20
//! ```

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use keel_server::mvcc::Revision;
use keel_server::mvcc::index::Index;
use keel_server::mvcc::key_index::{KeyHistory, RevInfo};

/// Puts per apply group: 3 members under 64 clients apply about 6–16 per group, under 256
/// clients about 60–90 (`keel_apply_group_entries` × `keel_proposal_batch_requests`).
const GROUPS: [u64; 2] = [16, 64];

fn key(i: u64) -> Vec<u8> {
    format!("{i:016}").into_bytes()
}

/// `keys` keys of 16 bytes, each with 3 revisions.
fn build(keys: u64) -> Index {
    Index::from_sorted((0..keys).map(|i| {
        let revs = (0..3)
            .map(|v| {
                RevInfo::put(
                    Revision::new(1 + v * keys as i64 + i as i64, 0),
                    1,
                    v + 1,
                    0,
                )
            })
            .collect();
        (key(i), KeyHistory::from_revisions(revs).expect("revisions"))
    }))
}

fn index(c: &mut Criterion) {
    for puts in GROUPS {
        let mut group = c.benchmark_group("index_apply_group");
        group.throughput(Throughput::Elements(puts));
        for keys in [100_000u64, 1_000_000] {
            let mut published = build(keys);
            let mut rev = 4 * keys as i64;
            let mut i = 0u64;
            group.bench_with_input(
                BenchmarkId::new(format!("put_{puts}_random"), keys),
                &keys,
                |b, &keys| {
                    b.iter(|| {
                        let mut staged = published.clone();
                        for _ in 0..puts {
                            i = (i + 104_729) % keys;
                            rev += 1;
                            staged.push(&key(i), RevInfo::put(Revision::new(rev, 0), 1, 4, 0));
                        }
                        published = staged;
                    })
                },
            );
            assert_eq!(published.keys(), keys as usize);
        }
        group.finish();
    }
}

/// One hot key with `older` revisions since the last compaction (a config or election key
/// updated every second, with no auto-compaction, holds 86,400 after a day) among 100k
/// keys: a put clones the published index and appends one revision to that key, while the
/// published index still holds the key's history (as readers and the previous apply group
/// do). The history stays at `older` revisions: each put starts from the same index.
fn hot_key(c: &mut Criterion) {
    let mut group = c.benchmark_group("index_hot_key_put");
    group.throughput(Throughput::Elements(1));
    for older in [16u64, 1_000, 100_000] {
        let mut published = build(100_000);
        let hot = key(50_000);
        let mut rev = 400_000i64;
        for _ in 0..older {
            rev += 1;
            published.push(&hot, RevInfo::put(Revision::new(rev, 0), 1, 4, 0));
        }
        let next = RevInfo::put(Revision::new(rev + 1, 0), 1, 4, 0);
        group.bench_with_input(BenchmarkId::new("older", older), &older, |b, _| {
            b.iter_batched(
                || published.clone(),
                |mut staged| {
                    staged.push(&hot, next);
                    staged
                },
                BatchSize::SmallInput,
            )
        });
        assert_eq!(
            published.get(&hot).expect("hot key").len() as u64,
            older + 3
        );
    }
    group.finish();
}

criterion_group!(benches, index, hot_key);
criterion_main!(benches);
