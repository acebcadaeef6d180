//! `--max-wals` and `--max-snapshots` (issue 15 part 8): under a write load with small WAL
//! segments and frequent snapshots, the live WAL segments and the snapshot files stay within
//! the limits, and a SIGKILL + restart still serves every acknowledged write. With
//! `--max-wals 0` (unlimited) the same load leaves many more segments, so the limit is what
//! bounds them.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use keel_testkit::grpc;

use crate::disaster_recovery::served;
use crate::member;

/// Live WAL segments (`*.wal`, `*.wal.tmp`; `.spare` files are recycled empties) and
/// snapshot files (`*.snap`) in a data dir.
fn file_counts(data: &Path) -> (usize, usize) {
    let count = |dir: &str, f: &dyn Fn(&str) -> bool| {
        std::fs::read_dir(data.join("member").join(dir))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| f(&e.file_name().to_string_lossy()))
                    .count()
            })
            .unwrap_or(0)
    };
    (
        count("wal", &|n| n.ends_with(".wal") || n.ends_with(".wal.tmp")),
        count("snap", &|n| n.ends_with(".snap")),
    )
}

/// Writes `n` 2 KiB values (four writers) while sampling the file counts; returns what was
/// acknowledged and the largest counts seen.
fn load(endpoint: &str, data: &Path, n: usize) -> (BTreeMap<String, String>, (usize, usize)) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (done, data) = (done.clone(), data.to_path_buf());
        std::thread::spawn(move || {
            let mut most = (0, 0);
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let (w, s) = file_counts(&data);
                most = (most.0.max(w), most.1.max(s));
                std::thread::sleep(Duration::from_millis(20));
            }
            most
        })
    };
    let written = rt.block_on(async {
        let mut tasks = Vec::new();
        for w in 0..4 {
            let ep = endpoint.to_string();
            tasks.push(tokio::spawn(async move {
                let mut kv = grpc::kv(&ep).await;
                let mut mine = Vec::new();
                for i in (w..n).step_by(4) {
                    let (key, value) =
                        (format!("ret/{i:05}"), format!("{i:05}{}", "x".repeat(2043)));
                    grpc::put(&mut kv, &key, &value).await;
                    mine.push((key, value));
                }
                mine
            }));
        }
        let mut all = BTreeMap::new();
        for t in tasks {
            let mine = tokio::time::timeout(Duration::from_secs(120), t)
                .await
                .expect("writes finish")
                .unwrap();
            all.extend(mine);
        }
        all
    });
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    (written, sampler.join().unwrap())
}

const FLAGS: &[&str] = &[
    "--snapshot-count=100",
    "--experimental-wal-segment-bytes=524288",
    "--max-snapshots=2",
];

#[test]
fn max_wals_and_max_snapshots_bound_the_files_and_a_crash_loses_nothing() {
    let (_guard, mut keel) = member(&[FLAGS, &["--max-wals=3"]].concat());
    let data = keel.data_dir();
    let started = Instant::now();
    let (written, most) = load(&keel.endpoint(), &data, 2400);
    eprintln!(
        "--max-wals 3: at most {} live segments and {} snapshot files during 2400 2 KiB writes ({:?})",
        most.0,
        most.1,
        started.elapsed()
    );
    assert!(most.0 <= 3, "{most:?} live WAL segments / snapshot files");
    assert!(most.1 <= 2, "{most:?}");

    keel.kill9();
    keel.restart();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let served: BTreeMap<String, String> = rt
        .block_on(served(&keel.endpoint(), "ret/"))
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    assert_eq!(served.len(), written.len());
    assert!(
        served == written,
        "every acknowledged write survives the crash"
    );
}

#[test]
fn without_max_wals_the_same_load_keeps_more_segments() {
    let (_guard, keel) = member(&[FLAGS, &["--max-wals=0"]].concat());
    let (_, most) = load(&keel.endpoint(), &keel.data_dir(), 2400);
    eprintln!("--max-wals 0: at most {} live segments", most.0);
    assert!(most.0 > 6, "{most:?}");
}
