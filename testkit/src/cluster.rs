//! Real multi-member Keel clusters.
//!
//! [`Cluster::start`] runs N [`Member`]s on 127.0.0.1 (names `m1`..`mN`, free ports, one temp
//! dir each) with the same `--initial-cluster`, `--initial-cluster-state new` and a
//! cluster-unique `--initial-cluster-token`, and waits until every member serves a
//! linearizable read. Members can be crashed, stopped, frozen and restarted through
//! [`Cluster::members`]; [`Cluster::join`] starts a member that was added with `MemberAdd`
//! (`--initial-cluster-state existing`). [`Cluster::leader`] finds the member every running
//! member names as leader. Each member logs to its own file and prints its tail when a test
//! panics (see [`crate::member`]).
//!
//! Every wait is bounded.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use keel_proto::etcdserverpb::StatusResponse;

use crate::grpc;
use crate::member::Member;
use crate::ports::free_ports;
use crate::spec::{ClusterState, MemberSpec, initial_cluster, loopback_url};

/// How long a cluster may take to serve linearizable reads on every member.
pub const CLUSTER_READY_TIMEOUT: Duration = Duration::from_secs(40);
/// Pause between two polls of the members.
const POLL: Duration = Duration::from_millis(50);

/// A cluster of real `keel` processes. See the module docs.
pub struct Cluster {
    /// Members in start order (`m1` is index 0).
    pub members: Vec<Member>,
    binary: PathBuf,
    /// Flags and environment of every member (the topology settings are the cluster's).
    template: MemberSpec,
    token: String,
    /// Where member dirs are created (`None`: the system temp dir).
    parent: Option<PathBuf>,
}

impl Cluster {
    /// Starts `n` members of `binary` with `extra` arguments (passed to every member, also on
    /// restarts and to joining members) and waits until each serves a linearizable read.
    pub fn start(binary: &Path, n: usize, extra: &[&str]) -> Cluster {
        Cluster::start_with(binary, n, MemberSpec::new().args(extra), None)
    }

    /// [`Cluster::start`] with the flags and environment of `template` for every member (its
    /// name, URLs and cluster settings are replaced by the cluster's), member dirs under
    /// `parent` (`None`: the system temp dir).
    pub fn start_with(
        binary: &Path,
        n: usize,
        template: MemberSpec,
        parent: Option<&Path>,
    ) -> Cluster {
        Cluster::start_prepared(binary, n, template, parent, &|_| {})
    }

    /// [`Cluster::start_with`], calling `prepare` on each member before it first starts (e.g.
    /// to restore a snapshot into its data dir).
    pub fn start_prepared(
        binary: &Path,
        n: usize,
        template: MemberSpec,
        parent: Option<&Path>,
        prepare: &dyn Fn(&Member),
    ) -> Cluster {
        let ports = free_ports(2 * n);
        let names: Vec<String> = (1..=n).map(|i| format!("m{i}")).collect();
        let peer_urls: Vec<String> = (0..n).map(|i| loopback_url(ports[2 * i + 1])).collect();
        let initial = initial_cluster(names.iter().zip(&peer_urls));
        let mut cluster = Cluster {
            members: Vec::new(),
            binary: binary.to_path_buf(),
            template,
            token: format!("keel-test-{}", ports[0]),
            parent: parent.map(Path::to_path_buf),
        };
        for (i, name) in names.iter().enumerate() {
            let member = cluster.new_member(
                name,
                (ports[2 * i], ports[2 * i + 1]),
                &initial,
                ClusterState::New,
            );
            cluster.members.push(member);
        }
        for m in &mut cluster.members {
            prepare(m);
            m.spawn();
        }
        cluster.wait_ready(&(0..n).collect::<Vec<_>>());
        cluster
    }

    fn new_member(
        &self,
        name: &str,
        ports: (u16, u16),
        initial: &str,
        state: ClusterState,
    ) -> Member {
        self.new_member_with(self.template.clone(), name, ports, initial, state)
    }

    fn new_member_with(
        &self,
        template: MemberSpec,
        name: &str,
        (client_port, peer_port): (u16, u16),
        initial: &str,
        state: ClusterState,
    ) -> Member {
        let spec = template
            .name(name)
            .client_url(&loopback_url(client_port))
            .peer_url(&loopback_url(peer_port))
            .initial_cluster(initial)
            .initial_cluster_state(state)
            .initial_cluster_token(&self.token);
        match &self.parent {
            Some(parent) => Member::new_in(&self.binary, spec, parent),
            None => Member::new(&self.binary, spec),
        }
    }

    /// Free ports for a member to be added: (client, peer).
    pub fn reserve_ports() -> (u16, u16) {
        let p = free_ports(2);
        (p[0], p[1])
    }

    /// Starts member `name` on `(client, peer)` ports with `--initial-cluster-state existing`
    /// and an `--initial-cluster` of every running member plus itself; it must have been added
    /// with `MemberAdd` first. Returns its index; does not wait for readiness.
    pub fn join(&mut self, name: &str, ports: (u16, u16)) -> usize {
        self.join_with(name, ports, self.template.clone())
    }

    /// [`Cluster::join`] with `template` instead of the cluster's flags (e.g. a member with
    /// another peer certificate).
    pub fn join_with(&mut self, name: &str, ports: (u16, u16), template: MemberSpec) -> usize {
        let mut members: Vec<(String, String)> = self
            .members
            .iter()
            .filter(|m| m.is_running())
            .map(|m| (m.name().to_string(), m.peer_url()))
            .collect();
        members.push((name.to_string(), loopback_url(ports.1)));
        let initial = initial_cluster(members);
        let mut member =
            self.new_member_with(template, name, ports, &initial, ClusterState::Existing);
        member.spawn();
        self.members.push(member);
        self.members.len() - 1
    }

    /// All client endpoints of running members, comma-separated (etcdctl `--endpoints`).
    pub fn endpoints(&self) -> String {
        self.running()
            .iter()
            .map(|i| self.members[*i].endpoint())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Indexes of the running members.
    pub fn running(&self) -> Vec<usize> {
        (0..self.members.len())
            .filter(|i| self.members[*i].is_running())
            .collect()
    }

    /// Waits until each member in `which` answers a linearizable Range, all within
    /// [`CLUSTER_READY_TIMEOUT`].
    pub fn wait_ready(&mut self, which: &[usize]) {
        let deadline = Instant::now() + CLUSTER_READY_TIMEOUT;
        for &i in which {
            let left = deadline.saturating_duration_since(Instant::now());
            self.members[i].wait_ready_within(left.max(POLL));
        }
    }

    /// `Maintenance.Status` of member `i` (bounded by a 2 s deadline).
    pub fn status(&self, i: usize) -> Result<StatusResponse, String> {
        grpc::status(&self.members[i].endpoint())
    }

    /// Index of the member that every running member names as leader, once they agree (waits
    /// up to `timeout`, then panics with the members' log tails). Blocks the calling thread;
    /// inside async code use [`Cluster::leader_async`].
    pub fn leader(&self, timeout: Duration) -> usize {
        let endpoints = self.running_endpoints();
        let found = grpc::block_on_thread(agreed_leader(endpoints.clone(), timeout))
            .unwrap_or_else(|e| panic!("{e}"));
        self.leader_index(&endpoints, found, timeout)
    }

    /// [`Cluster::leader`] for async code: polls without blocking the runtime.
    pub async fn leader_async(&self, timeout: Duration) -> usize {
        let endpoints = self.running_endpoints();
        let found = agreed_leader(endpoints.clone(), timeout).await;
        self.leader_index(&endpoints, found, timeout)
    }

    fn running_endpoints(&self) -> Vec<(usize, String)> {
        self.running()
            .into_iter()
            .map(|i| (i, self.members[i].endpoint()))
            .collect()
    }

    fn leader_index(
        &self,
        endpoints: &[(usize, String)],
        found: Result<usize, Vec<u64>>,
        timeout: Duration,
    ) -> usize {
        match found {
            Ok(position) => endpoints[position].0,
            Err(leaders) => panic!(
                "members {:?} do not agree on a leader within {timeout:?}: {leaders:x?}\n{}",
                endpoints.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
                self.log_tails()
            ),
        }
    }

    /// The member ID of member `i` (from its Status), if it answers.
    pub fn member_id(&self, i: usize) -> Option<u64> {
        self.status(i)
            .ok()
            .and_then(|s| s.header.map(|h| h.member_id))
    }

    /// Waits until every running member applied at least `index` (Status.raft_applied_index).
    pub fn wait_applied(&self, index: u64, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        for i in self.running() {
            loop {
                if self.status(i).is_ok_and(|s| s.raft_applied_index >= index) {
                    break;
                }
                if Instant::now() > deadline {
                    panic!(
                        "{} did not apply index {index}\n{}",
                        self.members[i].name(),
                        self.log_tails()
                    );
                }
                std::thread::sleep(POLL);
            }
        }
    }

    /// The log tails of all members.
    pub fn log_tails(&self) -> String {
        self.members
            .iter()
            .map(Member::log_tail)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Polls `Maintenance.Status` of `endpoints` until all answer and name the same leader, which
/// is one of them; returns its position in `endpoints`, or after `timeout` the leader IDs of
/// the last poll.
async fn agreed_leader(
    endpoints: Vec<(usize, String)>,
    timeout: Duration,
) -> Result<usize, Vec<u64>> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut statuses = Vec::with_capacity(endpoints.len());
        for (_, endpoint) in &endpoints {
            statuses.push(grpc::status_async(endpoint).await.ok());
        }
        let leaders: Vec<u64> = statuses.iter().flatten().map(|s| s.leader).collect();
        let agreed = !leaders.is_empty()
            && leaders.len() == endpoints.len()
            && leaders[0] != 0
            && leaders.iter().all(|l| *l == leaders[0]);
        if agreed
            && let Some(position) = statuses
                .iter()
                .flatten()
                .position(|s| s.header.as_ref().map(|h| h.member_id) == Some(leaders[0]))
        {
            return Ok(position);
        }
        if Instant::now() > deadline {
            return Err(leaders);
        }
        tokio::time::sleep(POLL).await;
    }
}
