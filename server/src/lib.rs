//! Keel member library: an etcd-v3-compatible, raft-replicated MVCC key-value store.
//!
//! The module tree is the architecture (see `docs/` and `../shared/DESIGN.md`):
//! `wal` → `raft` → `apply` (+ `cindex`) → `mvcc`, with `api` in front and `node` wiring a
//! member together.

pub mod api;
pub mod apply;
pub mod cindex;
pub mod cluster;
pub mod config;
pub mod error;
pub mod etcd_db;
pub mod failpoint;
pub mod lease;
pub mod membership;
pub mod mvcc;
pub mod node;
pub mod raft;
pub mod wal;
pub mod watch;
