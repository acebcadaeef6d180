//! The upgrade-compat scenario (`keel-chaos upgrade --from OLD --to NEW`, issue 16,
//! docs/upgrades.md): the cluster starts on the old binary; while the workload runs, each
//! member in turn is stopped (SIGTERM), swapped to the new binary and restarted. Between the
//! rolls the scenario checks the cluster version through the version gate: while any member
//! runs the old release, a 0.2-only request (`Auth.UserAdd`) is refused with the reason
//! (`cluster version 0.1 is too low for ...`) and changes nothing; within
//! [`RISE_TIMEOUT`] after the last roll it is allowed, and `UserAdd` works. The run's usual
//! checkers (linearizability, watch guarantees, convergence, HashKV) judge the history of the
//! whole rolling upgrade.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use keel_proto::etcdserverpb::auth_client::AuthClient;
use keel_proto::etcdserverpb::downgrade_request::DowngradeAction;
use keel_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use keel_proto::etcdserverpb::{
    AuthStatusRequest, AuthUserAddRequest, AuthUserDeleteRequest, AuthUserListRequest,
    DowngradeRequest,
};
use tokio::time::Instant;

use super::cluster::Cluster;
use super::rpc;

/// How long the cluster version may take to rise after the last member runs the new binary.
pub const RISE_TIMEOUT: Duration = Duration::from_secs(15);
/// How long one probe may take: bcrypt, plus up to 2 s a member waits for a cluster version
/// nobody decided yet (a cluster led by an old member).
const PROBE_TIMEOUT: Duration = Duration::from_secs(8);
/// How long a rolled member may take to serve again.
const MEMBER_READY_TIMEOUT: Duration = Duration::from_secs(30);
/// The user the probes try to add while the cluster is mixed (it must never appear).
pub const MIXED_PROBE_USER: &str = "chaos-upgrade-mixed";
/// The user added once the upgrade finished.
pub const UPGRADED_USER: &str = "chaos-upgrade-done";

/// A rolling upgrade: every member goes from `from` to `to`, in member order.
#[derive(Clone, Debug)]
pub struct UpgradePlan {
    /// The binary the cluster starts on.
    pub from: PathBuf,
    /// The binary each member is swapped to.
    pub to: PathBuf,
    /// Then downgrade back: delete the 0.2-only state, `Maintenance.Downgrade` ENABLE to the
    /// old release line, wait until the cluster version fell, and roll every member back to
    /// `from`.
    pub downgrade: Option<String>,
    /// How long each rolled member stays stopped before it starts on the other binary; the
    /// workload keeps writing meanwhile, so with a low `--snapshot-count` and
    /// `--experimental-snapshot-catchup-entries` the leader purges the entries the member
    /// misses and it must install a snapshot from a leader of the other version.
    pub hold_down: Duration,
    /// At least one member on the new binary must install a snapshot (it logs `installed a
    /// snapshot`, as 0.1.0 does) from a leader on the old one, and with `downgrade` one on
    /// the old binary from a new leader (faults during a hold-down may stop the writes that
    /// purge the log, so not every roll needs one).
    pub expect_snapshot: bool,
}

/// The line a member logs when it replaced its store with a received snapshot (0.1.0 and
/// later, `raft/state_machine.rs`).
const SNAPSHOT_INSTALLED: &str = "installed a snapshot";
/// How long a rolled member may take to log [`SNAPSHOT_INSTALLED`] once it serves.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(10);

/// What the scenario saw: one line per step, and the problems (empty: all checks passed).
#[derive(Debug, Default)]
pub struct UpgradeReport {
    pub steps: Vec<String>,
    pub errors: Vec<String>,
    /// Seconds from the last member's restart until the cluster version allowed 0.2 requests.
    pub rise_secs: Option<f64>,
    /// Snapshots a member installed from a leader on the other binary: `[0]` a member on the
    /// new binary from an old leader, `[1]` a member on the old binary from a new leader.
    pub cross_version_snapshots: [usize; 2],
}

/// The gate's answer to a 0.2-only request at one member.
#[derive(Debug, PartialEq, Eq)]
enum Gate {
    /// Allowed (the cluster version is 0.2 or later).
    Open,
    /// Refused by the cluster-version gate (the message).
    TooLow(String),
    /// Refused otherwise (an old member without the service, an unreachable member, ...).
    Other(String),
}

/// Runs `f` within [`PROBE_TIMEOUT`].
async fn probe<T>(f: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::time::timeout(PROBE_TIMEOUT, f)
        .await
        .map_err(|_| anyhow::anyhow!("no answer within {PROBE_TIMEOUT:?}"))?
}

async fn probe_auth_status(url: &str) -> Gate {
    let r = probe(async {
        let ch = rpc::connect(url, rpc::ADMIN_TIMEOUT).await?;
        Ok(AuthClient::new(ch).auth_status(AuthStatusRequest {}).await)
    })
    .await;
    classify(r.map_err(|e| e.to_string()))
}

async fn user_add(url: &str, name: &str) -> Gate {
    let r = probe(async {
        let ch = rpc::connect(url, rpc::ADMIN_TIMEOUT).await?;
        Ok(AuthClient::new(ch)
            .user_add(AuthUserAddRequest {
                name: name.into(),
                password: "chaos".into(),
                ..Default::default()
            })
            .await)
    })
    .await;
    classify(r.map_err(|e| e.to_string()))
}

fn classify<T>(r: Result<Result<T, tonic::Status>, String>) -> Gate {
    match r {
        Ok(Ok(_)) => Gate::Open,
        Ok(Err(s))
            if s.code() == tonic::Code::FailedPrecondition
                && s.message().contains("is too low for") =>
        {
            Gate::TooLow(s.message().to_string())
        }
        Ok(Err(s)) => Gate::Other(format!("{:?}: {}", s.code(), s.message())),
        Err(e) => Gate::Other(e),
    }
}

async fn users(url: &str) -> anyhow::Result<Vec<String>> {
    rpc::bounded(async {
        let ch = rpc::connect(url, rpc::ADMIN_TIMEOUT).await?;
        Ok(AuthClient::new(ch)
            .user_list(AuthUserListRequest {})
            .await?
            .into_inner()
            .users)
    })
    .await
}

/// Rolls every member from `plan.from` to `plan.to`, one at a time, at evenly spaced times
/// between `t0` and `until`, checking the version gate before and after each roll.
pub async fn run_upgrade(
    cluster: Arc<Cluster>,
    plan: UpgradePlan,
    t0: Instant,
    until: Instant,
) -> UpgradeReport {
    let mut report = UpgradeReport::default();
    let n = cluster.len();
    let rolls = if plan.downgrade.is_some() { 2 * n } else { n };
    let step = (until - t0) / (rolls as u32 + 1);
    let mut last_roll = Instant::now();
    for i in 0..n {
        tokio::time::sleep_until(t0 + step * (i as u32 + 1)).await;
        // While mixed (or all old), a 0.2-only request is refused on every upgraded member
        // with the reason; old members refuse it their own way.
        for (j, m) in cluster.members.iter().enumerate().take(i) {
            match user_add(&m.client_url, MIXED_PROBE_USER).await {
                Gate::TooLow(msg) => report
                    .steps
                    .push(format!("{} (new) refuses UserAdd: {msg}", m.name)),
                other => report.errors.push(format!(
                    "{} upgraded, {} of {n} members old: UserAdd answered {other:?}, want the \
                     cluster-version refusal",
                    cluster.members[j].name,
                    n - i
                )),
            }
        }
        if !roll(&cluster, &plan, i, &plan.to, "new", &mut report).await {
            return report;
        }
        let m = &cluster.members[i];
        last_roll = Instant::now();
        report.steps.push(format!(
            "{} rolled to {} at {:.1}s",
            m.name,
            plan.to.display(),
            (last_roll - t0).as_secs_f64()
        ));
    }
    // Every member runs the new binary: the cluster version rises within RISE_TIMEOUT.
    let open = wait_every_member(&cluster, last_roll + RISE_TIMEOUT, |g| *g == Gate::Open).await;
    if open.iter().all(|o| *o) {
        let secs = (Instant::now() - last_roll).as_secs_f64();
        report.rise_secs = Some(secs);
        report.steps.push(format!(
            "cluster version allows 0.2 requests on every member {secs:.1}s after the last roll"
        ));
    } else {
        report.errors.push(format!(
            "cluster version did not rise within {RISE_TIMEOUT:?} of the last roll (members \
             open: {open:?})"
        ));
        return report;
    }
    let url = &cluster.members[0].client_url;
    match user_add(url, UPGRADED_USER).await {
        Gate::Open => report.steps.push(format!("UserAdd {UPGRADED_USER} works")),
        other => report
            .errors
            .push(format!("UserAdd after the upgrade answered {other:?}")),
    }
    match users(url).await {
        Ok(list) if list == [UPGRADED_USER] => report
            .steps
            .push("the refused mixed-cluster UserAdds changed nothing".into()),
        Ok(list) => report.errors.push(format!(
            "users after the upgrade are {list:?}, want [{UPGRADED_USER:?}]"
        )),
        Err(e) => report.errors.push(format!("UserList: {e:#}")),
    }
    if let Some(target) = &plan.downgrade {
        downgrade(&cluster, &plan, target, t0, step, n, &mut report).await;
    }
    if plan.expect_snapshot {
        let [from_old, from_new] = report.cross_version_snapshots;
        if from_old == 0 {
            report
                .errors
                .push("no member on the new binary installed a snapshot from an old leader".into());
        }
        if plan.downgrade.is_some() && from_new == 0 {
            report
                .errors
                .push("no member on the old binary installed a snapshot from a new leader".into());
        }
    }
    report
}

/// The downgrade half: ENABLE to `target`, wait for the cluster version to fall, roll every
/// member back to `plan.from` at `t0 + step * (n + 1 + i)`.
async fn downgrade(
    cluster: &Cluster,
    plan: &UpgradePlan,
    target: &str,
    t0: Instant,
    step: Duration,
    n: usize,
    report: &mut UpgradeReport,
) {
    let url = cluster.members[0].client_url.clone();
    let downgrade = |action: DowngradeAction, version: &str| {
        let (url, version) = (url.clone(), version.to_string());
        async move {
            probe(async {
                let ch = rpc::connect(&url, rpc::ADMIN_TIMEOUT).await?;
                Ok(MaintenanceClient::new(ch)
                    .downgrade(DowngradeRequest {
                        action: action as i32,
                        version,
                    })
                    .await)
            })
            .await
        }
    };
    // With a user in place ENABLE is refused (0.1.0 would not see it) ...
    match downgrade(DowngradeAction::Enable, target).await {
        Ok(Err(s)) if s.code() == tonic::Code::FailedPrecondition => report.steps.push(format!(
            "Downgrade ENABLE refused while a user exists: {}",
            s.message()
        )),
        other => report.errors.push(format!(
            "Downgrade ENABLE with a user answered {other:?}, want FailedPrecondition"
        )),
    }
    let deleted = probe(async {
        let ch = rpc::connect(&url, rpc::ADMIN_TIMEOUT).await?;
        Ok(AuthClient::new(ch)
            .user_delete(AuthUserDeleteRequest {
                name: UPGRADED_USER.into(),
            })
            .await?)
    })
    .await;
    if let Err(e) = deleted {
        report
            .errors
            .push(format!("UserDelete before the downgrade: {e:#}"));
        return;
    }
    match downgrade(DowngradeAction::Enable, target).await {
        Ok(Ok(r)) => report.steps.push(format!(
            "Downgrade ENABLE {target} accepted (cluster version was {})",
            r.into_inner().version
        )),
        other => {
            report
                .errors
                .push(format!("Downgrade ENABLE {target} answered {other:?}"));
            return;
        }
    }
    // The cluster version falls to the target on every member.
    let low = wait_every_member(cluster, Instant::now() + RISE_TIMEOUT, |g| {
        matches!(g, Gate::TooLow(_))
    })
    .await;
    if low.iter().any(|l| !l) {
        report.errors.push(format!(
            "cluster version did not fall to {target} within {RISE_TIMEOUT:?} (members low: {low:?})"
        ));
        return;
    }
    report
        .steps
        .push(format!("cluster version fell to {target} on every member"));
    for i in 0..n {
        tokio::time::sleep_until(t0 + step * ((n + 1 + i) as u32)).await;
        if !roll(cluster, plan, i, &plan.from, "old", report).await {
            return;
        }
        let m = &cluster.members[i];
        report.steps.push(format!(
            "{} rolled back to {} at {:.1}s",
            m.name,
            plan.from.display(),
            (Instant::now() - t0).as_secs_f64()
        ));
    }
}

/// Stops member `i` (SIGTERM), keeps it down for `plan.hold_down`, swaps it to `binary` and
/// starts it again; with `plan.expect_snapshot` it must then install a snapshot. `false`
/// (with the problem in `report`) when it could not be started.
async fn roll(
    cluster: &Cluster,
    plan: &UpgradePlan,
    i: usize,
    binary: &std::path::Path,
    which: &str,
    report: &mut UpgradeReport,
) -> bool {
    let m = &cluster.members[i];
    let log_path = {
        let mut p = m.process.lock().await;
        p.stop().await;
        p.set_binary(binary.to_path_buf());
        p.log_path().to_path_buf()
    };
    let installs_before = count_lines(&log_path, SNAPSHOT_INSTALLED);
    tokio::time::sleep(plan.hold_down).await;
    let leader = leader_binary(cluster).await;
    if let Err(e) = cluster.start_member(i, &[]).await {
        report
            .errors
            .push(format!("restart {} on the {which} binary: {e:#}", m.name));
        return false;
    }
    if let Err(e) = wait_member_ready(&m.client_url).await {
        report
            .errors
            .push(format!("{} on the {which} binary: {e:#}", m.name));
    }
    if plan.expect_snapshot {
        let deadline = Instant::now() + SNAPSHOT_TIMEOUT;
        while count_lines(&log_path, SNAPSHOT_INSTALLED) <= installs_before
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if count_lines(&log_path, SNAPSHOT_INSTALLED) > installs_before {
            if leader.as_ref().is_some_and(|(_, b)| b != binary) {
                report.cross_version_snapshots[usize::from(binary == plan.from)] += 1;
            }
            report.steps.push(format!(
                "{} ({which}) installed a snapshot from leader {}",
                m.name,
                describe(&leader)
            ));
        } else {
            // A fault during the hold-down can stop the writes that would purge the log.
            report.steps.push(format!(
                "{} ({which}) caught up from the log, no snapshot (leader {})",
                m.name,
                describe(&leader)
            ));
        }
    }
    true
}

/// The member leading now and the binary it runs.
async fn leader_binary(cluster: &Cluster) -> Option<(String, std::path::PathBuf)> {
    let l = cluster.leader().await?;
    let m = &cluster.members[l];
    let binary = m.process.lock().await.binary().to_path_buf();
    Some((m.name.clone(), binary))
}

/// `m2 (on /path/keel)`, or `unknown`.
fn describe(leader: &Option<(String, std::path::PathBuf)>) -> String {
    match leader {
        Some((name, binary)) => format!("{name} (on {})", binary.display()),
        None => "unknown".into(),
    }
}

/// Lines of the file at `path` containing `needle` (0 when it cannot be read).
fn count_lines(path: &std::path::Path, needle: &str) -> usize {
    std::fs::read_to_string(path)
        .map(|s| s.lines().filter(|l| l.contains(needle)).count())
        .unwrap_or(0)
}

/// Probes AuthStatus on every member until each answered `want` once, or `deadline`; returns
/// which members did.
async fn wait_every_member(
    cluster: &Cluster,
    deadline: Instant,
    want: impl Fn(&Gate) -> bool,
) -> Vec<bool> {
    let mut seen = vec![false; cluster.len()];
    while Instant::now() < deadline && seen.iter().any(|s| !s) {
        for (k, m) in cluster.members.iter().enumerate() {
            if !seen[k] {
                seen[k] = want(&probe_auth_status(&m.client_url).await);
            }
        }
        if seen.iter().any(|s| !s) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    seen
}

async fn wait_member_ready(url: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + MEMBER_READY_TIMEOUT;
    loop {
        match rpc::status(url).await {
            Ok(s) if s.leader != 0 => return Ok(()),
            r => {
                if Instant::now() >= deadline {
                    anyhow::bail!("not ready within {MEMBER_READY_TIMEOUT:?}: {r:?}");
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
