//! The etcd view of raft membership: member lists, peer URL validation, IDs of added members
//! and the "started members" quorum rules of etcd's strict reconfiguration check
//! (etcd `membership.RaftCluster.IsReadyTo{Add,Remove,Promote}...`).

use keel_proto::etcdserverpb::Member;
use openraft::Membership;

use crate::error::EtcdError;
use crate::membership::{Attributes, member_id};
use crate::raft::types::{MemberNode, NodeId};

/// The members of `membership`, voters and learners, in ID order, with the name and client
/// URLs each published (empty until it started, as in etcd).
pub fn member_list(
    membership: &Membership<NodeId, MemberNode>,
    attributes: &Attributes,
) -> Vec<Member> {
    let learners: Vec<NodeId> = membership.learner_ids().collect();
    membership
        .nodes()
        .map(|(id, node)| to_member(*id, node, learners.contains(id), attributes))
        .collect()
}

/// One member as etcd reports it.
pub fn to_member(
    id: NodeId,
    node: &MemberNode,
    is_learner: bool,
    attributes: &Attributes,
) -> Member {
    let attrs = attributes.get(id);
    Member {
        id,
        name: attrs
            .as_ref()
            .map_or_else(|| node.name.clone(), |a| a.name.clone()),
        peer_ur_ls: node.peer_urls.clone(),
        client_ur_ls: attrs.map_or_else(Vec::new, |a| a.client_urls),
        is_learner,
    }
}

/// Validates peer URLs as etcd's `types.NewURLs` does and returns them sorted: at least one;
/// each `http://` or `https://` with `host:port` and no path.
///
/// Errors: `MemberBadUrls` ("etcdserver: given member URLs are invalid").
pub fn validate_peer_urls(urls: &[String]) -> Result<Vec<String>, EtcdError> {
    if urls.is_empty() {
        return Err(EtcdError::MemberBadUrls);
    }
    let mut out = Vec::with_capacity(urls.len());
    for url in urls {
        let rest = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("https://"))
            .ok_or(EtcdError::MemberBadUrls)?;
        let (host, port) = rest.rsplit_once(':').ok_or(EtcdError::MemberBadUrls)?;
        let port_ok = !port.is_empty()
            && port.bytes().all(|b| b.is_ascii_digit())
            && port.parse::<u16>().is_ok();
        if host.is_empty() || host.contains('/') || !port_ok {
            return Err(EtcdError::MemberBadUrls);
        }
        out.push(url.clone());
    }
    out.sort();
    Ok(out)
}

/// The ID etcd gives a member added at `unix_seconds`: SHA-1 over its sorted peer URLs and the
/// decimal time (etcd `NewMember(name, urls, "", &now)` → `computeMemberID`).
pub fn added_member_id(sorted_urls: &[String], unix_seconds: u64) -> NodeId {
    member_id(sorted_urls, &unix_seconds.to_string())
}

/// etcd `IsReadyToAddVotingMember`: after adding one more voter, the started voters are
/// still a quorum (a single started voter may always add a second one).
pub fn ready_to_add_voter(voters: usize, started: usize) -> bool {
    let members = voters + 1;
    if started == 1 && members == 2 {
        return true;
    }
    started > members / 2
}

/// etcd `IsReadyToRemoveVotingMember`: the started voters other than the removed one are a
/// quorum of the remaining voters. `voters`/`started` exclude the removed member.
pub fn ready_to_remove_voter(voters: usize, started: usize) -> bool {
    started > voters / 2
}

/// etcd `IsReadyToPromoteMember`: counting the learner as a started voter, the started voters
/// are a quorum of the voters after the promotion.
pub fn ready_to_promote(voters: usize, started: usize) -> bool {
    let (members, started) = (voters + 1, started + 1);
    started > members / 2
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    #[test]
    fn peer_urls_follow_etcd_rules() {
        let ok = validate_peer_urls(&["http://b:2".into(), "https://a:1".into()]).unwrap();
        assert_eq!(
            ok,
            vec!["http://b:2".to_string(), "https://a:1".to_string()]
        );
        for bad in [
            "",
            "a:1",
            "http://a",
            "http://a:",
            "http://a:x",
            "http://a:1/p",
            "ftp://a:1",
            "http://:1",
            "http://a:99999",
        ] {
            assert_eq!(
                validate_peer_urls(&[bad.to_string()]),
                Err(EtcdError::MemberBadUrls),
                "{bad}"
            );
        }
        assert_eq!(validate_peer_urls(&[]), Err(EtcdError::MemberBadUrls));
    }

    #[test]
    fn added_ids_depend_on_urls_and_time() {
        let u = vec!["http://127.0.0.1:2380".to_string()];
        assert_eq!(added_member_id(&u, 100), added_member_id(&u, 100));
        assert_ne!(added_member_id(&u, 100), added_member_id(&u, 101));
        assert_eq!(added_member_id(&u, 100), member_id(&u, "100"));
    }

    #[test]
    fn quorum_rules_match_etcd() {
        // 1 started voter may add a second.
        assert!(ready_to_add_voter(1, 1));
        // 3 voters, 2 started: adding a 4th needs 3 started.
        assert!(!ready_to_add_voter(3, 2));
        assert!(ready_to_add_voter(3, 3));
        // Removing one of 3 voters: 2 remain, quorum 2.
        assert!(ready_to_remove_voter(2, 2));
        assert!(!ready_to_remove_voter(2, 1));
        // Removing the last voter is never ready.
        assert!(!ready_to_remove_voter(0, 0));
        // Promoting a learner in a 3-voter cluster with one voter down: 3 of 4 started.
        assert!(ready_to_promote(3, 2));
        assert!(!ready_to_promote(3, 1));
    }

    #[test]
    fn member_list_marks_learners_and_uses_published_names() {
        let mut nodes = BTreeMap::new();
        nodes.insert(
            1u64,
            MemberNode {
                name: "a".into(),
                peer_urls: vec!["http://a:1".into()],
            },
        );
        nodes.insert(
            2u64,
            MemberNode {
                name: String::new(),
                peer_urls: vec!["http://b:1".into()],
            },
        );
        let m = Membership::new(vec![BTreeSet::from([1u64])], nodes);
        let attrs = Attributes::default();
        attrs.publish(keel_proto::keelpb::MemberAttributes {
            member_id: 1,
            name: "alpha".into(),
            client_urls: vec!["http://a:2".into()],
            ..Default::default()
        });
        let list = member_list(&m, &attrs);
        assert_eq!(list.len(), 2);
        assert_eq!(
            (list[0].id, list[0].name.as_str(), list[0].is_learner),
            (1, "alpha", false)
        );
        assert_eq!(list[0].client_ur_ls, vec!["http://a:2".to_string()]);
        assert_eq!(
            (list[1].id, list[1].name.as_str(), list[1].is_learner),
            (2, "", true)
        );
        assert!(list[1].client_ur_ls.is_empty());
    }
}
