//! `--traffic kubernetes`: kube-apiserver-shaped traffic beside the KV workload, modelled on
//! k8s.io/apiserver `pkg/storage/etcd3` (store.go, compact.go) and `pkg/storage/cacher`:
//!
//! - [`objects`]: writers that create `/registry/<resource>/<namespace>/<name>` with
//!   `Txn(create_revision == 0)`, update with `Txn(mod_revision == <read revision>)` and
//!   re-read in the failure branch (GuaranteedUpdate), delete the same way, and paginated
//!   lists at a pinned revision (`limit 500`, continue from last key + `\0`, `count`);
//!   an event writer putting `/registry/events/...` with leases reused for many keys; and a
//!   compactor running the apiserver's `compact_rev_key` txn followed by `Compact`.
//! - [`cache`]: watch caches: list `/registry/`, watch from the list's revision + 1 with
//!   `prev_kv`, progress requests and `hasleader: true`; re-dial from the last seen
//!   revision + 1 after errors; relist after a compaction cancel; at progress checkpoints a
//!   fresh list at the same revision is recorded for [`crate::check::check_watch_caches`].
//!
//! Every request carries the require-leader metadata kube-apiserver's client sets.

pub mod cache;
pub mod objects;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_proto::etcdserverpb::kv_client::KvClient;
use keel_proto::etcdserverpb::{RangeRequest, ResponseHeader};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::Status;
use tonic::transport::Channel;

use super::cluster::Cluster;
use super::outcome::is_transport_error;
use super::rpc::connect;
use crate::check::{Checker, Violation};
use crate::history::{CacheRecord, CachedKv};

/// Every key the traffic writes or watches is under it.
pub const REGISTRY: &str = "/registry/";
/// `REGISTRY` with its last byte incremented.
pub const REGISTRY_END: &str = "/registry0";
/// kube-apiserver's page size for paginated lists (`--default-watch-cache-size` aside, the
/// reflector's `limit=500`).
pub const PAGE_LIMIT: i64 = 500;

/// What the Kubernetes traffic shares with the harness.
#[derive(Default)]
pub struct KubeLog {
    /// Per operation kind: `[ok, failed]`.
    pub counts: Mutex<BTreeMap<&'static str, [u64; 2]>>,
    /// Closed cache records.
    pub caches: Mutex<Vec<CacheRecord>>,
    /// Paginated lists that were not one snapshot.
    pub violations: Mutex<Vec<Violation>>,
}

impl KubeLog {
    /// Counts one operation of `kind`.
    pub fn count(&self, kind: &'static str, ok: bool) {
        let mut counts = self.counts.lock().expect("kube counts lock");
        counts.entry(kind).or_default()[usize::from(!ok)] += 1;
    }

    /// All operations counted so far.
    pub fn total(&self) -> u64 {
        let counts = self.counts.lock().expect("kube counts lock");
        counts.values().map(|[ok, failed]| ok + failed).sum()
    }
}

/// Starts the writers (`writers` of them), the event writer, the compactor (until `until`) and
/// `caches` watch caches (until `stop`).
pub fn spawn(
    cluster: Arc<Cluster>,
    log: Arc<KubeLog>,
    writers: usize,
    caches: usize,
    seed: u64,
    until: Instant,
    stop: Arc<AtomicBool>,
) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    for id in 0..writers {
        tasks.push(tokio::spawn(objects::run_writer(
            id as u32,
            cluster.clone(),
            log.clone(),
            seed,
            until,
        )));
    }
    tasks.push(tokio::spawn(objects::run_events(
        cluster.clone(),
        log.clone(),
        seed,
        until,
    )));
    tasks.push(tokio::spawn(objects::run_compactor(
        cluster.clone(),
        log.clone(),
        until,
    )));
    for id in 0..caches {
        tasks.push(tokio::spawn(cache::run_cache(
            id as u32,
            cluster.clone(),
            log.clone(),
            seed,
            stop.clone(),
        )));
    }
    tasks
}

/// Deadline of one request.
pub const OP_TIMEOUT: Duration = Duration::from_secs(2);

/// `msg` with the metadata `hasleader: true` (clientv3's `WithRequireLeader`).
pub fn require_leader<T>(msg: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut().insert(
        "hasleader",
        tonic::metadata::MetadataValue::from_static("true"),
    );
    req
}

/// One cached connection per member.
pub struct Conns {
    channels: Vec<Option<Channel>>,
}

impl Conns {
    pub fn new(members: usize) -> Self {
        Conns {
            channels: vec![None; members],
        }
    }

    /// The KV client of `member`, connecting when needed.
    pub async fn kv(
        &mut self,
        cluster: &Cluster,
        member: usize,
    ) -> Result<KvClient<Channel>, Status> {
        Ok(KvClient::new(self.channel(cluster, member).await?))
    }

    /// The channel of `member`, connecting when needed.
    pub async fn channel(&mut self, cluster: &Cluster, member: usize) -> Result<Channel, Status> {
        if let Some(c) = &self.channels[member] {
            return Ok(c.clone());
        }
        let c = connect(&cluster.members[member].client_url, OP_TIMEOUT)
            .await
            .map_err(|e| Status::unavailable(format!("connect: {e}")))?;
        self.channels[member] = Some(c.clone());
        Ok(c)
    }

    /// Runs `f` within [`OP_TIMEOUT`]; drops the member's connection after a transport error
    /// or a timeout (a paused member, a blackholed link).
    pub async fn call<T>(
        &mut self,
        member: usize,
        f: impl Future<Output = Result<T, Status>>,
    ) -> Result<T, Status> {
        let result = match tokio::time::timeout(OP_TIMEOUT, f).await {
            Ok(r) => r,
            Err(_) => Err(Status::deadline_exceeded("no answer")),
        };
        if let Err(s) = &result
            && (is_transport_error(s) || s.code() == tonic::Code::DeadlineExceeded)
        {
            self.channels[member] = None;
        }
        result
    }
}

/// A paginated list of `[prefix, end)` as kube-apiserver's storage does it: the first page
/// at `revision` (0 = current), later pages pinned to the first page's revision, continuing
/// from the last key + `\0`, `limit` [`PAGE_LIMIT`], reading `count`. Returns the pinned
/// revision and the items; a page that contradicts the others (count, `more`, an item newer
/// than the pinned revision) is a violation in `log`.
pub async fn paginated_list(
    conns: &mut Conns,
    cluster: &Cluster,
    member: usize,
    prefix: &str,
    end: &str,
    revision: i64,
    log: &KubeLog,
) -> Result<(i64, Vec<CachedKv>), Status> {
    let mut kv = conns.kv(cluster, member).await?;
    let mut pinned = revision;
    let mut start = prefix.as_bytes().to_vec();
    let mut items = Vec::new();
    let mut first_count = None;
    loop {
        let req = RangeRequest {
            key: start.clone(),
            range_end: end.as_bytes().to_vec(),
            limit: PAGE_LIMIT,
            revision: pinned,
            ..Default::default()
        };
        let page = conns
            .call(member, async {
                Ok(kv.range(require_leader(req)).await?.into_inner())
            })
            .await?;
        if pinned == 0 {
            pinned = header_revision(page.header.as_ref());
        }
        let expected = first_count.map(|c: i64| c - items.len() as i64);
        let mut problems = Vec::new();
        if let Some(e) = expected
            && page.count != e
        {
            problems.push(format!("count {} where {e} keys remain", page.count));
        }
        if page.more != (page.count > page.kvs.len() as i64) {
            problems.push(format!(
                "more = {} with count {} and {} keys",
                page.more,
                page.count,
                page.kvs.len()
            ));
        }
        if let Some(kv) = page.kvs.iter().find(|kv| kv.mod_revision > pinned) {
            problems.push(format!(
                "{:?} at mod_revision {} in a list pinned to {pinned}",
                String::from_utf8_lossy(&kv.key),
                kv.mod_revision
            ));
        }
        if !problems.is_empty() {
            log.violations
                .lock()
                .expect("kube violations lock")
                .push(Violation::new(
                    Checker::WatchCache,
                    Some(prefix.to_string()),
                    format!(
                        "paginated list at revision {pinned}, page {} from {:?}: {}",
                        items.len() / PAGE_LIMIT as usize,
                        String::from_utf8_lossy(&start),
                        problems.join("; ")
                    ),
                ));
        }
        first_count.get_or_insert(page.count);
        items.extend(page.kvs.iter().map(|kv| CachedKv {
            key: String::from_utf8_lossy(&kv.key).into_owned(),
            value: String::from_utf8_lossy(&kv.value).into_owned(),
            mod_revision: kv.mod_revision,
        }));
        match page.kvs.last() {
            Some(last) if page.more => {
                start = last.key.clone();
                start.push(0);
            }
            _ => return Ok((pinned, items)),
        }
    }
}

/// ResponseHeader.revision, 0 when absent.
pub fn header_revision(h: Option<&ResponseHeader>) -> i64 {
    h.map(|h| h.revision).unwrap_or(0)
}
