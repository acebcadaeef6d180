//! Revisions and their byte encodings.
//!
//! A [`Revision`] is etcd's `(main, sub)` pair (etcd `server/storage/mvcc/revision.go`):
//! `main` is the store revision of the raft entry that made the change and `sub` numbers the
//! changes inside that entry (0, 1, 2, ...). Every change gets a unique revision, and revisions
//! sort first by `main`, then by `sub`.
//!
//! Two byte layouts exist:
//! - the sled record key ([`crate::backend::schema`]): `b'k'` + `main` (u64 big-endian) +
//!   `sub` (u64 big-endian), plus a trailing `b't'` for a tombstone (18 bytes, else 17). Big-endian keeps sled's byte order
//!   equal to revision order, so a scan of the `b'k'` prefix walks history oldest first;
//! - etcd's bolt key (`main` BE, `b'_'`, `sub` BE, optional `b't'`), used only as hash input
//!   so that `HashKV` covers the same bytes etcd hashes (see `hash.rs`).

use std::fmt;

use crate::backend::schema::{RECORD_PREFIX, TOMBSTONE_MARK};

/// Length of a record key without the tombstone mark: prefix + 2 × u64.
pub const RECORD_KEY_LEN: usize = 17;

/// An etcd revision: `main` is the store revision, `sub` the change index inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Revision {
    /// Store revision of the raft entry that made the change (≥ 1).
    pub main: i64,
    /// Index of the change within that entry, from 0.
    pub sub: i64,
}

impl Revision {
    /// The revision `(main, sub)`.
    pub fn new(main: i64, sub: i64) -> Revision {
        Revision { main, sub }
    }
}

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}_{}", self.main, self.sub)
    }
}

/// The sled key of the record holding revision `rev` (17 bytes, 18 with the tombstone mark).
pub fn record_key(rev: Revision, tombstone: bool) -> Vec<u8> {
    let mut k = Vec::with_capacity(RECORD_KEY_LEN + 1);
    k.push(RECORD_PREFIX);
    k.extend_from_slice(&(rev.main as u64).to_be_bytes());
    k.extend_from_slice(&(rev.sub as u64).to_be_bytes());
    if tombstone {
        k.push(TOMBSTONE_MARK);
    }
    k
}

/// The smallest record key of main revision `main` (a scan bound; `sub` = 0, no mark).
pub fn record_key_lower_bound(main: i64) -> [u8; RECORD_KEY_LEN] {
    let mut k = [0u8; RECORD_KEY_LEN];
    k[0] = RECORD_PREFIX;
    k[1..9].copy_from_slice(&(main as u64).to_be_bytes());
    k
}

/// Decodes a record key into its revision and tombstone flag.
///
/// Returns `None` when `key` is not a well-formed record key (wrong prefix or length, an
/// unknown trailing mark, or a revision that does not fit `i64`).
pub fn parse_record_key(key: &[u8]) -> Option<(Revision, bool)> {
    let tombstone = match key.len() {
        RECORD_KEY_LEN => false,
        n if n == RECORD_KEY_LEN + 1 && key[RECORD_KEY_LEN] == TOMBSTONE_MARK => true,
        _ => return None,
    };
    if key[0] != RECORD_PREFIX {
        return None;
    }
    let main = u64::from_be_bytes(key[1..9].try_into().ok()?);
    let sub = u64::from_be_bytes(key[9..17].try_into().ok()?);
    let main = i64::try_from(main).ok()?;
    let sub = i64::try_from(sub).ok()?;
    Some((Revision { main, sub }, tombstone))
}

/// etcd's bolt key of a revision (`main` BE, `'_'`, `sub` BE, optional `'t'`): the bytes
/// etcd's `HashKV` feeds to its CRC for each record.
pub fn etcd_rev_bytes(rev: Revision, tombstone: bool) -> Vec<u8> {
    let mut k = Vec::with_capacity(18);
    k.extend_from_slice(&(rev.main as u64).to_be_bytes());
    k.push(b'_');
    k.extend_from_slice(&(rev.sub as u64).to_be_bytes());
    if tombstone {
        k.push(TOMBSTONE_MARK);
    }
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_key_layout_is_prefix_main_sub_mark() {
        let k = record_key(Revision::new(0x0102, 3), false);
        assert_eq!(k, [b'k', 0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 0, 0, 0, 3]);
        let t = record_key(Revision::new(0x0102, 3), true);
        assert_eq!(t.len(), 18);
        assert_eq!(t[17], b't');
    }

    #[test]
    fn record_keys_sort_in_revision_order() {
        let revs = [
            (1, 0),
            (1, 1),
            (1, 255),
            (2, 0),
            (256, 0),
            (256, 7),
            (1 << 40, 0),
        ];
        let keys: Vec<Vec<u8>> = revs
            .iter()
            .enumerate()
            .map(|(i, &(m, s))| record_key(Revision::new(m, s), i % 2 == 0))
            .collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
    }

    #[test]
    fn parse_round_trips_and_rejects_garbage() {
        for (rev, tomb) in [
            (Revision::new(7, 0), false),
            (Revision::new(i64::MAX, 9), true),
        ] {
            assert_eq!(parse_record_key(&record_key(rev, tomb)), Some((rev, tomb)));
        }
        assert_eq!(parse_record_key(b"kshort"), None);
        let mut bad_mark = record_key(Revision::new(1, 0), false);
        bad_mark.push(b'x');
        assert_eq!(parse_record_key(&bad_mark), None);
        let mut bad_prefix = record_key(Revision::new(1, 0), false);
        bad_prefix[0] = b'm';
        assert_eq!(parse_record_key(&bad_prefix), None);
        let mut too_big = record_key(Revision::new(1, 0), false);
        too_big[1] = 0x80;
        assert_eq!(parse_record_key(&too_big), None);
    }

    #[test]
    fn lower_bound_sorts_before_every_record_of_that_main() {
        let lb = record_key_lower_bound(5);
        assert!(lb.as_slice() <= record_key(Revision::new(5, 0), false).as_slice());
        assert!(lb.as_slice() > record_key(Revision::new(4, u32::MAX as i64), true).as_slice());
    }

    #[test]
    fn etcd_bytes_match_etcd_layout() {
        let b = etcd_rev_bytes(Revision::new(2, 1), true);
        assert_eq!(
            b,
            [0, 0, 0, 0, 0, 0, 0, 2, b'_', 0, 0, 0, 0, 0, 0, 0, 1, b't']
        );
    }
}
