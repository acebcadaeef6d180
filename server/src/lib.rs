//! Keel member library: an etcd-v3-compatible, raft-replicated MVCC key-value store.
//!
//! The module tree is the architecture (`docs/architecture.md`, `../shared/DESIGN.md`). From
//! the top: `api` → `node` (wires a member) → `config` → `cluster` → `apply` → `auth` →
//! `membership` → `lease` → `watch` → `raft` → `cindex` → `mvcc` → `backend` → `wal` → `tls` →
//! `metrics`; a module uses only the modules after it (`scripts/layers.sh` checks), plus the
//! shared `error` and `failpoint`. `logging` sits with `main.rs` at the top.

pub mod alarm;
pub mod api;
pub mod apply;
pub mod auth;
pub mod backend;
pub mod backup;
pub mod cindex;
pub mod cluster;
pub mod config;
pub mod error;
pub mod etcd_db;
pub mod failpoint;
pub mod fence;
pub mod heavy;
pub mod lease;
pub mod logging;
pub mod membership;
pub mod metrics;
pub mod mvcc;
pub mod node;
pub mod qos;
pub mod raft;
pub mod tls;
pub mod version;
pub mod wal;
pub mod watch;
