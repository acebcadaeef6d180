//! Member and cluster IDs, computed exactly as etcd does so that IDs match what etcd would
//! print for the same flags (etcd `server/etcdserver/api/membership/member.go`
//! `computeMemberID`, and `cluster.go` `genID`).

use sha1::{Digest, Sha1};

/// One `name=url` group of `--initial-cluster`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitialMember {
    /// Member name.
    pub name: String,
    /// Its peer URLs (a name may repeat in the flag to give several URLs).
    pub peer_urls: Vec<String>,
}

/// A `--initial-cluster` value that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InitialClusterError {
    /// An element without `=`, or with an empty name or URL.
    #[error("--initial-cluster: {0:?} is not name=url")]
    NotNameUrl(String),
    /// A URL that is not http(s).
    #[error("--initial-cluster: URL {0:?} must start with http:// or https://")]
    Scheme(String),
    /// No member at all.
    #[error("--initial-cluster is empty")]
    Empty,
}

/// Parses `--initial-cluster` (`name1=http://a:2380,name2=http://b:2380`).
///
/// Errors: an element without `=`, an empty name or URL, or a URL that is not http(s).
pub fn parse_initial_cluster(spec: &str) -> Result<Vec<InitialMember>, InitialClusterError> {
    let mut members: Vec<InitialMember> = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let not_name_url = || InitialClusterError::NotNameUrl(part.to_string());
        let (name, url) = part.split_once('=').ok_or_else(not_name_url)?;
        if name.is_empty() || url.is_empty() {
            return Err(not_name_url());
        }
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(InitialClusterError::Scheme(url.to_string()));
        }
        match members.iter_mut().find(|m| m.name == name) {
            Some(m) => m.peer_urls.push(url.to_string()),
            None => members.push(InitialMember {
                name: name.to_string(),
                peer_urls: vec![url.to_string()],
            }),
        }
    }
    if members.is_empty() {
        return Err(InitialClusterError::Empty);
    }
    Ok(members)
}

/// etcd's member ID: the first 8 bytes (big endian) of SHA-1 over the sorted, concatenated
/// peer URLs followed by the cluster token (`--initial-cluster-token`).
pub fn member_id(peer_urls: &[String], cluster_token: &str) -> u64 {
    let mut urls = peer_urls.to_vec();
    urls.sort();
    let mut h = Sha1::new();
    h.update(urls.concat().as_bytes());
    h.update(cluster_token.as_bytes());
    first_u64(&h.finalize())
}

/// etcd's cluster ID: the first 8 bytes (big endian) of SHA-1 over the sorted member IDs,
/// each as 8 big-endian bytes.
pub fn cluster_id(member_ids: &[u64]) -> u64 {
    let mut ids = member_ids.to_vec();
    ids.sort_unstable();
    let mut h = Sha1::new();
    for id in ids {
        h.update(id.to_be_bytes());
    }
    first_u64(&h.finalize())
}

fn first_u64(digest: &[u8]) -> u64 {
    u64::from_be_bytes(digest[..8].try_into().expect("sha1 has 20 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_match_etcd_for_its_default_single_member() {
        // A default `etcd` (peer http://localhost:2380, token etcd-cluster) reports member
        // 8e9e05c52164694d in cluster cdf818194e3a8c32.
        let id = member_id(&["http://localhost:2380".to_string()], "etcd-cluster");
        assert_eq!(format!("{id:x}"), "8e9e05c52164694d");
        assert_eq!(format!("{:x}", cluster_id(&[id])), "cdf818194e3a8c32");
    }

    #[test]
    fn initial_cluster_groups_urls_by_name() {
        let m = parse_initial_cluster("a=http://1:2380,b=http://2:2380,a=http://3:2380").unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].peer_urls, vec!["http://1:2380", "http://3:2380"]);
        assert_eq!(
            parse_initial_cluster("a").unwrap_err().to_string(),
            "--initial-cluster: \"a\" is not name=url"
        );
        assert_eq!(
            parse_initial_cluster("a=ftp://x").unwrap_err().to_string(),
            "--initial-cluster: URL \"ftp://x\" must start with http:// or https://"
        );
        assert_eq!(
            parse_initial_cluster("").unwrap_err(),
            InitialClusterError::Empty
        );
    }
}
