//! Attributes members publish through raft: name and client URLs (etcd's `publish`).
//!
//! On-disk: sled key [`schema::MEMBER_ATTRIBUTES_PREFIX`] + member ID (8 bytes BE) → protobuf
//! `keelpb.MemberAttributes`, written in the apply batch of the entry that published them
//! (`docs/backend.md`).

use std::collections::BTreeMap;
use std::sync::RwLock;

use keel_proto::keelpb::MemberAttributes;
use prost::Message;

use crate::backend::{Batch, schema};

/// Stored member attributes that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    /// sled failed.
    #[error(transparent)]
    Storage(#[from] sled::Error),
    /// A stored value does not decode (a corrupt or foreign store).
    #[error("member attributes {key}: {error}")]
    Decode {
        /// The sled key, escaped for display.
        key: String,
        /// What prost said.
        error: prost::DecodeError,
    },
}

/// In-memory view of the published attributes, loaded at start and updated by apply.
#[derive(Default)]
pub struct Attributes {
    by_member: RwLock<BTreeMap<u64, MemberAttributes>>,
}

impl Attributes {
    /// Loads all published attributes from the store.
    ///
    /// Errors: sled I/O or a value that does not decode.
    pub fn load(tree: &sled::Tree) -> Result<Attributes, MembershipError> {
        let mut by_member = BTreeMap::new();
        for kv in tree.scan_prefix(schema::MEMBER_ATTRIBUTES_PREFIX) {
            let (k, v) = kv?;
            let a =
                MemberAttributes::decode(v.as_ref()).map_err(|error| MembershipError::Decode {
                    key: k.escape_ascii().to_string(),
                    error,
                })?;
            by_member.insert(a.member_id, a);
        }
        Ok(Attributes {
            by_member: RwLock::new(by_member),
        })
    }

    /// Stages `attrs` into an apply batch; call [`Attributes::publish`] after the batch lands.
    pub fn stage(batch: &mut Batch, attrs: &MemberAttributes) {
        let key = schema::id_key(
            schema::MEMBER_ATTRIBUTES_PREFIX,
            attrs.member_id.to_be_bytes(),
        );
        batch.insert(key, attrs.encode_to_vec());
    }

    /// Makes applied attributes visible to readers.
    pub fn publish(&self, attrs: MemberAttributes) {
        self.by_member
            .write()
            .expect("attributes lock")
            .insert(attrs.member_id, attrs);
    }

    /// The attributes a member published, if any.
    pub fn get(&self, member_id: u64) -> Option<MemberAttributes> {
        self.by_member
            .read()
            .expect("attributes lock")
            .get(&member_id)
            .cloned()
    }
}
