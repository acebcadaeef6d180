//! `HashKV`: a CRC-32C (Castagnoli, like etcd) over the MVCC state at a revision.
//!
//! What is hashed for revision `rev`: the bytes `"key"` (etcd's bucket name), then, in
//! revision order, for every key that exists at `rev`, the record of its revision visible
//! at `rev`: etcd's revision bytes (`main` BE, `_`, `sub` BE) followed by the stored
//! `KeyValue` bytes. Superseded revisions and tombstones at or below `rev` are skipped: they
//! are exactly what a compaction at or below `rev` may remove (etcd skips revisions
//! "scheduled for removal" by compaction the same way). Hence:
//! - two members that applied the same log hash equal at every revision, whatever their
//!   compaction progress;
//! - the hash at `rev` is the same before and after compacting at any revision `<= rev`;
//! - for a history with nothing superseded, the value equals etcd's `HashKV`.
//!
//! etcd's own `HashKV` also covers every superseded revision above its compact revision,
//! so its value changes when it compacts; Keel's does not (docs/mvcc.md, "Hash").

use std::sync::atomic::AtomicI64;

use super::revision::{
    Revision, etcd_rev_bytes, parse_record_key, record_key, record_key_lower_bound,
};
use super::store::View;
use crate::error::EtcdError;

/// Result of [`super::MvccStore::hash_kv`] (etcd `HashKVResponse`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashKv {
    /// CRC-32C of the state at `hash_revision` (see the module docs).
    pub hash: u32,
    /// Compact revision when the hash was computed (-1 if never compacted, as etcd's
    /// `compactMainRev`).
    pub compact_revision: i64,
    /// The revision hashed (the request's, or the current one for 0).
    pub hash_revision: i64,
    /// Store revision when the hash was computed (the response header revision).
    pub current_revision: i64,
}

/// Computes `HashKV(revision)` over `view`, reading records from `tree`.
pub(super) fn hash_kv(
    view: &View,
    tree: &sled::Tree,
    compact_floor: &AtomicI64,
    revision: i64,
) -> Result<HashKv, EtcdError> {
    if revision > view.rev {
        return Err(EtcdError::FutureRev);
    }
    if revision > 0 && revision < view.compact_rev {
        return Err(EtcdError::Compacted);
    }
    // etcd hashes nothing but the bucket name for a negative revision.
    let rev = if revision == 0 { view.rev } else { revision };
    let mut held = 0usize;
    let mut visible: Vec<Revision> = view
        .index
        .iter_all()
        .filter_map(|(_, h)| {
            held += h.len();
            h.visible_at(rev).map(|r| r.revision())
        })
        .collect();
    visible.sort_unstable();
    let missing = |r: Revision| {
        if compact_floor.load(std::sync::atomic::Ordering::Acquire) > rev {
            EtcdError::Compacted
        } else {
            EtcdError::Internal(format!("mvcc: hash: record {r} is missing"))
        }
    };
    let io = |e: sled::Error| EtcdError::Internal(format!("mvcc: hash: {e}"));
    let mut crc = Crc32c::new();
    crc.update(b"key");
    let mut feed = |r: Revision, value: &[u8]| {
        crc.update(&etcd_rev_bytes(r, false));
        crc.update(value);
    };
    if visible.len() * 2 >= held {
        // Dense (e.g. a compacted store): one sequential scan beats a lookup per record.
        let (Some(first), Some(last)) = (visible.first(), visible.last()) else {
            return Ok(done(view, rev, crc.finish()));
        };
        let mut want = visible.iter().peekable();
        let range = record_key_lower_bound(first.main)..record_key_lower_bound(last.main + 1);
        for item in tree.range(range) {
            let (k, v) = item.map_err(io)?;
            let Some((r, tombstone)) = parse_record_key(&k) else {
                continue;
            };
            let Some(&&w) = want.peek() else { break };
            if w < r {
                return Err(missing(w));
            }
            if w == r && !tombstone {
                feed(r, &v);
                want.next();
            }
        }
        if let Some(&&w) = want.peek() {
            return Err(missing(w));
        }
    } else {
        for r in visible {
            let value = tree
                .get(record_key(r, false))
                .map_err(io)?
                .ok_or_else(|| missing(r))?;
            feed(r, &value);
        }
    }
    Ok(done(view, rev, crc.finish()))
}

fn done(view: &View, rev: i64, hash: u32) -> HashKv {
    HashKv {
        hash,
        compact_revision: view.compact_rev,
        hash_revision: rev,
        current_revision: view.rev,
    }
}

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of `data`; the checksum etcd's
/// `HashKV` uses (`crc32.MakeTable(crc32.Castagnoli)`).
pub fn crc32c(data: &[u8]) -> u32 {
    let mut c = Crc32c::new();
    c.update(data);
    c.finish()
}

const POLY: u32 = 0x82F6_3B78;
static TABLES: [[u32; 256]; 8] = make_tables();

const fn make_tables() -> [[u32; 256]; 8] {
    let mut t = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut i = 0;
    while i < 256 {
        let mut s = 1;
        while s < 8 {
            let prev = t[s - 1][i];
            t[s][i] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
            s += 1;
        }
        i += 1;
    }
    t
}

/// Streaming CRC-32C (slice-by-8).
#[derive(Debug, Clone, Copy)]
pub struct Crc32c(u32);

impl Default for Crc32c {
    fn default() -> Self {
        Crc32c::new()
    }
}

impl Crc32c {
    /// A fresh checksum.
    pub fn new() -> Crc32c {
        Crc32c(!0)
    }

    /// Feeds `data`.
    pub fn update(&mut self, data: &[u8]) {
        let mut c = self.0;
        let mut chunks = data.chunks_exact(8);
        for ch in &mut chunks {
            let lo = u32::from_le_bytes([ch[0], ch[1], ch[2], ch[3]]) ^ c;
            let hi = u32::from_le_bytes([ch[4], ch[5], ch[6], ch[7]]);
            c = TABLES[7][(lo & 0xff) as usize]
                ^ TABLES[6][((lo >> 8) & 0xff) as usize]
                ^ TABLES[5][((lo >> 16) & 0xff) as usize]
                ^ TABLES[4][(lo >> 24) as usize]
                ^ TABLES[3][(hi & 0xff) as usize]
                ^ TABLES[2][((hi >> 8) & 0xff) as usize]
                ^ TABLES[1][((hi >> 16) & 0xff) as usize]
                ^ TABLES[0][(hi >> 24) as usize];
        }
        for &b in chunks.remainder() {
            c = (c >> 8) ^ TABLES[0][((c ^ u32::from(b)) & 0xff) as usize];
        }
        self.0 = c;
    }

    /// The checksum of everything fed so far.
    pub fn finish(&self) -> u32 {
        !self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytewise(data: &[u8]) -> u32 {
        let mut c = !0u32;
        for &b in data {
            c ^= u32::from(b);
            for _ in 0..8 {
                c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            }
        }
        !c
    }

    #[test]
    fn crc32c_check_values() {
        // The standard check value of CRC-32C, and RFC 3720 (iSCSI) test vectors.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62A8_AB43);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn slice_by_8_matches_bitwise_and_streaming_matches_one_shot() {
        let data: Vec<u8> = (0..1000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        for len in [0, 1, 7, 8, 9, 63, 64, 65, 999, 1000] {
            assert_eq!(crc32c(&data[..len]), bytewise(&data[..len]), "len {len}");
        }
        let mut s = Crc32c::new();
        for part in data.chunks(13) {
            s.update(part);
        }
        assert_eq!(s.finish(), crc32c(&data));
    }
}
