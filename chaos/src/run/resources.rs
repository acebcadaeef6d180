//! The resource sampler of a run (`--sample-every`, issue 18 part 5, the soak): every interval,
//! for each running member, its resident memory (`VmRSS` of `/proc/<pid>/status`), its open
//! file descriptors (entries of `/proc/<pid>/fd`) and the bytes on disk of its WAL
//! (`<data-dir>/member/wal`), snapshots (`member/snap`) and backend (`member/db*`: the
//! `db.gen-N` generations and `db.tmp`; the `db` symlink itself is not followed, so a
//! generation is counted once). Layout: docs/backend.md, docs/wal.md.
//!
//! A member restarted by a fault is a new process: each sample carries the member's start
//! count (`epoch`) and PID, so the summary ([`super::resource_summary`]) fits growth per
//! process and never across a restart. Reading `/proc` and the data dir never fails the run: a
//! member that exits between the PID read and the `/proc` read yields no sample.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::cluster::Cluster;

/// One reading of one member process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Seconds since the workload started.
    pub t_secs: f64,
    /// `--name` of the member (`m1`..`mN`).
    pub member: String,
    /// The member's process start count (1 = the first process; +1 per restart).
    pub epoch: u32,
    /// The OS process ID.
    pub pid: u32,
    /// `VmRSS` in KiB.
    pub rss_kib: u64,
    /// Open file descriptors.
    pub fds: u64,
    /// Bytes of `member/wal`.
    pub wal_bytes: u64,
    /// Bytes of `member/snap`.
    pub snap_bytes: u64,
    /// Bytes of `member/db*`.
    pub db_bytes: u64,
}

/// The samples of a run, shared between the sampler task and the run; with a file, every
/// sample is also appended to it as a JSON line when taken, so an interrupted run keeps them.
#[derive(Default)]
pub struct SampleLog {
    pub samples: Mutex<Vec<Sample>>,
    file: Option<Mutex<fs::File>>,
}

impl SampleLog {
    /// A log that also writes to `path` (created or truncated now).
    ///
    /// Errors: creating the file.
    pub fn to_file(path: &Path) -> std::io::Result<SampleLog> {
        Ok(SampleLog {
            samples: Mutex::default(),
            file: Some(Mutex::new(fs::File::create(path)?)),
        })
    }

    /// Records `s`; a failed file write is reported once per sample on stderr, never fatal.
    fn push(&self, s: Sample) {
        if let Some(file) = &self.file {
            let mut line = serde_json::to_vec(&s).expect("a Sample serialises");
            line.push(b'\n');
            if let Err(e) = file.lock().expect("sample file lock").write_all(&line) {
                eprintln!("chaos: resource sample not written: {e}");
            }
        }
        self.samples.lock().expect("sample log lock").push(s);
    }
}

/// Samples every `every` until `stop` is set (checked at least every 200 ms), starting now.
pub async fn run_sampler(
    cluster: Arc<Cluster>,
    every: Duration,
    t0: Instant,
    stop: Arc<AtomicBool>,
    log: Arc<SampleLog>,
) {
    let mut next = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        if Instant::now() >= next {
            next += every;
            for m in &cluster.members {
                let pid = m.process.lock().await.pid();
                let Some(pid) = pid else { continue };
                let t_secs = t0.elapsed().as_secs_f64();
                let data_dir = m.data_dir().to_path_buf();
                let (member, epoch) = (m.name.clone(), m.epoch());
                let sample = tokio::task::spawn_blocking(move || {
                    read_sample(pid, &data_dir).map(|r| Sample {
                        t_secs,
                        member,
                        epoch,
                        pid,
                        rss_kib: r.rss_kib,
                        fds: r.fds,
                        wal_bytes: r.wal_bytes,
                        snap_bytes: r.snap_bytes,
                        db_bytes: r.db_bytes,
                    })
                })
                .await
                .ok()
                .flatten();
                if let Some(s) = sample {
                    log.push(s);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200).min(every)).await;
    }
}

/// The readings of one process, without its identity.
struct Reading {
    rss_kib: u64,
    fds: u64,
    wal_bytes: u64,
    snap_bytes: u64,
    db_bytes: u64,
}

/// `None` when the process is gone (its `/proc` entry cannot be read), or has not started
/// yet: a process with one thread is still in the dynamic loader or parsing its flags (a
/// member runs a dozen threads), and its RSS and fds (2.6 MiB, 5 fds, seen in a run that
/// sampled a member restarted a moment before) say nothing about the member.
fn read_sample(pid: u32, data_dir: &Path) -> Option<Reading> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    if parse_status_field(&status, "Threads:")? < 2 {
        return None;
    }
    let rss_kib = parse_vm_rss_kib(&status)?;
    let fds = fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    let member = data_dir.join("member");
    let db_bytes = fs::read_dir(&member)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("db"))
                .map(|e| tree_bytes(&e.path()))
                .sum()
        })
        .unwrap_or(0);
    Some(Reading {
        rss_kib,
        fds,
        wal_bytes: tree_bytes(&member.join("wal")),
        snap_bytes: tree_bytes(&member.join("snap")),
        db_bytes,
    })
}

/// `VmRSS:   1234 kB` of a `/proc/<pid>/status` text, in KiB.
pub fn parse_vm_rss_kib(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|n| n.trim().parse().ok())
}

/// The number after `field` (e.g. `Threads:`) in a `/proc/<pid>/status` text.
fn parse_status_field(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|n| n.trim().parse().ok())
}

/// Bytes of the regular files under `path` (symlinks are not followed; a missing path or a
/// file removed while walking counts 0).
pub fn tree_bytes(path: &Path) -> u64 {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return 0;
    };
    if meta.is_file() {
        return meta.len();
    }
    if !meta.is_dir() {
        return 0;
    }
    fs::read_dir(path)
        .map(|entries| entries.flatten().map(|e| tree_bytes(&e.path())).sum())
        .unwrap_or(0)
}

/// Writes `samples` as JSON lines (one [`Sample`] object per line) to `path`.
///
/// Errors: creating or writing the file.
pub fn write_json_lines(path: &Path, samples: &[Sample]) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(fs::File::create(path)?);
    for s in samples {
        serde_json::to_writer(&mut out, s)?;
        out.write_all(b"\n")?;
    }
    out.flush()
}

/// Reads back what [`write_json_lines`] wrote.
///
/// Errors: reading the file, or a line that is not a [`Sample`].
pub fn read_json_lines(path: &Path) -> anyhow::Result<Vec<Sample>> {
    fs::read_to_string(path)?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| Ok(serde_json::from_str(l)?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_with_one_thread_is_not_sampled_yet() {
        let loader = "Name:\tkeel\nVmRSS:\t    2692 kB\nThreads:\t1\n";
        assert_eq!(parse_status_field(loader, "Threads:"), Some(1));
        assert_eq!(parse_vm_rss_kib(loader), Some(2692));
        assert_eq!(parse_status_field("Name:\tkeel\n", "Threads:"), None);
    }

    /// Runs `f` while this process has a second thread (tests may run on the main thread
    /// alone, and [`read_sample`] skips one-thread processes).
    fn with_two_threads<T>(f: impl FnOnce() -> T) -> T {
        let (done, wait) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || wait.recv().is_err());
        let out = f();
        drop(done);
        other.join().unwrap();
        out
    }

    #[test]
    fn vm_rss_is_read_from_a_status_text() {
        let status = "Name:\tkeel\nVmPeak:\t  900 kB\nVmRSS:\t   51234 kB\nRssAnon:\t 40000 kB\n";
        assert_eq!(parse_vm_rss_kib(status), Some(51234));
        assert_eq!(parse_vm_rss_kib("Name:\tkworker\n"), None);
    }

    #[test]
    fn tree_bytes_sums_files_and_skips_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let gen0 = dir.path().join("db.gen-0");
        fs::create_dir_all(gen0.join("blobs")).unwrap();
        fs::write(gen0.join("conf"), vec![0u8; 100]).unwrap();
        fs::write(gen0.join("blobs").join("b1"), vec![0u8; 23]).unwrap();
        std::os::unix::fs::symlink(&gen0, dir.path().join("db")).unwrap();
        assert_eq!(tree_bytes(&gen0), 123);
        assert_eq!(tree_bytes(&dir.path().join("db")), 0);
        assert_eq!(tree_bytes(dir.path()), 123);
        assert_eq!(tree_bytes(&dir.path().join("missing")), 0);
    }

    #[test]
    fn this_process_can_be_sampled() {
        let dir = tempfile::tempdir().unwrap();
        let wal = dir.path().join("member").join("wal");
        fs::create_dir_all(&wal).unwrap();
        fs::write(wal.join("0.wal"), vec![0u8; 4096]).unwrap();
        let r = with_two_threads(|| read_sample(std::process::id(), dir.path()))
            .expect("own /proc entry");
        assert!(r.rss_kib > 0);
        assert!(r.fds >= 3, "stdin, stdout, stderr at least: {}", r.fds);
        assert_eq!(r.wal_bytes, 4096);
        assert_eq!((r.snap_bytes, r.db_bytes), (0, 0));
    }

    #[test]
    fn a_file_log_has_every_sample_as_soon_as_it_is_taken() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("live.jsonl");
        let log = SampleLog::to_file(&path).unwrap();
        let r = with_two_threads(|| read_sample(std::process::id(), dir.path())).unwrap();
        let s = Sample {
            t_secs: 1.0,
            member: "m1".into(),
            epoch: 1,
            pid: std::process::id(),
            rss_kib: r.rss_kib,
            fds: r.fds,
            wal_bytes: 0,
            snap_bytes: 0,
            db_bytes: 0,
        };
        log.push(s.clone());
        assert_eq!(read_json_lines(&path).unwrap(), vec![s.clone()]);
        log.push(s.clone());
        assert_eq!(read_json_lines(&path).unwrap().len(), 2);
        assert_eq!(log.samples.lock().unwrap().len(), 2);
    }

    #[test]
    fn samples_round_trip_through_json_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.jsonl");
        let s = Sample {
            t_secs: 10.5,
            member: "m2".into(),
            epoch: 3,
            pid: 4242,
            rss_kib: 80_000,
            fds: 61,
            wal_bytes: 64 << 20,
            snap_bytes: 12_345,
            db_bytes: 7 << 20,
        };
        write_json_lines(&path, &[s.clone(), s.clone()]).unwrap();
        assert_eq!(read_json_lines(&path).unwrap(), vec![s.clone(), s]);
    }
}
