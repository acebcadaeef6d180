//! The data dir's storage version (etcd 3.6 `meta/storageVersion`, issue 16 part 3): the
//! release line whose schema (`backend/schema.rs`) the data dir is written in.
//!
//! On-disk: sled key [`schema::STORAGE_VERSION`] of the member-local tree → `major.minor` as
//! UTF-8. Keel 0.1.0 wrote no such key: a data dir with state but without it is a 0.1 dir.
//! Every start checks it before anything else reads the store:
//! - newer than this binary → refused (an older binary must never write a schema it does not
//!   know; the downgrade procedure lowers the version first, docs/upgrades.md);
//! - older → migrated forward in one atomic step (one sled transaction over both trees), with
//!   a log line;
//! - absent in an empty data dir → this binary's version.

use sled::Transactional as _;

use super::{ParseVersionError, Version};
use crate::backend::schema;

/// The data dir cannot be opened by this binary.
#[derive(Debug, thiserror::Error)]
pub enum StorageVersionError {
    /// sled failed.
    #[error(transparent)]
    Storage(#[from] sled::Error),
    /// The stored value is not a version.
    #[error("stored storage version: {0}")]
    Decode(#[from] ParseVersionError),
    /// The data dir was written by a newer release.
    #[error(
        "data dir storage version {stored} is newer than this binary's {binary}: run Keel \
         {stored} or newer, or downgrade the cluster to {binary} first (docs/upgrades.md)"
    )]
    Newer {
        /// The data dir's storage version.
        stored: Version,
        /// This binary's release line.
        binary: Version,
    },
}

/// What [`check_and_migrate`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageCheck {
    /// A new data dir: stamped with this binary's version.
    Created,
    /// Already at this binary's version.
    Current,
    /// Migrated forward from the given version.
    Migrated(Version),
}

/// Checks the storage version of the data dir whose trees are `local` (member-local) and
/// `member` (replicated) against `binary`, migrating an older dir forward.
///
/// Errors: [`StorageVersionError::Newer`] for a newer dir; sled I/O; an unreadable value.
pub fn check_and_migrate(
    local: &sled::Tree,
    member: &sled::Tree,
    binary: Version,
) -> Result<StorageCheck, StorageVersionError> {
    let stored = match local.get(schema::STORAGE_VERSION)? {
        Some(v) => Some(String::from_utf8_lossy(&v).parse::<Version>()?),
        None if local.is_empty() && member.is_empty() => None,
        // State without a storage version: written by Keel 0.1.0.
        None => Some(Version::MIN),
    };
    let result = match stored {
        Some(s) if s > binary => {
            return Err(StorageVersionError::Newer { stored: s, binary });
        }
        Some(s) if s == binary => return Ok(StorageCheck::Current),
        Some(s) => StorageCheck::Migrated(s),
        None => StorageCheck::Created,
    };
    let stamp = binary.to_string();
    // One transaction over both trees: a crash leaves the dir either untouched or fully
    // migrated. 0.1 → 0.2 adds key spaces whose absence means "empty" (auth, QoS rules,
    // alarms, cluster version), so the stamp is the whole migration; later steps join here.
    (local, member)
        .transaction(|(l, _m)| {
            l.insert(schema::STORAGE_VERSION, stamp.as_bytes())?;
            Ok::<(), sled::transaction::ConflictableTransactionError<()>>(())
        })
        .map_err(|e| match e {
            sled::transaction::TransactionError::Storage(e) => e,
            sled::transaction::TransactionError::Abort(()) => {
                unreachable!("the migration never aborts")
            }
        })?;
    local.flush()?;
    if let StorageCheck::Migrated(from) = result {
        tracing::info!(%from, to = %binary, "migrated the data dir's storage version");
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trees() -> (sled::Db, sled::Tree, sled::Tree) {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let local = db.open_tree(schema::LOCAL_TREE).unwrap();
        let member = db.open_tree(schema::MEMBER_TREE).unwrap();
        (db, local, member)
    }

    fn stored(local: &sled::Tree) -> Option<String> {
        local
            .get(schema::STORAGE_VERSION)
            .unwrap()
            .map(|v| String::from_utf8(v.to_vec()).unwrap())
    }

    #[test]
    fn a_new_dir_is_stamped_with_this_version() {
        let (_db, local, member) = trees();
        assert_eq!(
            check_and_migrate(&local, &member, Version::V0_2).unwrap(),
            StorageCheck::Created
        );
        assert_eq!(stored(&local).as_deref(), Some("0.2"));
        assert_eq!(
            check_and_migrate(&local, &member, Version::V0_2).unwrap(),
            StorageCheck::Current
        );
    }

    #[test]
    fn a_0_1_dir_is_migrated_once() {
        let (_db, local, member) = trees();
        local
            .insert(schema::MEMBER_ID, &7u64.to_be_bytes())
            .unwrap();
        member.insert(b"mformat", &1u64.to_be_bytes()).unwrap();
        assert_eq!(
            check_and_migrate(&local, &member, Version::V0_2).unwrap(),
            StorageCheck::Migrated(Version::MIN)
        );
        assert_eq!(stored(&local).as_deref(), Some("0.2"));
        assert_eq!(
            check_and_migrate(&local, &member, Version::V0_2).unwrap(),
            StorageCheck::Current
        );
    }

    #[test]
    fn a_newer_dir_is_refused_untouched() {
        let (_db, local, member) = trees();
        local.insert(schema::STORAGE_VERSION, b"0.3").unwrap();
        let e = check_and_migrate(&local, &member, Version::V0_2).unwrap_err();
        assert_eq!(
            e.to_string(),
            "data dir storage version 0.3 is newer than this binary's 0.2: run Keel 0.3 or \
             newer, or downgrade the cluster to 0.2 first (docs/upgrades.md)"
        );
        assert_eq!(stored(&local).as_deref(), Some("0.3"));
    }

    #[test]
    fn a_garbled_version_is_an_error_not_a_migration() {
        let (_db, local, member) = trees();
        local.insert(schema::STORAGE_VERSION, b"zz").unwrap();
        assert!(matches!(
            check_and_migrate(&local, &member, Version::V0_2),
            Err(StorageVersionError::Decode(_))
        ));
    }
}
