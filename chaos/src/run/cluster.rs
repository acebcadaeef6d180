//! The cluster under test: N `keel` members on 127.0.0.1, each with its own data dir under the
//! run directory, and a [`LinkProxy`] for every ordered pair (i -> j) of members. Member i is
//! started with `--experimental-peer-dial-override <peer URL of j>=<proxy i->j>` for every j,
//! so all peer traffic i originates crosses a proxy the harness controls; clients talk to the
//! members' client URLs directly.
//!
//! Flags per member (etcd's, as scripts/cluster.sh, built with keel-testkit's `MemberSpec`):
//! `--name mI`, `--data-dir`, client and peer listen/advertise URLs, one `--initial-cluster`
//! for all, `--initial-cluster-state new` (`existing` once the member was removed and
//! re-added), a run-unique `--initial-cluster-token`, `--heartbeat-interval`/
//! `--election-timeout`, and the extra `--keel-arg`s.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use keel_testkit::spec::{ClusterState, MemberSpec, initial_cluster};
use tokio::sync::Mutex;

use super::ports::{PortRange, free_ports};
use super::process::MemberProcess;
use super::proxy::{LinkMode, LinkProxy};
use super::rpc;

/// How a cluster is started.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    /// Members (3 or 5).
    pub nodes: usize,
    /// The `keel` binary.
    pub binary: PathBuf,
    /// Where data dirs and logs go.
    pub dir: PathBuf,
    /// Ports come from here (`None`: OS-assigned).
    pub ports: Option<PortRange>,
    /// `--heartbeat-interval` (ms).
    pub heartbeat_ms: u64,
    /// `--election-timeout` (ms).
    pub election_ms: u64,
    /// Extra flags for every member, on every start.
    pub extra_args: Vec<String>,
    /// Extra environment for every member, on every start (e.g. `FAILPOINTS`).
    pub env: Vec<(String, String)>,
    /// Client TLS of every member (`--cacert --cert --key` of keel-chaos): https client URLs
    /// with that certificate and `--client-cert-auth`; the harness connects with the same
    /// files ([`super::rpc::set_tls`]).
    pub tls: Option<keel_testkit::tls::ServerTls>,
}

/// One member: fixed addresses plus its process.
pub struct Member {
    pub index: usize,
    /// `--name` (`m1`..`mN`).
    pub name: String,
    /// `http://127.0.0.1:<client port>`.
    pub client_url: String,
    /// `http://127.0.0.1:<peer port>`: advertised peer URL (kept across remove/re-add).
    pub peer_url: String,
    data_dir: PathBuf,
    /// Process start count, readable without the process lock.
    epoch: AtomicU32,
    /// Raft member ID (changes when the member is removed and re-added; 0 = not known).
    id: AtomicU64,
    /// Set once the member was re-added: later starts use `--initial-cluster-state existing`.
    joined_existing: AtomicBool,
    pub process: Mutex<MemberProcess>,
}

impl Member {
    /// How many times the process was started (the epoch of member revisions).
    pub fn epoch(&self) -> u32 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// The raft member ID last learned (0 when unknown).
    pub fn id(&self) -> u64 {
        self.id.load(Ordering::SeqCst)
    }

    /// The data dir (`--data-dir`).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }
}

/// The running cluster. See the module docs.
pub struct Cluster {
    pub members: Vec<Member>,
    /// `proxies[i][j]`: the link member i uses to reach member j (`None` on the diagonal).
    proxies: Vec<Vec<Option<LinkProxy>>>,
    spec: ClusterSpec,
    token: String,
    initial_cluster: String,
}

impl Cluster {
    /// Starts the proxies and every member, and waits (up to `ready_timeout`) until each
    /// member answers `Maintenance.Status` with a leader, recording member IDs.
    ///
    /// Errors: port allocation, spawning, or a member not ready in time (the log tail says why).
    pub async fn start(spec: ClusterSpec, ready_timeout: Duration) -> anyhow::Result<Cluster> {
        let n = spec.nodes;
        let ports = free_ports(2 * n + n * (n - 1), spec.ports)?;
        let mut members = Vec::with_capacity(n);
        for i in 0..n {
            let name = format!("m{}", i + 1);
            let dir = spec.dir.join(&name);
            std::fs::create_dir_all(&dir)?;
            members.push(Member {
                index: i,
                client_url: format!("http://127.0.0.1:{}", ports[2 * i]),
                peer_url: format!("http://127.0.0.1:{}", ports[2 * i + 1]),
                data_dir: dir.join("data"),
                epoch: AtomicU32::new(0),
                id: AtomicU64::new(0),
                joined_existing: AtomicBool::new(false),
                process: Mutex::new(MemberProcess::new(
                    spec.binary.clone(),
                    spec.dir.join(format!("{name}.log")),
                )),
                name,
            });
        }
        let mut next_proxy_port = ports[2 * n..].iter().copied();
        let mut proxies = Vec::with_capacity(n);
        for i in 0..n {
            let mut row = Vec::with_capacity(n);
            for j in 0..n {
                if i == j {
                    row.push(None);
                    continue;
                }
                let port = next_proxy_port
                    .next()
                    .expect("allocated n*(n-1) proxy ports");
                let listen: SocketAddr = format!("127.0.0.1:{port}").parse()?;
                let target: SocketAddr = format!("127.0.0.1:{}", ports[2 * j + 1]).parse()?;
                row.push(Some(LinkProxy::start(listen, target).await?));
            }
            proxies.push(row);
        }
        let initial_cluster = initial_cluster(members.iter().map(|m| (&m.name, &m.peer_url)));
        let cluster = Cluster {
            members,
            proxies,
            token: format!("keel-chaos-{}", ports[0]),
            initial_cluster,
            spec,
        };
        for i in 0..n {
            cluster.start_member(i, &[]).await?;
        }
        cluster.wait_ready(ready_timeout).await?;
        Ok(cluster)
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Always false: a cluster has 3 or 5 members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The flags member `i` starts with.
    fn args(&self, i: usize) -> Vec<String> {
        let m = &self.members[i];
        let overrides = (0..self.len()).filter(|&j| j != i).map(|j| {
            let proxy = self.proxies[i][j].as_ref().expect("off-diagonal proxy");
            (
                self.members[j].peer_url.clone(),
                format!("http://{}", proxy.listen),
            )
        });
        let state = if m.joined_existing.load(Ordering::SeqCst) {
            ClusterState::Existing
        } else {
            ClusterState::New
        };
        let spec = match &self.spec.tls {
            Some(tls) => MemberSpec::new().client_tls(tls.clone()),
            None => MemberSpec::new(),
        };
        spec.name(&m.name)
            .data_dir(&m.data_dir)
            .client_url(&m.client_url)
            .peer_url(&m.peer_url)
            .initial_cluster(&self.initial_cluster)
            .initial_cluster_state(state)
            .initial_cluster_token(&self.token)
            .heartbeat_interval(self.spec.heartbeat_ms)
            .election_timeout(self.spec.election_ms)
            .peer_dial_override(overrides)
            .args(&self.spec.extra_args)
            .to_args()
    }

    /// Starts member `i` (not running) with the cluster's environment plus `extra_env`.
    ///
    /// Errors: as [`MemberProcess::start`].
    pub async fn start_member(
        &self,
        i: usize,
        extra_env: &[(String, String)],
    ) -> anyhow::Result<()> {
        let mut env = self.spec.env.clone();
        for (k, v) in extra_env {
            env.retain(|(key, _)| key != k);
            env.push((k.clone(), v.clone()));
        }
        let args = self.args(i);
        let epoch = self.members[i].process.lock().await.start(&args, &env)?;
        self.members[i].epoch.store(epoch, Ordering::SeqCst);
        Ok(())
    }

    /// Marks member `i` as re-added: its next start uses `--initial-cluster-state existing`.
    pub fn mark_rejoined(&self, i: usize) {
        self.members[i]
            .joined_existing
            .store(true, Ordering::SeqCst);
        self.members[i].id.store(0, Ordering::SeqCst);
    }

    /// Records the raft ID of member `i`.
    pub fn set_id(&self, i: usize, id: u64) {
        self.members[i].id.store(id, Ordering::SeqCst);
    }

    /// Sets the mode of link `from -> to`.
    pub fn set_link(&self, from: usize, to: usize, mode: LinkMode) {
        if let Some(p) = self.proxies[from][to].as_ref() {
            p.set(mode);
        }
    }

    /// Every link back to [`LinkMode::Pass`].
    pub fn heal_links(&self) {
        for row in &self.proxies {
            for p in row.iter().flatten() {
                p.set(LinkMode::Pass);
            }
        }
    }

    /// Status of member `i`; learns its ID from the response header.
    pub async fn status(
        &self,
        i: usize,
    ) -> anyhow::Result<keel_proto::etcdserverpb::StatusResponse> {
        let s = rpc::status(&self.members[i].client_url).await?;
        if let Some(h) = &s.header {
            self.set_id(i, h.member_id);
        }
        Ok(s)
    }

    /// The member index every answering member names as leader (majority of answers agree),
    /// or `None` when unknown right now.
    pub async fn leader(&self) -> Option<usize> {
        let answers = futures::future::join_all((0..self.len()).map(|i| self.status(i))).await;
        let mut votes: Vec<u64> = answers
            .iter()
            .filter_map(|a| a.as_ref().ok())
            .map(|s| s.leader)
            .filter(|&l| l != 0)
            .collect();
        votes.sort_unstable();
        let leader_id = votes.first().copied()?;
        if !votes.iter().all(|&v| v == leader_id) {
            return None;
        }
        self.members.iter().position(|m| m.id() == leader_id)
    }

    /// Waits until every member answers Status naming a leader.
    ///
    /// Errors: after `timeout`, naming the members that are not ready.
    pub async fn wait_ready(&self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let mut not_ready = Vec::new();
            for i in 0..self.len() {
                match self.status(i).await {
                    Ok(s) if s.leader != 0 => {}
                    Ok(_) => not_ready.push(format!("{}: no leader", self.members[i].name)),
                    Err(e) => not_ready.push(format!("{}: {e}", self.members[i].name)),
                }
            }
            if not_ready.is_empty() {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                anyhow::bail!(
                    "cluster not ready within {timeout:?}: {}",
                    not_ready.join("; ")
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Stops every member (SIGTERM, then SIGKILL) and every proxy forwarding.
    pub async fn shutdown(&self) {
        for m in &self.members {
            m.process.lock().await.stop().await;
        }
    }

    /// The run directory (data dirs and logs).
    pub fn dir(&self) -> &Path {
        &self.spec.dir
    }
}
