//! The etcd `Election` service (`v3electionpb.Election`: Campaign, Proclaim, Leader,
//! Observe, Resign), etcd's `v3election` server and `concurrency.Election` run in the
//! member ([`super::concurrency`]).
//!
//! - Campaign(name, lease, value): the session lease (lease 0: a new 60 s one); one Txn
//!   puts `<name>/<lease hex> = value` on it if absent, else reads it (and proclaims
//!   `value` if the key holds another); then waits for every older candidate's key to go.
//!   Unlike etcd, it then checks that its key is still there with its create revision and
//!   lease (etcd-io/etcd#11456 is the same bug class; etcd's Campaign never got the check),
//!   stops waiting as soon as its key goes, and answers `mutex: session is expired` then.
//!   A failed or abandoned wait resigns (deletes the key if it is still ours).
//! - Proclaim and Resign act only while `leader.key` still has create revision `leader.rev`
//!   (a Txn comparing it); a Proclaim that finds otherwise answers `election: not leader`,
//!   a Resign then does nothing.
//! - Leader: the oldest key under `<name>/` (`election: no leader` without one).
//! - Observe: the current leader's key-value, then every put to it, then the next leader
//!   when it is deleted, in revision order; the stream ends only with the call (or when a
//!   read or watch fails, with that error). Like etcd's, it always shows the latest leader
//!   value but may skip leaders that came and went while it was reading.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use keel_proto::etcdserverpb::TxnRequest;
use keel_proto::mvccpb::event::EventType;
use keel_proto::v3electionpb::election_server::Election;
use keel_proto::v3electionpb::{
    CampaignRequest, CampaignResponse, LeaderKey, LeaderRequest, LeaderResponse, ProclaimRequest,
    ProclaimResponse, ResignRequest, ResignResponse,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::concurrency::caller::{Caller, Entry};
use super::concurrency::wait::{OwnKey, Watches, wait_for_turn};
use super::concurrency::{ConcurrencyError, first_created, ops, prefix_end, prefix_of};
use crate::error::EtcdError;
use crate::node::Node;
use crate::qos::Method;

/// Leader updates buffered per Observe stream before it stops reading the watch.
const OBSERVE_BUFFER: usize = 16;

/// The response stream of `Observe`.
type ObserveStream = Pin<Box<dyn Stream<Item = Result<LeaderResponse, Status>> + Send>>;

/// Election service of one member.
pub struct ElectionService {
    node: Arc<Node>,
}

impl ElectionService {
    /// Serves elections through `node`'s KV, Lease and Watch.
    pub fn new(node: Arc<Node>) -> ElectionService {
        ElectionService { node }
    }
}

/// Puts `value` on `key` if it still has create revision `rev` (etcd `Election.Proclaim`).
/// Returns the Txn's header.
///
/// Errors: [`ConcurrencyError::NotLeader`] if it does not; those of the Txn.
async fn proclaim(
    caller: &Caller,
    key: &[u8],
    rev: i64,
    lease: i64,
    value: &[u8],
) -> Result<Option<keel_proto::etcdserverpb::ResponseHeader>, Status> {
    let resp = caller
        .txn(TxnRequest {
            compare: vec![ops::created_at(key, rev)],
            success: vec![ops::put(key, value, lease)],
            failure: vec![],
        })
        .await?;
    if !resp.succeeded {
        return Err(ConcurrencyError::NotLeader.into());
    }
    Ok(resp.header)
}

/// Deletes `key` if it still has create revision `rev` (etcd `Election.Resign`). Returns
/// the Txn's header.
///
/// Errors: those of the Txn.
async fn resign(
    caller: &Caller,
    key: &[u8],
    rev: i64,
) -> Result<Option<keel_proto::etcdserverpb::ResponseHeader>, Status> {
    let resp = caller
        .txn(TxnRequest {
            compare: vec![ops::created_at(key, rev)],
            success: vec![ops::delete(key)],
            failure: vec![],
        })
        .await?;
    Ok(resp.header)
}

/// Sends every leader of the election under `prefix` to `tx`, in order (etcd
/// `Election.observe`), until `tx` closes.
///
/// Errors: those of the reads and watches; the caller sends them as the stream's end.
async fn observe(
    caller: &Caller,
    prefix: &[u8],
    tx: &mpsc::Sender<Result<LeaderResponse, Status>>,
) -> Result<(), Status> {
    let node = caller.node().clone();
    loop {
        let current = caller.range(first_created(prefix)).await?;
        let (header, leader) = match current.kvs.into_iter().next() {
            Some(kv) => (current.header, kv),
            None => {
                // No candidate: the first put under the prefix is the next leader.
                let read_at = current.header.as_ref().map_or(0, |h| h.revision);
                let mut watches = Watches::new(&node);
                watches.changes_of(prefix, &prefix_end(prefix), read_at);
                loop {
                    let resp = watches.next().await?;
                    let put = resp
                        .events
                        .into_iter()
                        .find(|e| e.r#type == EventType::Put as i32)
                        .and_then(|e| e.kv);
                    if let Some(kv) = put {
                        break (Some(node.header(kv.mod_revision)), kv);
                    }
                }
            }
        };
        let after = header.as_ref().map_or(0, |h| h.revision) + 1;
        let key = leader.key.clone();
        let first = LeaderResponse {
            header,
            kv: Some(leader),
        };
        if tx.send(Ok(first)).await.is_err() {
            return Ok(());
        }
        // Every put to the leader's key is a proclamation; its delete ends the leadership.
        let mut watches = Watches::new(&node);
        watches.changes_of(&key, &[], after);
        'leader: loop {
            let resp = watches.next().await?;
            let header = resp.header.as_ref().map(|h| node.header(h.revision));
            for event in resp.events {
                if event.r#type == EventType::Delete as i32 {
                    break 'leader;
                }
                let update = LeaderResponse {
                    header,
                    kv: event.kv,
                };
                if tx.send(Ok(update)).await.is_err() {
                    return Ok(());
                }
            }
        }
    }
}

#[tonic::async_trait]
impl Election for ElectionService {
    async fn campaign(
        &self,
        request: Request<CampaignRequest>,
    ) -> Result<Response<CampaignResponse>, Status> {
        let caller = Caller::of(&self.node, &request);
        let req = request.into_inner();
        let Entry { prefix, lease, key } =
            caller.enter(Method::Campaign, &req.name, req.lease).await?;
        let entered = caller
            .txn(TxnRequest {
                compare: vec![ops::created_at(&key, 0)],
                success: vec![ops::put(&key, &req.value, lease)],
                failure: vec![ops::get_key(&key)],
            })
            .await?;
        let seen_at = ops::revision_of(&entered);
        let mut create_revision = seen_at;
        if !entered.succeeded {
            let kv = ops::first_kv(&entered, 0).ok_or_else(|| {
                EtcdError::Internal("keel: election key missing in its Txn".into())
            })?;
            create_revision = kv.create_revision;
            if kv.value != req.value
                && let Err(e) = proclaim(&caller, &key, create_revision, lease, &req.value).await
            {
                let _ = resign(&caller, &key, create_revision).await;
                return Err(e);
            }
        }
        let own = OwnKey {
            key: key.clone(),
            create_revision,
            lease,
            seen_at,
        };
        let release = |caller: Caller, own: OwnKey| async move {
            let _ = resign(&caller, &own.key, own.create_revision).await;
        };
        let header = wait_for_turn(&caller, &prefix, own, release).await?;
        Ok(Response::new(CampaignResponse {
            header,
            leader: Some(LeaderKey {
                name: req.name,
                key,
                rev: create_revision,
                lease,
            }),
        }))
    }

    async fn proclaim(
        &self,
        request: Request<ProclaimRequest>,
    ) -> Result<Response<ProclaimResponse>, Status> {
        let caller = Caller::of(&self.node, &request);
        let req = request.into_inner();
        let leader = req.leader.ok_or(ConcurrencyError::MissingLeaderKey)?;
        caller.admit(Method::Proclaim, &leader.key, &[]).await?;
        // etcd resumes a session on the leader's lease (lease 0: a new one) and puts on it.
        let lease = caller.session_lease(leader.lease).await?;
        let header = proclaim(&caller, &leader.key, leader.rev, lease, &req.value).await?;
        Ok(Response::new(ProclaimResponse { header }))
    }

    async fn leader(
        &self,
        request: Request<LeaderRequest>,
    ) -> Result<Response<LeaderResponse>, Status> {
        let caller = Caller::of(&self.node, &request);
        let prefix = prefix_of(&request.into_inner().name);
        caller
            .admit(Method::Leader, &prefix, &prefix_end(&prefix))
            .await?;
        let resp = caller.range(first_created(&prefix)).await?;
        let kv = resp
            .kvs
            .into_iter()
            .next()
            .ok_or(ConcurrencyError::NoLeader)?;
        Ok(Response::new(LeaderResponse {
            header: resp.header,
            kv: Some(kv),
        }))
    }

    async fn observe(
        &self,
        request: Request<LeaderRequest>,
    ) -> Result<Response<ObserveStream>, Status> {
        let caller = Caller::of(&self.node, &request);
        let prefix = prefix_of(&request.into_inner().name);
        caller
            .admit(Method::Observe, &prefix, &prefix_end(&prefix))
            .await?;
        let (tx, rx) = mpsc::channel(OBSERVE_BUFFER);
        tokio::spawn(async move {
            // Ends when the client goes away (the receiver is dropped) even mid-wait.
            tokio::select! {
                () = tx.closed() => {}
                result = observe(&caller, &prefix, &tx) => {
                    if let Err(status) = result {
                        let _ = tx.send(Err(status)).await;
                    }
                }
            }
        });
        let responses =
            super::until_stopped::until_stopped(ReceiverStream::new(rx), self.node.stopped());
        Ok(Response::new(Box::pin(responses)))
    }

    async fn resign(
        &self,
        request: Request<ResignRequest>,
    ) -> Result<Response<ResignResponse>, Status> {
        let caller = Caller::of(&self.node, &request);
        let leader = request
            .into_inner()
            .leader
            .ok_or(ConcurrencyError::MissingLeaderKey)?;
        caller.admit(Method::Resign, &leader.key, &[]).await?;
        // etcd opens a session on `leader.lease` first; its lease is not used by the delete,
        // so Keel does not grant one for lease 0.
        let header = resign(&caller, &leader.key, leader.rev).await?;
        Ok(Response::new(ResignResponse { header }))
    }
}
