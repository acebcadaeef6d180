//! Network faults on the peer links (the proxies): partitions and added latency. Client
//! traffic is never touched, so clients keep reaching isolated members (which is what exposes
//! stale reads).

use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use crate::run::cluster::Cluster;
use crate::run::proxy::LinkMode;

/// Which directions a partition cuts.
#[derive(Clone, Copy, Debug)]
enum Direction {
    /// Neither side reaches the other.
    Both,
    /// The isolated members cannot send to the rest (the rest still reach them).
    Outbound,
    /// The rest cannot send to the isolated members (they still send out).
    Inbound,
}

/// Isolates the leader (half the time, when known) or a random minority from the rest, for
/// `hold`, then heals those links.
pub async fn partition(
    cluster: &Cluster,
    hold: Duration,
    rng: &mut StdRng,
    symmetric_only: bool,
) -> anyhow::Result<String> {
    let n = cluster.len();
    let isolated: Vec<usize> = match cluster.leader().await {
        Some(l) if rng.gen_bool(0.5) => vec![l],
        _ => {
            let size = rng.gen_range(1..=(n - 1) / 2);
            let mut all: Vec<usize> = (0..n).collect();
            all.shuffle(rng);
            all.truncate(size);
            all.sort_unstable();
            all
        }
    };
    let direction = if symmetric_only {
        Direction::Both
    } else {
        [Direction::Both, Direction::Outbound, Direction::Inbound][rng.gen_range(0..3)]
    };
    let mut cut = Vec::new();
    for &i in &isolated {
        for j in (0..n).filter(|j| !isolated.contains(j)) {
            if matches!(direction, Direction::Both | Direction::Outbound) {
                cut.push((i, j));
            }
            if matches!(direction, Direction::Both | Direction::Inbound) {
                cut.push((j, i));
            }
        }
    }
    for &(from, to) in &cut {
        cluster.set_link(from, to, LinkMode::Drop);
    }
    tokio::time::sleep(hold).await;
    for &(from, to) in &cut {
        cluster.set_link(from, to, LinkMode::Pass);
    }
    let names: Vec<&str> = isolated
        .iter()
        .map(|&i| cluster.members[i].name.as_str())
        .collect();
    Ok(format!("isolate {names:?} ({direction:?}) for {hold:?}"))
}

/// Delays every peer link of one random member (half the time) or of all members by
/// 50-400 ms per chunk, for `hold`.
pub async fn latency(
    cluster: &Cluster,
    hold: Duration,
    rng: &mut StdRng,
) -> anyhow::Result<String> {
    let n = cluster.len();
    let delay = Duration::from_millis(rng.gen_range(50..=400));
    let (links, what): (Vec<(usize, usize)>, String) = if rng.gen_bool(0.5) {
        let t = rng.gen_range(0..n);
        let links = (0..n)
            .filter(|&j| j != t)
            .flat_map(|j| [(t, j), (j, t)])
            .collect();
        (links, format!("links of {}", cluster.members[t].name))
    } else {
        let links = (0..n)
            .flat_map(|i| (0..n).filter(move |&j| j != i).map(move |j| (i, j)))
            .collect();
        (links, "all links".to_string())
    };
    for &(from, to) in &links {
        cluster.set_link(from, to, LinkMode::Delay(delay));
    }
    tokio::time::sleep(hold).await;
    for &(from, to) in &links {
        cluster.set_link(from, to, LinkMode::Pass);
    }
    Ok(format!("+{delay:?} on {what} for {hold:?}"))
}
