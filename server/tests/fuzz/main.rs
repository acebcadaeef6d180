//! Bounded-time fuzzing on stable Rust (issue 18 part 4): every decoder that reads bytes
//! Keel did not just write itself, and every client request type, fed generated and mutated
//! input. No input may panic, hang, or make a single allocation larger than
//! [`alloc::LIMIT_BYTES`]; decoders guarded by a checksum must never accept damaged bytes.
//!
//! Each target runs for `KEEL_FUZZ_SECS` seconds (default 4) with proptest generation and
//! shrinking ([`budget::fuzz`]); a failure prints the shrunk input and its seed. Seeds
//! (`corpus`) are valid encodings, so mutations reach deep into the formats: a WAL with
//! entries, a Keel snapshot, etcd 3.4.23's snapshot database, encoded raft entries and peer
//! messages. Regression inputs found by fuzzing live next to their target as plain tests.
//!
//! This is a test binary of its own because it installs a global allocator.
//!
//! `KEEL_FUZZ_SECS=60 cargo test --release -p keel-server --test fuzz` (docs/testing.md).

mod alloc;
mod budget;
mod etcd_db;
mod mutate;
mod peer;
mod raft_entry;
mod requests;
mod snapshot_file;
mod wal;
