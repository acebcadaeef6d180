//! The etcd `Maintenance` service: Alarm, Status, Hash, HashKV, MoveLeader, Defragment and
//! Snapshot. Other methods answer UNIMPLEMENTED until their issues land (see
//! docs/compat.md).
//!
//! Snapshot streams a bbolt file in etcd's schema (`backup::export`), written first to
//! `<data-dir>/member/tmp/` (one database-sized file per running snapshot, at most
//! [`MAX_SNAPSHOTS`] at once) and removed when the stream ends or the client goes away.

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::Stream;
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use keel_proto::etcdserverpb::maintenance_server::Maintenance;
use keel_proto::etcdserverpb::{
    AlarmRequest, AlarmResponse, DefragmentRequest, DefragmentResponse, DowngradeRequest,
    DowngradeResponse, HashKvRequest, HashKvResponse, HashRequest, HashResponse, MoveLeaderRequest,
    MoveLeaderResponse, SnapshotRequest, SnapshotResponse, StatusRequest, StatusResponse,
};
use keel_proto::keelpb::{raft_request::Request as Rq, raft_response::Response as Rs};
use tonic::{Request, Response, Status};

use super::credentials::authorize;
use crate::auth::check::Rpc;
use crate::backup::export::Capture;
use crate::cluster::transfer;
use crate::error::EtcdError;
use crate::etcd_db::snapshot::SnapshotStream as DbChunks;
use crate::node::Node;

/// Most snapshots streamed at once by one member (each costs a database-sized temp file);
/// more wait for a slot.
pub const MAX_SNAPSHOTS: usize = 2;
/// Snapshot chunks buffered ahead of a slow client.
const SNAPSHOT_BUFFER: usize = 4;

/// The response stream of `Snapshot`.
type SnapshotResponses = Pin<Box<dyn Stream<Item = Result<SnapshotResponse, Status>> + Send>>;

/// Maintenance service of one member.
pub struct MaintenanceService {
    node: Arc<Node>,
    snapshots: Arc<Semaphore>,
    next_snapshot: AtomicU64,
}

impl MaintenanceService {
    /// Serves maintenance requests for `node`. Removes snapshot files a crashed earlier run
    /// left in `<data-dir>/member/tmp/`.
    pub fn new(node: Arc<Node>) -> MaintenanceService {
        if let Ok(dir) = std::fs::read_dir(snapshot_dir(&node)) {
            for e in dir.flatten() {
                if e.file_name().to_string_lossy().starts_with("snapshot-") {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        MaintenanceService {
            node,
            snapshots: Arc::new(Semaphore::new(MAX_SNAPSHOTS)),
            next_snapshot: AtomicU64::new(1),
        }
    }
}

fn snapshot_dir(node: &Node) -> PathBuf {
    node.data_dir().join("member").join("tmp")
}

/// A snapshot file that is removed when dropped (the stream ended or the client left).
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        let _ = std::fs::remove_file(self.0.with_extension("db.part"));
    }
}

#[tonic::async_trait]
impl Maintenance for MaintenanceService {
    /// etcd `Status`: `version` is the etcd API version Keel implements
    /// ([`keel_proto::ETCD_API_VERSION`]); raft fields come from this member's raft metrics.
    async fn status(
        &self,
        request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        authorize(&self.node, &request, Rpc::Status).await?;
        let store = self.node.store.get();
        let m = self.node.raft.metrics().borrow().clone();
        let is_learner = m
            .membership_config
            .membership()
            .learner_ids()
            .any(|id| id == self.node.id);
        let db_size = self.node.db_size();
        // etcd reports the commit index as `raft_index`.
        let committed = self
            .node
            .raft
            .with_raft_state(|st| st.committed.map_or(0, |l| l.index))
            .await
            .unwrap_or_else(|_| m.last_log_index.unwrap_or(0));
        // An etcd leader that lost its quorum steps down after an election timeout
        // (CheckQuorum) and reports no leader (0); openraft keeps the role, so the quorum check
        // of `cluster::leadership` stands in, as for /health and `etcd_server_has_leader`.
        let leader = match m.current_leader {
            Some(l) if self.node.cluster.has_leader() => l,
            _ => 0,
        };
        // etcd 3.4+: "etcdserver: no leader" first, then the active alarms.
        let mut errors = Vec::new();
        if leader == 0 {
            errors.push(EtcdError::NoLeader.to_string());
        }
        errors.extend(self.node.alarms.status_errors());
        Ok(Response::new(StatusResponse {
            header: Some(self.node.header(store.current_revision())),
            version: keel_proto::ETCD_API_VERSION.to_string(),
            db_size,
            leader,
            raft_index: committed,
            raft_term: m.current_term,
            raft_applied_index: m.last_applied.map_or(0, |l| l.index),
            errors,
            db_size_in_use: self.node.db_size_in_use(),
            is_learner,
            storage_version: String::new(),
            db_size_quota: self.node.config.quota_bytes(),
            downgrade_info: None,
        }))
    }

    /// etcd `Alarm`: GET, ACTIVATE and DEACTIVATE all go through raft (as in etcd, so GET
    /// is linearizable) and are applied by `alarm::Alarms::apply`; the response has no
    /// header, as etcd 3.4's.
    async fn alarm(
        &self,
        request: Request<AlarmRequest>,
    ) -> Result<Response<AlarmResponse>, Status> {
        // GET needs credentials, ACTIVATE/DEACTIVATE root (checked again at apply).
        let rpc = Rpc::alarm(request.get_ref());
        let ai = authorize(&self.node, &request, rpc).await?;
        let resp = self
            .node
            .propose_as(&ai, Rq::Alarm(request.into_inner()))
            .await?;
        match resp.response {
            Some(Rs::Alarm(r)) => Ok(Response::new(r)),
            _ => Err(EtcdError::Internal(
                "keel: apply returned an unexpected response type".into(),
            )
            .into()),
        }
    }

    /// etcd `Hash`: a hash of the member's whole replicated state at one revision
    /// (`backup::export::Capture::hash`; Keel's own bytes, so comparable between Keel
    /// members only). Apply pauses only while the small tables are copied.
    async fn hash(&self, request: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        authorize(&self.node, &request, Rpc::Hash).await?;
        let internal = |e: &dyn std::fmt::Display| -> Status {
            EtcdError::Internal(format!("hash: {e}")).into()
        };
        let capture = Capture::take(&self.node.export_locks, &self.node.tree(), &self.node.store)
            .await
            .map_err(|e| internal(&e))?;
        let header = self.node.header(capture.revision);
        let tree = self.node.tree().clone();
        let hash = tokio::task::spawn_blocking(move || capture.hash(&tree))
            .await
            .map_err(|e| internal(&e))?
            .map_err(|e| internal(&e))?;
        Ok(Response::new(HashResponse {
            header: Some(header),
            hash,
        }))
    }

    /// etcd `HashKV`: the hash of the MVCC key space at `revision` (0 = current).
    async fn hash_kv(
        &self,
        request: Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
        authorize(&self.node, &request, Rpc::HashKv).await?;
        let req = request.into_inner();
        let store = self.node.store.get();
        let h = store.hash_kv(req.revision)?;
        Ok(Response::new(HashKvResponse {
            header: Some(self.node.header(store.current_revision())),
            hash: h.hash,
            compact_revision: h.compact_revision,
            hash_revision: h.hash_revision,
        }))
    }

    /// etcd `Defragment`: rewrites this member's store into a fresh file while it serves
    /// ([`Node::defragment`]); unlike etcd's bolt rewrite, reads never wait and writes wait
    /// only for the switch (docs/backend.md).
    async fn defragment(
        &self,
        request: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
        authorize(&self.node, &request, Rpc::Defragment).await?;
        let r = self.node.defragment().await?;
        tracing::info!(
            before_bytes = r.before,
            after_bytes = r.after,
            copied_keys = r.copied,
            followed_changes = r.followed,
            subscribe_pause_us = r.subscribe_pause.as_micros() as u64,
            switch_pause_us = r.switch_pause.as_micros() as u64,
            took_ms = r.took.as_millis() as u64,
            "defragment: store rewritten"
        );
        // etcd 3.4 answers an empty DefragmentResponse (no header).
        Ok(Response::new(DefragmentResponse { header: None }))
    }

    /// etcd `Snapshot`: the applied state at one revision as a bbolt database in etcd's
    /// schema, in 32 KiB blobs, then the sha256 of the file (etcd `v3rpc/maintenance.go`);
    /// writes go on while it is written. Like etcd 3.4's, the messages carry no header.
    async fn snapshot(
        &self,
        request: Request<SnapshotRequest>,
    ) -> Result<Response<SnapshotResponses>, Status> {
        authorize(&self.node, &request, Rpc::Snapshot).await?;
        let internal = |what: &str, e: &dyn std::fmt::Display| -> Status {
            EtcdError::Internal(format!("snapshot: {what}: {e}")).into()
        };
        let permit = self
            .snapshots
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| internal("slot", &e))?;
        let dir = snapshot_dir(&self.node);
        std::fs::create_dir_all(&dir).map_err(|e| internal("create the temp dir", &e))?;
        let n = self.next_snapshot.fetch_add(1, Ordering::Relaxed);
        let file = TempFile(dir.join(format!("snapshot-{n}.db")));
        let capture = Capture::take(&self.node.export_locks, &self.node.tree(), &self.node.store)
            .await
            .map_err(|e| internal("capture", &e))?;
        let header = self.node.header(capture.revision);
        let tree = self.node.tree().clone();
        let path = file.0.clone();
        let written = tokio::task::spawn_blocking(move || capture.write_etcd_db(&tree, &path))
            .await
            .map_err(|e| internal("export task", &e))?
            .map_err(|e| internal("export", &e))?;
        tracing::info!(
            bytes = written.size,
            revision = header.revision,
            "snapshot: database written"
        );
        let chunks = DbChunks::open(&file.0).map_err(|e| internal("open", &e))?;
        let (tx, rx) = mpsc::channel(SNAPSHOT_BUFFER);
        tokio::task::spawn_blocking(move || {
            let _hold = (permit, file);
            for chunk in chunks {
                let msg = chunk
                    .map(SnapshotResponse::from)
                    .map_err(|e| internal("read", &e));
                let failed = msg.is_err();
                // The client went away: stop reading; the file goes with `_hold`.
                if tx.blocking_send(msg).is_err() || failed {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    /// etcd `Downgrade` (VALIDATE / ENABLE / CANCEL, `api::downgrade`).
    async fn downgrade(
        &self,
        request: Request<DowngradeRequest>,
    ) -> Result<Response<DowngradeResponse>, Status> {
        authorize(&self.node, &request, Rpc::Downgrade).await?;
        let resp = super::downgrade::downgrade(&self.node, request.get_ref()).await?;
        Ok(Response::new(resp))
    }

    /// etcd `MoveLeader`: only the leader accepts it (`NotLeader` elsewhere, as in etcd;
    /// etcdctl sends it to the leader among its endpoints).
    async fn move_leader(
        &self,
        request: Request<MoveLeaderRequest>,
    ) -> Result<Response<MoveLeaderResponse>, Status> {
        authorize(&self.node, &request, Rpc::MoveLeader).await?;
        transfer::move_leader(&self.node.cluster, request.into_inner().target_id).await?;
        // etcd answers an empty MoveLeaderResponse (no header).
        Ok(Response::new(MoveLeaderResponse { header: None }))
    }
}
