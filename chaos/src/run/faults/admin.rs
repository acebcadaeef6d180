//! Faults driven through the etcd API: leader transfer (Maintenance.MoveLeader), a compaction
//! storm (KV.Compact), and member remove + re-add (Cluster.MemberRemove / MemberAdd).

use std::time::Duration;

use anyhow::Context;
use keel_proto::etcdserverpb::cluster_client::ClusterClient;
use keel_proto::etcdserverpb::kv_client::KvClient;
use keel_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use keel_proto::etcdserverpb::{
    CompactionRequest, MemberAddRequest, MemberRemoveRequest, MoveLeaderRequest,
};
use rand::Rng;
use rand::rngs::StdRng;
use tokio::time::Instant;

use crate::run::cluster::Cluster;
use crate::run::rpc::{ADMIN_TIMEOUT, bounded, connect, member_list};

/// How long a membership change may keep retrying (leader changes, not enough started
/// members) before the fault reports an error.
const MEMBERSHIP_RETRY: Duration = Duration::from_secs(20);

/// Moves leadership from the current leader to a random follower (sent to the leader, as
/// etcd requires).
pub async fn transfer(cluster: &Cluster, rng: &mut StdRng) -> anyhow::Result<String> {
    let (leader, target) = random_follower(cluster, rng, "no leader to transfer from").await?;
    let target_id = cluster.members[target].id();
    bounded(async {
        let ch = connect(&cluster.members[leader].client_url, ADMIN_TIMEOUT).await?;
        MaintenanceClient::new(ch)
            .move_leader(MoveLeaderRequest { target_id })
            .await?;
        Ok(())
    })
    .await?;
    Ok(format!(
        "leader {} -> {}",
        cluster.members[leader].name, cluster.members[target].name
    ))
}

/// For `hold`: every 20-100 ms, compact at the latest revision minus 0-10, through a random
/// member. Errors of single compactions (already compacted, no leader) are expected.
pub async fn compaction_storm(
    cluster: &Cluster,
    hold: Duration,
    rng: &mut StdRng,
) -> anyhow::Result<String> {
    let until = Instant::now() + hold;
    let (mut done, mut failed, mut highest) = (0u32, 0u32, 0i64);
    while Instant::now() < until {
        let i = rng.gen_range(0..cluster.len());
        let back = rng.gen_range(0..=10);
        let result = bounded(async {
            let url = &cluster.members[i].client_url;
            let rev = cluster
                .status(i)
                .await?
                .header
                .map(|h| h.revision)
                .unwrap_or(0);
            let target = (rev - back).max(1);
            let ch = connect(url, ADMIN_TIMEOUT).await?;
            KvClient::new(ch)
                .compact(CompactionRequest {
                    revision: target,
                    physical: false,
                })
                .await?;
            Ok(target)
        })
        .await;
        match result {
            Ok(rev) => {
                done += 1;
                highest = highest.max(rev);
            }
            Err(_) => failed += 1,
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(20..=100))).await;
    }
    Ok(format!(
        "{done} compactions (up to revision {highest}), {failed} refused, over {hold:?}"
    ))
}

/// Removes a random follower from the cluster (MemberRemove through the leader), SIGKILLs it
/// and wipes its data dir, holds, adds it back with the same peer URL (MemberAdd) and starts
/// it with `--initial-cluster-state existing`.
pub async fn remove_and_readd(
    cluster: &Cluster,
    hold: Duration,
    rng: &mut StdRng,
) -> anyhow::Result<String> {
    let (_, t) = random_follower(cluster, rng, "no leader to change membership through").await?;
    let m = &cluster.members[t];
    let old_id = m.id();
    anyhow::ensure!(old_id != 0, "member ID of {} unknown", m.name);
    retry_on_leader(cluster, t, |url| async move {
        let ch = connect(&url, ADMIN_TIMEOUT).await?;
        match ClusterClient::new(ch)
            .member_remove(MemberRemoveRequest { id: old_id })
            .await
        {
            // An earlier attempt whose answer was lost already removed it.
            Err(s) if s.code() == tonic::Code::NotFound => Ok(()),
            Err(s) => Err(s.into()),
            Ok(_) => Ok(()),
        }
    })
    .await
    .with_context(|| format!("MemberRemove {}", m.name))?;
    m.process
        .lock()
        .await
        .kill("removed from the cluster")
        .await;
    if m.data_dir().exists() {
        std::fs::remove_dir_all(m.data_dir())
            .with_context(|| format!("wipe {}", m.data_dir().display()))?;
    }
    tokio::time::sleep(hold).await;
    let peer_url = m.peer_url.clone();
    let new_id = retry_on_leader(cluster, t, |url| {
        let peer_url = peer_url.clone();
        async move {
            let ch = connect(&url, ADMIN_TIMEOUT).await?;
            let added = ClusterClient::new(ch)
                .member_add(MemberAddRequest {
                    peer_ur_ls: vec![peer_url.clone()],
                    is_learner: false,
                })
                .await;
            match added {
                Ok(resp) => Ok(resp.into_inner().member.map(|m| m.id).unwrap_or(0)),
                // An earlier attempt whose answer was lost already added it: find its ID.
                Err(s) if s.message().contains("Peer URLs already exists") => member_list(&url)
                    .await?
                    .into_iter()
                    .find(|(_, urls)| urls.contains(&peer_url))
                    .map(|(id, _)| id)
                    .context("re-added member missing from the member list"),
                Err(s) => Err(s.into()),
            }
        }
    })
    .await
    .with_context(|| format!("MemberAdd {} back", m.name))?;
    cluster.mark_rejoined(t);
    cluster.set_id(t, new_id);
    cluster.start_member(t, &[]).await?;
    Ok(format!(
        "removed {} (id {old_id:x}), wiped, re-added as {new_id:x} after {hold:?}",
        m.name
    ))
}

/// The current leader and a random other member, `(leader, follower)`; the follower's member
/// ID is asked for (Status) when the run has not learned it yet. `no_leader` is the error's
/// context when there is no leader.
async fn random_follower(
    cluster: &Cluster,
    rng: &mut StdRng,
    no_leader: &'static str,
) -> anyhow::Result<(usize, usize)> {
    let leader = cluster.leader().await.context(no_leader)?;
    let others: Vec<usize> = (0..cluster.len()).filter(|&i| i != leader).collect();
    let follower = others[rng.gen_range(0..others.len())];
    if cluster.members[follower].id() == 0 {
        cluster.status(follower).await?;
    }
    Ok((leader, follower))
}

/// Runs `call` against the current leader (or any member but `skip` when no leader is
/// known), retrying on errors for up to [`MEMBERSHIP_RETRY`].
async fn retry_on_leader<T, F, Fut>(cluster: &Cluster, skip: usize, call: F) -> anyhow::Result<T>
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    let deadline = Instant::now() + MEMBERSHIP_RETRY;
    let mut attempt = 0usize;
    loop {
        let via = match cluster.leader().await {
            Some(l) if l != skip => l,
            _ => (0..cluster.len())
                .filter(|&i| i != skip)
                .nth(attempt % (cluster.len() - 1))
                .unwrap_or(0),
        };
        attempt += 1;
        match bounded(call(cluster.members[via].client_url.clone())).await {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
}
