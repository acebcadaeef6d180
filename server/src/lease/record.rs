//! On-disk lease records (the `l` part of the sled key space, docs/backend.md).
//!
//! One sled key per lease: `l` + lease ID (8 bytes, big-endian two's complement) →
//! `[format version = 1][TTL: i64 BE][remaining TTL: i64 BE]`, both in seconds; a remaining
//! TTL of 0 means "no checkpoint: the full TTL" (etcd `leasepb.Lease{ID, TTL,
//! RemainingTTL}`). Records are written and removed only in apply batches, so they move
//! with the consistent index. Attached keys are not stored here: they are the `lease`
//! field of the MVCC records, written in the same batch.

use super::LeaseId;

/// First byte of every lease key (declared in the backend schema).
pub const PREFIX: u8 = crate::backend::schema::LEASE_PREFIX;
/// Format version of the record value.
pub const FORMAT: u8 = 1;
const KEY_LEN: usize = 9;
const VALUE_LEN: usize = 17;

/// A persisted lease: its TTL and last checkpointed remaining TTL (seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseRecord {
    /// Lease ID.
    pub id: LeaseId,
    /// Granted TTL in seconds.
    pub ttl: i64,
    /// Remaining TTL in seconds at the last checkpoint; 0 when none applies.
    pub remaining_ttl: i64,
}

/// The sled key of lease `id`.
pub fn key(id: LeaseId) -> [u8; KEY_LEN] {
    let mut k = [0u8; KEY_LEN];
    k[0] = PREFIX;
    k[1..].copy_from_slice(&id.to_be_bytes());
    k
}

/// Encodes a record's value.
pub fn encode(r: &LeaseRecord) -> [u8; VALUE_LEN] {
    let mut v = [0u8; VALUE_LEN];
    v[0] = FORMAT;
    v[1..9].copy_from_slice(&r.ttl.to_be_bytes());
    v[9..].copy_from_slice(&r.remaining_ttl.to_be_bytes());
    v
}

/// Why lease records cannot be read ([`decode`], [`load_all`]). The text names the key.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// A key that is not `l` + 8 bytes.
    #[error("lease record {}: key is not `l` + 8 bytes", key.escape_ascii())]
    BadKey {
        /// The stored key.
        key: Vec<u8>,
    },
    /// A value whose first byte is not [`FORMAT`] (`None`: an empty value).
    #[error("lease record {}: unsupported format {found:?} (this binary reads {FORMAT})", key.escape_ascii())]
    UnsupportedFormat {
        /// The stored key.
        key: Vec<u8>,
        /// The value's first byte.
        found: Option<u8>,
    },
    /// A value of a size other than 17 bytes.
    #[error("lease record {}: value has the wrong size", key.escape_ascii())]
    WrongSize {
        /// The stored key.
        key: Vec<u8>,
    },
    /// sled failed to read the records.
    #[error("reading lease records: {0}")]
    Read(#[from] sled::Error),
}

/// For callers that still carry errors as text (`Applier::open_with_lessor`).
impl From<RecordError> for String {
    fn from(e: RecordError) -> String {
        e.to_string()
    }
}

/// Decodes one `l` key/value pair.
///
/// Errors: [`RecordError`]: a key or value of the wrong size, or an unknown format version.
pub fn decode(key: &[u8], value: &[u8]) -> Result<LeaseRecord, RecordError> {
    let key_vec = || key.to_vec();
    if key.len() != KEY_LEN || key[0] != PREFIX {
        return Err(RecordError::BadKey { key: key_vec() });
    }
    if value.first() != Some(&FORMAT) {
        return Err(RecordError::UnsupportedFormat {
            key: key_vec(),
            found: value.first().copied(),
        });
    }
    if value.len() != VALUE_LEN {
        return Err(RecordError::WrongSize { key: key_vec() });
    }
    let i64_at = |b: &[u8]| i64::from_be_bytes(b.try_into().expect("8 bytes"));
    Ok(LeaseRecord {
        id: i64_at(&key[1..]),
        ttl: i64_at(&value[1..9]),
        remaining_ttl: i64_at(&value[9..]),
    })
}

/// Reads every lease record of `tree`, in key order.
///
/// Errors: sled I/O or an undecodable record ([`RecordError`]).
pub fn load_all(tree: &sled::Tree) -> Result<Vec<LeaseRecord>, RecordError> {
    tree.scan_prefix([PREFIX])
        .map(|kv| {
            let (k, v) = kv?;
            decode(&k, &v)
        })
        .collect()
}

/// Stages "lease `r` is as given" into an apply batch.
pub fn stage_put(batch: &mut crate::backend::Batch, r: &LeaseRecord) {
    batch.insert(&key(r.id)[..], &encode(r)[..]);
}

/// Stages "lease `id` is gone" into an apply batch.
pub fn stage_remove(batch: &mut crate::backend::Batch, id: LeaseId) {
    batch.remove(&key(id)[..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_negative_and_large_ids() {
        for r in [
            LeaseRecord {
                id: -5,
                ttl: 60,
                remaining_ttl: 0,
            },
            LeaseRecord {
                id: i64::MAX,
                ttl: super::super::MAX_LEASE_TTL,
                remaining_ttl: 42,
            },
        ] {
            assert_eq!(decode(&key(r.id), &encode(&r)).unwrap(), r);
        }
    }

    #[test]
    fn rejects_unknown_formats_and_sizes() {
        let r = LeaseRecord {
            id: 7,
            ttl: 1,
            remaining_ttl: 0,
        };
        let mut v = encode(&r);
        v[0] = 9;
        assert!(
            decode(&key(7), &v)
                .unwrap_err()
                .to_string()
                .contains("unsupported format")
        );
        assert!(
            decode(&key(7), &encode(&r)[..10])
                .unwrap_err()
                .to_string()
                .contains("wrong size")
        );
        assert!(decode(b"lx", &encode(&r)).is_err());
    }

    #[test]
    fn stages_land_in_the_tree() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let tree = db.open_tree("t").unwrap();
        tree.insert(b"k-not-a-lease", b"x").unwrap();
        let mut b = crate::backend::Batch::default();
        stage_put(
            &mut b,
            &LeaseRecord {
                id: 2,
                ttl: 10,
                remaining_ttl: 0,
            },
        );
        stage_put(
            &mut b,
            &LeaseRecord {
                id: 1,
                ttl: 20,
                remaining_ttl: 5,
            },
        );
        b.commit(&tree).unwrap();
        let all = load_all(&tree).unwrap();
        assert_eq!(
            all.iter()
                .map(|r| (r.id, r.ttl, r.remaining_ttl))
                .collect::<Vec<_>>(),
            vec![(1, 20, 5), (2, 10, 0)]
        );
        let mut b = crate::backend::Batch::default();
        stage_remove(&mut b, 1);
        b.commit(&tree).unwrap();
        assert_eq!(load_all(&tree).unwrap().len(), 1);
    }
}
