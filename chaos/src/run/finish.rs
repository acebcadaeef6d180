//! The end of a run: heal every fault, restart every member (a cold restart of the whole
//! cluster, so recovery from disk is part of every run), wait for the members to converge on
//! one revision, and collect `HashKV` at that revision from each ([`MemberFinal`]).

use std::time::Duration;

use keel_proto::etcdserverpb::HashKvRequest;
use keel_proto::etcdserverpb::maintenance_client::MaintenanceClient;

use super::cluster::Cluster;
use super::rpc::{ADMIN_TIMEOUT, bounded, connect};
use crate::history::MemberFinal;

/// Links pass again, paused members continue, stopped members start.
///
/// Errors: a member that cannot be started.
pub async fn heal_all(cluster: &Cluster) -> anyhow::Result<()> {
    cluster.heal_links();
    for i in 0..cluster.len() {
        let running = {
            let mut p = cluster.members[i].process.lock().await;
            if p.is_paused() {
                p.resume();
            }
            p.is_running()
        };
        if !running {
            cluster.start_member(i, &[]).await?;
        }
    }
    Ok(())
}

/// Stops every member (SIGTERM) and starts them all again with their normal flags.
///
/// Errors: a member that cannot be started.
pub async fn restart_all(cluster: &Cluster) -> anyhow::Result<()> {
    cluster.shutdown().await;
    for i in 0..cluster.len() {
        cluster.start_member(i, &[]).await?;
    }
    Ok(())
}

/// Waits until every member answers Status with the same leader and the same revision on two
/// polls in a row, and returns that revision.
///
/// Errors: after `timeout`, with every member's last answer.
pub async fn converge(cluster: &Cluster, timeout: Duration) -> anyhow::Result<i64> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut previous: Option<i64> = None;
    loop {
        let answers =
            futures::future::join_all((0..cluster.len()).map(|i| cluster.status(i))).await;
        let seen: Vec<Option<(u64, i64)>> = answers
            .iter()
            .map(|a| {
                a.as_ref()
                    .ok()
                    .map(|s| (s.leader, s.header.as_ref().map(|h| h.revision).unwrap_or(0)))
            })
            .collect();
        let agreed = match seen.first() {
            Some(Some((leader, rev)))
                if *leader != 0 && seen.iter().all(|s| *s == Some((*leader, *rev))) =>
            {
                Some(*rev)
            }
            _ => None,
        };
        if agreed.is_some() && agreed == previous {
            return Ok(agreed.unwrap_or(0));
        }
        previous = agreed;
        if tokio::time::Instant::now() >= deadline {
            let detail: Vec<String> = answers
                .iter()
                .zip(&cluster.members)
                .map(|(a, m)| match a {
                    Ok(s) => format!(
                        "{}: leader {:x} revision {} applied index {}",
                        m.name,
                        s.leader,
                        s.header.as_ref().map(|h| h.revision).unwrap_or(0),
                        s.raft_applied_index
                    ),
                    Err(e) => format!("{}: {e:#}", m.name),
                })
                .collect();
            anyhow::bail!(
                "members did not converge within {timeout:?}: {}",
                detail.join("; ")
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// `Maintenance.HashKV` at `revision` from every member.
///
/// Errors: the first member that does not answer.
pub async fn collect_finals(cluster: &Cluster, revision: i64) -> anyhow::Result<Vec<MemberFinal>> {
    let mut finals = Vec::with_capacity(cluster.len());
    for m in &cluster.members {
        let resp = bounded(async {
            let ch = connect(&m.client_url, ADMIN_TIMEOUT).await?;
            Ok(MaintenanceClient::new(ch)
                .hash_kv(HashKvRequest { revision })
                .await?
                .into_inner())
        })
        .await
        .map_err(|e| anyhow::anyhow!("HashKV at revision {revision} on {}: {e:#}", m.name))?;
        finals.push(MemberFinal {
            member: m.index,
            hash: resp.hash,
            revision: if resp.hash_revision != 0 {
                resp.hash_revision
            } else {
                revision
            },
            compact_revision: resp.compact_revision,
        });
    }
    Ok(finals)
}
