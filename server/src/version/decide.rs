//! The leader's decision of the cluster version (etcd `version/monitor.go`,
//! `UpdateClusterVersionIfNeeded`): the lowest server version over all members, proposed only
//! when it is higher than the current one, or when none is decided yet; no decision while any
//! member is unknown (etcd: "any member unknown or unreachable → no change").

use super::Version;

/// The cluster version the leader should propose, if any.
///
/// `current` is the applied cluster version (`None`: never decided); `members` holds every
/// member's (voters and learners) published server version ([`super::published`]: 0.1 for a
/// Keel 0.1.0 member, whose attributes carry none), `None` for a member that published no
/// attributes yet: then nothing is decided, so an unknown member holds the cluster version
/// where it is (and a new cluster's first decision waits for every member). `downgrade_target` is the target of an enabled downgrade: then the cluster version
/// goes to the target and no higher. Returns `None` when nothing changes; never a version
/// lower than `current` except the downgrade target.
pub fn decide(
    current: Option<Version>,
    members: impl IntoIterator<Item = Option<Version>>,
    downgrade_target: Option<Version>,
) -> Option<Version> {
    let known: Option<Vec<Version>> = members.into_iter().collect();
    let lowest = known?.into_iter().min()?;
    let wanted = match downgrade_target {
        Some(target) => target.min(lowest),
        None => lowest,
    };
    match current {
        None => Some(wanted),
        Some(c) if wanted > c => Some(wanted),
        Some(c) if downgrade_target == Some(wanted) && wanted < c => Some(wanted),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1: Version = Version::MIN;
    const V2: Version = Version::V0_2;

    #[test]
    fn the_lowest_member_decides_and_it_only_rises() {
        assert_eq!(decide(None, [Some(V2), Some(V2), Some(V2)], None), Some(V2));
        assert_eq!(decide(None, [Some(V2), Some(V1), Some(V2)], None), Some(V1));
        // An unknown member (no attributes yet) holds every decision.
        assert_eq!(decide(None, [Some(V2), None, Some(V2)], None), None);
        assert_eq!(decide(Some(V1), [Some(V2), None, Some(V2)], None), None);
        assert_eq!(decide(Some(V1), [Some(V2); 3], None), Some(V2));
        assert_eq!(decide(Some(V2), [Some(V2); 3], None), None);
        // A member that runs an older release again does not lower it without a downgrade.
        assert_eq!(decide(Some(V2), [Some(V2), Some(V1), Some(V2)], None), None);
        // No members known: nothing to decide.
        assert_eq!(decide(None, [], None), None);
    }

    #[test]
    fn a_downgrade_lowers_it_to_the_target_and_holds_it_there() {
        assert_eq!(decide(Some(V2), [Some(V2); 3], Some(V1)), Some(V1));
        assert_eq!(decide(Some(V1), [Some(V2); 3], Some(V1)), None);
        assert_eq!(
            decide(Some(V1), [Some(V1), Some(V2), Some(V2)], Some(V1)),
            None
        );
    }
}
