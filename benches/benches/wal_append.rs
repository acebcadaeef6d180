//! Criterion: WAL append of a batch of 1, 16 or 256 entries of 256 B, waiting until the batch
//! is durable (one `fdatasync` per batch, as raft's log store appends one AppendEntries
//! batch). The WAL is on a temp dir under the current directory, so on the build disk, not a
//! tmpfs.
//!
//! ```sh
//! cargo bench -p keel-benches --bench wal_append -- --sample-size 10
//! ```

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use keel_server::wal::{Wal, WalOptions};

/// Bytes of each entry's payload (about a 256 B put with its raft framing).
const ENTRY_BYTES: usize = 256;

fn wal_append(c: &mut Criterion) {
    let dir = tempfile::tempdir_in(".").expect("temp dir for the WAL");
    let wal = Wal::open(dir.path(), WalOptions::default()).expect("open the WAL");
    let payload = vec![0xabu8; ENTRY_BYTES];
    let mut next_index = 1u64;
    let mut group = c.benchmark_group("wal_append");
    for batch in [1usize, 16, 256] {
        group.throughput(Throughput::Elements(batch as u64));
        group.bench_with_input(BenchmarkId::from_parameter(batch), &batch, |b, &batch| {
            b.iter(|| {
                let entries: Vec<(u64, &[u8])> = (0..batch as u64)
                    .map(|k| (next_index + k, payload.as_slice()))
                    .collect();
                let lsn = wal.append(&entries).expect("append");
                next_index += batch as u64;
                wal.wait_durable(lsn).expect("durable");
            });
        });
    }
    group.finish();
}

criterion_group!(benches, wal_append);
criterion_main!(benches);
