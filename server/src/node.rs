//! One Keel member: opens its data dir (WAL, snapshots, sled), starts openraft, bootstraps
//! the cluster on first start, and offers the two primitives the API is built on:
//! [`Node::propose`] (a write through the raft log) and [`Node::read_barrier`] (a
//! linearizable read point, Raft thesis §6.4 ReadIndex).

use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use anyhow::Context;
use keel_proto::etcdserverpb::alarm_request::AlarmAction;
use keel_proto::etcdserverpb::{AlarmRequest, AlarmType, ResponseHeader};
use keel_proto::keelpb::{self, RaftRequest, RaftResponse, peer_answer, peer_call, raft_request};
use openraft::Membership;
use openraft::error::ClientWriteError;
use prost::Message;

use crate::alarm::{Alarms, quota};
use crate::apply::Applier;
use crate::auth::{AuthInfo, AuthState, TokenProvider};
use crate::backend::{Backend, DamageMark, LiveTree, generation};
use crate::backup::defragment;
use crate::cluster::bootstrap::{self, Identity};
use crate::cluster::{Cluster, timing};
use crate::cluster::{autocompact, compact_hash, corrupt};
use crate::config::{Config, split_urls};
use crate::error::EtcdError;
use crate::lease::runner::{self, RunnerConfig};
use crate::lease::{Lessor, id::LeaseIdGenerator};
use crate::membership::Attributes;
use crate::mvcc::{MvccStore, SharedStore};
use crate::qos::{Admission, LoadGauge, RuleChange, RuleSet};
use crate::raft::export::ExportLocks;
use crate::raft::force_new_cluster::restart_as_standalone;
use crate::raft::leader_calls::Opened;
use crate::raft::peers::{PeerFailure, Peers, classify, is_transport_failure};
use crate::raft::proposer::{Proposer, Refused, Route, into_result};
use crate::raft::trace::Stage;
use crate::raft::types::{MemberNode, NodeId, Raft, Request};
use crate::raft::{LogStore, PeerNetwork, StateMachine};
use crate::raft::{dial_override, rebuild};
use crate::version::{ClusterVersion, Downgrade, Version, gates};
use crate::wal::Wal;
use crate::watch::{StoreHistory, WatchConfig, WatchHub};

/// gRPC response metadata key of `keelpb.Peer/Forward`: the raft log index of the proposed
/// entry, so the forwarding member can wait until it applied the entry itself.
pub const FORWARD_LOG_INDEX: &str = "keel-log-index";

/// The bytes-in-use scan runs at most once per this many times its own duration (and at
/// most once a second): a 2 GiB store that takes 2 s to scan is measured every 200 s, so the
/// scan costs at most a hundredth of one core. Between scans the figure grows by every byte
/// apply inserts ([`LiveTree::in_use`]), so the quota never lags behind the writes; only
/// the space a compaction frees would show up late, so a new compact revision brings the
/// next scan forward to [`IN_USE_SCAN_SHARE_COMPACTED`]. At 10 for every scan they took ~4 %
/// of a 3-member leader's CPU under a put load (docs/benchmarks.md).
const IN_USE_SCAN_SHARE: u32 = 100;

/// The scan share after a compaction (at most a tenth of one core, when compactions come
/// faster than scans end).
const IN_USE_SCAN_SHARE_COMPACTED: u32 = 10;

/// How often the leader re-decides the cluster version (etcd polls every 4 s; Keel reads the
/// replicated attributes, which costs nothing, so it looks more often).
const VERSION_MONITOR_INTERVAL: Duration = Duration::from_millis(500);

/// How often a member publishes its attributes again while the cluster version is below its
/// server version (a rolling upgrade).
const REPUBLISH_INTERVAL: Duration = Duration::from_secs(2);

/// How long a gated request waits for the leader's first cluster-version decision.
const UNDECIDED_VERSION_WAIT: Duration = Duration::from_secs(2);

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
    /// The raft log (shared with the log store); `fence` reads its sticky failure.
    pub wal: Arc<Wal>,
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
    /// QoS admission (issue 17): the replicated rules in force, their buckets and counters
    /// (`Admission::stats`), and overload protection fed by raft's commit and apply indexes.
    pub qos: Arc<Admission>,
    /// Users, roles, permissions and tokens, as applied (docs/auth.md).
    pub auth: Arc<AuthState>,
    /// The raised alarms, as applied on this member.
    pub alarms: Arc<Alarms>,
    /// The cluster version, as applied on this member (docs/upgrades.md).
    pub cluster_version: Arc<ClusterVersion>,
    /// The downgrade job, as applied on this member (`Maintenance.Downgrade`).
    pub downgrade: Arc<Downgrade>,
    /// The locks an export of the applied state takes (`Maintenance.Snapshot`).
    pub export_locks: ExportLocks,
    /// The member tree of the current database generation (switched by Defragment).
    live: LiveTree,
    /// `member/db`, the link to the current generation (backend/generation.rs).
    db_link: PathBuf,
    /// One Defragment at a time.
    defrag: Arc<tokio::sync::Mutex<()>>,
    /// sled's size on disk in bytes, refreshed every second (reading it walks the files).
    db_size: AtomicI64,
    next_request_id: AtomicU64,
    proposer: OnceLock<Proposer>,
    /// `true` once the member stops serving clients ([`Node::begin_stop`]).
    stopping: tokio::sync::watch::Sender<bool>,
}

impl Node {
    /// Opens `<data-dir>/member/{wal,snap,db}`, recovers, starts raft and bootstraps a new
    /// cluster if this is the first start with `--initial-cluster-state new`.
    ///
    /// Errors: unusable data dir, corrupt WAL or store, or flags that do not describe this
    /// member (its name or peer URLs missing from `--initial-cluster`).
    pub async fn start(config: Config) -> anyhow::Result<Arc<Node>> {
        // A malformed rule file stops the member before it touches its data dir.
        let qos_file = config.qos_file_rules()?;
        let qos = Arc::new(Admission::new(
            RuleSet::empty(),
            config.qos_thresholds()?,
            Arc::new(LoadGauge::default()),
        ));
        let member_dir = config.data_dir().join("member");
        let (wal_dir, snap_dir, db_dir) = (
            member_dir.join("wal"),
            member_dir.join("snap"),
            member_dir.join("db"),
        );
        for d in [&wal_dir, &snap_dir] {
            std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
        }
        // sled opens the current generation's real directory, never the link (a
        // defragment moves the link while this database stays open).
        let db_real = tokio::task::block_in_place(|| generation::prepare(&db_dir))
            .with_context(|| format!("cannot prepare the store in {}", db_dir.display()))?;

        let wal = Arc::new(
            tokio::task::block_in_place(|| Wal::open(&wal_dir, config.wal_options()))
                .with_context(|| format!("cannot open WAL in {}", wal_dir.display()))?,
        );
        let backend = Backend::open(&db_real)
            .with_context(|| format!("cannot open store in {}", db_real.display()))?;
        let tree = backend.tree().clone();
        // Before anything reads the store: rebuild a tree a failed commit left damaged
        // (backend/damage.rs, raft/rebuild.rs).
        let damage = tokio::task::block_in_place(|| -> anyhow::Result<Arc<DamageMark>> {
            let (mark, state) =
                DamageMark::open(&member_dir, tree.is_empty()).with_context(|| {
                    format!("cannot open the damage mark in {}", member_dir.display())
                })?;
            let log = rebuild::LogStart {
                first_index: wal.first_index(),
                purged_index: wal.purged_index(),
            };
            rebuild::repair(&tree, &snap_dir, log, &mark, &state)
                .context("cannot rebuild the member tree")?;
            Ok(Arc::new(mark))
        })?;
        // Before anything reads the store: refuse a newer data dir, migrate an older one.
        tokio::task::block_in_place(|| {
            crate::version::check_and_migrate(
                &backend.local()?,
                &tree,
                crate::version::server_version(),
            )
            .map_err(anyhow::Error::from)
        })
        .with_context(|| format!("cannot open store in {}", db_dir.display()))?;

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
        peers.set_cluster_id(cluster_id);

        let live = backend.into_live();
        live.set_damage_mark(damage);
        let store = Arc::new(
            tokio::task::block_in_place(|| MvccStore::open_live(live.clone()))
                .map_err(|e| anyhow::anyhow!("cannot open MVCC store: {e}"))?,
        );
        // Groups reach sled in batches, as etcd's backend batch transaction (mvcc/unpersisted.rs).
        store
            .set_persist_policy(config.persist_policy())
            .map_err(|e| anyhow::anyhow!("cannot open MVCC store: {e}"))?;
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
        applier.set_token_provider(
            config
                .token_provider()
                .map_err(|e| anyhow::anyhow!("--auth-token: {e}"))?,
        );
        let auth = applier.auth().clone();
        let shared: Arc<SharedStore> = applier.shared_store().clone();
        let alarms = applier.alarms().clone();
        let cluster_version = applier.cluster_version().clone();
        let downgrade = applier.downgrade().clone();
        let watch = WatchHub::new(
            Arc::new(StoreHistory(shared.clone())),
            WatchConfig::from_config(&config),
        );
        watch
            .spawn_sync_thread()
            .context("cannot start the watch sync thread")?;
        applier.set_watch_hub(watch.clone());
        applier.set_admission(qos.clone());
        if config.recovery.force_new_cluster {
            restart_as_standalone(&wal, id, cluster_id, applier.membership())?;
        }
        let sm = StateMachine::new(applier, snap_dir);
        let export_locks = sm.export_locks();

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
            // etcd's --pre-vote (Keel patch of openraft: third_party/openraft, core/pre_vote.rs).
            enable_pre_vote: config.operator.pre_vote,
            ..Default::default()
        }
        .validate()?;
        let network = PeerNetwork::new(peers.clone());
        let load = qos.load().clone();
        let retained_wal = wal.clone();
        let log_store =
            LogStore::with_commit_hook(wal.clone(), Arc::new(move |i| load.set_committed(i)))
                .restarting_as_follower(id);
        let raft = Raft::new(id, Arc::new(raft_config), network, log_store, sm).await?;

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
            wal,
            store: shared,
            attributes,
            config,
            lessor,
            lease_ids: LeaseIdGenerator::new(id),
            watch,
            cluster,
            qos,
            auth,
            alarms,
            cluster_version,
            downgrade,
            export_locks,
            db_size: AtomicI64::new(live.size_on_disk().map_or(0, |b| b as i64)),
            // Its bytes in use are measured by the first refresh, right after start.
            live,
            db_link: db_dir,
            defrag: Arc::new(tokio::sync::Mutex::new(())),
            next_request_id: AtomicU64::new(1),
            proposer: OnceLock::new(),
            stopping: tokio::sync::watch::Sender::new(false),
        });
        let weak: Weak<Node> = Arc::downgrade(&node);
        let _ = node.proposer.set(Proposer::start(
            Arc::new(move |req, route| {
                let weak = weak.clone();
                Box::pin(async move {
                    match weak.upgrade() {
                        Some(node) => node.propose_entry(req, route).await,
                        None => Err(Refused::Failed(EtcdError::Stopped)),
                    }
                })
            }),
            node.request_timeout(),
        ));
        node.clone().spawn_publish();
        node.spawn_version_monitor();
        if let Some(rules) = qos_file {
            node.clone().spawn_qos_config(rules);
        }
        tokio::spawn(crate::cluster::watchdog::run(Arc::downgrade(&node.cluster)));
        tokio::spawn(crate::cluster::leadership::monitor(Arc::downgrade(
            &node.cluster,
        )));
        tokio::spawn(crate::raft::retention::run(
            node.raft.clone(),
            retained_wal,
            node.config.recovery.max_wals as usize,
        ));
        node.clone().spawn_db_size_refresh();
        node.spawn_corrupt_check();
        node.spawn_compact_hash_check();
        node.spawn_auto_compaction();
        node.spawn_token_sweep();
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
        let attrs = keelpb::MemberAttributes {
            member_id: self.id,
            name: self.config.name.clone(),
            client_urls: split_urls(&self.config.advertise_client_urls),
            server_version: crate::version::SERVER_VERSION_FULL.to_string(),
        };
        let weak = Arc::downgrade(&self);
        drop(self);
        tokio::spawn(async move {
            let mut failures = 0u32;
            loop {
                let Some(node) = weak.upgrade() else { return };
                let stored = node.attributes.get(node.id).as_ref() == Some(&attrs);
                // While the cluster version is below this binary's, publish again now and
                // then: a member that ran an older release applied the others' attributes
                // without their version (0.1.0 drops the field), and must learn it again
                // before it can lead the decision.
                let behind = node.cluster_version.get() < crate::version::server_version();
                if stored && !behind {
                    return;
                }
                // Bounded by the proposer's request timeout: a proposal made during a brief
                // leadership right after start may wait for a commit that never comes; the
                // loop then checks what applied.
                match node
                    .propose(raft_request::Request::MemberAttributes(attrs.clone()))
                    .await
                {
                    Ok(_) => {
                        if !stored {
                            tracing::info!(server_version = %attrs.server_version, "published member attributes");
                        }
                        failures = 0;
                    }
                    Err(e) => {
                        failures += 1;
                        tracing::debug!("publishing member attributes: {e}");
                        if failures == 600 {
                            tracing::warn!("could not publish member attributes");
                        }
                    }
                }
                drop(node);
                let pause = if failures > 0 {
                    Duration::from_millis(100)
                } else {
                    REPUBLISH_INTERVAL
                };
                tokio::time::sleep(pause).await;
            }
        });
    }

    /// Puts the rules of `--qos-config` in force through raft, once a leader exists and this
    /// member caught up (a read barrier), unless the replicated rules are already the same.
    fn spawn_qos_config(self: Arc<Self>, rules: Vec<crate::qos::Rule>) {
        tokio::spawn(async move {
            for _ in 0..600 {
                if self.read_barrier().await.is_ok() {
                    if self.qos.rules().rules() == rules.as_slice() {
                        return;
                    }
                    let change = RuleChange::Replace {
                        rules: rules.clone(),
                    };
                    match self.propose_qos(None, &change).await {
                        Ok(version) => {
                            tracing::info!(version, "qos rules of --qos-config in force");
                            return;
                        }
                        Err(e) => tracing::debug!("proposing the --qos-config rules: {e}"),
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            tracing::warn!("could not put the --qos-config rules in force");
        });
    }

    /// Proposes a QoS rule change as `ai` (a client of the admin service; `None`: the
    /// server itself, for `--qos-config`, with root authority) and returns the rule set's
    /// version after it applied.
    /// The change is checked against the rules in force first, so a malformed rule is
    /// answered at once without a raft round; apply checks again (the rules may change in
    /// between) and refuses with the same kind of error on every member.
    ///
    /// Errors: `InvalidArgument` naming the field (`rule.rate: must be > 0`); those of
    /// [`Node::propose`].
    pub async fn propose_qos(
        &self,
        ai: Option<&AuthInfo>,
        change: &RuleChange,
    ) -> Result<u64, EtcdError> {
        self.qos
            .rules()
            .apply(change)
            .map_err(|e| EtcdError::InvalidArgument(e.to_string()))?;
        let request = raft_request::Request::QosRuleChange(keelpb::QosRuleChange {
            change: change.encode(),
        });
        let resp = match ai {
            Some(ai) => self.propose_as(ai, request).await?,
            None => self.propose(request).await?,
        };
        match resp.response {
            Some(keelpb::raft_response::Response::QosRuleChange(r)) => Ok(r.version),
            _ => Err(EtcdError::Internal(
                "keel: apply returned an unexpected response type".into(),
            )),
        }
    }

    /// Proposes a request the server issues itself (no auth header: it applies with root
    /// authority, etcd #11689) through the raft log and waits until it is applied here.
    /// Concurrent requests are batched into one log entry ([`Proposer`]). Client requests go
    /// through [`Node::propose_as`].
    ///
    /// Errors: `RequestTooLarge` if the encoded request exceeds `--max-request-bytes`;
    /// `NoLeader`/`Timeout` if no leader emerges within the request timeout; `Stopped` when
    /// the member shuts down; apply-time etcd errors from the response.
    pub async fn propose(&self, request: raft_request::Request) -> Result<RaftResponse, EtcdError> {
        self.propose_with_header(None, request).await
    }

    /// Proposes a client request made as `ai` (stamped into the entry's auth header, which
    /// apply checks permissions with); otherwise as [`Node::propose`].
    ///
    /// Errors: as [`Node::propose`], and the apply-time permission errors.
    pub async fn propose_as(
        &self,
        ai: &AuthInfo,
        request: raft_request::Request,
    ) -> Result<RaftResponse, EtcdError> {
        let header = keelpb::AuthHeader {
            username: ai.username.clone(),
            auth_revision: ai.revision,
        };
        self.propose_with_header(Some(header), request).await
    }

    async fn propose_with_header(
        &self,
        auth_header: Option<keelpb::AuthHeader>,
        request: raft_request::Request,
    ) -> Result<RaftResponse, EtcdError> {
        let req = RaftRequest {
            auth_header,
            id: self.next_request_id.fetch_add(1, Ordering::Relaxed),
            request: Some(request),
        };
        if req.encoded_len() > self.config.max_request_bytes as usize {
            return Err(EtcdError::RequestTooLarge);
        }
        if let Some(r) = &req.request {
            self.check_gate(r).await?;
        }
        let proposer = self.proposer.get().ok_or(EtcdError::Stopped)?;
        self.qos.load().set_queued(proposer.queued());
        let result = proposer.propose(req).await;
        if result.as_ref().is_err_and(is_proposal_failure) {
            crate::metrics::server().proposals_failed.inc();
        }
        result
    }

    /// Proposes an entry another member forwarded (`keelpb.Peer/Forward`) through this
    /// member's proposer, so that it shares a raft entry with this member's own requests
    /// and other forwarded ones; returns its result in the shape it came in (a batch gets a
    /// batch of per-request results, apply-time errors included) and the log index of the
    /// entry that carried it. Nothing is checked again: the forwarding member did that.
    ///
    /// Errors: `NotLeader` when this member knows another leader, or stops leading before
    /// the entry is proposed (the request is never forwarded a second time; the member that
    /// sent it asks the leader itself: `raft::proposer`, "One forwarding hop"); otherwise as
    /// [`Node::propose`]; for a single request also its apply-time error.
    pub async fn propose_forwarded(
        &self,
        req: RaftRequest,
    ) -> Result<(RaftResponse, u64), EtcdError> {
        let me = self.id;
        let other_leads =
            move |m: &openraft::RaftMetrics<_, _>| matches!(m.current_leader, Some(l) if l != me);
        let mut metrics = self.raft.metrics();
        if other_leads(&metrics.borrow()) {
            return Err(EtcdError::NotLeader);
        }
        let proposer = self.proposer.get().ok_or(EtcdError::Stopped)?;
        let stepped_down = async move {
            if metrics.wait_for(other_leads).await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        match req.request {
            Some(raft_request::Request::Batch(batch)) => {
                let (responses, index) = proposer
                    .propose_forwarded(batch.requests, stepped_down)
                    .await?;
                let batch = keelpb::ResponseBatch { responses };
                let resp = RaftResponse {
                    revision: 0,
                    response: Some(keelpb::raft_response::Response::Batch(batch)),
                };
                Ok((resp, index))
            }
            _ => {
                let (mut responses, index) =
                    proposer.propose_forwarded(vec![req], stepped_down).await?;
                let resp = responses.pop().ok_or_else(|| {
                    EtcdError::Internal("keel: a forwarded request got no result".into())
                })?;
                into_result(resp).map(|r| (r, index))
            }
        }
    }

    /// Requests waiting in the proposer (`etcd_server_proposals_pending`).
    pub fn proposals_pending(&self) -> u64 {
        self.proposer.get().map_or(0, Proposer::queued)
    }

    /// Proposes one log entry as is (a request or a batch) along `route`: here when this
    /// member leads; else forwarded to the leader ([`Route::Anywhere`]) or handed back
    /// ([`Route::LeaderOnly`], an entry holding requests another member forwarded: one hop
    /// only, see `raft::proposer`). Returns its apply result and log index. A forwarded entry
    /// is also applied here before this returns (read-your-writes on every member).
    ///
    /// Errors: as [`Node::propose`], as [`Refused::Failed`]; [`Refused::NotLeader`] with the
    /// entry, unproposed, for a `LeaderOnly` entry on a member that does not lead.
    async fn propose_entry(
        &self,
        req: RaftRequest,
        route: Route,
    ) -> Result<(RaftResponse, u64), Refused> {
        let deadline = tokio::time::Instant::now() + self.request_timeout();
        // A leadership transfer holds new proposals until leadership moved.
        if !self.cluster.gate.wait_idle(deadline).await {
            return Err(EtcdError::Timeout.into());
        }
        loop {
            // A member that knows another member leads forwards at once: asking openraft
            // first would cost a round trip through its core and a copy of the entry, only
            // to hear "forward to the leader". (Should the metrics lag behind a change, the
            // member named answers `not leader`, and this member asks again once its metrics
            // name another leader.)
            let (leader_id, leader) = match self.other_leader() {
                Some(leader) => leader,
                // This member leads, but no quorum acknowledged it for an election timeout:
                // an etcd leader steps down then (CheckQuorum) and holds proposals until a
                // leader is known. Appending here would commit the entry whenever the quorum
                // comes back, long after its client was told it timed out.
                None if self.cluster.leads_without_quorum() => {
                    if route == Route::LeaderOnly {
                        return Err(Refused::NotLeader(req));
                    }
                    self.wait_for_quorum(deadline).await?;
                    continue;
                }
                None => match self.write_locally(&req, deadline).await? {
                    Local::Written(result) => return Ok(result?),
                    Local::ForwardTo(id, leader) => (id, leader),
                    Local::NoLeader if route == Route::LeaderOnly => {
                        return Err(Refused::NotLeader(req));
                    }
                    Local::NoLeader => {
                        self.wait_for_leader(deadline).await?;
                        continue;
                    }
                },
            };
            if route == Route::LeaderOnly {
                return Err(Refused::NotLeader(req));
            }
            match self.forward(&leader, req.clone(), deadline).await {
                Err(PeerFailure::NotDelivered) => {
                    // The leader is unreachable (likely crashed) and did not get the request:
                    // retry once a new leader is known.
                    self.retry_pause(None, deadline).await?;
                }
                Err(PeerFailure::Answer(EtcdError::NotLeader)) => {
                    // It proposed nothing: it stopped leading, or does not lead yet (it won
                    // the election our metrics name it for, but its own do not show it).
                    // Ask again once our metrics name another leader, or after a pause.
                    self.retry_pause(Some(leader_id), deadline).await?;
                }
                Err(PeerFailure::Ambiguous) => {
                    return Err(EtcdError::TimeoutDueToLeaderFail.into());
                }
                Err(PeerFailure::Answer(e)) => return Err(e.into()),
                Ok((resp, index)) => {
                    // Read-your-writes on this member (as in etcd): wait until it applied
                    // the entry too.
                    self.wait_applied(index, deadline).await?;
                    return Ok(into_result(resp).map(|r| (r, index))?);
                }
            }
        }
    }

    /// Proposes `req` through this member's openraft (`client_write_ff`, then its answer),
    /// bounded by `deadline`.
    ///
    /// A deposed leader that catches up by installing a snapshot drops the pending writes the
    /// snapshot supersedes unanswered (Keel's openraft patch for upstream #1761,
    /// docs/third_party.md): such an entry may or may not be in the snapshot, so the client
    /// gets etcd's "request timed out, possibly due to previous leader failure" at once. The
    /// deadline stays as a safeguard: an unanswered write would hold one of the proposer's
    /// few in-flight slots.
    ///
    /// Errors: `TimeoutDueToLeaderFail` for a superseded write, `Timeout` at `deadline`,
    /// `Stopped` when raft stopped, `Internal` for a membership-change error.
    async fn write_locally(
        &self,
        req: &RaftRequest,
        deadline: tokio::time::Instant,
    ) -> Result<Local, EtcdError> {
        let proposed_us = crate::raft::trace::start();
        let answer = self
            .raft
            .client_write_ff(Request::new(req.clone()))
            .await
            .map_err(|_| EtcdError::Stopped)?;
        let written = match tokio::time::timeout_at(deadline, answer).await {
            Err(_) => return Err(EtcdError::Timeout),
            Ok(Ok(written)) => written,
            // The core dropped the answer: it stopped, or a snapshot superseded the entry.
            Ok(Err(_)) if self.raft.metrics().borrow().running_state.is_err() => {
                return Err(EtcdError::Stopped);
            }
            Ok(Err(_)) => return Err(EtcdError::TimeoutDueToLeaderFail),
        };
        match written {
            Ok(resp) => {
                let index = resp.log_id.index;
                if proposed_us != 0 {
                    crate::raft::trace::mark_proposed(req.id, index, proposed_us);
                    crate::raft::trace::mark(Stage::Response, index, index, 0);
                }
                Ok(Local::Written(into_result(resp.data.0).map(|r| (r, index))))
            }
            Err(ClientWriteError::ForwardToLeader(f)) => Ok(match (f.leader_id, f.leader_node) {
                (Some(id), Some(leader)) if id != self.id => Local::ForwardTo(id, leader),
                _ => Local::NoLeader,
            }),
            Err(ClientWriteError::ChangeMembershipError(e)) => {
                Err(EtcdError::Internal(e.to_string()))
            }
        }
    }

    /// The leader's ID and membership entry when raft metrics name a leader other than this
    /// member.
    fn other_leader(&self) -> Option<(NodeId, MemberNode)> {
        match crate::raft::peers::leader_node(&self.raft) {
            (Some(leader), Some(node)) if leader != self.id => Some((leader, node)),
            _ => None,
        }
    }

    /// The cluster version in force on this member (`/version`'s `keelcluster`, metrics):
    /// the applied one, 0.1 until the leader's first decision.
    pub fn cluster_version(&self) -> Version {
        self.cluster_version.get()
    }

    /// Refuses `request` if the cluster version does not allow it (`version::gates`; apply
    /// checks again). Before the leader's first decision (a new cluster's first second),
    /// waits up to [`UNDECIDED_VERSION_WAIT`] for it rather than refuse on a version not yet
    /// known (a cluster led by a 0.1.0 member never decides: then the refusal is 0.1's).
    ///
    /// Errors: `FailedPrecondition` with `cluster version X is too low for ...`.
    async fn check_gate(&self, request: &raft_request::Request) -> Result<(), EtcdError> {
        if gates::check(self.cluster_version.get(), request).is_ok() {
            return Ok(());
        }
        if self.cluster_version.decided().is_none() {
            let mut rx = self.cluster_version.subscribe();
            let wait = self.request_timeout().min(UNDECIDED_VERSION_WAIT);
            let _ = tokio::time::timeout(wait, rx.wait_for(|v| v.is_some())).await;
        }
        gates::check(self.cluster_version.get(), request).map_err(EtcdError::from)
    }

    /// On the leader, decides the cluster version from the members' published server
    /// versions every [`VERSION_MONITOR_INTERVAL`] and proposes a change (etcd's
    /// `monitorClusterVersions`).
    fn spawn_version_monitor(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(VERSION_MONITOR_INTERVAL).await;
                let Some(node) = weak.upgrade() else { return };
                let metrics = node.raft.metrics().borrow().clone();
                if metrics.current_leader != Some(node.id) {
                    continue;
                }
                // Decide on the applied state of the whole committed log: a leader that just
                // restarted may not have applied the last version or attributes yet.
                if node.read_barrier().await.is_err() {
                    continue;
                }
                let members = metrics
                    .membership_config
                    .membership()
                    .nodes()
                    .map(|(id, _)| {
                        node.attributes
                            .get(*id)
                            .map(|a| crate::version::published(&a.server_version))
                    })
                    .collect::<Vec<_>>();
                let target = node.downgrade.target();
                let Some(v) =
                    crate::version::decide(node.cluster_version.decided(), members, target)
                else {
                    continue;
                };
                let set = keelpb::ClusterVersionSet {
                    version: v.to_string(),
                };
                // Bounded by the proposer's request timeout, as publishing: a lost
                // leadership must not stall the monitor.
                match node
                    .propose(raft_request::Request::ClusterVersionSet(set))
                    .await
                {
                    Ok(_) => tracing::info!(cluster_version = %v, "proposed the cluster version"),
                    Err(e) => tracing::debug!("proposing cluster version {v}: {e}"),
                }
            }
        });
    }

    /// Waits until this member can serve a linearizable read (Raft thesis §6.4 ReadIndex,
    /// on any member, batched: see `cluster::read_index`): it obtained a read index from the
    /// leader and applied up to it.
    ///
    /// Errors: `NotSupportedForLearner` on a member that is not a voter (a learner, as etcd),
    /// `NoLeader` when no leader emerges in time, `Timeout`, `Stopped` on shutdown.
    pub async fn read_barrier(&self) -> Result<(), EtcdError> {
        if !self.is_voter() {
            return Err(EtcdError::NotSupportedForLearner);
        }
        self.cluster.reads.barrier().await
    }

    /// Whether this member is a voter of the membership config it knows. A learner is not,
    /// and neither is a member that joined and has not received its membership yet (it may
    /// be a learner: etcd's learner refuses client RPCs from its first one) or one that
    /// applied its own removal.
    pub fn is_voter(&self) -> bool {
        // On every client request (the learner gate): `voter_ids` would build a set.
        self.in_membership(|m| m.get_joint_config().iter().any(|c| c.contains(&self.id)))
    }

    /// Whether this member is a raft learner (Status, `etcd_server_is_learner`, `/readyz`).
    pub fn is_learner(&self) -> bool {
        self.in_membership(|m| m.learner_ids().any(|l| l == self.id))
    }

    /// `look` at the membership config this member knows now.
    fn in_membership<R>(&self, look: impl FnOnce(&Membership<NodeId, MemberNode>) -> R) -> R {
        look(self.raft.metrics().borrow().membership_config.membership())
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

    /// The pause before a request that was not proposed is sent again: [`FORWARD_RETRY_PAUSE`],
    /// cut short once raft metrics no longer name `stale` as the leader (a member that said
    /// it does not lead).
    ///
    /// Errors: `TimeoutDueToLeaderFail` when the pause would reach `deadline`, `Stopped`
    /// when raft stopped.
    async fn retry_pause(
        &self,
        stale: Option<NodeId>,
        deadline: tokio::time::Instant,
    ) -> Result<(), EtcdError> {
        let until = tokio::time::Instant::now() + FORWARD_RETRY_PAUSE;
        if until >= deadline {
            return Err(EtcdError::TimeoutDueToLeaderFail);
        }
        let Some(stale) = stale else {
            tokio::time::sleep_until(until).await;
            return Ok(());
        };
        let mut metrics = self.raft.metrics();
        let moved = metrics.wait_for(|m| m.current_leader != Some(stale));
        match tokio::time::timeout_at(until, moved).await {
            Ok(Err(_)) => Err(EtcdError::Stopped),
            Ok(Ok(_)) | Err(_) => Ok(()),
        }
    }

    /// Waits while this member leads without a quorum's acknowledgement
    /// ([`Cluster::has_leader`]), until a quorum acknowledges it or raft changes its mind;
    /// checks on every raft metrics change and at least every [`FORWARD_RETRY_PAUSE`].
    ///
    /// Errors: `Timeout` at `deadline` (etcd's answer to a proposal held for want of a
    /// leader), `Stopped` when raft stopped.
    async fn wait_for_quorum(&self, deadline: tokio::time::Instant) -> Result<(), EtcdError> {
        let mut metrics = self.raft.metrics();
        while self.cluster.leads_without_quorum() {
            if tokio::time::Instant::now() >= deadline {
                return Err(EtcdError::Timeout);
            }
            let wake = (tokio::time::Instant::now() + FORWARD_RETRY_PAUSE).min(deadline);
            if let Ok(Err(_)) = tokio::time::timeout_at(wake, metrics.changed()).await {
                return Err(EtcdError::Stopped);
            }
        }
        Ok(())
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

    /// Sends `request` straight to `leader` (`keelpb.Peer/Forward`), bypassing this member's
    /// raft: how a fencing member whose own raft stopped raises NOSPACE (`fence.rs`).
    ///
    /// Errors: the leader's answer, `NoLeader` when it cannot be reached, `Timeout` at
    /// `deadline`.
    pub(crate) async fn forward_request(
        &self,
        leader: &MemberNode,
        request: raft_request::Request,
        deadline: tokio::time::Instant,
    ) -> Result<RaftResponse, EtcdError> {
        let req = RaftRequest {
            auth_header: None,
            id: self.next_request_id.fetch_add(1, Ordering::Relaxed),
            request: Some(request),
        };
        match self.forward(leader, req, deadline).await {
            Ok((resp, _)) => into_result(resp),
            Err(PeerFailure::Answer(e)) => Err(e),
            Err(PeerFailure::NotDelivered) => Err(EtcdError::NoLeader),
            Err(PeerFailure::Ambiguous) => Err(EtcdError::Timeout),
        }
    }

    /// Sends a proposal to the leader on this member's leader-call stream to it
    /// (`keelpb.Peer/LeaderCalls`, `raft::leader_calls`), or as a unary `keelpb.Peer/Forward`
    /// to a leader that does not serve the stream (0.1.0); returns the result and the entry's
    /// log index.
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
        let peers = &self.cluster.peers;
        let stream = match peers.leader_calls().open(peers, &url, deadline).await {
            Opened::Stream(stream) => stream,
            Opened::Failed(failure) => return Err(failure),
            Opened::Unary => return self.forward_unary(&url, req, deadline).await,
        };
        match stream.call(peer_call::Call::Forward(req), deadline).await {
            Ok(peer_answer::Answer::Forward(a)) => match a.response {
                Some(resp) => Ok((resp, a.log_index)),
                None => Err(PeerFailure::Answer(EtcdError::Internal(
                    "keel: the leader answered a forwarded request with no response".into(),
                ))),
            },
            Ok(_) => Err(PeerFailure::Answer(EtcdError::Internal(
                "keel: the leader answered a forwarded request with another kind of answer".into(),
            ))),
            Err(e) => Err(e.into_failure(peers, &url)),
        }
    }

    /// [`Node::forward`] as a unary `keelpb.Peer/Forward` on the pooled connection (the log
    /// index comes in response metadata [`FORWARD_LOG_INDEX`]).
    async fn forward_unary(
        &self,
        url: &str,
        req: RaftRequest,
        deadline: tokio::time::Instant,
    ) -> Result<(RaftResponse, u64), PeerFailure> {
        let mut client = self
            .cluster
            .peers
            .client(url)
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
                    self.cluster.peers.reset(url);
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

    /// Keel's `Maintenance.Defragment`: rewrites the store into a fresh database generation
    /// while the member serves, and switches to it in a short write pause
    /// (`backup::defragment`), so the file shrinks to the live data; then measures the
    /// sizes again (so a quota freed by a compaction shows at once). One at a time.
    ///
    /// Errors: `Internal` with the I/O error; the member keeps its current database.
    pub async fn defragment(&self) -> Result<defragment::Report, EtcdError> {
        let one = self.defrag.clone().lock_owned().await;
        let (live, link, locks, store) = (
            self.live.clone(),
            self.db_link.clone(),
            self.export_locks.clone(),
            self.store.clone(),
        );
        // A task of its own: a client that gives up (etcdctl's 5 s timeout) does not stop it.
        let report = tokio::spawn(async move {
            let _one = one;
            defragment::defragment(&live, &link, &locks, &store).await
        })
        .await
        .map_err(|e| EtcdError::Internal(format!("defragment task: {e}")))?
        .map_err(|e| EtcdError::Internal(format!("defragment: {e}")))?;
        let live = self.live.clone();
        tokio::task::spawn_blocking(move || live.measure_in_use())
            .await
            .map_err(|e| EtcdError::Internal(format!("defragment task: {e}")))?
            .map_err(|e| EtcdError::Internal(format!("defragment: measure the store: {e}")))?;
        self.db_size.store(report.after as i64, Ordering::Relaxed);
        Ok(report)
    }

    /// Bytes the store occupies on disk: sled's figure (at most ~1 s old), and never less
    /// than [`Node::db_size_in_use`] (etcd's `dbSize` ≥ `dbSizeInUse`; sled's files can
    /// lag a burst of writes by that second).
    pub fn db_size(&self) -> i64 {
        self.db_size
            .load(Ordering::Relaxed)
            .max(self.db_size_in_use())
    }

    /// Bytes of the keys and values in the member tree (MVCC records of every revision not
    /// yet compacted, leases, auth, alarms, meta): the live data, which the quota counts.
    /// Current to the last applied batch, never below the true figure
    /// ([`LiveTree::in_use`]); space a compaction frees counts from the next scan
    /// ([`IN_USE_SCAN_SHARE`]).
    pub fn db_size_in_use(&self) -> i64 {
        i64::try_from(self.live.in_use()).unwrap_or(i64::MAX)
    }

    /// etcd's initial corruption check (`--experimental-initial-corrupt-check`): before
    /// serving clients, this member's HashKV against every peer's at the same revision
    /// (`cluster::corrupt`). Peers that cannot answer are skipped.
    ///
    /// Errors: a peer with the same compact revision and a different hash (etcd's "found
    /// data inconsistency with peers"); the member must not start.
    pub async fn initial_corrupt_check(&self) -> anyhow::Result<()> {
        if !self.config.maintenance.experimental_initial_corrupt_check {
            return Ok(());
        }
        let local = corrupt::local_hash(&self.cluster).await?;
        let found =
            corrupt::find_mismatches(&self.cluster, &local, corrupt::INITIAL_CHECK_TIMEOUT).await;
        if let Some(m) = found.first() {
            anyhow::bail!(
                "found data inconsistency with peers: member {:x} has hash {} at revision {}, this member {:x} has {}",
                m.member,
                m.peer,
                m.revision,
                self.id,
                m.local
            );
        }
        tracing::info!(
            revision = local.hash_revision,
            hash = local.hash,
            "initial corruption check passed"
        );
        Ok(())
    }

    /// etcd's periodic corruption check (`--experimental-corrupt-check-time`): every
    /// interval the leader compares the followers' HashKV with its own and raises CORRUPT
    /// through raft for each member that differs (every member then refuses writes).
    fn spawn_corrupt_check(self: &Arc<Self>) {
        let every = self.config.maintenance.experimental_corrupt_check_time.0;
        if every.is_zero() {
            return;
        }
        let mut ticks = LeaderTicks::new(self, every);
        tokio::spawn(async move {
            while let Some(node) = ticks.next().await {
                let local = match corrupt::local_hash(&node.cluster).await {
                    Ok(h) => h,
                    Err(e) => {
                        tracing::warn!("corruption check: local hash: {e}");
                        continue;
                    }
                };
                let found =
                    corrupt::find_mismatches(&node.cluster, &local, node.request_timeout()).await;
                for m in found {
                    tracing::error!(
                        member = %format!("{:x}", m.member),
                        revision = m.revision,
                        leader_hash = m.local,
                        member_hash = m.peer,
                        "found data inconsistency with peers: raising CORRUPT"
                    );
                    node.raise_corrupt(m.member).await;
                }
            }
        });
    }

    /// etcd's compact-hash check (`--experimental-compact-hash-check-enabled`, every
    /// `--experimental-compact-hash-check-time`): every member keeps HashKV at its
    /// compaction revisions, and the leader compares the peers' at the newest one they all
    /// hold, raising CORRUPT for the member that differs (`cluster::compact_hash`).
    fn spawn_compact_hash_check(self: &Arc<Self>) {
        let Some(every) = self.config.maintenance.compact_hash_check() else {
            return;
        };
        self.store.get().set_compact_hashing(true);
        let mut ticks = LeaderTicks::new(self, every);
        tokio::spawn(async move {
            let mut checker = compact_hash::Checker::default();
            while let Some(node) = ticks.next().await {
                for member in checker.check(&node.cluster, node.request_timeout()).await {
                    node.raise_corrupt(member).await;
                }
            }
        });
    }

    /// Proposes CORRUPT for `member` (0: the whole cluster) unless it is raised already;
    /// every member then refuses writes.
    async fn raise_corrupt(&self, member: NodeId) {
        if self.alarms.has(member, AlarmType::Corrupt) {
            return;
        }
        let raise = AlarmRequest {
            action: AlarmAction::Activate as i32,
            member_id: member,
            alarm: AlarmType::Corrupt as i32,
        };
        if let Err(e) = self.propose(raft_request::Request::Alarm(raise)).await {
            tracing::warn!("raising the CORRUPT alarm: {e}");
        }
    }

    /// etcd's auto-compaction (`--auto-compaction-mode`, `--auto-compaction-retention`): the
    /// leader proposes compactions on etcd's schedule (`cluster::autocompact`).
    fn spawn_auto_compaction(self: &Arc<Self>) {
        // The flags were checked at start-up (`Config::normalize`).
        if let Ok(Some(mode)) = self.config.maintenance.auto_compaction() {
            let target = NodeCompactor(Arc::downgrade(self));
            tokio::spawn(autocompact::run(mode, target, autocompact::TokioClock));
        }
    }

    /// Drops expired simple tokens about once a second (etcd's 1 s ticker); lookups also
    /// refuse expired tokens, so this only bounds memory.
    fn spawn_token_sweep(&self) {
        let auth = Arc::downgrade(&self.auth);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let Some(auth) = auth.upgrade() else { return };
                if let TokenProvider::Simple(t) = auth.tokens() {
                    t.sweep(std::time::Instant::now());
                }
            }
        });
    }

    /// etcd's backend quota (`--quota-backend-bytes`, `quotaKVServer`/`quotaLeaseServer`):
    /// a request that adds `cost` bytes ([`quota::cost`]) must fit below the quota together
    /// with the bytes in use; otherwise this member raises NOSPACE through raft (once) and
    /// the request is refused. Requests that add nothing (cost 0) always pass, so reads,
    /// deletes and compactions can reclaim space. Keel counts the bytes in use, not the file
    /// size, because sled never gives freed space back (docs/compat.md).
    ///
    /// Errors: `NoSpace` (`etcdserver: mvcc: database space exceeded`).
    pub async fn check_quota(&self, cost: i64) -> Result<(), EtcdError> {
        if cost == 0 || quota::fits(self.db_size_in_use(), cost, self.config.quota_bytes()) {
            return Ok(());
        }
        if !self.alarms.has(self.id, AlarmType::Nospace) {
            let raise = AlarmRequest {
                action: AlarmAction::Activate as i32,
                member_id: self.id,
                alarm: AlarmType::Nospace as i32,
            };
            // As etcd: the request fails with NoSpace whether or not the alarm got through.
            if let Err(e) = self.propose(raft_request::Request::Alarm(raise)).await {
                tracing::warn!("raising the NOSPACE alarm: {e}");
            }
        }
        Err(EtcdError::NoSpace)
    }

    /// Refreshes [`Node::db_size`] every second, and re-measures the bytes in use
    /// ([`Node::db_size_in_use`]) as often as a scan of the tree allows
    /// ([`IN_USE_SCAN_SHARE`], or [`IN_USE_SCAN_SHARE_COMPACTED`] once the compact revision
    /// moved).
    fn spawn_db_size_refresh(self: Arc<Self>) {
        let weak = Arc::downgrade(&self);
        drop(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            let mut next_scan = tokio::time::Instant::now();
            // (when the last scan ended, how long it took, the compact revision before it)
            let mut last: Option<(tokio::time::Instant, Duration, i64)> = None;
            loop {
                tick.tick().await;
                let Some(node) = weak.upgrade() else { return };
                let backend = node.live.clone();
                let now = tokio::time::Instant::now();
                let compacted = node.store.get().compact_revision();
                let after_compaction = last.is_some_and(|(ended, took, compact)| {
                    compact != compacted && now >= ended + took * IN_USE_SCAN_SHARE_COMPACTED
                });
                let scan = now >= next_scan || after_compaction;
                let measured = tokio::task::spawn_blocking(move || {
                    let started = std::time::Instant::now();
                    let scanned = scan && backend.measure_in_use().is_ok();
                    let took = started.elapsed();
                    (backend.size_on_disk().ok(), scanned, took)
                })
                .await;
                if let Ok((size, scanned, took)) = measured {
                    if let Some(size) = size {
                        node.db_size.store(size as i64, Ordering::Relaxed);
                    }
                    if scanned {
                        let ended = tokio::time::Instant::now();
                        next_scan = ended + took * IN_USE_SCAN_SHARE;
                        last = Some((ended, took, compacted));
                    }
                }
            }
        });
    }

    /// The replicated member tree of the current database generation (exports read it;
    /// only apply writes it).
    pub fn tree(&self) -> sled::Tree {
        self.live.tree()
    }

    /// Data directory of this member.
    pub fn data_dir(&self) -> PathBuf {
        self.config.data_dir()
    }

    /// Marks the member as stopping (SIGTERM, its removal): the client streams that would
    /// otherwise run until their clients close them (Watch, LeaseKeepAlive, Observe) end,
    /// so the client servers' graceful shutdown finishes and those clients re-dial another
    /// member at once. etcd ends its watch streams likewise when it stops (its mvcc watch
    /// channels close), then stops its gRPC server.
    pub fn begin_stop(&self) {
        self.stopping.send_replace(true);
    }

    /// Resolves once [`Node::begin_stop`] was called (at once if it was).
    pub fn stopped(&self) -> futures::future::BoxFuture<'static, ()> {
        let mut stopping = self.stopping.subscribe();
        Box::pin(async move {
            let _ = stopping.wait_for(|s| *s).await;
        })
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
        let (live, store) = (self.live.clone(), self.store.get());
        let _ = tokio::task::spawn_blocking(move || {
            // Nothing is lost without it (the WAL holds every entry), but a restart then
            // has nothing to apply again.
            if let Err(e) = store.persist() {
                tracing::warn!(error = %e, "shutdown: could not commit the store's pending writes");
            }
            live.flush()
        })
        .await;
    }
}

/// What a proposal through this member's own raft came to ([`Node::write_locally`]).
enum Local {
    /// Applied: the result (an apply-time etcd error as `Err`) and the entry's log index.
    Written(Result<(RaftResponse, u64), EtcdError>),
    /// This member does not lead; this is the leader (its ID and membership entry).
    ForwardTo(NodeId, MemberNode),
    /// This member does not lead and knows no leader.
    NoLeader,
}

/// Whether `e` means the proposal did not make it through raft (etcd's
/// `proposals_failed_total`: no leader, timed out, stopped, internal failure), as opposed to
/// an answer of apply (a compare that failed, a lease not found, ...).
fn is_proposal_failure(e: &EtcdError) -> bool {
    matches!(
        *e,
        EtcdError::NoLeader
            | EtcdError::Timeout
            | EtcdError::TimeoutDueToLeaderFail
            | EtcdError::Stopped
            | EtcdError::Internal(_)
    )
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

/// The auto-compactor's member (`cluster::autocompact::Compactable`): the store revision,
/// leadership, and compactions proposed through raft like any server-issued request.
struct NodeCompactor(Weak<Node>);

impl autocompact::Compactable for NodeCompactor {
    fn revision(&self) -> Option<i64> {
        Some(self.0.upgrade()?.store.get().current_revision())
    }

    fn is_leader(&self) -> bool {
        self.0.upgrade().is_some_and(|n| n.cluster.is_leader())
    }

    async fn compact(&self, revision: i64) -> Result<(), EtcdError> {
        let node = self.0.upgrade().ok_or(EtcdError::Stopped)?;
        let request = keel_proto::etcdserverpb::CompactionRequest {
            revision,
            physical: false,
        };
        node.propose(raft_request::Request::Compaction(request))
            .await
            .map(|_| ())
    }
}

/// The rounds of a leader-only background check: every interval (the first one interval
/// after start), the node if it leads then; `None` once it is gone.
struct LeaderTicks {
    tick: tokio::time::Interval,
    node: Weak<Node>,
    started: bool,
}

impl LeaderTicks {
    fn new(node: &Arc<Node>, every: Duration) -> LeaderTicks {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        LeaderTicks {
            tick,
            node: Arc::downgrade(node),
            started: false,
        }
    }

    async fn next(&mut self) -> Option<Arc<Node>> {
        if !std::mem::replace(&mut self.started, true) {
            // An interval's first tick is immediate.
            self.tick.tick().await;
        }
        loop {
            self.tick.tick().await;
            let node = self.node.upgrade()?;
            if node.cluster.is_leader() {
                return Some(node);
            }
        }
    }
}
