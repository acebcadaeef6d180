//! Attributes members publish through raft: name and client URLs (etcd's `publish`).
//!
//! On-disk: sled key `s/attr/<member id, 8 bytes BE>` → protobuf `keelpb.MemberAttributes`,
//! written in the apply batch of the entry that published them.

use std::collections::BTreeMap;
use std::sync::RwLock;

use keel_proto::keelpb::MemberAttributes;
use prost::Message;

const PREFIX: &[u8] = b"s/attr/";

/// In-memory view of the published attributes, loaded at start and updated by apply.
#[derive(Default)]
pub struct Attributes {
    by_member: RwLock<BTreeMap<u64, MemberAttributes>>,
}

impl Attributes {
    /// Loads all published attributes from the store.
    pub fn load(tree: &sled::Tree) -> Result<Attributes, String> {
        let mut by_member = BTreeMap::new();
        for kv in tree.scan_prefix(PREFIX) {
            let (_, v) = kv.map_err(|e| e.to_string())?;
            let a = MemberAttributes::decode(v.as_ref()).map_err(|e| e.to_string())?;
            by_member.insert(a.member_id, a);
        }
        Ok(Attributes {
            by_member: RwLock::new(by_member),
        })
    }

    /// Stages `attrs` into an apply batch; call [`Attributes::publish`] after the batch lands.
    pub fn stage(batch: &mut crate::mvcc::Writes, attrs: &MemberAttributes) {
        let mut key = PREFIX.to_vec();
        key.extend_from_slice(&attrs.member_id.to_be_bytes());
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
