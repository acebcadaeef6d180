//! `keelutl`: offline tools for a Keel data dir and for etcd snapshot files, like etcd's
//! `etcdutl` (flag names are etcdutl's).
//!
//! - `keelutl snapshot restore FILE --data-dir D --name N --initial-cluster C
//!   --initial-advertise-peer-urls U [--initial-cluster-token T] [--skip-hash-check]
//!   [--bump-revision N --mark-compacted]`: an etcd or Keel snapshot into a new Keel data dir
//!   (`keel_server::backup::restore`); then start `keel` on D with the same cluster flags.
//! - `keelutl snapshot status FILE [-w table|json|simple]`: etcdutl's hash, revision, total
//!   keys and size.
//! - `keelutl hashkv --data-dir D`: the member's HashKV at its current revision (stopped
//!   member).
//! - `keelutl defrag --data-dir D`: rewrites a stopped member's store into a fresh file.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use keel_server::backend::Backend;
use keel_server::backup::restore::{self, RestoreOptions};
use keel_server::etcd_db::{EtcdDb, HashCheck};
use keel_server::membership::parse_initial_cluster;
use keel_server::mvcc::MvccStore;

#[derive(Parser)]
#[command(
    name = "keelutl",
    version,
    about = "Offline tools for Keel data dirs and etcd snapshots"
)]
struct Cli {
    /// Output format of status commands (etcdutl's `-w`).
    #[arg(
        short = 'w',
        long = "write-out",
        value_enum,
        default_value = "simple",
        global = true
    )]
    write_out: Format,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Simple,
    Table,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Snapshot files (etcd's format: Keel's and etcd's snapshots alike).
    Snapshot {
        #[command(subcommand)]
        command: SnapshotCommand,
    },
    /// HashKV of a stopped member's store at its current revision.
    Hashkv {
        /// The member's data dir.
        #[arg(long = "data-dir")]
        data_dir: PathBuf,
    },
    /// Rewrites a stopped member's store into a fresh, compact file.
    Defrag {
        /// The member's data dir.
        #[arg(long = "data-dir")]
        data_dir: PathBuf,
    },
}

#[derive(Subcommand)]
enum SnapshotCommand {
    /// Restores a snapshot into a new data dir.
    Restore {
        /// The snapshot file (`etcdctl snapshot save` output, or a `member/snap/db` with
        /// `--skip-hash-check`).
        file: PathBuf,
        /// The new data dir (must not exist).
        #[arg(long = "data-dir")]
        data_dir: Option<PathBuf>,
        /// This member's name.
        #[arg(long, default_value = "default")]
        name: String,
        /// The new cluster: `name=peer-url,...`.
        #[arg(
            long = "initial-cluster",
            default_value = "default=http://localhost:2380"
        )]
        initial_cluster: String,
        /// The new cluster's token (start every member with the same one).
        #[arg(long = "initial-cluster-token", default_value = "etcd-cluster")]
        initial_cluster_token: String,
        /// This member's peer URLs (comma-separated).
        #[arg(
            long = "initial-advertise-peer-urls",
            default_value = "http://localhost:2380"
        )]
        initial_advertise_peer_urls: String,
        /// Accept a file without a trailing sha256 (a db copied from a data dir).
        #[arg(long = "skip-hash-check")]
        skip_hash_check: bool,
        /// Raise the revision by this much (with --mark-compacted).
        #[arg(long = "bump-revision", default_value_t = 0)]
        bump_revision: u64,
        /// Record a compaction at the (bumped) revision.
        #[arg(long = "mark-compacted")]
        mark_compacted: bool,
    },
    /// Hash, revision, total keys and size of a snapshot file.
    Status {
        /// The snapshot file.
        file: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {}", error_text(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes joined by `: `, skipping a cause whose text the previous part
/// already ends with (some library errors print their source and also return it from
/// `source()`, which `{:#}` would print twice).
fn error_text(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if parts.last().is_some_and(|last| last.ends_with(&text)) {
            continue;
        }
        parts.push(text);
    }
    parts.join(": ")
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Snapshot {
            command: SnapshotCommand::Status { file },
        } => {
            let s = EtcdDb::open(&file, HashCheck::Skip)?.status()?;
            let cells = [
                format!("{:x}", s.hash),
                s.revision.to_string(),
                s.total_key.to_string(),
                humanize_bytes(s.total_size),
            ];
            let header = ["HASH", "REVISION", "TOTAL KEYS", "TOTAL SIZE"];
            print(cli.write_out, &header, &cells, &serde_json::to_string(&s)?);
        }
        Command::Snapshot {
            command:
                SnapshotCommand::Restore {
                    file,
                    data_dir,
                    name,
                    initial_cluster,
                    initial_cluster_token,
                    initial_advertise_peer_urls,
                    skip_hash_check,
                    bump_revision,
                    mark_compacted,
                },
        } => {
            check_member(&name, &initial_cluster, &initial_advertise_peer_urls)?;
            let data_dir = data_dir.unwrap_or_else(|| PathBuf::from(format!("{name}.keel")));
            let opts = RestoreOptions {
                skip_hash_check,
                bump_revision,
                mark_compacted,
            };
            let member = data_dir.join("member");
            if member.exists() {
                // etcdctl 3.4's text (Go's %q quotes the path).
                anyhow::bail!("data-dir {:?} exists", data_dir.display().to_string());
            }
            // Restore into `member.restoring` and rename it to `member` once complete and
            // durable: an interrupted restore never leaves a `member` dir that keel would
            // start on with part of the data. A leftover of an earlier one is discarded.
            let staging = data_dir.join(STAGING_DIR);
            if staging.exists() {
                std::fs::remove_dir_all(&staging)?;
            }
            std::fs::create_dir_all(&staging)?;
            let db_dir = staging.join("db");
            let total = EtcdDb::open(
                &file,
                if skip_hash_check {
                    HashCheck::Skip
                } else {
                    HashCheck::Verify
                },
            )?
            .status()?
            .total_key;
            let bar = bar(total, "restoring");
            let restored = restore::restore(&file, &db_dir, opts, &|n| bar.inc(n))?;
            bar.finish_and_clear();
            for d in ["wal", "snap"] {
                std::fs::create_dir_all(staging.join(d))?;
            }
            sync_dir(&staging)?;
            std::fs::rename(&staging, &member)?;
            sync_dir(&data_dir)?;
            println!(
                "restored {} into {}: {} records, revision {}, compact revision {}, {} leases, {} users, {} roles",
                file.display(),
                data_dir.display(),
                restored.records,
                restored.revision,
                restored.compact_revision,
                restored.leases,
                restored.users,
                restored.roles,
            );
            println!(
                "start it with: keel --name {name} --data-dir {} --initial-cluster {initial_cluster} \
                 --initial-advertise-peer-urls {initial_advertise_peer_urls} \
                 --initial-cluster-token {initial_cluster_token} --initial-cluster-state new",
                data_dir.display()
            );
        }
        Command::Hashkv { data_dir } => {
            let backend = Backend::open(&db_dir(&data_dir)?)?;
            let store = MvccStore::open(backend.tree().clone())?;
            let h = store.hash_kv(0).map_err(|e| anyhow::anyhow!("{e}"))?;
            let cells = [
                h.hash.to_string(),
                h.hash_revision.to_string(),
                h.compact_revision.to_string(),
            ];
            let json = serde_json::json!({
                "hash": h.hash,
                "hashRevision": h.hash_revision,
                "compactRevision": h.compact_revision,
            });
            let header = ["HASH", "HASH REVISION", "COMPACT REVISION"];
            print(cli.write_out, &header, &cells, &json.to_string());
        }
        Command::Defrag { data_dir } => {
            let db = db_dir(&data_dir)?;
            let bar = bar(0, "defragmenting");
            let (before, after) = restore::defrag(&db, &|n| bar.inc(n))?;
            bar.finish_and_clear();
            println!(
                "Finished defragmenting {}: {} -> {}",
                db.display(),
                humanize_bytes(before),
                humanize_bytes(after)
            );
        }
    }
    Ok(())
}

/// The store of `data_dir`, which must exist.
fn db_dir(data_dir: &Path) -> anyhow::Result<PathBuf> {
    let db = data_dir.join("member").join("db");
    anyhow::ensure!(
        db.is_dir(),
        "{} is not a Keel data dir (no member/db)",
        data_dir.display()
    );
    Ok(db)
}

/// `--name` must be in `--initial-cluster` with exactly `--initial-advertise-peer-urls`
/// (as etcd's restore checks).
fn check_member(name: &str, cluster: &str, urls: &str) -> anyhow::Result<()> {
    let members = parse_initial_cluster(cluster)?;
    let me = members
        .iter()
        .find(|m| m.name == name)
        .ok_or_else(|| anyhow::anyhow!("--initial-cluster has no member named {name:?}"))?;
    let mut listed = me.peer_urls.clone();
    let mut given: Vec<String> = urls.split(',').map(|u| u.trim().to_string()).collect();
    listed.sort();
    given.sort();
    anyhow::ensure!(
        listed == given,
        "--initial-cluster has {name}={listed:?} but --initial-advertise-peer-urls is {given:?}"
    );
    Ok(())
}

fn bar(total: u64, what: &str) -> ProgressBar {
    let bar = if total > 0 {
        ProgressBar::new(total)
    } else {
        ProgressBar::new_spinner()
    };
    let template = if total > 0 {
        "{msg} [{bar:40}] {pos}/{len} entries ({eta})"
    } else {
        "{msg} {spinner} {pos} entries"
    };
    bar.set_style(ProgressStyle::with_template(template).expect("a valid template"));
    bar.set_message(what.to_string());
    bar
}

/// Prints one row as etcdutl does: `simple` (comma-separated), `table` (tablewriter's
/// boxes: headers centred, cells right-aligned) or `json`.
fn print(format: Format, header: &[&str], cells: &[String], json: &str) {
    match format {
        Format::Simple => println!("{}", cells.join(", ")),
        Format::Json => println!("{json}"),
        Format::Table => {
            let widths: Vec<usize> = header
                .iter()
                .zip(cells)
                .map(|(h, c)| h.len().max(c.len()))
                .collect();
            let line: String = widths
                .iter()
                .map(|w| format!("+{}", "-".repeat(w + 2)))
                .collect();
            println!("{line}+");
            let head: String = header
                .iter()
                .zip(&widths)
                .map(|(h, w)| {
                    let left = (w - h.len()) / 2;
                    format!(
                        "| {}{h}{} ",
                        " ".repeat(left),
                        " ".repeat(w - h.len() - left)
                    )
                })
                .collect();
            println!("{head}|");
            println!("{line}+");
            let row: String = cells
                .iter()
                .zip(&widths)
                .map(|(c, w)| format!("| {c:>w$} "))
                .collect();
            println!("{row}|");
            println!("{line}+");
        }
    }
}

/// go-humanize's `Bytes` (SI units), as etcdutl prints sizes: `25 kB`, `4.1 MB`.
fn humanize_bytes(s: u64) -> String {
    if s < 10 {
        return format!("{s} B");
    }
    const SIZES: [&str; 7] = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
    let e = ((s as f64).ln() / 1000f64.ln()).floor();
    let val = ((s as f64) / 1000f64.powf(e) * 10.0 + 0.5).floor() / 10.0;
    if val < 10.0 {
        format!("{val:.1} {}", SIZES[e as usize])
    } else {
        format!("{val:.0} {}", SIZES[e as usize])
    }
}

/// Where `snapshot restore` builds the member dir before renaming it to `member`.
const STAGING_DIR: &str = "member.restoring";

/// fsyncs a directory, so the entries created or renamed in it are durable.
fn sync_dir(dir: &std::path::Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}
