//! Byte-level mutations of a valid seed: the edits a torn write, a bad sector or a hostile
//! peer make. They shrink towards "no edit", so a failure shows the smallest damage.

use proptest::prelude::*;
use proptest::sample::Index;

/// One edit of a byte string.
#[derive(Debug, Clone)]
pub enum Edit {
    /// Flip one bit.
    Flip(Index, u8),
    /// Overwrite one byte.
    Set(Index, u8),
    /// Overwrite 4 bytes with an integer a length field might hold.
    Length(Index, u32),
    /// Insert bytes.
    Insert(Index, Vec<u8>),
    /// Remove up to `n` bytes.
    Remove(Index, u8),
    /// Cut the string (a torn tail).
    Truncate(Index),
}

fn edit() -> impl Strategy<Value = Edit> {
    let lengths = prop_oneof![
        Just(0u32),
        Just(1),
        Just(0x7FFF_FFFF),
        Just(u32::MAX),
        Just(u32::MAX - 1),
        0u32..4096,
        any::<u32>(),
    ];
    prop_oneof![
        (any::<Index>(), 0u8..8).prop_map(|(i, b)| Edit::Flip(i, b)),
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Set(i, b)),
        (any::<Index>(), lengths).prop_map(|(i, v)| Edit::Length(i, v)),
        (any::<Index>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(i, b)| Edit::Insert(i, b)),
        (any::<Index>(), 1u8..32).prop_map(|(i, n)| Edit::Remove(i, n)),
        any::<Index>().prop_map(Edit::Truncate),
    ]
}

/// 1 to 6 edits.
pub fn edits() -> impl Strategy<Value = Vec<Edit>> {
    prop::collection::vec(edit(), 1..6)
}

/// `seed` with `edits` applied in order.
pub fn apply(seed: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for e in edits {
        if b.is_empty() {
            if let Edit::Insert(_, bytes) = e {
                b.extend_from_slice(bytes);
            }
            continue;
        }
        match e {
            Edit::Flip(i, bit) => {
                let i = i.index(b.len());
                b[i] ^= 1 << bit;
            }
            Edit::Set(i, v) => {
                let i = i.index(b.len());
                b[i] = *v;
            }
            Edit::Length(i, v) => {
                let i = i.index(b.len());
                for (k, byte) in v.to_le_bytes().iter().enumerate() {
                    if let Some(slot) = b.get_mut(i + k) {
                        *slot = *byte;
                    }
                }
            }
            Edit::Insert(i, bytes) => {
                let i = i.index(b.len() + 1);
                b.splice(i..i, bytes.iter().copied());
            }
            Edit::Remove(i, n) => {
                let i = i.index(b.len());
                let end = (i + usize::from(*n)).min(b.len());
                b.drain(i..end);
            }
            Edit::Truncate(i) => {
                let i = i.index(b.len());
                b.truncate(i);
            }
        }
    }
    b
}

/// A seed, mutated; or (one input in eight) bytes with no structure at all.
pub fn mutated(seed: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        7 => edits().prop_map(move |e| apply(&seed, &e)),
        1 => prop::collection::vec(any::<u8>(), 0..512),
    ]
}
