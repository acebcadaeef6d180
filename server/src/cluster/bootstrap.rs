//! Who this member is and which cluster it belongs to, decided once at first start
//! (etcd `--initial-cluster`, `--initial-cluster-state`, `--initial-cluster-token`).
//!
//! - `new`: every member derives the same member IDs from `--initial-cluster` and the token
//!   (SHA-1 of sorted peer URLs + token) and the same cluster ID from them, as etcd does, and
//!   bootstraps raft with all of them as voters. All members started with the same flags form
//!   one cluster.
//! - `existing`: the member was added with `MemberAdd` beforehand. It asks the other members
//!   of `--initial-cluster` (`keelpb.Peer/ClusterInfo`) for the cluster ID and finds its own
//!   member ID by its peer URLs; raft then receives the log (or a snapshot) from the leader.
//!
//! The member ID is stored in the data dir's local sled tree (never replicated, never part of
//! a snapshot) and the cluster ID in the replicated tree, so a restart ignores the flags, as
//! etcd does (keys: [`schema::MEMBER_ID`], [`schema::CLUSTER_ID`]).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, bail};
use keel_proto::keelpb::ClusterInfoRequest;

use crate::backend::{Backend, schema};
use crate::membership::{self, InitialMember};
use crate::raft::Peers;
use crate::raft::types::{MemberNode, NodeId};

/// How long a joining member keeps asking its peers for the cluster.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(15);
/// Deadline of one `ClusterInfo` call.
const DISCOVERY_RPC_TIMEOUT: Duration = Duration::from_secs(2);

/// The flags that decide a member's identity at its first start (etcd's names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flags {
    /// `--name`.
    pub name: String,
    /// `--initial-cluster`: `name=peer-url,...`.
    pub initial_cluster: String,
    /// `--initial-advertise-peer-urls`, one URL per element.
    pub advertise_peer_urls: Vec<String>,
    /// `--initial-cluster-token`: member and cluster IDs derive from it.
    pub token: String,
    /// `--initial-cluster-state new` (`false`: `existing`).
    pub new_cluster: bool,
}

/// The result of [`identify`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// This member's ID.
    pub id: NodeId,
    /// The cluster ID.
    pub cluster_id: u64,
    /// With `new`: the initial voters to bootstrap raft with (used only while raft is not
    /// initialized yet). `None` with `existing`.
    pub initial_members: Option<BTreeMap<NodeId, MemberNode>>,
}

/// Decides this member's identity (see the module docs) and persists it in `backend`.
///
/// Errors: `--initial-cluster` lacks this member or disagrees with
/// `--initial-advertise-peer-urls`; with `existing`, no peer answers within 15 s or the
/// cluster has no member with this member's peer URLs; sled I/O.
pub async fn identify(flags: &Flags, backend: &Backend, peers: &Peers) -> anyhow::Result<Identity> {
    let initial = membership::parse_initial_cluster(&flags.initial_cluster)?;
    let my_urls = own_peer_urls(flags, &initial)?;
    let token = &flags.token;
    let initial_members: BTreeMap<NodeId, MemberNode> = initial
        .iter()
        .map(|m| {
            let node = MemberNode {
                name: m.name.clone(),
                peer_urls: m.peer_urls.clone(),
            };
            (membership::member_id(&m.peer_urls, token), node)
        })
        .collect();
    let is_new = flags.new_cluster;

    let (local, tree) = (backend.local()?, backend.tree());
    let stored_id = read_u64(&local, schema::MEMBER_ID)?;
    let stored_cluster = read_u64(tree, schema::CLUSTER_ID)?;
    let (id, cluster_id) = match (stored_id, stored_cluster) {
        (Some(id), Some(cid)) => (id, cid),
        // A data dir of a version that did not store the member ID: it was a `new` member.
        (None, Some(cid)) => (membership::member_id(&my_urls, token), cid),
        _ if is_new => {
            let ids: Vec<NodeId> = initial_members.keys().copied().collect();
            (
                membership::member_id(&my_urls, token),
                membership::cluster_id(&ids),
            )
        }
        _ => discover(&initial, &flags.name, &my_urls, peers).await?,
    };
    local.insert(schema::MEMBER_ID, &id.to_be_bytes())?;
    tree.insert(schema::CLUSTER_ID, &cluster_id.to_be_bytes())?;
    backend.flush_async().await?;
    Ok(Identity {
        id,
        cluster_id,
        initial_members: is_new.then_some(initial_members),
    })
}

/// This member's peer URLs, checked against its `--initial-cluster` entry.
fn own_peer_urls(flags: &Flags, initial: &[InitialMember]) -> anyhow::Result<Vec<String>> {
    let my_urls = flags.advertise_peer_urls.clone();
    let me = initial
        .iter()
        .find(|m| m.name == flags.name)
        .with_context(|| {
            // etcd `ServerConfig.VerifyBootstrap` / `VerifyJoinExisting`, byte for byte.
            format!(
                "couldn't find local name {:?} in the initial cluster configuration",
                flags.name
            )
        })?;
    let (mut listed, mut advertised) = (me.peer_urls.clone(), my_urls.clone());
    listed.sort();
    advertised.sort();
    if listed != advertised {
        bail!(
            "--initial-cluster has {}={:?} but --initial-advertise-peer-urls is {:?}",
            flags.name,
            me.peer_urls,
            my_urls
        );
    }
    Ok(my_urls)
}

/// Asks the other members of `--initial-cluster` for the cluster ID and this member's ID.
async fn discover(
    initial: &[InitialMember],
    my_name: &str,
    my_urls: &[String],
    peers: &Peers,
) -> anyhow::Result<(NodeId, u64)> {
    let urls: Vec<&String> = initial
        .iter()
        .filter(|m| m.name != my_name)
        .flat_map(|m| m.peer_urls.iter())
        .collect();
    if urls.is_empty() {
        bail!("--initial-cluster-state existing needs the other members in --initial-cluster");
    }
    let mut sorted_mine = my_urls.to_vec();
    sorted_mine.sort();
    let deadline = tokio::time::Instant::now() + DISCOVERY_TIMEOUT;
    let mut last_error = String::from("no peer answered");
    while tokio::time::Instant::now() < deadline {
        for url in &urls {
            let Ok(mut client) = peers.client(url) else {
                continue;
            };
            let mut request = tonic::Request::new(ClusterInfoRequest {});
            request.set_timeout(DISCOVERY_RPC_TIMEOUT);
            match client.cluster_info(request).await {
                Ok(resp) => {
                    let info = resp.into_inner();
                    let mine = info.members.iter().find(|m| {
                        let mut u = m.peer_ur_ls.clone();
                        u.sort();
                        u == sorted_mine
                    });
                    match mine {
                        Some(m) => {
                            tracing::info!(
                                member_id = format!("{:x}", m.id),
                                cluster_id = format!("{:x}", info.cluster_id),
                                peer = %url,
                                "joining an existing cluster"
                            );
                            return Ok((m.id, info.cluster_id));
                        }
                        None => {
                            last_error = format!(
                                "cluster {:x} (asked {url}) has no member with peer URLs {my_urls:?}; \
                                 add this member with `etcdctl member add` first",
                                info.cluster_id
                            )
                        }
                    }
                }
                Err(status) => {
                    peers.reset(url);
                    last_error = format!("{url}: {}", crate::raft::peers::describe(&status));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!("--initial-cluster-state existing: cannot join the cluster: {last_error}")
}

fn read_u64(tree: &sled::Tree, key: &[u8]) -> anyhow::Result<Option<u64>> {
    match tree.get(key)? {
        None => Ok(None),
        Some(v) => Ok(Some(u64::from_be_bytes(
            v.as_ref()
                .try_into()
                .with_context(|| format!("{} is not 8 bytes", key.escape_ascii()))?,
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(name: &str, state: &str) -> Flags {
        let port = match name {
            "a" => 1,
            "b" => 2,
            _ => 3,
        };
        Flags {
            name: name.into(),
            initial_cluster: "a=http://127.0.0.1:1,b=http://127.0.0.1:2,c=http://127.0.0.1:3"
                .into(),
            advertise_peer_urls: vec![format!("http://127.0.0.1:{port}")],
            token: "etcd-cluster".into(),
            new_cluster: state == "new",
        }
    }

    fn backend() -> Backend {
        Backend::temporary().unwrap()
    }

    #[tokio::test]
    async fn a_name_missing_from_the_initial_cluster_gets_etcds_text() {
        for state in ["new", "existing"] {
            let err = identify(&flags("default", state), &backend(), &Peers::default())
                .await
                .unwrap_err();
            assert_eq!(
                err.to_string(),
                "couldn't find local name \"default\" in the initial cluster configuration"
            );
        }
    }

    #[tokio::test]
    async fn new_members_agree_on_ids_and_keep_them_across_restarts() {
        let peers = Peers::default();
        let mut seen = Vec::new();
        for name in ["a", "b", "c"] {
            let backend = backend();
            let ident = identify(&flags(name, "new"), &backend, &peers)
                .await
                .unwrap();
            let members = ident.initial_members.clone().unwrap();
            assert_eq!(members.len(), 3);
            assert!(members.contains_key(&ident.id));
            seen.push(ident.clone());
            // A restart with other flags keeps the stored identity.
            let mut changed = flags(name, "new");
            changed.token = "other".into();
            let again = identify(&changed, &backend, &peers).await.unwrap();
            assert_eq!((again.id, again.cluster_id), (ident.id, ident.cluster_id));
        }
        assert!(seen.iter().all(|i| i.cluster_id == seen[0].cluster_id));
        assert_eq!(
            seen.iter()
                .map(|i| i.id)
                .collect::<std::collections::BTreeSet<_>>()
                .len(),
            3
        );
        assert_eq!(
            seen[0].id,
            membership::member_id(&["http://127.0.0.1:1".to_string()], "etcd-cluster")
        );
    }

    #[tokio::test]
    async fn flags_that_do_not_describe_this_member_are_refused() {
        let backend = backend();
        let mut c = flags("a", "new");
        c.advertise_peer_urls = vec!["http://127.0.0.1:9".into()];
        let err = identify(&c, &backend, &Peers::default()).await.unwrap_err();
        assert!(
            err.to_string().contains("--initial-advertise-peer-urls"),
            "{err}"
        );
        let mut c = flags("a", "new");
        c.name = "z".into();
        let err = identify(&c, &backend, &Peers::default()).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "couldn't find local name \"z\" in the initial cluster configuration"
        );
    }
}
