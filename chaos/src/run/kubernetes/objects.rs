//! The apiserver's writes (k8s.io/apiserver `pkg/storage/etcd3/store.go`): Create,
//! GuaranteedUpdate, conditional Delete, paginated List; events with reused leases
//! (`lease_manager.go`); and compaction (`compact.go`).

use std::sync::Arc;
use std::time::Duration;

use keel_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use keel_proto::etcdserverpb::kv_client::KvClient;
use keel_proto::etcdserverpb::lease_client::LeaseClient;
use keel_proto::etcdserverpb::request_op::Request as OpRequest;
use keel_proto::etcdserverpb::response_op::Response as OpResponse;
use keel_proto::etcdserverpb::{
    CompactionRequest, Compare, DeleteRangeRequest, LeaseGrantRequest, PutRequest, RangeRequest,
    RequestOp, TxnRequest, TxnResponse,
};
use keel_proto::mvccpb::KeyValue;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;
use tonic::Status;
use tonic::transport::Channel;

use super::{Conns, KubeLog, REGISTRY, header_revision, paginated_list, require_leader};
use crate::run::cluster::Cluster;

/// Resources the writers keep objects of.
const RESOURCES: [&str; 3] = ["pods", "configmaps", "services"];
/// Namespaces per resource.
const NAMESPACES: usize = 4;
/// Object names per namespace.
const NAMES: usize = 8;
/// GuaranteedUpdate's attempts before giving up on a contended object.
const UPDATE_ATTEMPTS: usize = 5;
/// The key of the compaction bookkeeping (compact.go's `compactRevKey`).
pub const COMPACT_REV_KEY: &str = "compact_rev_key";
/// `--etcd-compaction-interval` of the traffic (the apiserver's default is 5 minutes).
const COMPACT_EVERY: Duration = Duration::from_secs(5);
/// TTL of the events' leases (`--event-ttl`, 1 h by default; short here so leases expire
/// during a run and their deletes flow through the watches).
const EVENT_TTL_S: i64 = 30;
/// A lease is reused for this many events or this long (lease_manager.go reuses a lease
/// for a fraction of its TTL).
const LEASE_KEYS: u32 = 50;
const LEASE_REUSE: Duration = Duration::from_secs(5);

/// Runs object writer `id` until `until`.
pub async fn run_writer(
    id: u32,
    cluster: Arc<Cluster>,
    log: Arc<KubeLog>,
    seed: u64,
    until: Instant,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x4b55_4245 ^ (u64::from(id) << 32));
    let mut conns = Conns::new(cluster.len());
    let mut seq = 0u64;
    while Instant::now() < until {
        let member = rng.gen_range(0..cluster.len());
        let key = format!(
            "{REGISTRY}{}/ns-{}/obj-{}",
            RESOURCES[rng.gen_range(0..RESOURCES.len())],
            rng.gen_range(0..NAMESPACES),
            rng.gen_range(0..NAMES)
        );
        seq += 1;
        let value = format!("w{id}-{seq}");
        let roll = rng.gen_range(0..100);
        let (kind, result) = if roll < 25 {
            (
                "create",
                create(&mut conns, &cluster, member, &key, &value).await,
            )
        } else if roll < 70 {
            (
                "update",
                update(&mut conns, &cluster, member, &key, &value).await,
            )
        } else if roll < 85 {
            ("delete", delete(&mut conns, &cluster, member, &key).await)
        } else {
            let resource = RESOURCES[rng.gen_range(0..RESOURCES.len())];
            let (prefix, end) = if rng.gen_bool(0.3) {
                (format!("{REGISTRY}events/"), format!("{REGISTRY}events0"))
            } else {
                (
                    format!("{REGISTRY}{resource}/"),
                    format!("{REGISTRY}{resource}0"),
                )
            };
            let r = paginated_list(&mut conns, &cluster, member, &prefix, &end, 0, &log).await;
            ("list", r.map(|_| ()))
        };
        log.count(kind, result.is_ok());
        if result.is_err() {
            tokio::time::sleep(Duration::from_millis(rng.gen_range(5..50))).await;
        }
    }
}

fn put_op(key: &str, value: &str, lease: i64) -> RequestOp {
    RequestOp {
        request: Some(OpRequest::RequestPut(PutRequest {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            lease,
            ..Default::default()
        })),
    }
}

fn get_op(key: &str) -> RequestOp {
    RequestOp {
        request: Some(OpRequest::RequestRange(RangeRequest {
            key: key.as_bytes().to_vec(),
            ..Default::default()
        })),
    }
}

fn compare(key: &str, target: CompareTarget, union: TargetUnion) -> Compare {
    Compare {
        result: CompareResult::Equal as i32,
        target: target as i32,
        key: key.as_bytes().to_vec(),
        target_union: Some(union),
        ..Default::default()
    }
}

async fn txn(
    conns: &mut Conns,
    cluster: &Cluster,
    member: usize,
    req: TxnRequest,
) -> Result<TxnResponse, Status> {
    let mut kv = conns.kv(cluster, member).await?;
    conns
        .call(member, async {
            Ok(kv.txn(require_leader(req)).await?.into_inner())
        })
        .await
}

/// The object the failure branch's `Get` read (`None`: it does not exist).
fn else_object(resp: &TxnResponse) -> Option<KeyValue> {
    match resp.responses.first()?.response.as_ref()? {
        OpResponse::ResponseRange(r) => r.kvs.first().cloned(),
        _ => None,
    }
}

/// store.go Create: `If(create_revision == 0).Then(Put)`.
async fn create(
    conns: &mut Conns,
    cluster: &Cluster,
    member: usize,
    key: &str,
    value: &str,
) -> Result<(), Status> {
    let req = TxnRequest {
        compare: vec![compare(
            key,
            CompareTarget::Create,
            TargetUnion::CreateRevision(0),
        )],
        success: vec![put_op(key, value, 0)],
        failure: vec![],
    };
    txn(conns, cluster, member, req).await.map(|_| ())
}

async fn get(
    conns: &mut Conns,
    cluster: &Cluster,
    member: usize,
    key: &str,
) -> Result<Option<KeyValue>, Status> {
    let mut kv: KvClient<Channel> = conns.kv(cluster, member).await?;
    let req = RangeRequest {
        key: key.as_bytes().to_vec(),
        ..Default::default()
    };
    conns
        .call(member, async {
            Ok(kv
                .range(require_leader(req))
                .await?
                .into_inner()
                .kvs
                .first()
                .cloned())
        })
        .await
}

/// store.go GuaranteedUpdate: read, then `If(mod_revision == read).Then(Put).Else(Get)`,
/// retrying from the object the failure branch returned.
async fn update(
    conns: &mut Conns,
    cluster: &Cluster,
    member: usize,
    key: &str,
    value: &str,
) -> Result<(), Status> {
    let mut current = get(conns, cluster, member, key).await?;
    for _ in 0..UPDATE_ATTEMPTS {
        let Some(obj) = current else {
            return Ok(()); // NotFound: the apiserver answers 404
        };
        let req = TxnRequest {
            compare: vec![compare(
                key,
                CompareTarget::Mod,
                TargetUnion::ModRevision(obj.mod_revision),
            )],
            success: vec![put_op(key, value, 0)],
            failure: vec![get_op(key)],
        };
        let resp = txn(conns, cluster, member, req).await?;
        if resp.succeeded {
            return Ok(());
        }
        current = else_object(&resp);
    }
    Ok(()) // still contended: the apiserver would answer 409 after its own retries
}

/// store.go conditional Delete: `If(mod_revision == read).Then(Delete).Else(Get)`, retried.
async fn delete(
    conns: &mut Conns,
    cluster: &Cluster,
    member: usize,
    key: &str,
) -> Result<(), Status> {
    let mut current = get(conns, cluster, member, key).await?;
    for _ in 0..UPDATE_ATTEMPTS {
        let Some(obj) = current else {
            return Ok(());
        };
        let req = TxnRequest {
            compare: vec![compare(
                key,
                CompareTarget::Mod,
                TargetUnion::ModRevision(obj.mod_revision),
            )],
            success: vec![RequestOp {
                request: Some(OpRequest::RequestDeleteRange(DeleteRangeRequest {
                    key: key.as_bytes().to_vec(),
                    prev_kv: true,
                    ..Default::default()
                })),
            }],
            failure: vec![get_op(key)],
        };
        let resp = txn(conns, cluster, member, req).await?;
        if resp.succeeded {
            return Ok(());
        }
        current = else_object(&resp);
    }
    Ok(())
}

/// Writes `/registry/events/<ns>/ev-<n>` with leases of [`EVENT_TTL_S`], each reused for up
/// to [`LEASE_KEYS`] events or [`LEASE_REUSE`], until `until`.
pub async fn run_events(cluster: Arc<Cluster>, log: Arc<KubeLog>, seed: u64, until: Instant) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x4556_454e_5453);
    let mut conns = Conns::new(cluster.len());
    let mut lease: Option<(i64, u32, Instant)> = None;
    let mut seq = 0u64;
    while Instant::now() < until {
        let member = rng.gen_range(0..cluster.len());
        if lease.is_none_or(|(_, uses, at)| uses >= LEASE_KEYS || at.elapsed() > LEASE_REUSE) {
            let granted = match conns.channel(&cluster, member).await {
                Ok(ch) => {
                    let mut leases = LeaseClient::new(ch);
                    let req = LeaseGrantRequest {
                        ttl: EVENT_TTL_S,
                        id: 0,
                    };
                    conns
                        .call(member, async {
                            Ok(leases.lease_grant(require_leader(req)).await?.into_inner())
                        })
                        .await
                }
                Err(e) => Err(e),
            };
            log.count("lease grant", granted.is_ok());
            match granted {
                Ok(g) => lease = Some((g.id, 0, Instant::now())),
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(rng.gen_range(5..50))).await;
                    continue;
                }
            }
        }
        let Some((id, uses, _)) = lease.as_mut() else {
            continue;
        };
        seq += 1;
        let key = format!(
            "{REGISTRY}events/ns-{}/ev-{seq}",
            rng.gen_range(0..NAMESPACES)
        );
        let req = TxnRequest {
            compare: vec![compare(
                &key,
                CompareTarget::Create,
                TargetUnion::CreateRevision(0),
            )],
            success: vec![put_op(&key, &format!("event-{seq}"), *id)],
            failure: vec![],
        };
        *uses += 1;
        let r = txn(&mut conns, &cluster, member, req).await;
        log.count("event", r.is_ok());
        if r.is_err() {
            tokio::time::sleep(Duration::from_millis(rng.gen_range(5..50))).await;
        }
    }
}

/// compact.go: every [`COMPACT_EVERY`], `If(version(compact_rev_key) == t).Then(Put(
/// compact_rev_key, rev)).Else(Get(compact_rev_key))`; on success `Compact(rev)` where `rev`
/// is the revision seen one interval earlier; `t` and `rev` come from the answer.
pub async fn run_compactor(cluster: Arc<Cluster>, log: Arc<KubeLog>, until: Instant) {
    let mut conns = Conns::new(cluster.len());
    let (mut t, mut rev) = (0i64, 0i64);
    let mut member = 0;
    while Instant::now() + COMPACT_EVERY < until {
        tokio::time::sleep(COMPACT_EVERY).await;
        member = (member + 1) % cluster.len();
        let req = TxnRequest {
            compare: vec![compare(
                COMPACT_REV_KEY,
                CompareTarget::Version,
                TargetUnion::Version(t),
            )],
            success: vec![put_op(COMPACT_REV_KEY, &rev.to_string(), 0)],
            failure: vec![get_op(COMPACT_REV_KEY)],
        };
        let resp = match txn(&mut conns, &cluster, member, req).await {
            Ok(r) => r,
            Err(_) => {
                log.count("compact txn", false);
                continue;
            }
        };
        log.count("compact txn", true);
        let cur_rev = header_revision(resp.header.as_ref());
        if !resp.succeeded {
            // Another apiserver compacted: adopt its version.
            t = else_object(&resp).map_or(0, |kv| kv.version);
            rev = cur_rev;
            continue;
        }
        t += 1;
        if rev != 0 {
            let compacted = match conns.kv(&cluster, member).await {
                Ok(mut kv) => {
                    let req = CompactionRequest {
                        revision: rev,
                        physical: false,
                    };
                    conns
                        .call(member, async {
                            Ok(kv.compact(require_leader(req)).await?.into_inner())
                        })
                        .await
                }
                Err(e) => Err(e),
            };
            log.count("compact", compacted.is_ok());
        }
        rev = cur_rev;
    }
}
