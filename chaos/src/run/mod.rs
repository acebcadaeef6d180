//! One chaos run: start the cluster under test, run the workload, the watchers and the fault
//! scheduler for the run's duration, heal and restart everything, collect the members' final
//! hashes, and check the history. See docs/chaos.md.

pub mod binary;
pub mod cluster;
pub mod faults;
pub mod finish;
pub mod kubernetes;
pub mod outcome;
pub mod ports;
pub mod process;
pub mod proxy;
pub mod resource_summary;
pub mod resources;
pub mod rpc;
pub mod summary;
pub mod upgrade;
pub mod watcher;
pub mod workload;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::check::{CheckOptions, CheckReport, check_history};
use crate::history::History;
use cluster::{Cluster, ClusterSpec};
use faults::{FaultPlan, FaultRecord};
use upgrade::UpgradePlan;
use watcher::WatcherState;
use workload::{OpLog, WorkloadSpec};

/// A deliberately broken server, to prove the checkers catch it (`--inject`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Inject {
    /// Every member starts with `FAILPOINTS=linearizable_read_stale=return`: linearizable
    /// reads are answered from local state without ReadIndex (needs a `keel` built with the
    /// `failpoints` feature). Partitions are made symmetric so an isolated member goes stale.
    StaleRead,
}

/// The traffic beside the KV workload (`--traffic`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Traffic {
    /// Only the KV workload and the watchers.
    #[default]
    Kv,
    /// Plus kube-apiserver-shaped traffic and watch caches ([`kubernetes`]).
    Kubernetes,
}

/// What the Kubernetes traffic did and what its checker found.
#[derive(Clone, Debug, Default)]
pub struct KubeSummary {
    /// Per operation kind: `[ok, failed]`.
    pub counts: std::collections::BTreeMap<&'static str, [u64; 2]>,
    /// Cache records (one per list), their watch events, re-dials and compared checkpoints.
    pub caches: usize,
    pub events: usize,
    pub redials: u64,
    pub checkpoints: usize,
}

impl KubeSummary {
    /// All Kubernetes operations.
    pub fn ops(&self) -> u64 {
        self.counts.values().map(|[ok, failed]| ok + failed).sum()
    }
}

/// Everything a run needs.
#[derive(Clone, Debug)]
pub struct RunSpec {
    pub cluster: ClusterSpec,
    pub workload: WorkloadSpec,
    pub faults: FaultPlan,
    /// Watchers on the key range.
    pub watchers: usize,
    /// How long the workload and the faults run.
    pub duration: Duration,
    pub check: CheckOptions,
    /// A rolling upgrade during the workload (`keel-chaos upgrade`); the cluster starts on
    /// its `from` binary.
    pub upgrade: Option<UpgradePlan>,
    pub traffic: Traffic,
    /// The resource sampler (`--sample-every`, [`resources`]) and its summary's warm-up and
    /// bounds.
    pub resources: ResourceSpec,
}

/// How members' resources are sampled and judged (the soak, docs/chaos.md "Soak").
#[derive(Clone, Debug)]
pub struct ResourceSpec {
    /// Interval between samples.
    pub every: Duration,
    /// Samples before this (since the workload started) are warm-up: not in the slope.
    pub warmup: Duration,
    pub bounds: resource_summary::ResourceBounds,
    /// Every sample is appended here as a JSON line when taken (`--resources-out`).
    pub out: Option<PathBuf>,
}

/// What a run produced.
pub struct RunResult {
    pub history: History,
    pub faults: Vec<FaultRecord>,
    pub report: CheckReport,
    /// Problems of the harness or of the cluster's liveness (not checker violations): a
    /// member that did not come back, members that did not converge, ...
    pub errors: Vec<String>,
    /// Wall-clock time of the workload phase.
    pub workload_time: Duration,
    /// With `--traffic kubernetes`.
    pub kubernetes: Option<KubeSummary>,
    /// Every resource sample of the workload phase, in time order.
    pub samples: Vec<resources::Sample>,
    /// Their summary, with the exceeded bounds (they fail the run like violations).
    pub resources: resource_summary::ResourceReport,
}

/// How long the cluster may take to serve after the start and after the final restart.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the members may take to agree on one revision at the end.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long watchers may take to catch up to the final revision.
const WATCH_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs one chaos run. The cluster is shut down before this returns (its directory stays).
///
/// Errors: only when the cluster cannot be started at all; later problems are listed in
/// [`RunResult::errors`] with the history recorded so far.
pub async fn run(spec: RunSpec) -> anyhow::Result<RunResult> {
    let cluster = Arc::new(Cluster::start(spec.cluster.clone(), READY_TIMEOUT).await?);
    eprintln!(
        "chaos: {} members ready in {} ({})",
        cluster.len(),
        cluster.dir().display(),
        cluster
            .members
            .iter()
            .map(|m| format!("{} {}", m.name, m.client_url))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let t0 = Instant::now();
    let until = t0 + spec.duration;
    let log = Arc::new(OpLog::default());
    let clients: Vec<_> = (0..spec.workload.clients)
        .map(|id| {
            tokio::spawn(workload::run_client(
                id as u32,
                cluster.clone(),
                spec.workload.clone(),
                t0,
                until,
                log.clone(),
            ))
        })
        .collect();
    let watch_stop = Arc::new(AtomicBool::new(false));
    let watch_states: Vec<Arc<WatcherState>> = (0..spec.watchers).map(|_| Arc::default()).collect();
    let watchers: Vec<_> = watch_states
        .iter()
        .enumerate()
        .map(|(id, state)| {
            tokio::spawn(watcher::run_watcher(
                id as u32,
                cluster.clone(),
                spec.workload.seed,
                t0,
                watch_stop.clone(),
                state.clone(),
            ))
        })
        .collect();
    let kube_log = Arc::new(kubernetes::KubeLog::default());
    let kube_tasks = match spec.traffic {
        Traffic::Kv => Vec::new(),
        Traffic::Kubernetes => kubernetes::spawn(
            cluster.clone(),
            kube_log.clone(),
            spec.workload.clients.max(1),
            spec.watchers.max(1),
            spec.workload.seed,
            until,
            watch_stop.clone(),
        ),
    };
    let fault_stop = Arc::new(AtomicBool::new(false));
    let fault_task = tokio::spawn(faults::run_faults(
        cluster.clone(),
        spec.faults.clone(),
        t0,
        until,
        fault_stop.clone(),
    ));

    let sample_stop = Arc::new(AtomicBool::new(false));
    let sample_log = Arc::new(match &spec.resources.out {
        Some(path) => resources::SampleLog::to_file(path)?,
        None => resources::SampleLog::default(),
    });
    let sampler = tokio::spawn(resources::run_sampler(
        cluster.clone(),
        spec.resources.every,
        t0,
        sample_stop.clone(),
        sample_log.clone(),
    ));

    let upgrade_task = spec
        .upgrade
        .clone()
        .map(|plan| tokio::spawn(upgrade::run_upgrade(cluster.clone(), plan, t0, until)));

    let mut errors = Vec::new();
    for c in clients {
        if let Err(e) = c.await {
            errors.push(format!("workload client panicked: {e}"));
        }
    }
    if let Some(task) = upgrade_task {
        match task.await {
            Ok(report) => {
                for step in &report.steps {
                    eprintln!("chaos: upgrade: {step}");
                }
                errors.extend(report.errors.into_iter().map(|e| format!("upgrade: {e}")));
            }
            Err(e) => errors.push(format!("upgrade scenario panicked: {e}")),
        }
    }
    let workload_time = t0.elapsed();
    // The final heal-and-restart is not steady state: sampling ends with the workload.
    sample_stop.store(true, Ordering::SeqCst);
    if let Err(e) = sampler.await {
        errors.push(format!("resource sampler panicked: {e}"));
    }
    fault_stop.store(true, Ordering::SeqCst);
    let faults = fault_task.await.unwrap_or_else(|e| {
        errors.push(format!("fault scheduler panicked: {e}"));
        Vec::new()
    });

    let mut finals = Vec::new();
    match end_of_run(&cluster).await {
        Ok(revision) => {
            drain_watchers(&watch_states, revision).await;
            match finish::collect_finals(&cluster, revision).await {
                Ok(f) => finals = f,
                Err(e) => errors.push(format!("{e:#}")),
            }
        }
        Err(e) => errors.push(format!("{e:#}")),
    }
    watch_stop.store(true, Ordering::SeqCst);
    for w in watchers {
        if let Err(e) = w.await {
            errors.push(format!("watcher panicked: {e}"));
        }
    }
    for t in kube_tasks {
        if let Err(e) = t.await {
            errors.push(format!("kubernetes traffic task panicked: {e}"));
        }
    }
    cluster.shutdown().await;

    let mut history = History {
        operations: std::mem::take(&mut *log.operations.lock().expect("op log lock")),
        watches: Vec::new(),
        finals,
        member_revisions: std::mem::take(&mut *log.member_revisions.lock().expect("op log lock")),
    };
    for s in &watch_states {
        history
            .watches
            .extend(std::mem::take(&mut *s.records.lock().expect("watch lock")));
    }
    history.operations.sort_by_key(|o| o.invoke_ns);
    let samples = std::mem::take(&mut *sample_log.samples.lock().expect("sample log lock"));
    let check = spec.check.clone();
    let traffic = spec.traffic;
    let (history, report, kube) = tokio::task::spawn_blocking(move || {
        let mut report = check_history(&history, &check);
        let kube =
            (traffic == Traffic::Kubernetes).then(|| check_kubernetes(&kube_log, &mut report));
        (history, report, kube)
    })
    .await?;
    Ok(RunResult {
        history,
        faults,
        report,
        errors,
        workload_time,
        kubernetes: kube,
        resources: resource_summary::summarise(
            &samples,
            spec.resources.warmup,
            &spec.resources.bounds,
        ),
        samples,
    })
}

/// Runs the watch-cache checker over the Kubernetes traffic's caches and adds its (and the
/// paginated lists') violations to `report`.
fn check_kubernetes(log: &kubernetes::KubeLog, report: &mut CheckReport) -> KubeSummary {
    let caches = std::mem::take(&mut *log.caches.lock().expect("kube caches lock"));
    let (mut violations, checkpoints) = crate::check::check_watch_caches(&caches);
    violations.extend(std::mem::take(
        &mut *log.violations.lock().expect("kube violations lock"),
    ));
    let max = CheckOptions::default().max_violations_per_checker;
    report.stats.violations_suppressed += violations.len().saturating_sub(max);
    report.violations.extend(violations.into_iter().take(max));
    KubeSummary {
        counts: log.counts.lock().expect("kube counts lock").clone(),
        caches: caches.len(),
        events: caches.iter().map(|c| c.events.len()).sum(),
        redials: caches.iter().map(|c| u64::from(c.redials)).sum(),
        checkpoints,
    }
}

/// Heals, restarts every member, waits until ready and converged; returns the final revision.
async fn end_of_run(cluster: &Cluster) -> anyhow::Result<i64> {
    eprintln!("chaos: healing and restarting every member");
    finish::heal_all(cluster).await?;
    finish::restart_all(cluster).await?;
    cluster.wait_ready(READY_TIMEOUT).await?;
    let revision = finish::converge(cluster, CONVERGE_TIMEOUT).await?;
    eprintln!("chaos: converged at revision {revision}");
    Ok(revision)
}

/// Waits (bounded) until every watcher has seen `revision`.
async fn drain_watchers(states: &[Arc<WatcherState>], revision: i64) {
    let deadline = Instant::now() + WATCH_DRAIN_TIMEOUT;
    while Instant::now() < deadline
        && states
            .iter()
            .any(|s| s.seen_revision.load(Ordering::SeqCst) < revision)
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Where a run's directory lives when not given: a fresh temp dir `keel-chaos-*`.
pub fn default_run_dir() -> anyhow::Result<PathBuf> {
    Ok(tempfile::Builder::new()
        .prefix("keel-chaos-")
        .tempdir()?
        .keep())
}
