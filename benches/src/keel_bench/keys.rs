//! Keys and values as etcd's `benchmark` tool makes them (etcd `tools/benchmark/cmd/put.go`):
//! the key is a random number below `--key-space-size`, Go-`binary.PutVarint`-encoded into
//! the front of a `--key-size`-byte zero buffer; the value is `--val-size` random bytes, drawn
//! once per worker. `--key-prefix P` (Keel) puts `P` in front of every key, so a run can be
//! aimed at one key range (e.g. a QoS rule's `key_prefix`).

use rand::Rng;

/// Builds keys and values for one worker.
#[derive(Debug, Clone)]
pub struct KeyGen {
    key_size: usize,
    key_space: u64,
    sequential: bool,
    next: u64,
    prefix: Vec<u8>,
}

impl KeyGen {
    /// Keys of `key_size` bytes (at least 1) from `key_space` distinct numbers (at least
    /// 1); a key size below the varint's length cuts it, merging keys, as a too small
    /// `--key-size` would in etcd.
    /// `sequential` walks the key space in order from `start` instead of drawing at random
    /// (etcd `--sequential-keys`).
    pub fn new(key_size: usize, key_space: u64, sequential: bool, start: u64) -> KeyGen {
        KeyGen {
            key_size: key_size.max(1),
            key_space: key_space.max(1),
            sequential,
            next: start,
            prefix: Vec::new(),
        }
    }

    /// The same keys with `prefix` in front of each (`--key-prefix`); the key size counts
    /// the bytes after the prefix.
    pub fn with_prefix(mut self, prefix: &[u8]) -> KeyGen {
        self.prefix = prefix.to_vec();
        self
    }

    /// The next key.
    pub fn key(&mut self, rng: &mut impl Rng) -> Vec<u8> {
        let n = if self.sequential {
            let n = self.next % self.key_space;
            self.next += 1;
            n
        } else {
            rng.gen_range(0..self.key_space)
        };
        if self.prefix.is_empty() {
            return encode_key(n, self.key_size);
        }
        let mut key = self.prefix.clone();
        key.extend_from_slice(&encode_key(n, self.key_size));
        key
    }
}

/// `n` as Go's `binary.PutVarint` (zig-zag, then base-128 little-endian groups) at the front
/// of a zero buffer of `size` bytes; a varint longer than `size` is cut to `size`.
pub fn encode_key(n: u64, size: usize) -> Vec<u8> {
    let mut out = vec![0u8; size];
    // Zig-zag of a non-negative i64 is 2n; key spaces are far below 2^62.
    let mut ux = n.wrapping_shl(1);
    let mut i = 0;
    while i < size {
        if ux < 0x80 {
            out[i] = ux as u8;
            break;
        }
        out[i] = (ux as u8) | 0x80;
        ux >>= 7;
        i += 1;
    }
    out
}

/// `size` random bytes (etcd `mustRandBytes`).
pub fn random_value(size: usize, rng: &mut impl Rng) -> Vec<u8> {
    let mut v = vec![0u8; size];
    rng.fill(&mut v[..]);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn keys_match_go_put_varint() {
        // Go: binary.PutVarint(buf, 0) = [0], 1 = [2], 64 = [0x80 0x01], 300 = [0xd8 0x04].
        assert_eq!(encode_key(0, 4), vec![0, 0, 0, 0]);
        assert_eq!(encode_key(1, 4), vec![2, 0, 0, 0]);
        assert_eq!(encode_key(64, 4), vec![0x80, 0x01, 0, 0]);
        assert_eq!(encode_key(300, 3), vec![0xd8, 0x04, 0]);
        assert_eq!(encode_key(300, 1), vec![0xd8], "cut to the key size");
    }

    #[test]
    fn keys_stay_in_the_key_space() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut g = KeyGen::new(16, 3, false, 0);
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..200 {
            let k = g.key(&mut rng);
            assert_eq!(k.len(), 16);
            seen.insert(k);
        }
        assert_eq!(seen.len(), 3);
        let mut s = KeyGen::new(8, 2, true, 1);
        assert_eq!(s.key(&mut rng), encode_key(1, 8));
        assert_eq!(s.key(&mut rng), encode_key(0, 8));
        assert_eq!(random_value(256, &mut rng).len(), 256);
        let mut p = KeyGen::new(2, 1, true, 0).with_prefix(b"/noisy/");
        assert_eq!(p.key(&mut rng), b"/noisy/\0\0");
    }
}
