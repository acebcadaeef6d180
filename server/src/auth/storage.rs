//! How auth state is stored in the member tree, and the trait through which apply stages
//! auth's changes into the entry's batch.
//!
//! The keys (first byte `a`, owned by auth) are declared in [`crate::backend::schema`]
//! (`AUTH_*`, documented there and in docs/backend.md); this file encodes and decodes their
//! values: the format version and the revision as u64 BE, the enabled flag as one byte, users
//! and roles as the prost `authpb` messages etcd keeps in its `authUsers` and `authRoles`
//! buckets.
//!
//! Every write goes through [`AuthWrites`], implemented for the apply batch
//! ([`backend::Batch`]), which also carries the entry's consistent index: an auth change and
//! the log position that made it land together or not at all (etcd #11651).

use std::collections::BTreeMap;

use keel_proto::authpb::{Role, User};
use prost::Message;

use crate::backend;
use crate::backend::schema::{
    AUTH_ENABLED, AUTH_FORMAT, AUTH_PREFIX, AUTH_REVISION, AUTH_ROLE_PREFIX, AUTH_USER_PREFIX,
};

/// Current format of the auth records. Bump on any incompatible change.
pub const FORMAT_VERSION: u64 = 1;

/// Where apply records auth's durable changes: the batch of the entry being applied, which
/// the coordinator commits atomically with the consistent index.
///
/// A later write of a key wins over an earlier one in the same batch.
pub trait AuthWrites {
    /// Stages `key = value`.
    fn put(&mut self, key: &[u8], value: Vec<u8>);
    /// Stages the removal of `key`.
    fn remove(&mut self, key: &[u8]);
}

impl AuthWrites for backend::Batch {
    fn put(&mut self, key: &[u8], value: Vec<u8>) {
        self.insert(key, value);
    }
    fn remove(&mut self, key: &[u8]) {
        backend::Batch::remove(self, key);
    }
}

/// The sled key of user `name`.
pub fn user_key(name: &str) -> Vec<u8> {
    [AUTH_USER_PREFIX, name.as_bytes()].concat()
}

/// The sled key of role `name`.
pub fn role_key(name: &str) -> Vec<u8> {
    [AUTH_ROLE_PREFIX, name.as_bytes()].concat()
}

/// Stages the record of `user`.
pub(super) fn put_user(w: &mut impl AuthWrites, name: &str, user: &User) {
    w.put(&user_key(name), user.encode_to_vec());
}

/// Stages the record of `role`.
pub(super) fn put_role(w: &mut impl AuthWrites, name: &str, role: &Role) {
    w.put(&role_key(name), role.encode_to_vec());
}

/// Stages the enabled flag.
pub(super) fn put_enabled(w: &mut impl AuthWrites, enabled: bool) {
    w.put(AUTH_ENABLED, vec![enabled as u8]);
}

/// Stages the auth revision (and the format version beside it, so any store holding auth
/// state names its format).
pub(super) fn put_revision(w: &mut impl AuthWrites, revision: u64) {
    w.put(AUTH_FORMAT, FORMAT_VERSION.to_be_bytes().to_vec());
    w.put(AUTH_REVISION, revision.to_be_bytes().to_vec());
}

/// Why stored auth records could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// A record that is not in the format (the text names the key and what is wrong).
    #[error("auth record {key}: {why}")]
    Record {
        /// The record's key, ASCII-escaped.
        key: String,
        /// What is wrong with it, e.g. `value is not 8 bytes`.
        why: String,
    },
    /// Reading the records from sled failed.
    #[error("reading auth records: {0}")]
    Io(#[from] sled::Error),
}

/// The auth state as stored: what [`decode`] returns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stored {
    /// Auth is enabled.
    pub enabled: bool,
    /// The auth revision (1 on a store that never changed auth).
    pub revision: u64,
    /// Users by name.
    pub users: BTreeMap<String, User>,
    /// Roles by name.
    pub roles: BTreeMap<String, Role>,
}

/// Decodes auth records from `pairs` (key, value), in any order; pairs whose key does not
/// start with [`AUTH_PREFIX`] are skipped, so a whole snapshot's records can be passed.
///
/// Errors (text names the key): an unknown format version, a value of the wrong size, a
/// record that does not decode, a name that is not UTF-8 or differs from the record's own
/// `name`, an unknown `a` key.
pub fn decode<K, V>(pairs: impl IntoIterator<Item = (K, V)>) -> Result<Stored, StorageError>
where
    K: AsRef<[u8]>,
    V: AsRef<[u8]>,
{
    let mut stored = Stored {
        revision: 1,
        ..Default::default()
    };
    for (key, value) in pairs {
        let (key, value) = (key.as_ref(), value.as_ref());
        if key.first() != Some(&AUTH_PREFIX) {
            continue;
        }
        let bad = |why: &str| StorageError::Record {
            key: key.escape_ascii().to_string(),
            why: why.to_string(),
        };
        let u64_be = |v: &[u8]| -> Result<u64, StorageError> {
            Ok(u64::from_be_bytes(
                v.try_into().map_err(|_| bad("value is not 8 bytes"))?,
            ))
        };
        if key == AUTH_FORMAT {
            let format = u64_be(value)?;
            if format != FORMAT_VERSION {
                return Err(bad(&format!(
                    "unsupported format {format} (this binary reads {FORMAT_VERSION})"
                )));
            }
        } else if key == AUTH_ENABLED {
            stored.enabled = match value {
                [0] => false,
                [1] => true,
                _ => return Err(bad("value is not [0] or [1]")),
            };
        } else if key == AUTH_REVISION {
            stored.revision = u64_be(value)?;
        } else if let Some(name) = key.strip_prefix(AUTH_USER_PREFIX) {
            let name = std::str::from_utf8(name).map_err(|_| bad("name is not UTF-8"))?;
            let user = User::decode(value).map_err(|e| bad(&format!("does not decode: {e}")))?;
            if user.name != name.as_bytes() {
                return Err(bad("record names another user"));
            }
            if !user.roles.is_sorted() {
                return Err(bad("roles are not sorted"));
            }
            stored.users.insert(name.to_string(), user);
        } else if let Some(name) = key.strip_prefix(AUTH_ROLE_PREFIX) {
            let name = std::str::from_utf8(name).map_err(|_| bad("name is not UTF-8"))?;
            let role = Role::decode(value).map_err(|e| bad(&format!("does not decode: {e}")))?;
            if role.name != name.as_bytes() {
                return Err(bad("record names another role"));
            }
            stored.roles.insert(name.to_string(), role);
        } else {
            return Err(bad("unknown auth key"));
        }
    }
    Ok(stored)
}

/// Reads every auth record of `tree` (see [`decode`]).
///
/// Errors: sled I/O, or what [`decode`] rejects.
pub fn read_tree(tree: &sled::Tree) -> Result<Stored, StorageError> {
    let pairs: Vec<(sled::IVec, sled::IVec)> =
        tree.scan_prefix([AUTH_PREFIX]).collect::<Result<_, _>>()?;
    decode(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_store_is_disabled_at_revision_one() {
        let stored = decode(Vec::<(Vec<u8>, Vec<u8>)>::new()).unwrap();
        assert!(!stored.enabled);
        assert_eq!(stored.revision, 1);
        assert!(stored.users.is_empty() && stored.roles.is_empty());
    }

    #[test]
    fn rejects_foreign_or_corrupt_records() {
        let err = |pairs: Vec<(&[u8], Vec<u8>)>| decode(pairs).unwrap_err().to_string();
        assert!(err(vec![(AUTH_FORMAT, 2u64.to_be_bytes().to_vec())]).contains("format 2"));
        assert!(err(vec![(AUTH_ENABLED, vec![2])]).contains("[0] or [1]"));
        assert!(err(vec![(AUTH_REVISION, vec![1, 2])]).contains("8 bytes"));
        assert!(err(vec![(b"a/other", vec![])]).contains("unknown auth key"));
        let alice = User {
            name: b"alice".to_vec(),
            ..Default::default()
        };
        assert!(err(vec![(b"a/user/bob", alice.encode_to_vec())]).contains("another user"));
        assert!(err(vec![(b"a/user/alice", vec![0xff])]).contains("does not decode"));
    }

    #[test]
    fn skips_other_components_keys() {
        let stored = decode(vec![
            (backend::schema::CONSISTENT_INDEX, vec![1, 2, 3]),
            (b"k\0\0".as_slice(), vec![9]),
            (AUTH_ENABLED, vec![1]),
        ])
        .unwrap();
        assert!(stored.enabled);
    }
}
