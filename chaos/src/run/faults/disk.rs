//! Disk faults: a slow disk on one member (`slow-fsync`), through the `wal_slow_fsync`
//! failpoint of a `keel` built with the `failpoints` feature (docs/failpoints.md), set at run
//! time: such a `keel` re-reads `<data-dir>/failpoints` every 100 ms, so the member keeps its
//! role (a slow *leader* stays the leader unless raft moves it).

use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;
use tokio::time::Instant;

use super::pick_target;
use crate::run::cluster::Cluster;

/// Range of the delay before each WAL fdatasync, in milliseconds (issue 18: 100–500 ms).
pub const SLOW_FSYNC_MS: (u64, u64) = (100, 500);
/// How often the leader is sampled during the hold.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// The run-time failpoint file of a failpoints build, in the data dir.
const FAILPOINT_FILE: &str = "failpoints";

/// Arms `wal_slow_fsync=sleep(<100..=500>)` on the leader (half the time) or a random member
/// through its run-time failpoint file, holds while sampling who leads, then disarms it. The
/// detail says whether leadership left a slow leader, and after how long.
pub async fn slow_fsync(
    cluster: &Cluster,
    hold: Duration,
    rng: &mut StdRng,
) -> anyhow::Result<String> {
    let (t, why) = pick_target(cluster, rng).await;
    let ms = rng.gen_range(SLOW_FSYNC_MS.0..=SLOW_FSYNC_MS.1);
    let spec = format!("wal_slow_fsync=sleep({ms})");
    let m = &cluster.members[t];
    let file = m.data_dir().join(FAILPOINT_FILE);
    std::fs::write(&file, &spec)?;
    let until = Instant::now() + hold;
    let watched = watch_leader(cluster, t, until).await;
    std::fs::write(&file, "")?;
    Ok(format!("{} ({why}) {spec} for {hold:.1?}{watched}", m.name))
}

/// Samples the leader until `until`: how long member `t` led and whether leadership left it.
async fn watch_leader(cluster: &Cluster, t: usize, until: Instant) -> String {
    let started = Instant::now();
    let (mut led, mut left_after) = (false, None);
    while Instant::now() < until {
        match cluster.leader().await {
            Some(l) if l == t => led = true,
            Some(_) if led && left_after.is_none() => left_after = Some(started.elapsed()),
            _ => {}
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
    match (led, left_after) {
        (true, Some(d)) => format!("; the slow leader lost leadership after {d:.1?}"),
        (true, None) => format!("; it stayed leader for {:.1?}", started.elapsed()),
        (false, _) => "; it was a follower throughout".to_string(),
    }
}
