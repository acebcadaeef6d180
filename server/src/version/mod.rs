//! Keel versions (issue 16, docs/upgrades.md): this binary's server version, the cluster
//! version every member applies from the log, the table of what each cluster version enables,
//! the leader's decision of the cluster version, and the data dir's storage version.
//!
//! Invariants:
//! - the cluster version is replicated state: it changes only by applying a
//!   `cluster_version_set` entry, staged with the consistent index, so every member holds the
//!   same value after the same log index;
//! - it never rises above the lowest server version a member published (a member without a
//!   published version counts as [`Version::MIN`], 0.1, the release without the mechanism);
//! - a gated entry is refused before proposing and again at apply against the applied cluster
//!   version, so an entry that raced a lower cluster version is refused alike on every member.

mod cluster;
mod decide;
mod downgrade;
pub mod gates;
mod storage;

use std::fmt;
use std::str::FromStr;

#[cfg(test)]
pub(crate) use cluster::store_for_test;
pub use cluster::{ClusterVersion, ClusterVersionError};
pub use decide::decide;
pub use downgrade::{Downgrade, validate as validate_downgrade};
pub use gates::{Gate, GateRefusal};
pub use storage::{StorageCheck, StorageVersionError, check_and_migrate};

/// A Keel release line, `major.minor` (patch releases never change what is replicated).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Major release number.
    pub major: u32,
    /// Minor release number.
    pub minor: u32,
}

impl Version {
    /// Keel 0.1: the first release, which publishes no server version.
    pub const MIN: Version = Version::new(0, 1);
    /// Keel 0.2: this release (cluster versions, gates, storage versions).
    pub const V0_2: Version = Version::new(0, 2);

    /// `major.minor`.
    pub const fn new(major: u32, minor: u32) -> Version {
        Version { major, minor }
    }

    /// The release line one minor below, if any (the only allowed downgrade target).
    pub fn previous_minor(self) -> Option<Version> {
        self.minor
            .checked_sub(1)
            .map(|minor| Version::new(self.major, minor))
    }
}

/// This binary's full release (`CARGO_PKG_VERSION`, "0.2.0").
pub const SERVER_VERSION_FULL: &str = env!("CARGO_PKG_VERSION");

/// This binary's release line (`major.minor` of [`SERVER_VERSION_FULL`]).
pub fn server_version() -> Version {
    SERVER_VERSION_FULL
        .parse()
        .expect("CARGO_PKG_VERSION is major.minor.patch")
}

/// A version string that is not `major.minor` or `major.minor.patch`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid version {0:?}: want major.minor or major.minor.patch")]
pub struct ParseVersionError(pub String);

/// Parses `X.Y` or `X.Y.Z` (the patch is dropped: `0.2.7` is line 0.2).
impl FromStr for Version {
    type Err = ParseVersionError;

    fn from_str(s: &str) -> Result<Version, ParseVersionError> {
        let bad = || ParseVersionError(s.to_string());
        let mut parts = s.split('.');
        let mut number = |required: bool| -> Result<Option<u32>, ParseVersionError> {
            match parts.next() {
                Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
                    p.parse().map(Some).map_err(|_| bad())
                }
                None if !required => Ok(None),
                _ => Err(bad()),
            }
        };
        let major = number(true)?.ok_or_else(bad)?;
        let minor = number(true)?.ok_or_else(bad)?;
        number(false)?;
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(Version::new(major, minor))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The version a member published in its attributes; empty (Keel 0.1.0 has no such field)
/// or unreadable counts as [`Version::MIN`].
pub fn published(server_version: &str) -> Version {
    server_version.parse().unwrap_or(Version::MIN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_major_minor() {
        assert_eq!("0.2".parse(), Ok(Version::new(0, 2)));
        assert_eq!("0.2.0".parse(), Ok(Version::new(0, 2)));
        assert_eq!("3.15.7".parse(), Ok(Version::new(3, 15)));
        for bad in [
            "", "0", "0.", ".1", "a.b", "0.1.2.3", "0.-1", "v0.1", "0.1.",
        ] {
            assert_eq!(
                bad.parse::<Version>(),
                Err(ParseVersionError(bad.into())),
                "{bad:?}"
            );
        }
        assert_eq!(Version::new(0, 2).to_string(), "0.2");
        assert!(Version::new(0, 10) > Version::new(0, 9));
        assert!(Version::new(1, 0) > Version::new(0, 99));
    }

    #[test]
    fn this_release_is_0_2() {
        assert_eq!(SERVER_VERSION_FULL, "0.2.0");
        assert_eq!(server_version(), Version::V0_2);
        assert_eq!(Version::V0_2.previous_minor(), Some(Version::MIN));
        assert_eq!(Version::new(1, 0).previous_minor(), None);
    }

    #[test]
    fn a_member_without_a_version_counts_as_0_1() {
        assert_eq!(published(""), Version::MIN);
        assert_eq!(published("garbage"), Version::MIN);
        assert_eq!(published("0.2.0"), Version::V0_2);
    }
}
