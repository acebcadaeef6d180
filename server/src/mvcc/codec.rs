//! The bytes of MVCC's part of the member tree: record and meta values (the keys are declared
//! in [`crate::backend::schema`], which documents the whole layout once).
//!
//! Record values are exactly what etcd stores in its `key` bucket (gogo-proto and prost both
//! write set fields in field order and skip defaults), which lets `HashKV` hash the same
//! bytes as etcd.

use keel_proto::mvccpb::KeyValue;
use prost::Message;

use super::MvccError;
use super::revision::{Revision, parse_record_key};

/// Current on-disk format of MVCC records and meta (the value of
/// [`crate::backend::schema::MVCC_FORMAT`]). Bump on any incompatible change.
pub const FORMAT_VERSION: u64 = 1;

/// Encodes the value of a put record.
pub fn encode_put(kv: &KeyValue) -> Vec<u8> {
    kv.encode_to_vec()
}

/// Encodes the value of a tombstone record: a `KeyValue` holding only the key (etcd).
pub fn encode_tombstone(key: &[u8]) -> Vec<u8> {
    KeyValue {
        key: key.to_vec(),
        ..Default::default()
    }
    .encode_to_vec()
}

/// Decodes a record value.
pub fn decode_kv(record_key: &[u8], value: &[u8]) -> Result<KeyValue, MvccError> {
    KeyValue::decode(value)
        .map_err(|e| MvccError::corrupt(record_key, format!("bad KeyValue: {e}")))
}

/// Encodes an i64 meta value.
pub fn encode_i64(v: i64) -> [u8; 8] {
    v.to_be_bytes()
}

/// Decodes an i64 meta value stored under `key`.
pub fn decode_i64(key: &[u8], v: &[u8]) -> Result<i64, MvccError> {
    let bytes: [u8; 8] = v
        .try_into()
        .map_err(|_| MvccError::corrupt(key, format!("expected 8 bytes, found {}", v.len())))?;
    Ok(i64::from_be_bytes(bytes))
}

/// The fields of a record that the key index needs, decoded without copying the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordMeta<'a> {
    /// Revision from the record key.
    pub rev: Revision,
    /// Whether the record key carries the tombstone mark.
    pub tombstone: bool,
    /// The user key (borrowed from the value bytes).
    pub key: &'a [u8],
    /// `create_revision` field.
    pub create: i64,
    /// `mod_revision` field.
    pub modified: i64,
    /// `version` field.
    pub version: i64,
    /// `lease` field.
    pub lease: i64,
}

/// Decodes a record for the index rebuild: the revision from `rkey` and every `KeyValue`
/// field except `value`, which is skipped without copying.
///
/// Errors: a malformed record key, malformed protobuf, or a put whose `mod_revision` differs
/// from the revision in its key.
pub fn decode_meta<'a>(rkey: &[u8], value: &'a [u8]) -> Result<RecordMeta<'a>, MvccError> {
    let (rev, tombstone) =
        parse_record_key(rkey).ok_or_else(|| MvccError::corrupt(rkey, "malformed record key"))?;
    let mut m = RecordMeta {
        rev,
        tombstone,
        key: &[],
        create: 0,
        modified: 0,
        version: 0,
        lease: 0,
    };
    let bad = |why: &str| MvccError::corrupt(rkey, format!("bad KeyValue: {why}"));
    let mut buf = value;
    while !buf.is_empty() {
        let tag = read_varint(&mut buf).ok_or_else(|| bad("truncated tag"))?;
        let (field, wire) = (tag >> 3, tag & 7);
        match wire {
            0 => {
                let v = read_varint(&mut buf).ok_or_else(|| bad("truncated varint"))? as i64;
                match field {
                    2 => m.create = v,
                    3 => m.modified = v,
                    4 => m.version = v,
                    6 => m.lease = v,
                    _ => {}
                }
            }
            2 => {
                let len = read_varint(&mut buf).ok_or_else(|| bad("truncated length"))?;
                let len = usize::try_from(len).map_err(|_| bad("length overflow"))?;
                if len > buf.len() {
                    return Err(bad("truncated bytes field"));
                }
                let (bytes, rest) = buf.split_at(len);
                if field == 1 {
                    m.key = bytes;
                }
                buf = rest;
            }
            1 => buf = buf.get(8..).ok_or_else(|| bad("truncated fixed64"))?,
            5 => buf = buf.get(4..).ok_or_else(|| bad("truncated fixed32"))?,
            _ => return Err(bad("unknown wire type")),
        }
    }
    if m.key.is_empty() {
        return Err(bad("empty key"));
    }
    if !tombstone && m.modified != rev.main {
        return Err(bad("mod_revision differs from the record revision"));
    }
    Ok(m)
}

fn read_varint(buf: &mut &[u8]) -> Option<u64> {
    let mut v: u64 = 0;
    for i in 0..10 {
        let (&b, rest) = buf.split_first()?;
        *buf = rest;
        v |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return Some(v);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::revision::record_key;

    fn kv(key: &[u8], value: &[u8], rev: i64) -> KeyValue {
        KeyValue {
            key: key.to_vec(),
            create_revision: 2,
            mod_revision: rev,
            version: 3,
            value: value.to_vec(),
            lease: 0x7fff_0000_0000_0001,
        }
    }

    #[test]
    fn meta_decoder_matches_prost_without_the_value() {
        let k = kv(b"foo", &[0xffu8; 300], 9);
        let bytes = encode_put(&k);
        let rkey = record_key(Revision::new(9, 4), false);
        let m = decode_meta(&rkey, &bytes).unwrap();
        assert_eq!(m.rev, Revision::new(9, 4));
        assert!(!m.tombstone);
        assert_eq!(m.key, b"foo");
        assert_eq!(
            (m.create, m.modified, m.version, m.lease),
            (2, 9, 3, 0x7fff_0000_0000_0001)
        );
        assert_eq!(decode_kv(&rkey, &bytes).unwrap(), k);
    }

    #[test]
    fn tombstone_value_holds_only_the_key() {
        let bytes = encode_tombstone(b"gone");
        assert_eq!(bytes, [0x0a, 4, b'g', b'o', b'n', b'e']);
        let rkey = record_key(Revision::new(5, 0), true);
        let m = decode_meta(&rkey, &bytes).unwrap();
        assert!(m.tombstone);
        assert_eq!((m.key, m.create, m.version), (&b"gone"[..], 0, 0));
    }

    #[test]
    fn corrupt_records_are_rejected() {
        let rkey = record_key(Revision::new(9, 0), false);
        let good = encode_put(&kv(b"foo", b"v", 9));
        assert!(decode_meta(&rkey, &good[..good.len() - 1]).is_err());
        assert!(decode_meta(&rkey, &encode_put(&kv(b"foo", b"v", 8))).is_err());
        assert!(decode_meta(b"kbad", &good).is_err());
        assert!(decode_meta(&rkey, &[0x0f]).is_err());
        assert!(decode_meta(&rkey, &[]).is_err());
    }

    #[test]
    fn i64_meta_round_trips() {
        assert_eq!(
            decode_i64(crate::backend::schema::MVCC_COMPACT, &encode_i64(-1)).unwrap(),
            -1
        );
        assert!(decode_i64(crate::backend::schema::MVCC_COMPACT, &[1, 2]).is_err());
    }
}
