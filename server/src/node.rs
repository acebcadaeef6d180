//! One Keel member: opens its data dir (WAL, snapshots, sled), starts openraft, bootstraps
//! the cluster on first start, and offers the two primitives the API is built on:
//! [`Node::propose`] (a write through the raft log) and [`Node::read_barrier`] (a
//! linearizable read point, Raft thesis §6.4 ReadIndex).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use anyhow::{bail, Context};
use keel_proto::etcdserverpb::ResponseHeader;
use keel_proto::keelpb::{self, raft_request, RaftRequest, RaftResponse};
use openraft::error::{ClientWriteError, RaftError};
use prost::Message;

use crate::apply::Applier;
use crate::config::{split_urls, Config};
use crate::error::EtcdError;
use crate::lease::{self, id::LeaseIdGenerator, Lessor};
use crate::membership::{self, Attributes};
use crate::mvcc::MvccStore;
use crate::raft::types::{MemberNode, NodeId, Raft, Request};
use crate::raft::proposer::{into_result, Proposer};
use crate::raft::{LogStore, PeerNetwork, SharedStore, StateMachine};
use crate::wal::{Wal, WalOptions};
use crate::watch::{StoreHistory, WatchConfig, WatchHub};

/// sled tree holding all member state (MVCC, consistent index, membership, ...).
const TREE: &str = "keel";
/// sled key of the cluster ID (8 bytes BE), fixed at bootstrap.
const CLUSTER_ID_KEY: &[u8] = b"s/cluster_id";

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
    db: sled::Db,
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
        let (wal_dir, snap_dir, db_dir) = (member_dir.join("wal"), member_dir.join("snap"), member_dir.join("db"));
        for d in [&wal_dir, &snap_dir, &db_dir] {
            std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
        }

        let initial = membership::parse_initial_cluster(&config.initial_cluster).map_err(anyhow::Error::msg)?;
        let my_urls = split_urls(&config.initial_advertise_peer_urls);
        let me = initial
            .iter()
            .find(|m| m.name == config.name)
            .with_context(|| format!("--initial-cluster has no member named {:?}", config.name))?;
        let mut mine_sorted = me.peer_urls.clone();
        mine_sorted.sort();
        let mut adv_sorted = my_urls.clone();
        adv_sorted.sort();
        if mine_sorted != adv_sorted {
            bail!(
                "--initial-cluster has {}={:?} but --initial-advertise-peer-urls is {:?}",
                config.name,
                me.peer_urls,
                my_urls
            );
        }
        let token = &config.initial_cluster_token;
        let id = membership::member_id(&my_urls, token);
        let members: BTreeMap<NodeId, MemberNode> = initial
            .iter()
            .map(|m| {
                let node = MemberNode {
                    name: m.name.clone(),
                    peer_urls: m.peer_urls.clone(),
                };
                (membership::member_id(&m.peer_urls, token), node)
            })
            .collect();

        let wal = Arc::new(
            tokio::task::block_in_place(|| Wal::open(&wal_dir, WalOptions::default()))
                .with_context(|| format!("cannot open WAL in {}", wal_dir.display()))?,
        );
        let db = sled::Config::new()
            .path(&db_dir)
            .cache_capacity(256 * 1024 * 1024)
            .open()
            .with_context(|| format!("cannot open store in {}", db_dir.display()))?;
        let tree = db.open_tree(TREE)?;

        let cluster_id = match tree.get(CLUSTER_ID_KEY)? {
            Some(v) => u64::from_be_bytes(v.as_ref().try_into().context("cluster id is 8 bytes")?),
            None => {
                let cid = membership::cluster_id(&members.keys().copied().collect::<Vec<_>>());
                tree.insert(CLUSTER_ID_KEY, &cid.to_be_bytes())?;
                tree.flush()?;
                cid
            }
        };

        let store = Arc::new(
            tokio::task::block_in_place(|| MvccStore::open(tree.clone()))
                .map_err(|e| anyhow::anyhow!("cannot open MVCC store: {e}"))?,
        );
        let attributes = Arc::new(Attributes::load(&tree).map_err(anyhow::Error::msg)?);
        let lessor = Arc::new(Lessor::new());
        let mut applier = Applier::open_with_lessor(tree.clone(), store.clone(), attributes.clone(), lessor.clone())
            .map_err(anyhow::Error::msg)?;
        let shared = Arc::new(SharedStore::new(store));
        let watch = WatchHub::new(Arc::new(StoreHistory(shared.clone())), WatchConfig::from_config(&config));
        watch.spawn_sync_thread().context("cannot start the watch sync thread")?;
        applier.set_watch_hub(watch.clone());
        let sm = StateMachine::new(applier, shared.clone(), attributes.clone(), snap_dir);

        let raft_config = openraft::Config {
            cluster_name: token.clone(),
            heartbeat_interval: config.heartbeat_interval,
            election_timeout_min: config.election_timeout,
            election_timeout_max: config.election_timeout * 2,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(config.snapshot_count),
            // etcd keeps 5000 entries after a snapshot so slow followers catch up from the log.
            max_in_snapshot_log_to_keep: 5000,
            ..Default::default()
        }
        .validate()?;
        let raft = Raft::new(id, Arc::new(raft_config), PeerNetwork, LogStore::new(wal), sm).await?;

        if !raft.is_initialized().await? {
            if config.initial_cluster_state != "new" {
                bail!("--initial-cluster-state existing: joining a running cluster is not supported by this version");
            }
            raft.initialize(members.clone()).await?;
        } else if members.len() == 1 && members.contains_key(&id) {
            // A lone voter need not wait an election timeout after a restart.
            let _ = raft.trigger().elect().await;
        }

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
            db_size: AtomicI64::new(db.size_on_disk().map_or(0, |b| b as i64)),
            db,
            next_request_id: AtomicU64::new(1),
            proposer: OnceLock::new(),
        });
        let weak: Weak<Node> = Arc::downgrade(&node);
        let _ = node.proposer.set(Proposer::start(Arc::new(move |req| {
            let weak = weak.clone();
            Box::pin(async move {
                match weak.upgrade() {
                    Some(node) => node.propose_entry(req).await,
                    None => Err(EtcdError::Stopped),
                }
            })
        })));
        node.clone().spawn_publish();
        node.clone().spawn_db_size_refresh();
        lease::runner::spawn(&node, lease::runner::RunnerConfig::from_config(&node.config));
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
                match self.propose(raft_request::Request::MemberAttributes(attrs.clone())).await {
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
        self.proposer.get().ok_or(EtcdError::Stopped)?.propose(req).await
    }

    /// Proposes one log entry as is (a request or a batch), forwarding it to the leader when
    /// this member is a follower, and returns its apply result.
    ///
    /// Errors: as [`Node::propose`].
    pub async fn propose_entry(&self, req: RaftRequest) -> Result<RaftResponse, EtcdError> {
        let deadline = tokio::time::Instant::now() + self.request_timeout();
        loop {
            match self.raft.client_write(Request(req.clone())).await {
                Ok(resp) => return into_result(resp.data.0),
                Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                    match f.leader_node {
                        Some(leader) if f.leader_id != Some(self.id) => {
                            return self.forward(&leader, req).await;
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

    /// Waits until this member can serve a linearizable read: the leader confirmed its
    /// leadership with a quorum and this member applied up to the read index.
    ///
    /// Errors: `NoLeader` when no leader emerges in time, `Stopped` on shutdown.
    pub async fn read_barrier(&self) -> Result<(), EtcdError> {
        let deadline = tokio::time::Instant::now() + self.request_timeout();
        loop {
            match self.raft.ensure_linearizable().await {
                Ok(_) => return Ok(()),
                Err(RaftError::APIError(_)) => self.wait_for_leader(deadline).await?,
                Err(RaftError::Fatal(_)) => return Err(EtcdError::Stopped),
            }
        }
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

    async fn forward(&self, leader: &MemberNode, req: RaftRequest) -> Result<RaftResponse, EtcdError> {
        let url = leader.peer_urls.first().cloned().ok_or(EtcdError::NoLeader)?;
        let mut client = keelpb::peer_client::PeerClient::connect(url)
            .await
            .map_err(|_| EtcdError::NoLeader)?
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        let mut request = tonic::Request::new(req);
        request.set_timeout(self.request_timeout());
        match client.forward(request).await {
            Ok(r) => into_result(r.into_inner()),
            Err(s) => Err(EtcdError::from_parts(s.code() as i32, s.message())),
        }
    }

    /// etcd's request timeout: 5 s plus twice the election timeout.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(5000 + 2 * self.config.election_timeout)
    }

    /// A response header for `revision` (etcd fills cluster_id, member_id, revision and
    /// raft_term on every response).
    pub fn header(&self, revision: i64) -> ResponseHeader {
        ResponseHeader {
            cluster_id: self.cluster_id,
            member_id: self.id,
            revision,
            raft_term: self.raft.metrics().borrow().current_term,
        }
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
                let db = node.db.clone();
                if let Ok(Ok(size)) = tokio::task::spawn_blocking(move || db.size_on_disk()).await {
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
        let _ = self.raft.shutdown().await;
        let _ = self.db.flush_async().await;
    }
}
