//! openraft type configuration: what a log entry carries (`Request`), what applying it returns
//! (`Response`), and what the membership config records about a member (`MemberNode`).
//!
//! `Request` and `Response` wrap the prost messages of `keelpb` and serialize as their protobuf
//! bytes, so the WAL and the peer protocol carry the same compact, versionable encoding
//! (fields are only ever added; see docs/compat.md).

use std::fmt;

use keel_proto::keelpb;
use prost::Message;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

openraft::declare_raft_types!(
    /// Keel's openraft types. Node ids are etcd member IDs (u64).
    pub TypeConfig:
        D = Request,
        R = Response,
        NodeId = u64,
        Node = MemberNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = tokio::fs::File,
        AsyncRuntime = openraft::TokioRuntime,
);

/// A member id, as etcd's: 64 bits derived from the peer URLs and the cluster token.
pub type NodeId = u64;
/// Log entry of Keel's raft log.
pub type Entry = openraft::Entry<TypeConfig>;
/// openraft log id (term, leader, index).
pub type LogId = openraft::LogId<NodeId>;
/// openraft storage error.
pub type StorageError = openraft::StorageError<NodeId>;
/// The raft handle.
pub type Raft = openraft::Raft<TypeConfig>;

/// What the raft membership config records about a member: its name and peer URLs.
/// Client URLs are published separately (see `keelpb::MemberAttributes`), as etcd does.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberNode {
    /// Member name (`--name`); empty until the member publishes it.
    pub name: String,
    /// Peer URLs, e.g. `http://127.0.0.1:2380`.
    pub peer_urls: Vec<String>,
}

impl MemberNode {
    /// The URL other members dial to reach this one: the first of its peer URLs (etcd's
    /// peer transport also picks one URL per member).
    pub fn peer_url(&self) -> Option<&String> {
        self.peer_urls.first()
    }
}

impl fmt::Display for MemberNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.name, self.peer_urls.join(","))
    }
}

macro_rules! prost_wrapper {
    ($(#[$doc:meta])* $name:ident, $inner:ty) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Default, PartialEq)]
        pub struct $name(pub $inner);

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_bytes(&self.0.encode_to_vec())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let bytes = d.deserialize_byte_buf(BytesVisitor)?;
                <$inner>::decode(bytes.as_slice())
                    .map($name)
                    .map_err(serde::de::Error::custom)
            }
        }
    };
}

prost_wrapper!(
    /// A state-machine command in a raft log entry (`keelpb.RaftRequest`).
    Request,
    keelpb::RaftRequest
);
prost_wrapper!(
    /// The result of applying one log entry (`keelpb.RaftResponse`).
    Response,
    keelpb::RaftResponse
);

/// Accepts protobuf bytes from formats that encode bytes natively (bincode) or as a
/// sequence of integers (JSON).
struct BytesVisitor;

impl<'de> serde::de::Visitor<'de> for BytesVisitor {
    type Value = Vec<u8>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("protobuf bytes")
    }

    fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
        Ok(v.to_vec())
    }

    fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
        Ok(v)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(b) = seq.next_element::<u8>()? {
            out.push(b);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_proto::etcdserverpb::PutRequest;

    fn put_request() -> Request {
        Request(keelpb::RaftRequest {
            auth_header: None,
            id: 7,
            request: Some(keelpb::raft_request::Request::Put(PutRequest {
                key: b"k".to_vec(),
                value: b"v".to_vec(),
                ..Default::default()
            })),
        })
    }

    #[test]
    fn request_round_trips_through_bincode_and_json() {
        let req = put_request();
        let bin = bincode::serialize(&req).unwrap();
        assert_eq!(bincode::deserialize::<Request>(&bin).unwrap(), req);
        let json = serde_json::to_string(&req).unwrap();
        assert_eq!(serde_json::from_str::<Request>(&json).unwrap(), req);
    }

    #[test]
    fn entry_round_trips_through_bincode() {
        let entry = Entry {
            log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(3, 1), 42),
            payload: openraft::EntryPayload::Normal(put_request()),
        };
        let bin = bincode::serialize(&entry).unwrap();
        let back: Entry = bincode::deserialize(&bin).unwrap();
        assert_eq!(back.log_id, entry.log_id);
        assert!(matches!(back.payload, openraft::EntryPayload::Normal(r) if r == put_request()));
    }
}
