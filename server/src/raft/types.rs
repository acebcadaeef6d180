//! openraft type configuration: what a log entry carries (`Request`), what applying it returns
//! (`Response`), and what the membership config records about a member (`MemberNode`).
//!
//! `Request` and `Response` wrap the prost messages of `keelpb` and serialize as their protobuf
//! bytes, so the WAL and the peer protocol carry the same compact, versionable encoding
//! (fields are only ever added; see docs/compat.md).
//!
//! A `Request` is encoded once (issue 20 part 4, "encode once"): it keeps the protobuf bytes
//! it was built from or decoded from next to the decoded message, behind one `Arc`. The
//! leader's WAL write and every AppendEntries to a follower copy those bytes, a follower
//! writes to its WAL the bytes the leader sent, and the copies of an entry that openraft, the
//! in-memory log tail and apply hold share one allocation.
//!
//! Invariant: `bytes` decode to `message`. It holds by construction: the only two
//! constructors encode the message or decode the bytes, and neither changes after. Bytes from
//! a newer member may hold fields this build does not know; they are kept as received, so a
//! follower's log holds exactly what the leader's holds.

use std::fmt;
use std::sync::Arc;

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

/// A state-machine command in a raft log entry (`keelpb.RaftRequest`), with its protobuf
/// bytes (module docs, "encode once"). Cloning it costs one reference count.
#[derive(Clone)]
pub struct Request(Arc<Encoded>);

struct Encoded {
    message: keelpb::RaftRequest,
    bytes: Vec<u8>,
}

impl Request {
    /// Encodes `message` (the one protobuf encoding this entry gets on this member).
    pub fn new(message: keelpb::RaftRequest) -> Request {
        let bytes = message.encode_to_vec();
        Request(Arc::new(Encoded { message, bytes }))
    }

    /// Decodes `bytes` and keeps them as the entry's encoding.
    ///
    /// Errors: prost's decode error for bytes that are not a `keelpb.RaftRequest`.
    pub fn decode(bytes: Vec<u8>) -> Result<Request, prost::DecodeError> {
        let message = keelpb::RaftRequest::decode(bytes.as_slice())?;
        Ok(Request(Arc::new(Encoded { message, bytes })))
    }

    /// The decoded message.
    pub fn message(&self) -> &keelpb::RaftRequest {
        &self.0.message
    }

    /// The protobuf bytes: what the WAL and the peer protocol carry.
    pub fn bytes(&self) -> &[u8] {
        &self.0.bytes
    }
}

impl std::ops::Deref for Request {
    type Target = keelpb::RaftRequest;

    fn deref(&self) -> &keelpb::RaftRequest {
        self.message()
    }
}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Request").field(self.message()).finish()
    }
}

impl PartialEq for Request {
    /// Equal messages (two encodings of one message compare equal).
    fn eq(&self, other: &Request) -> bool {
        self.message() == other.message()
    }
}

impl Serialize for Request {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.bytes())
    }
}

impl<'de> Deserialize<'de> for Request {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let bytes = d.deserialize_byte_buf(BytesVisitor)?;
        Request::decode(bytes).map_err(serde::de::Error::custom)
    }
}
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
        Request::new(keelpb::RaftRequest {
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
    fn a_request_is_encoded_once_and_shared_by_its_clones() {
        let req = put_request();
        assert_eq!(req.bytes(), req.message().encode_to_vec().as_slice());
        // The WAL record and AppendEntries carry exactly these bytes (bincode: a u64 length,
        // then the bytes).
        let bin = bincode::serialize(&req).unwrap();
        assert_eq!(&bin[8..], req.bytes());
        assert_eq!(
            u64::from_le_bytes(bin[..8].try_into().unwrap()),
            req.bytes().len() as u64
        );
        let copy = req.clone();
        assert!(
            std::ptr::eq(copy.bytes(), req.bytes()),
            "a clone shares the bytes"
        );
        assert!(
            std::ptr::eq(copy.message(), req.message()),
            "and the message"
        );
    }

    #[test]
    fn a_decoded_request_keeps_the_bytes_it_came_in() {
        let req = put_request();
        // A field this build does not know (number 1000, varint 5), as a newer leader may send.
        let mut sent = req.bytes().to_vec();
        sent.extend_from_slice(&[0xc0, 0x3e, 0x05]);
        let wire = bincode::serialize(&serde_bytes_of(&sent)).unwrap();
        let back: Request = bincode::deserialize(&wire).unwrap();
        assert_eq!(back.message(), req.message());
        assert_eq!(back.bytes(), sent.as_slice(), "the unknown field is kept");
        assert_eq!(
            bincode::serialize(&back).unwrap(),
            wire,
            "and written on as received"
        );
        let garbage = bincode::serialize(&serde_bytes_of(&[0x0a, 0x05])).unwrap();
        assert!(bincode::deserialize::<Request>(&garbage).is_err());
    }

    /// `bytes` serialized as serde bytes (what `Request` serializes as).
    fn serde_bytes_of(bytes: &[u8]) -> impl Serialize + '_ {
        struct B<'a>(&'a [u8]);
        impl Serialize for B<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_bytes(self.0)
            }
        }
        B(bytes)
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
