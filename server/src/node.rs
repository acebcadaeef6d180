//! One Keel member: opens its data dir (WAL, snapshots, sled), starts openraft, bootstraps
//! the cluster on first start, and offers the two primitives the API is built on:
//! [`Node::propose`] (a write through the raft log) and [`Node::read_barrier`] (a
//! linearizable read point, Raft thesis §6.4 ReadIndex).

use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use anyhow::Context;
use keel_proto::etcdserverpb::ResponseHeader;
use keel_proto::keelpb::{self, RaftRequest, RaftResponse, raft_request};
use openraft::error::{ClientWriteError, RaftError};
use prost::Message;

use crate::apply::Applier;
use crate::backend::Backend;
use crate::cluster::bootstrap::{self, Identity};
use crate::cluster::{Cluster, timing};
use crate::config::{Config, split_urls};
use crate::error::EtcdError;
use crate::lease::runner::{self, RunnerConfig};
use crate::lease::{Lessor, id::LeaseIdGenerator};
use crate::membership::Attributes;
use crate::mvcc::{MvccStore, SharedStore};
use crate::raft::dial_override;
use crate::raft::peers::{PeerFailure, Peers, classify, is_transport_failure};
use crate::raft::proposer::{Proposer, into_result};
use crate::raft::types::{MemberNode, NodeId, Raft, Request};
use crate::raft::{LogStore, PeerNetwork, StateMachine};
use crate::wal::{Wal, WalOptions};
use crate::watch::{StoreHistory, WatchConfig, WatchHub};

/// gRPC response metadata key of `keelpb.Peer/Forward`: the raft log index of the proposed
/// entry, so the forwarding member can wait until it applied the entry itself.
pub const FORWARD_LOG_INDEX: &str = "keel-log-index";

/// Pause before re-sending a proposal that could not reach the leader.
const FORWARD_RETRY_PAUSE: Duration = Duration::from_millis(50);

/// A running member.
pub struct Node {
    /// This member's ID (etcd-compatible, from its peer URLs and the cluster token).
    pub id: NodeId,
    /// The cluster ID (etcd-compatible, from the initial members' IDs).
    pub cluster_id: u64,
    /// The raft handle.
    pub raft: Raft,
    /// The current MVCC store.
    pub store: Arc<SharedStore>,
    /// Published member attributes (names, client URLs).
    pub attributes: Arc<Attributes>,
    /// The configuration this member runs with.
    pub config: Config,
    /// Lease state (every member) and, on the leader, the expiry schedule.
    pub lessor: Arc<Lessor>,
    /// Lease IDs for grants proposed by this member without a client-chosen ID.
    pub lease_ids: LeaseIdGenerator,
    /// The watchable store: every watcher of every stream on this member.
    pub watch: Arc<WatchHub>,
    /// Peer connections, the read path, leadership transfer and membership changes.
    pub cluster: Arc<Cluster>,
    backend: Backend,
    /// sled's size on disk in bytes, refreshed every second (reading it walks the files).
    db_size: AtomicI64,
    next_request_id: AtomicU64,
    proposer: OnceLock<Proposer>,
}

impl Node {
    /// Opens `<data-dir>/member/{wal,snap,db}`, recovers, starts raft and bootstraps a new
    /// cluster if this is the first start with `--initial-cluster-state new`.
    ///
    /// Errors: unusable data dir, corrupt WAL or store, or flags that do not describe this
    /// member (its name or peer URLs missing from `--initial-cluster`).
    pub async fn start(config: Config) -> anyhow::Result<Arc<Node>> {
        let member_dir = config.data_dir().join("member");
        let (wal_dir, snap_dir, db_dir) = (
            member_dir.join("wal"),
            member_dir.join("snap"),
            member_dir.join("db"),
        );
        for d in [&wal_dir, &snap_dir, &db_dir] {
            std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
        }

        let wal = Arc::new(
            tokio::task::block_in_place(|| Wal::open(&wal_dir, WalOptions::default()))
                .with_context(|| format!("cannot open WAL in {}", wal_dir.display()))?,
        );
        let backend = Backend::open(&db_dir)
            .with_context(|| format!("cannot open store in {}", db_dir.display()))?;
        let tree = backend.tree().clone();

        // Member and cluster IDs: derived from the flags (`new`), asked from the cluster
        // (`existing`), or as stored by an earlier start.
        let overrides = dial_override::parse(&config.experimental_peer_dial_override)?;
        let peers =
            Arc::new(Peers::with_dial_overrides(overrides).with_tls(config.peer_connector()?));
        let Identity {
            id,
            cluster_id,
            initial_members,
        } = bootstrap::identify(&bootstrap::Flags::from_config(&config), &backend, &peers).await?;

        let store = Arc::new(
            tokio::task::block_in_place(|| MvccStore::open(tree.clone()))
                .map_err(|e| anyhow::anyhow!("cannot open MVCC store: {e}"))?,
        );
        // Message-only errors (`{e}`): the text names the cause once, as before.
        let attributes = Arc::new(Attributes::load(&tree).map_err(|e| anyhow::anyhow!("{e}"))?);
        let lessor = Arc::new(Lessor::new());
        let mut applier = Applier::open_with_lessor(
            tree.clone(),
            store.clone(),
            attributes.clone(),
            lessor.clone(),
        )
        .map_err(|e| anyhow::anyhow!("{e}"))?;
        let shared: Arc<SharedStore> = applier.shared_store().clone();
        let watch = WatchHub::new(
            Arc::new(StoreHistory(shared.clone())),
            WatchConfig::from_config(&config),
        );
        watch
            .spawn_sync_thread()
            .context("cannot start the watch sync thread")?;
        applier.set_watch_hub(watch.clone());
        let sm = StateMachine::new(applier, snap_dir);

        let timers = config.raft_timers();
        let raft_config = openraft::Config {
            cluster_name: config.initial_cluster_token.clone(),
            heartbeat_interval: timers.heartbeat_interval,
            election_timeout_min: timers.election_timeout_min,
            election_timeout_max: timers.election_timeout_max,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(config.snapshot_count),
            // etcd keeps this many entries after a snapshot so slow followers catch up from
            // the log (`--experimental-snapshot-catchup-entries`, default 5000).
            max_in_snapshot_log_to_keep: config.snapshot_catchup_entries,
            install_snapshot_timeout: timing::INSTALL_SNAPSHOT_TIMEOUT_MS,
            ..Default::default()
        }
        .validate()?;
        let network = PeerNetwork::new(peers.clone());
        let raft = Raft::new(id, Arc::new(raft_config), network, LogStore::new(wal), sm).await?;

        if !raft.is_initialized().await? {
            // `existing`: the leader replicates the log (or a snapshot) to this member.
            if let Some(members) = &initial_members {
                raft.initialize(members.clone()).await?;
            }
        } else {
            let voters: Vec<NodeId> = raft
                .metrics()
                .borrow()
                .membership_config
                .membership()
                .voter_ids()
                .collect();
            if voters == [id] {
                // A lone voter need not wait an election timeout after a restart.
                let _ = raft.trigger().elect().await;
            }
        }

        let cluster = Arc::new(Cluster::new(
            id,
            cluster_id,
            raft.clone(),
            peers,
            attributes.clone(),
            shared.clone(),
            config.timing(),
        ));
        let node = Arc::new(Node {
            id,
            cluster_id,
            raft,
            store: shared,
            attributes,
            config,
            lessor,
            lease_ids: LeaseIdGenerator::new(id),
            watch,
            cluster,
            db_size: AtomicI64::new(backend.size_on_disk().map_or(0, |b| b as i64)),
            backend,
            next_request_id: AtomicU64::new(1),
            proposer: OnceLock::new(),
        });
        let weak: Weak<Node> = Arc::downgrade(&node);
        let _ = node.proposer.set(Proposer::start(Arc::new(move |req| {
            let weak = weak.clone();
            Box::pin(async move {
                match weak.upgrade() {
                    Some(node) => node.propose_entry(req).await.map(|(resp, _)| resp),
                    None => Err(EtcdError::Stopped),
                }
            })
        })));
        node.clone().spawn_publish();
        tokio::spawn(crate::cluster::watchdog::run(Arc::downgrade(&node.cluster)));
        node.clone().spawn_db_size_refresh();
        tokio::spawn(runner::run(
            node.lessor.clone(),
            Arc::new(NodeProposer(Arc::downgrade(&node))),
            runner::leadership(node.raft.metrics(), node.id),
            RunnerConfig::from_config(&node.config),
        ));
        Ok(node)
    }

    /// Publishes this member's name and client URLs through raft (etcd's `publish`), once a
    /// leader exists, unless the store already has the same attributes.
    fn spawn_publish(self: Arc<Self>) {
        tokio::spawn(async move {
            let attrs = keelpb::MemberAttributes {
                member_id: self.id,
                name: self.config.name.clone(),
                client_urls: split_urls(&self.config.advertise_client_urls),
            };
            for _ in 0..600 {
                if self.attributes.get(self.id).as_ref() == Some(&attrs) {
                    return;
                }
                match self
                    .propose(raft_request::Request::MemberAttributes(attrs.clone()))
                    .await
                {
                    Ok(_) => return,
                    Err(e) => {
                        tracing::debug!("publishing member attributes: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
            tracing::warn!("could not publish member attributes");
        });
    }

    /// Proposes a client request through the raft log and waits until it is applied here.
    /// Concurrent requests are batched into one log entry ([`Proposer`]).
    ///
    /// Errors: `RequestTooLarge` if the encoded request exceeds `--max-request-bytes`;
    /// `NoLeader`/`Timeout` if no leader emerges within the request timeout; `Stopped` when
    /// the member shuts down; apply-time etcd errors from the response.
    pub async fn propose(&self, request: raft_request::Request) -> Result<RaftResponse, EtcdError> {
        let req = RaftRequest {
            id: self.next_request_id.fetch_add(1, Ordering::Relaxed),
            request: Some(request),
        };
        if req.encoded_len() > self.config.max_request_bytes as usize {
            return Err(EtcdError::RequestTooLarge);
        }
        self.proposer
            .get()
            .ok_or(EtcdError::Stopped)?
            .propose(req)
            .await
    }

    /// Proposes one log entry as is (a request or a batch), forwarding it to the leader when
    /// this member is a follower, and returns its apply result and log index. A forwarded
    /// entry is also applied here before this returns (read-your-writes on every member).
    ///
    /// Errors: as [`Node::propose`].
    pub async fn propose_entry(&self, req: RaftRequest) -> Result<(RaftResponse, u64), EtcdError> {
        let deadline = tokio::time::Instant::now() + self.request_timeout();
        // A leadership transfer holds new proposals until leadership moved.
        if !self.cluster.gate.wait_idle(deadline).await {
            return Err(EtcdError::Timeout);
        }
        loop {
            match self.raft.client_write(Request(req.clone())).await {
                Ok(resp) => return into_result(resp.data.0).map(|r| (r, resp.log_id.index)),
                Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                    match f.leader_node {
                        Some(leader) if f.leader_id != Some(self.id) => {
                            match self.forward(&leader, req.clone(), deadline).await {
                                Err(PeerFailure::NotDelivered) => {
                                    // The leader is unreachable (likely crashed) and did not get
                                    // the request: retry once a new leader is known.
                                    if tokio::time::Instant::now() + FORWARD_RETRY_PAUSE >= deadline
                                    {
                                        return Err(EtcdError::TimeoutDueToLeaderFail);
                                    }
                                    tokio::time::sleep(FORWARD_RETRY_PAUSE).await;
                                }
                                Err(PeerFailure::Ambiguous) => {
                                    return Err(EtcdError::TimeoutDueToLeaderFail);
                                }
                                Err(PeerFailure::Answer(e)) => return Err(e),
                                Ok((resp, index)) => {
                                    // Read-your-writes on this member (as in etcd): wait
                                    // until it applied the entry too.
                                    self.wait_applied(index, deadline).await?;
                                    return into_result(resp).map(|r| (r, index));
                                }
                            }
                        }
                        _ => self.wait_for_leader(deadline).await?,
                    }
                }
                Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
                    return Err(EtcdError::Internal(e.to_string()));
                }
                Err(RaftError::Fatal(_)) => return Err(EtcdError::Stopped),
            }
        }
    }

    /// Waits until this member can serve a linearizable read (Raft thesis §6.4 ReadIndex,
    /// on any member, batched: see `cluster::read_index`): it obtained a read index from the
    /// leader and applied up to it.
    ///
    /// Errors: `NotSupportedForLearner` on a learner (as etcd), `NoLeader` when no leader
    /// emerges in time, `Timeout`, `Stopped` on shutdown.
    pub async fn read_barrier(&self) -> Result<(), EtcdError> {
        if self.is_learner() {
            return Err(EtcdError::NotSupportedForLearner);
        }
        self.cluster.reads.barrier().await
    }

    /// Whether this member is a raft learner (etcd refuses most client RPCs on learners).
    pub fn is_learner(&self) -> bool {
        self.raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .learner_ids()
            .any(|l| l == self.id)
    }

    /// Waits until this member applied log index `index`.
    ///
    /// Errors: `Timeout` at `deadline`, `Stopped` on shutdown.
    async fn wait_applied(
        &self,
        index: u64,
        deadline: tokio::time::Instant,
    ) -> Result<(), EtcdError> {
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        crate::raft::wait_applied(&self.raft, index, remaining, "forwarded write applied here")
            .await
    }

    async fn wait_for_leader(&self, deadline: tokio::time::Instant) -> Result<(), EtcdError> {
        let mut metrics = self.raft.metrics();
        let changed = tokio::time::timeout_at(deadline, metrics.changed()).await;
        match changed {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(EtcdError::Stopped),
            Err(_) => Err(if metrics.borrow().current_leader.is_none() {
                EtcdError::NoLeader
            } else {
                EtcdError::Timeout
            }),
        }
    }

    /// Sends a proposal to the leader (`keelpb.Peer/Forward`) on the pooled connection;
    /// returns the result and the entry's log index (response metadata
    /// [`FORWARD_LOG_INDEX`]).
    async fn forward(
        &self,
        leader: &MemberNode,
        req: RaftRequest,
        deadline: tokio::time::Instant,
    ) -> Result<(RaftResponse, u64), PeerFailure> {
        let url = leader
            .peer_url()
            .cloned()
            .ok_or(PeerFailure::Answer(EtcdError::NoLeader))?;
        let mut client = self
            .cluster
            .peers
            .client(&url)
            .map_err(|_| PeerFailure::Answer(EtcdError::NoLeader))?;
        let mut request = tonic::Request::new(req);
        request.set_timeout(deadline.saturating_duration_since(tokio::time::Instant::now()));
        match client.forward(request).await {
            Ok(r) => {
                let index = r
                    .metadata()
                    .get(FORWARD_LOG_INDEX)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                Ok((r.into_inner(), index))
            }
            Err(s) => {
                if is_transport_failure(&s) {
                    self.cluster.peers.reset(&url);
                }
                Err(classify(&s))
            }
        }
    }

    /// etcd's request timeout: 5 s plus twice the election timeout.
    pub fn request_timeout(&self) -> Duration {
        self.config.request_timeout()
    }

    /// A response header for `revision` (etcd fills cluster_id, member_id, revision and
    /// raft_term on every response).
    pub fn header(&self, revision: i64) -> ResponseHeader {
        self.cluster.header(revision)
    }

    /// Keel's `Maintenance.Defragment`: writes every dirty page of the store (sled) to disk
    /// and returns the bytes flushed. sled 0.34 has no offline rewrite, so unlike etcd's
    /// defragment this does not shrink the file (docs/compat.md).
    ///
    /// Errors: `Internal` with sled's I/O error.
    pub async fn defragment(&self) -> Result<usize, EtcdError> {
        let backend = self.backend.clone();
        tokio::task::spawn_blocking(move || {
            // Crash with the defragment accepted but the store not yet flushed.
            crate::failpoint::crash_point!("defrag_mid");
            backend.flush()
        })
        .await
        .map_err(|e| EtcdError::Internal(format!("defragment task: {e}")))?
        .map_err(|e| EtcdError::Internal(format!("defragment: flush the store: {e}")))
    }

    /// Bytes the store occupies on disk (sled's figure, at most ~1 s old).
    pub fn db_size(&self) -> i64 {
        self.db_size.load(Ordering::Relaxed)
    }

    /// etcd's backend quota (`--quota-backend-bytes`): requests that add data (puts, txns
    /// with puts) are refused once the store is larger than the quota; reads, deletes and
    /// compactions still work so space can be reclaimed.
    ///
    /// Errors: `NoSpace` (`etcdserver: mvcc: database space exceeded`).
    pub fn check_quota(&self) -> Result<(), EtcdError> {
        if self.db_size() > self.config.quota_bytes() {
            Err(EtcdError::NoSpace)
        } else {
            Ok(())
        }
    }

    fn spawn_db_size_refresh(self: Arc<Self>) {
        let weak = Arc::downgrade(&self);
        drop(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let Some(node) = weak.upgrade() else { return };
                let backend = node.backend.clone();
                if let Ok(Ok(size)) =
                    tokio::task::spawn_blocking(move || backend.size_on_disk()).await
                {
                    node.db_size.store(size as i64, Ordering::Relaxed);
                }
            }
        });
    }

    /// Data directory of this member.
    pub fn data_dir(&self) -> PathBuf {
        self.config.data_dir()
    }

    /// Stops raft and flushes the store. Called on SIGTERM.
    pub async fn shutdown(&self) {
        let stats = self.cluster.peers.append_stats();
        let (member_rounds, leader_rounds) = self.cluster.reads.rounds();
        tracing::info!(
            append_rpcs = stats.rpcs,
            appended_entries = stats.entries,
            read_index_rounds = member_rounds,
            leader_read_rounds = leader_rounds,
            "peer transport totals"
        );
        let _ = self.raft.shutdown().await;
        let _ = self.backend.flush_async().await;
    }
}

/// The lease loop's [`runner::Proposer`]: proposes through the node without keeping it
/// alive (the loop ends with the node's raft).
pub struct NodeProposer(pub Weak<Node>);

impl runner::Proposer for NodeProposer {
    async fn propose(&self, req: raft_request::Request) -> Result<RaftResponse, EtcdError> {
        let node = self.0.upgrade().ok_or(EtcdError::Stopped)?;
        node.propose(req).await
    }
}
