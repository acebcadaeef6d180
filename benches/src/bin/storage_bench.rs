//! Storage micro-benchmarks for the single-member slice. Not part of `cargo test`; run in
//! release and copy the figures into docs/benchmarks.md:
//!
//! ```sh
//! cargo run --release -p keel-benches --bin storage-bench -- wal --appenders 64 --record-bytes 300 --seconds 10
//! cargo run --release -p keel-benches --bin storage-bench -- mvcc --keys 1000000
//! cargo run --release -p keel-benches --bin storage-bench -- member --endpoint 127.0.0.1:2379 --pid <keel pid> --keys 1000000
//! cargo run --release -p keel-benches --bin storage-bench -- etcd-db --mib 96
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use keel_benches::mvcc_data::{all_keys, key, load, open_db};
use keel_proto::etcdserverpb::{PutRequest, RangeRequest, RequestOp, TxnRequest, request_op};
use keel_server::mvcc::MvccStore;
use keel_server::wal::{Wal, WalOptions};

#[derive(Parser)]
#[command(about = "Keel storage micro-benchmarks")]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// WAL group commit: N threads append one record each and wait until it is durable.
    Wal {
        #[arg(long, default_value_t = 64)]
        appenders: usize,
        #[arg(long, default_value_t = 300)]
        record_bytes: usize,
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Directory for the WAL (default: a temp dir under the current directory's disk).
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
    },
    /// MVCC over N keys (16 B keys, 256 B values): load, count_only, limit 10, index rebuild.
    Mvcc {
        #[arg(long, default_value_t = 1_000_000)]
        keys: u64,
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
    },
    /// Loads N keys (16 B, 256 B values) into a running member over gRPC and reports its RSS.
    Member {
        #[arg(long, default_value = "127.0.0.1:2379")]
        endpoint: String,
        /// PID of the keel process, to read its RSS from /proc.
        #[arg(long)]
        pid: u32,
        #[arg(long, default_value_t = 1_000_000)]
        keys: u64,
        #[arg(long, default_value_t = 64)]
        clients: usize,
        /// Puts per request: 1 sends plain Puts; more sends Txns of that many puts (at most
        /// --max-txn-ops, 128 by default), which loads large stores quickly.
        #[arg(long, default_value_t = 1)]
        batch: u64,
    },
    /// Writes an etcd-format bbolt file of N MiB of 1 KiB values generated on the fly and
    /// reports how much this process's anonymous memory grew (the writer must stream).
    EtcdDb {
        #[arg(long, default_value_t = 96)]
        mib: i64,
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
    },
}

fn main() {
    match Args::parse().cmd {
        Cmd::Wal {
            appenders,
            record_bytes,
            seconds,
            dir,
        } => wal(appenders, record_bytes, seconds, dir),
        Cmd::Mvcc { keys, dir } => mvcc(keys, dir),
        Cmd::Member {
            endpoint,
            pid,
            keys,
            clients,
            batch,
        } => member(&endpoint, pid, keys, clients, batch),
        Cmd::EtcdDb { mib, dir } => etcd_db(mib, dir),
    }
}

fn temp_in(dir: Option<std::path::PathBuf>) -> tempfile::TempDir {
    match dir {
        Some(d) => tempfile::tempdir_in(d).expect("temp dir"),
        None => tempfile::tempdir_in(".").expect("temp dir"),
    }
}

fn wal(appenders: usize, record_bytes: usize, seconds: u64, dir: Option<std::path::PathBuf>) {
    let tmp = temp_in(dir);
    let wal = Arc::new(Wal::open(tmp.path(), WalOptions::default()).expect("open wal"));
    let next_index = Arc::new(std::sync::Mutex::new(1u64));
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut lat_us: Vec<u64> = Vec::new();
    std::thread::scope(|s| {
        let mut handles = Vec::new();
        for _ in 0..appenders {
            let (wal, next_index, done, stop) =
                (wal.clone(), next_index.clone(), done.clone(), stop.clone());
            handles.push(s.spawn(move || {
                let payload = vec![0xabu8; record_bytes];
                let mut lats = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    // Index assignment and append under one lock keep indexes contiguous, like
                    // raft's single appender; the fsync wait happens outside it.
                    let lsn = {
                        let mut i = next_index.lock().unwrap();
                        let lsn = wal.append(&[(*i, &payload)]).expect("append");
                        *i += 1;
                        lsn
                    };
                    wal.wait_durable(lsn).expect("durable");
                    lats.push(t.elapsed().as_micros() as u64);
                    done.fetch_add(1, Ordering::Relaxed);
                }
                lats
            }));
        }
        std::thread::sleep(Duration::from_secs(seconds));
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            lat_us.extend(h.join().unwrap());
        }
    });
    let elapsed = start.elapsed().as_secs_f64();
    let n = done.load(Ordering::Relaxed);
    lat_us.sort_unstable();
    let pct = |p: f64| lat_us[((lat_us.len() as f64 - 1.0) * p) as usize];
    println!(
        "wal: {appenders} appenders x {record_bytes} B: {n} durable appends in {elapsed:.1} s = {:.0} appends/s; latency p50 {} us, p99 {} us",
        n as f64 / elapsed,
        pct(0.5),
        pct(0.99)
    );
}

fn mvcc(keys: u64, dir: Option<std::path::PathBuf>) {
    let tmp = temp_in(dir);
    let db = open_db(tmp.path());
    let tree = db.open_tree("keel").expect("tree");
    {
        let store = MvccStore::open(tree.clone()).expect("open");
        let t = Instant::now();
        load(&store, keys);
        println!(
            "mvcc: loaded {keys} keys in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        let all = all_keys();
        for _ in 0..3 {
            let t = Instant::now();
            let r = store
                .range(&RangeRequest {
                    count_only: true,
                    ..all.clone()
                })
                .expect("range");
            println!(
                "mvcc: count_only over all keys: count {} in {:.2} ms",
                r.count,
                t.elapsed().as_secs_f64() * 1e3
            );
        }
        for _ in 0..3 {
            let t = Instant::now();
            let r = store
                .range(&RangeRequest {
                    limit: 10,
                    ..all.clone()
                })
                .expect("range");
            println!(
                "mvcc: limit 10 over all keys: {} kvs, count {}, more {} in {:.3} ms",
                r.kvs.len(),
                r.count,
                r.more,
                t.elapsed().as_secs_f64() * 1e3
            );
        }
        db.flush().expect("flush");
    }
    let rss_before = rss_kb(std::process::id());
    let t = Instant::now();
    let store = MvccStore::open(tree).expect("reopen");
    let rebuild = t.elapsed();
    let rss_after = rss_kb(std::process::id());
    println!(
        "mvcc: index rebuild of {keys} keys in {:.2} s; process RSS {} MiB -> {} MiB (current revision {})",
        rebuild.as_secs_f64(),
        rss_before / 1024,
        rss_after / 1024,
        store.current_revision()
    );
}

fn rss_kb(pid: u32) -> u64 {
    proc_status_kb(&pid.to_string(), "VmRSS:")
}

/// A `kB` field of /proc/<pid>/status (`pid` may be `self`); 0 when unreadable.
fn proc_status_kb(pid: &str, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn member(endpoint: &str, pid: u32, keys: u64, clients: usize, batch: u64) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let url = format!("http://{endpoint}");
        let before = rss_kb(pid);
        let next = Arc::new(AtomicU64::new(0));
        let t = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..clients {
            let (url, next) = (url.clone(), next.clone());
            tasks.push(tokio::spawn(async move {
                let mut kv = keel_proto::etcdserverpb::kv_client::KvClient::connect(url).await.expect("connect");
                let value = vec![b'v'; 256];
                loop {
                    let first = next.fetch_add(batch, Ordering::Relaxed);
                    if first >= keys {
                        break;
                    }
                    let last = (first + batch).min(keys);
                    if batch == 1 {
                        kv.put(PutRequest { key: key(first), value: value.clone(), ..Default::default() })
                            .await
                            .expect("put");
                        continue;
                    }
                    let success = (first..last)
                        .map(|i| RequestOp {
                            request: Some(request_op::Request::RequestPut(PutRequest {
                                key: key(i),
                                value: value.clone(),
                                ..Default::default()
                            })),
                        })
                        .collect();
                    kv.txn(TxnRequest { success, ..Default::default() }).await.expect("txn");
                }
            }));
        }
        for t in tasks {
            t.await.expect("client");
        }
        let secs = t.elapsed().as_secs_f64();
        let after = rss_kb(pid);
        println!(
            "member: {keys} keys ({batch} per request) with {clients} clients in {secs:.1} s ({:.0} keys/s); keel RSS {} MiB -> {} MiB",
            keys as f64 / secs,
            before / 1024,
            after / 1024
        );
    });
}

/// The etcd-format writer streams: memory grows by a few write transactions
/// (`etcd_db::writer::BATCH_BYTES` each), not by the size of the file written.
fn etcd_db(mib: i64, dir: Option<std::path::PathBuf>) {
    use keel_proto::mvccpb::KeyValue;
    use keel_server::etcd_db::{DbWriter, EtcdDb, HashCheck, MvccRecord};
    use keel_server::mvcc::Revision;
    use prost::Message;
    let dir = temp_in(dir);
    let n = mib * 1024;
    let base = proc_status_kb("self", "RssAnon:");
    let mut peak = base;
    let started = Instant::now();
    let records = (0..n).map(|i| {
        if i % 4096 == 0 {
            peak = peak.max(proc_status_kb("self", "RssAnon:"));
        }
        let kv = KeyValue {
            key: format!("key/{i:08}").into_bytes(),
            create_revision: i + 2,
            mod_revision: i + 2,
            version: 1,
            value: vec![(i % 251) as u8; 1024],
            lease: 0,
        };
        Ok::<_, std::io::Error>(MvccRecord {
            rev: Revision::new(i + 2, 0),
            tombstone: false,
            value: kv.encode_to_vec(),
        })
    });
    let mut w = DbWriter::create(dir.path().join("db")).expect("create");
    assert_eq!(w.put_records(records).expect("write"), n as u64);
    let written = w.finish(&Default::default()).expect("finish");
    let took = started.elapsed();
    let db = EtcdDb::open(&written.path, HashCheck::Skip).expect("reopen");
    assert_eq!(db.status().expect("status").revision, n + 1);
    println!(
        "etcd-db: wrote {n} keys, a {} MiB file, in {:.2} s; anonymous memory grew {} MiB",
        written.size >> 20,
        took.as_secs_f64(),
        (peak.saturating_sub(base)) / 1024
    );
}
