//! The export of one applied state as an etcd database (see the module docs of `backup`).

use std::path::Path;
use std::time::Duration;

use keel_proto::authpb::{Role, User};
use keel_proto::etcdserverpb::AlarmType;
use keel_proto::leasepb::Lease;
use openraft::StoredMembership;
use tokio::sync::OwnedRwLockReadGuard;

use super::BackupError;
use crate::alarm::Alarms;
use crate::auth::AuthStore;
use crate::backend::{Backend, schema};
use crate::cindex;
use crate::etcd_db::writer::Written;
use crate::etcd_db::{AuthMeta, Cluster, ConfState, DbWriter, Member, Meta, MvccRecord};
use crate::lease::record as lease_record;
use crate::membership::Attributes;
use crate::mvcc::revision::record_key_lower_bound;
use crate::mvcc::{Crc32c, SharedStore};
use crate::raft::export::ExportLocks;
use crate::raft::types::{MemberNode, NodeId};

/// The cluster version an export records: Keel applies etcd 3.4's semantics.
pub const CLUSTER_VERSION: &str = "3.4.0";

/// How long an export waits for a running physical compaction to finish, so the records it
/// scans are exactly those the compaction keeps (afterwards it exports what is there: extra
/// superseded records below the compact revision are ignored by etcd's reads and hashes).
const PHYSICAL_COMPACTION_WAIT: Duration = Duration::from_secs(30);

/// One applied state, pinned: its revision, a copy of its tables, and the export lock that
/// keeps its records in the live tree.
pub struct Capture {
    /// The store revision of the captured state: records above it are not exported.
    pub revision: i64,
    /// The compact revision (0: never compacted).
    pub compact_revision: i64,
    /// Every key of the member tree outside the record space, as of `revision`.
    tables: Backend,
    _export: OwnedRwLockReadGuard<()>,
}

impl Capture {
    /// Pins the current applied state of `tree` (whose MVCC store `store` serves). Waits for
    /// the group being applied, holds apply off while it copies the tables (a few keys per
    /// lease, member, user and role), then lets apply go on.
    ///
    /// Errors: sled I/O.
    pub async fn take(
        locks: &ExportLocks,
        tree: &sled::Tree,
        store: &SharedStore,
    ) -> Result<Capture, BackupError> {
        let gate = locks.gate.clone().read_owned().await;
        let export = locks.export.clone().read_owned().await;
        let mvcc = store.get();
        let (revision, compact_revision) = (mvcc.current_revision(), mvcc.compact_revision());
        let tree = tree.clone();
        let pending = mvcc.clone();
        let tables = tokio::task::spawn_blocking(move || -> Result<Backend, BackupError> {
            // Apply is paused: every applied group goes to sled before the copy.
            pending.persist().map_err(std::io::Error::other)?;
            let tables = Backend::temporary()?;
            let records_end = [schema::RECORD_PREFIX + 1];
            let below = tree.range(..[schema::RECORD_PREFIX].as_slice());
            for kv in below.chain(tree.range(records_end.as_slice()..)) {
                let (k, v) = kv?;
                tables.tree().insert(k, v)?;
            }
            drop(gate);
            Ok(tables)
        })
        .await
        .map_err(|e| std::io::Error::other(format!("capture task: {e}")))??;
        if compact_revision > 0 {
            let wait = mvcc.clone();
            let _ = tokio::task::spawn_blocking(move || {
                wait.wait_physical_compaction(compact_revision, PHYSICAL_COMPACTION_WAIT)
            })
            .await;
        }
        Ok(Capture {
            revision,
            compact_revision,
            tables,
            _export: export,
        })
    }

    /// Writes the captured state as an etcd database at `dest` (blocking: call from a
    /// blocking thread), reading the records `<= revision` from `tree`. The export lock is
    /// released when this returns.
    ///
    /// Errors: sled I/O, a stored value that does not decode, or the writer's I/O.
    pub fn write_etcd_db(self, tree: &sled::Tree, dest: &Path) -> Result<Written, BackupError> {
        let t = self.tables.tree();
        let mut w = DbWriter::create(dest)?;
        let bound = record_key_lower_bound(0)..record_key_lower_bound(self.revision + 1);
        type SourceError = Box<dyn std::error::Error + Send + Sync>;
        let records = tree
            .range(bound)
            .map(|kv| -> Result<MvccRecord, SourceError> {
                let (k, v) = kv?;
                Ok(MvccRecord::from_keel(&k, v.to_vec())?)
            });
        w.put_records(records)?;
        let leases = lease_record::load_all(t)?.into_iter().map(|l| Lease {
            id: l.id,
            ttl: l.ttl,
            remaining_ttl: l.remaining_ttl,
        });
        w.put_leases(leases)?;
        let (members, conf_state) = members(t)?;
        w.put_members(&members, &[])?;
        w.put_cluster(&Cluster {
            cluster_version: Some(CLUSTER_VERSION.into()),
            downgrade: None,
        })?;
        w.put_alarms(&Alarms::load(t)?.get(AlarmType::None))?;
        // The auth store as applied, as etcd's auth buckets.
        if let Some((auth, users, roles)) = auth(t)? {
            w.put_auth(&auth, users, roles)?;
        }
        let applied = cindex::load(t)?.applied;
        let compact = (self.compact_revision > 0).then_some(self.compact_revision);
        let meta = Meta {
            // etcd never stores 0 (restore replaces both anyway).
            consistent_index: applied.map_or(1, |l| l.index.max(1)),
            term: applied.map_or(1, |l| l.leader_id.term.max(1)),
            conf_state: Some(conf_state),
            scheduled_compact_rev: compact,
            finished_compact_rev: compact,
            // A 3.5-shaped file: 3.4 ignores the extra keys, 3.6 migrates it.
            storage_version: None,
        };
        Ok(w.finish(&meta)?)
    }
}

impl Capture {
    /// `Maintenance.Hash`: CRC-32C of every key and value of the captured state, in key
    /// order (the captured tables below the record space, the records `<= revision`, the
    /// tables above), except the consistent index (etcd's `DefaultIgnores`: it says how
    /// the state was reached, not what it is). Blocking: call from a blocking thread.
    /// Members at the same revision agree; it is meant for tests, as etcd says of `Hash`.
    ///
    /// Errors: sled I/O.
    pub fn hash(self, tree: &sled::Tree) -> Result<u32, BackupError> {
        let mut crc = Crc32c::new();
        let mut feed = |k: &[u8], v: &[u8]| {
            if k != schema::CONSISTENT_INDEX {
                crc.update(k);
                crc.update(v);
            }
        };
        let t = self.tables.tree();
        for kv in t.range(..[schema::RECORD_PREFIX].as_slice()) {
            let (k, v) = kv?;
            feed(&k, &v);
        }
        let bound = record_key_lower_bound(0)..record_key_lower_bound(self.revision + 1);
        for kv in tree.range(bound) {
            let (k, v) = kv?;
            feed(&k, &v);
        }
        for kv in t.range([schema::RECORD_PREFIX + 1].as_slice()..) {
            let (k, v) = kv?;
            feed(&k, &v);
        }
        Ok(crc.finish())
    }
}

/// The members (raft membership joined with the published attributes) and the raft
/// configuration, as etcd stores them.
fn members(t: &sled::Tree) -> Result<(Vec<Member>, ConfState), BackupError> {
    let stored: StoredMembership<NodeId, MemberNode> = match t.get(schema::RAFT_MEMBERSHIP)? {
        Some(v) => bincode::deserialize(&v).map_err(BackupError::Membership)?,
        None => StoredMembership::default(),
    };
    let attributes = Attributes::load(t)?;
    let config = stored.membership();
    let learners: Vec<u64> = config.learner_ids().collect();
    let members = config
        .nodes()
        .map(|(id, node)| {
            let attrs = attributes.get(*id);
            Member {
                id: *id,
                peer_urls: node.peer_urls.clone(),
                is_learner: learners.contains(id),
                name: attrs
                    .as_ref()
                    .map_or_else(|| node.name.clone(), |a| a.name.clone()),
                client_urls: attrs.map(|a| a.client_urls).unwrap_or_default(),
            }
        })
        .collect();
    let conf_state = ConfState {
        voters: config.voter_ids().collect(),
        learners,
        ..Default::default()
    };
    Ok((members, conf_state))
}

/// The auth flags, users and roles, if the store holds any auth key.
#[allow(clippy::type_complexity)]
fn auth(t: &sled::Tree) -> Result<Option<(AuthMeta, Vec<User>, Vec<Role>)>, BackupError> {
    if t.scan_prefix([schema::AUTH_PREFIX]).next().is_none() {
        return Ok(None);
    }
    let store = AuthStore::load(t)?;
    let meta = AuthMeta {
        enabled: store.is_enabled(),
        revision: store.revision(),
    };
    let users = store.users().values().cloned().collect();
    let roles = store.roles().values().cloned().collect();
    Ok(Some((meta, users, roles)))
}
