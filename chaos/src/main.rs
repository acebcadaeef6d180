//! `keel-chaos`: runs a chaos run against a real Keel cluster and prints the report.
//! Exit status: 0 without violations, 1 with violations (or an exceeded resource bound), 2 on
//! harness errors (the cluster did not start, converge, or a member did not come back). See
//! docs/chaos.md.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use keel_chaos::check::CheckOptions;
use keel_chaos::run::cluster::ClusterSpec;
use keel_chaos::run::faults::{FaultKind, FaultPlan};
use keel_chaos::run::ports::PortRange;
use keel_chaos::run::resource_summary::{
    ResourceBounds, default_warmup, render as render_resources, summarise,
};
use keel_chaos::run::resources::read_json_lines;
use keel_chaos::run::summary::{RunHeader, render};
use keel_chaos::run::upgrade::UpgradePlan;
use keel_chaos::run::workload::WorkloadSpec;
use keel_chaos::run::{Inject, ResourceSpec, RunSpec, Traffic, default_run_dir, run};

/// Chaos-monkey harness for Keel: N real members behind controllable TCP proxies, seeded
/// faults, a concurrent KV + watch workload, and linearizability / watch / convergence checks.
#[derive(Parser, Debug)]
#[command(name = "keel-chaos", version)]
struct Cli {
    /// Members in the cluster under test (3 or 5).
    #[arg(long, default_value_t = 3, value_parser = parse_nodes)]
    nodes: usize,
    /// How long the workload and faults run (e.g. 20s, 2m).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Comma-separated faults: kill, pause, partition, latency, transfer, member, compact,
    /// failpoint, slow-fsync; `all` for every one; `none` for no faults.
    #[arg(long, default_value = "kill,pause,partition", value_parser = FaultKind::parse_list)]
    faults: FaultList,
    /// RNG seed of the fault schedule and the workload (random when not given; always
    /// printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Concurrent KV clients.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Concurrent watchers on the key range.
    #[arg(long, default_value_t = 2)]
    watchers: usize,
    /// Hot keys.
    #[arg(long, default_value_t = 8)]
    keys: usize,
    /// Deadline of one KV operation.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    op_timeout: Duration,
    /// Shortest hold of one fault.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    fault_min: Duration,
    /// Longest hold of one fault.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    fault_max: Duration,
    /// The `keel` binary (default: $KEEL_BIN, else `keel` next to this executable).
    #[arg(long)]
    keel_bin: Option<PathBuf>,
    /// Ports for members and proxies, `LO-HI` (default: OS-assigned).
    #[arg(long)]
    port_range: Option<PortRange>,
    /// Members' `--heartbeat-interval` (ms).
    #[arg(long, default_value_t = 100)]
    heartbeat_interval: u64,
    /// Members' `--election-timeout` (ms).
    #[arg(long, default_value_t = 1000)]
    election_timeout: u64,
    /// Extra flag for every member (repeatable), e.g. `--keel-arg=--snapshot-count=1000`.
    #[arg(long = "keel-arg", allow_hyphen_values = true)]
    keel_args: Vec<String>,
    /// Run with a deliberately broken server to prove the checkers catch it.
    #[arg(long, value_enum)]
    inject: Option<Inject>,
    /// Write the recorded history as JSON here.
    #[arg(long)]
    history_out: Option<PathBuf>,
    /// Directory for data dirs and logs (default: a fresh temp dir, removed after a clean run).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep the directory even after a clean run.
    #[arg(long)]
    keep_dir: bool,
    /// TLS: CA file (etcdctl's `--cacert`). With `--cert` and `--key`, every member serves
    /// its client URL over TLS with that certificate and `--client-cert-auth`, and the
    /// harness connects presenting the same certificate (it needs `clientAuth` usage and a
    /// `127.0.0.1` SAN).
    #[arg(long, requires_all = ["cert", "key"])]
    cacert: Option<PathBuf>,
    /// TLS: certificate file (etcdctl's `--cert`).
    #[arg(long, requires = "cacert")]
    cert: Option<PathBuf>,
    /// TLS: key file (etcdctl's `--key`).
    #[arg(long, requires = "cacert")]
    key: Option<PathBuf>,
    /// `kubernetes` adds kube-apiserver-shaped traffic (`--clients` object writers and
    /// `--watchers` watch caches on `/registry/`, events with leases, compaction) and the
    /// watch-cache checker; docs/kubernetes.md.
    #[arg(long, value_enum, default_value_t = Traffic::Kv)]
    traffic: Traffic,
    /// Wall-clock budget of the linearizability search per key.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    check_budget: Duration,
    /// Interval of the resource sampler: each member's RSS, open fds and WAL / snap / db bytes
    /// (docs/chaos.md, "Soak").
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    sample_every: Duration,
    /// Write every resource sample here, one JSON object per line, as it is taken.
    #[arg(long)]
    resources_out: Option<PathBuf>,
    /// Samples before this (since the workload started) are warm-up, not in the RSS growth
    /// rate (default: 5 min, or a sixth of a shorter `--duration`).
    #[arg(long, value_parser = humantime::parse_duration)]
    soak_warmup: Option<Duration>,
    /// Fail the run when a member's RSS grows faster than this after the warm-up (MiB/min,
    /// least-squares over samples of the same process).
    #[arg(long)]
    max_rss_growth_mib_per_min: Option<f64>,
    /// Fail the run when a member process has more open fds than this at a sample.
    #[arg(long)]
    max_fds: Option<u64>,
    /// Fail the run when a member's WAL + snap + db exceed this many MiB at a sample.
    #[arg(long)]
    max_disk_mib: Option<f64>,
    #[command(subcommand)]
    scenario: Option<Scenario>,
}

/// A scenario instead of the plain chaos run (the options above still apply; give them
/// before the scenario's name).
#[derive(clap::Subcommand, Debug)]
enum Scenario {
    /// Rolling upgrade (docs/upgrades.md): start on `--from`, swap each member to `--to`
    /// (SIGTERM, swap, restart) during the workload, check the cluster version stays low
    /// while mixed and rises after the last member, then the usual checkers.
    Upgrade {
        /// The old release's `keel` (scripts/build-release.sh builds and caches it).
        #[arg(long)]
        from: PathBuf,
        /// The new release's `keel`.
        #[arg(long)]
        to: PathBuf,
        /// Then downgrade back to this release line (`Maintenance.Downgrade` ENABLE, e.g.
        /// `0.1`) and roll every member back to `--from`.
        #[arg(long)]
        downgrade_to: Option<String>,
        /// Keep each rolled member stopped this long before restarting it (e.g. 5s); with a
        /// low `--keel-arg=--snapshot-count=..` and
        /// `--keel-arg=--experimental-snapshot-catchup-entries=..` it then has to install a
        /// snapshot from a leader of the other version.
        #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
        hold_down: Duration,
        /// Require a snapshot across versions in each direction: a rolled member on `--to`
        /// installs one from a leader on `--from` and (with `--downgrade-to`) the reverse.
        #[arg(long)]
        expect_snapshot: bool,
    },
    /// Summarise a `--resources-out` file again (with this invocation's `--soak-warmup`,
    /// `--duration` and bounds) instead of running; exit status 1 when a bound is exceeded.
    ResourceSummary {
        /// The JSON lines file.
        file: PathBuf,
    },
}

fn parse_nodes(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n @ (3 | 5)) => Ok(n),
        _ => Err(format!("--nodes takes 3 or 5, not {s:?}")),
    }
}

/// A parsed `--faults` list (a type alias would make clap expect repeated values).
type FaultList = std::vec::Vec<FaultKind>;

fn keel_binary(cli: &Cli) -> anyhow::Result<PathBuf> {
    let path = match (&cli.keel_bin, std::env::var_os("KEEL_BIN")) {
        (Some(p), _) => p.clone(),
        (None, Some(p)) => PathBuf::from(p),
        (None, None) => std::env::current_exe()?
            .parent()
            .map(|d| d.join("keel"))
            .ok_or_else(|| anyhow::anyhow!("cannot locate the keel binary"))?,
    };
    anyhow::ensure!(
        path.is_file(),
        "keel binary {} not found (pass --keel-bin or set KEEL_BIN; build it with \
         `cargo build --release --bin keel`)",
        path.display()
    );
    Ok(path)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match real_main(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("keel-chaos: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// The resource summary's warm-up and bounds from the flags.
fn resource_spec(cli: &Cli) -> ResourceSpec {
    ResourceSpec {
        every: cli.sample_every.max(Duration::from_millis(100)),
        warmup: cli
            .soak_warmup
            .unwrap_or_else(|| default_warmup(cli.duration)),
        bounds: ResourceBounds {
            max_rss_growth_mib_per_min: cli.max_rss_growth_mib_per_min,
            max_fds: cli.max_fds,
            max_disk_mib: cli.max_disk_mib,
        },
        out: cli.resources_out.clone(),
    }
}

fn real_main(cli: Cli) -> anyhow::Result<ExitCode> {
    if let Some(Scenario::ResourceSummary { file }) = &cli.scenario {
        let spec = resource_spec(&cli);
        let samples = read_json_lines(file)?;
        let report = summarise(&samples, spec.warmup, &spec.bounds);
        print!("{}", render_resources(&report));
        return Ok(if report.violations.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    let upgrade = match &cli.scenario {
        Some(Scenario::Upgrade {
            from,
            to,
            downgrade_to,
            hold_down,
            expect_snapshot,
        }) => {
            for b in [from, to] {
                anyhow::ensure!(b.is_file(), "keel binary {} not found", b.display());
            }
            // The scenario stops and starts members itself: process faults would race it.
            let racing = [
                FaultKind::Kill,
                FaultKind::Pause,
                FaultKind::Member,
                FaultKind::Failpoint,
                FaultKind::SlowFsync,
            ];
            anyhow::ensure!(
                !cli.faults.iter().any(|k| racing.contains(k)),
                "upgrade takes network and admin faults only (partition, latency, transfer, \
                 compact): pass e.g. --faults partition or --faults none"
            );
            Some(UpgradePlan {
                from: from.clone(),
                to: to.clone(),
                downgrade: downgrade_to.clone(),
                hold_down: *hold_down,
                expect_snapshot: *expect_snapshot,
            })
        }
        Some(Scenario::ResourceSummary { .. }) | None => None,
    };
    let binary = match &upgrade {
        Some(plan) => plan.from.clone(),
        None => keel_binary(&cli)?,
    };
    anyhow::ensure!(
        cli.fault_min <= cli.fault_max,
        "--fault-min exceeds --fault-max"
    );
    let wants_failpoints = cli.inject.is_some()
        || cli.faults.contains(&FaultKind::Failpoint)
        || cli.faults.contains(&FaultKind::SlowFsync);
    if wants_failpoints && !keel_chaos::run::binary::has_failpoints(&binary)? {
        anyhow::bail!(
            "{} was built without failpoints, which --inject and --faults failpoint/slow-fsync need: \
             build it with `cargo build --release -p keel-server --features failpoints` and \
             pass it with --keel-bin (CI: $KEEL_FAILPOINTS_BIN)",
            binary.display()
        );
    }
    let seed = cli.seed.unwrap_or_else(rand::random);
    let dir = match &cli.dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            d.clone()
        }
        None => default_run_dir()?,
    };
    eprintln!("chaos: seed {seed}, run dir {}", dir.display());
    let mut env = Vec::new();
    if cli.inject == Some(Inject::StaleRead) {
        env.push((
            keel_testkit::spec::FAILPOINTS_ENV.to_string(),
            "linearizable_read_stale=return".to_string(),
        ));
    }
    let tls = match (&cli.cacert, &cli.cert, &cli.key) {
        (Some(ca), Some(cert), Some(key)) => {
            let files = keel_testkit::tls::CertFiles {
                cert: cert.clone(),
                key: key.clone(),
            };
            keel_chaos::run::rpc::set_tls(keel_testkit::tls::ClientTls {
                ca: ca.clone(),
                identity: Some(files.clone()),
            });
            Some(keel_testkit::tls::ServerTls {
                files,
                ca: ca.clone(),
                client_cert_auth: true,
            })
        }
        _ => None,
    };
    let spec = RunSpec {
        cluster: ClusterSpec {
            nodes: cli.nodes,
            binary: binary.clone(),
            dir: dir.clone(),
            ports: cli.port_range,
            heartbeat_ms: cli.heartbeat_interval,
            election_ms: cli.election_timeout,
            extra_args: cli.keel_args.clone(),
            env,
            tls: tls.clone(),
        },
        workload: WorkloadSpec {
            clients: cli.clients.max(1),
            keys: cli.keys.max(1),
            op_timeout: cli.op_timeout,
            seed,
        },
        faults: FaultPlan {
            kinds: cli.faults.clone(),
            seed,
            hold: (cli.fault_min, cli.fault_max),
            symmetric_partitions_only: cli.inject == Some(Inject::StaleRead),
        },
        watchers: cli.watchers,
        duration: cli.duration,
        check: CheckOptions {
            linearizability_budget: cli.check_budget,
            ..CheckOptions::default()
        },
        upgrade,
        traffic: cli.traffic,
        resources: resource_spec(&cli),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // On SIGINT/SIGTERM the run is abandoned; dropping the runtime drops the cluster, whose
    // member processes are SIGKILLed (kill_on_drop), so no `keel` outlives the harness.
    let result = runtime.block_on(async {
        tokio::select! {
            r = run(spec) => r,
            s = interrupted() => Err(anyhow::anyhow!(
                "interrupted by {s}: members stopped, run dir {} kept",
                dir.display()
            )),
        }
    })?;
    if let Some(path) = &cli.history_out {
        std::fs::write(path, serde_json::to_vec(&result.history)?)?;
        eprintln!("chaos: history written to {}", path.display());
    }
    if let Some(path) = &cli.resources_out {
        eprintln!(
            "chaos: {} resource samples written to {}",
            result.samples.len(),
            path.display()
        );
    }
    let header = RunHeader {
        seed,
        nodes: cli.nodes,
        faults: cli
            .faults
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>()
            .join(","),
        inject: cli.inject.map(|i| format!("{i:?}")),
        binary: binary.display().to_string(),
        dir: dir.display().to_string(),
    };
    print!("{}", render(&header, &result));
    let failed = !result.report.violations.is_empty() || !result.resources.violations.is_empty();
    let clean = !failed && result.errors.is_empty();
    if clean && !cli.keep_dir && cli.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        eprintln!("chaos: data dirs and member logs kept in {}", dir.display());
    }
    Ok(if failed {
        ExitCode::from(1)
    } else if !result.errors.is_empty() {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}

/// Resolves with the signal's name on the first SIGINT or SIGTERM.
async fn interrupted() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        // Without signal handlers the default action (exit) applies.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}
