//! A kube-apiserver watch cache (k8s.io/apiserver `pkg/storage/cacher` and its reflector):
//! list `/registry/`, watch from the list's revision + 1 with `prev_kv`, `progress_notify`,
//! a progress request every second and `hasleader: true`; after a stream error, stall or
//! leader-loss cancel, re-dial a random member from the last seen revision + 1; after a
//! compaction cancel, relist (a new [`CacheRecord`]). At a progress notification at revision
//! R (at most every [`CHECKPOINT_EVERY`]) a fresh list at R becomes a checkpoint.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use keel_proto::etcdserverpb::watch_client::WatchClient;
use keel_proto::etcdserverpb::watch_request::RequestUnion;
use keel_proto::etcdserverpb::{WatchCreateRequest, WatchProgressRequest, WatchRequest};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{
    Conns, KubeLog, REGISTRY, REGISTRY_END, header_revision, paginated_list, require_leader,
};
use crate::history::{CacheCheckpoint, CacheRecord};
use crate::run::cluster::Cluster;
use crate::run::watcher::{event, tokio_stream_from};

/// A stream with no response for this long is abandoned.
const STALL: Duration = Duration::from_secs(3);
/// Interval of progress requests (the apiserver's progress requester asks when a consistent
/// read waits on the cache).
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// Minimum spacing of checkpoints (each costs a full list).
const CHECKPOINT_EVERY: Duration = Duration::from_secs(2);

/// Why a stream ended.
enum Ended {
    /// The harness stopped the run.
    Stopped,
    /// The start revision was compacted: relist.
    Compacted,
    /// Anything else: re-dial from the last seen revision + 1.
    Broken,
}

/// Runs cache `id` until `stop` is set.
pub async fn run_cache(
    id: u32,
    cluster: Arc<Cluster>,
    log: Arc<KubeLog>,
    seed: u64,
    stop: Arc<AtomicBool>,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x0043_4143_4845 ^ (u64::from(id) << 40));
    let mut conns = Conns::new(cluster.len());
    while !stop.load(Ordering::SeqCst) {
        let member = rng.gen_range(0..cluster.len());
        let listed = paginated_list(
            &mut conns,
            &cluster,
            member,
            REGISTRY,
            REGISTRY_END,
            0,
            &log,
        )
        .await;
        log.count("cache list", listed.is_ok());
        let Ok((list_revision, listed)) = listed else {
            tokio::time::sleep(Duration::from_millis(rng.gen_range(50..200))).await;
            continue;
        };
        let mut record = CacheRecord {
            cache: id,
            prefix: REGISTRY.to_string(),
            list_revision,
            listed,
            events: Vec::new(),
            checkpoints: Vec::new(),
            redials: 0,
        };
        let mut next = list_revision + 1;
        let mut member = member;
        let mut opened = false;
        loop {
            if opened {
                record.redials += 1;
            }
            opened = true;
            let ended = stream(
                &cluster,
                member,
                &mut conns,
                &log,
                &stop,
                &mut record,
                &mut next,
            )
            .await;
            match ended {
                Ended::Stopped | Ended::Compacted => break,
                Ended::Broken => {
                    tokio::time::sleep(Duration::from_millis(rng.gen_range(50..200))).await;
                    member = rng.gen_range(0..cluster.len());
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                }
            }
        }
        log.caches.lock().expect("kube caches lock").push(record);
    }
}

/// One watch stream from `*next`; advances `*next` past every event and progress revision.
async fn stream(
    cluster: &Cluster,
    member: usize,
    conns: &mut Conns,
    log: &KubeLog,
    stop: &AtomicBool,
    record: &mut CacheRecord,
    next: &mut i64,
) -> Ended {
    let Ok(channel) = conns.channel(cluster, member).await else {
        return Ended::Broken;
    };
    let (tx, rx) = mpsc::channel(4);
    let create = WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: REGISTRY.as_bytes().to_vec(),
            range_end: REGISTRY_END.as_bytes().to_vec(),
            start_revision: *next,
            progress_notify: true,
            prev_kv: true,
            ..Default::default()
        })),
    };
    if tx.send(create).await.is_err() {
        return Ended::Broken;
    }
    let opened = tokio::time::timeout(
        STALL,
        WatchClient::new(channel).watch(require_leader(tokio_stream_from(rx))),
    )
    .await;
    let mut responses = match opened {
        Ok(Ok(r)) => r.into_inner(),
        _ => return Ended::Broken,
    };
    let mut progress = tokio::time::interval(PROGRESS_EVERY);
    let mut last_response = Instant::now();
    let mut last_checkpoint = Instant::now();
    loop {
        if stop.load(Ordering::SeqCst) {
            return Ended::Stopped;
        }
        tokio::select! {
            msg = responses.next() => {
                let Some(Ok(r)) = msg else {
                    return Ended::Broken;
                };
                last_response = Instant::now();
                if r.canceled {
                    return if r.compact_revision > 0 { Ended::Compacted } else { Ended::Broken };
                }
                if r.created {
                    continue;
                }
                if let Some(last) = r.events.last() {
                    record.events.extend(r.events.iter().map(event));
                    *next = last.kv.as_ref().map_or(*next, |kv| kv.mod_revision + 1);
                    continue;
                }
                // A progress notification: every event at or below `revision` was delivered.
                let revision = header_revision(r.header.as_ref());
                *next = (*next).max(revision + 1);
                let newer = record.checkpoints.last().is_none_or(|c| c.revision < revision);
                if newer && last_checkpoint.elapsed() >= CHECKPOINT_EVERY {
                    last_checkpoint = Instant::now();
                    let fresh = paginated_list(conns, cluster, member, REGISTRY, REGISTRY_END, revision, log).await;
                    // A list at a compacted revision fails: no checkpoint then.
                    log.count("cache checkpoint list", fresh.is_ok());
                    if let Ok((_, fresh)) = fresh {
                        record.checkpoints.push(CacheCheckpoint { revision, fresh });
                    }
                    last_response = Instant::now();
                }
            }
            _ = progress.tick() => {
                if last_response.elapsed() > STALL {
                    return Ended::Broken;
                }
                let req = WatchRequest {
                    request_union: Some(RequestUnion::ProgressRequest(WatchProgressRequest {})),
                };
                if tx.send(req).await.is_err() {
                    return Ended::Broken;
                }
            }
        }
    }
}
