//! The client-side record of a crash test: every write a client sent and what it learned.

use std::time::Instant;

/// One write sent by a client. Every key is unique to one write, so a key's presence and
/// `mod_revision` identify exactly which write produced it.
#[derive(Debug, Clone)]
pub enum Write {
    /// `Put(key, value)`.
    Put { key: Vec<u8>, value: Vec<u8> },
    /// `Txn(if create_revision(a) == 0 then put a, put b)`: both keys or neither.
    PairTxn {
        a: Vec<u8>,
        b: Vec<u8>,
        value: Vec<u8>,
    },
}

impl Write {
    /// The keys this write creates.
    pub fn keys(&self) -> Vec<&[u8]> {
        match self {
            Write::Put { key, .. } => vec![key],
            Write::PairTxn { a, b, .. } => vec![a, b],
        }
    }

    /// The value every key of this write gets.
    pub fn value(&self) -> &[u8] {
        match self {
            Write::Put { value, .. } | Write::PairTxn { value, .. } => value,
        }
    }
}

/// What the client learned about a write.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// The server acknowledged it: the write is durable at `revision` (`header.revision`).
    Acked { revision: i64 },
    /// The RPC failed (crash, timeout, refused): the write may or may not have been applied,
    /// but never partly.
    Unknown { error: String },
}

/// One write attempt with its real-time interval `[sent, done]`.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub writer: usize,
    pub write: Write,
    pub sent: Instant,
    pub done: Instant,
    pub outcome: Outcome,
}

impl Attempt {
    /// The acknowledged revision, if any.
    pub fn acked_revision(&self) -> Option<i64> {
        match self.outcome {
            Outcome::Acked { revision } => Some(revision),
            Outcome::Unknown { .. } => None,
        }
    }
}
