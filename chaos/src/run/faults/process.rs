//! Process faults: SIGKILL + restart, SIGSTOP + SIGCONT, and a restart with a crash failpoint
//! armed (the `fail` crate's `FAILPOINTS` env var, read by `keel` built with the `failpoints`
//! feature).

use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;

use keel_proto::etcdserverpb::kv_client::KvClient;
use keel_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use keel_proto::etcdserverpb::{CompactionRequest, DefragmentRequest};
use keel_testkit::spec::FAILPOINTS_ENV;
use tokio::time::Instant;

use super::pick_target;
use crate::run::cluster::Cluster;
use crate::run::rpc::{ADMIN_TIMEOUT, bounded, connect};

/// Failpoints that crash the member (see docs/chaos.md): each is armed to fire after a random
/// number of passes, so the crash lands mid-traffic.
pub const CRASH_FAILPOINTS: [&str; 7] = [
    "wal_before_fsync",
    "wal_after_fsync",
    "wal_torn_write",
    "apply_before_cindex",
    "snapshot_install_mid",
    "compact_mid",
    "defrag_mid",
];

/// SIGKILL the leader or a random member, hold, restart it.
pub async fn kill(cluster: &Cluster, hold: Duration, rng: &mut StdRng) -> anyhow::Result<String> {
    let (t, why) = pick_target(cluster, rng).await;
    cluster.members[t]
        .process
        .lock()
        .await
        .kill("fault kill")
        .await;
    tokio::time::sleep(hold).await;
    cluster.start_member(t, &[]).await?;
    Ok(format!(
        "SIGKILL {} ({why}), restarted after {hold:?}",
        cluster.members[t].name
    ))
}

/// SIGSTOP the leader or a random member, hold, SIGCONT.
pub async fn pause(cluster: &Cluster, hold: Duration, rng: &mut StdRng) -> anyhow::Result<String> {
    let (t, why) = pick_target(cluster, rng).await;
    cluster.members[t].process.lock().await.pause();
    tokio::time::sleep(hold).await;
    cluster.members[t].process.lock().await.resume();
    Ok(format!(
        "SIGSTOP {} ({why}) for {hold:?}",
        cluster.members[t].name
    ))
}

/// Restart a random member with one crash failpoint armed
/// (`FAILPOINTS=<name>=<skip>*off->return`), wait up to `hold` for it to crash (SIGKILL it if
/// the failpoint was not reached), then restart it normally.
pub async fn failpoint_crash(
    cluster: &Cluster,
    hold: Duration,
    rng: &mut StdRng,
) -> anyhow::Result<String> {
    let t = rng.gen_range(0..cluster.len());
    let name = CRASH_FAILPOINTS[rng.gen_range(0..CRASH_FAILPOINTS.len())];
    // Points on the hot write path fire after a random number of passes; the rare ones
    // (one pass per compaction, defragmentation, snapshot install) on the first.
    let skip = match name {
        "compact_mid" | "defrag_mid" | "snapshot_install_mid" => 0,
        _ => rng.gen_range(0..20),
    };
    let spec = format!("{name}={skip}*off->return");
    let m = &cluster.members[t];
    m.process.lock().await.kill("fault failpoint: re-arm").await;
    cluster
        .start_member(t, &[(FAILPOINTS_ENV.to_string(), spec.clone())])
        .await?;
    // Compaction and defragmentation only run when asked: ask, so their points are reached.
    if matches!(name, "compact_mid" | "defrag_mid") {
        provoke(cluster, t, name, hold).await;
    }
    let crashed = m.process.lock().await.wait_exit(hold).await;
    if !crashed {
        m.process.lock().await.kill("failpoint not reached").await;
    }
    cluster.start_member(t, &[]).await?;
    Ok(format!(
        "{} FAILPOINTS={spec}: {}",
        m.name,
        if crashed {
            "crashed"
        } else {
            "not reached, SIGKILLed"
        }
    ))
}

/// Within `within`: once member `t` serves, `Compact` at its latest revision (`compact_mid`;
/// every member compacts, so the point fires on `t` too) or `Defragment` it (`defrag_mid`).
/// Retries refused requests until one is accepted; the error of the call that crashes the
/// member is expected.
async fn provoke(cluster: &Cluster, t: usize, point: &str, within: Duration) {
    let deadline = Instant::now() + within;
    let url = &cluster.members[t].client_url;
    while Instant::now() < deadline {
        let Ok(status) = cluster.status(t).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let revision = status.header.map(|h| h.revision).unwrap_or(0);
        let asked = bounded(async {
            let ch = connect(url, ADMIN_TIMEOUT).await?;
            if point == "compact_mid" {
                KvClient::new(ch)
                    .compact(CompactionRequest {
                        revision,
                        physical: false,
                    })
                    .await?;
            } else {
                MaintenanceClient::new(ch)
                    .defragment(DefragmentRequest {})
                    .await?;
            }
            Ok(())
        })
        .await;
        if asked.is_ok() {
            return;
        }
        // A member still catching up may name a revision that is already compacted: retry.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
