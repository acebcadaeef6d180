//! Alarms (etcd `server/etcdserver/api/v3alarm`, `apply.go` `applierV3Capped` and
//! `applierV3Corrupt`): the replicated set of raised `(member, alarm type)` pairs and what
//! apply refuses while one is active.
//!
//! - `Maintenance.Alarm` requests (GET, ACTIVATE, DEACTIVATE) are raft entries; apply changes
//!   the set with [`Alarms::apply`], which stages the change in the apply group's batch (the
//!   one that carries the consistent index) and updates the in-memory set at once, so later
//!   requests of the same group see it, exactly as on every other member.
//! - While a NOSPACE alarm is active, apply refuses requests that add data (Put, a Txn with a
//!   put, LeaseGrant) with `etcdserver: mvcc: database space exceeded`; while a CORRUPT alarm
//!   is active it refuses every write (Put, DeleteRange, Txn, Compaction, LeaseGrant,
//!   LeaseRevoke and Keel's LeaseExpire) with `etcdserver: corrupt cluster`
//!   ([`Alarms::refusal`]). Reads never go through apply, so they keep working.
//! - The quota that raises NOSPACE is checked before proposing ([`quota`]).
//!
//! Invariant: the in-memory set equals the `x/alarm/` keys of the member tree after every
//! flushed group; it is reloaded from the tree at start and after a snapshot install
//! ([`Alarms::reload`]).
//!
//! On disk: [`schema::ALARM_PREFIX`] + member ID (u64 BE) + alarm type (i32 BE) → empty.

pub mod quota;

use std::collections::BTreeSet;
use std::sync::RwLock;

use keel_proto::etcdserverpb::alarm_request::AlarmAction;
use keel_proto::etcdserverpb::{AlarmMember, AlarmRequest, AlarmResponse, AlarmType};
use keel_proto::keelpb::raft_request::Request as Rq;

use crate::backend::{Batch, schema};
use crate::error::EtcdError;

/// A stored alarm key that does not decode (a corrupt or foreign store).
#[derive(Debug, thiserror::Error)]
pub enum AlarmError {
    /// sled failed.
    #[error(transparent)]
    Storage(#[from] sled::Error),
    /// A key under the alarm prefix of the wrong length.
    #[error("alarm key {0} is not prefix + member ID + alarm type")]
    BadKey(String),
}

/// The active alarms of the cluster, as applied on this member. Shared by apply (writer) and
/// the API (Status, quota checks).
#[derive(Debug, Default)]
pub struct Alarms {
    /// `(alarm type, member ID)`: sorted by type, then member, the order GET answers in.
    active: RwLock<BTreeSet<(i32, u64)>>,
}

/// The key of one alarm in the member tree.
fn key(member_id: u64, alarm: i32) -> Vec<u8> {
    let mut k = schema::id_key(schema::ALARM_PREFIX, member_id.to_be_bytes());
    k.extend_from_slice(&alarm.to_be_bytes());
    k
}

fn member(&(alarm, member_id): &(i32, u64)) -> AlarmMember {
    AlarmMember { member_id, alarm }
}

impl Alarms {
    /// The alarms stored in `tree`.
    ///
    /// Errors: sled I/O or an undecodable alarm key.
    pub fn load(tree: &sled::Tree) -> Result<Alarms, AlarmError> {
        let alarms = Alarms::default();
        alarms.reload(tree)?;
        Ok(alarms)
    }

    /// Replaces the in-memory set with the alarms stored in `tree` (after a snapshot install).
    ///
    /// Errors: as [`Alarms::load`]; the set is unchanged then.
    pub fn reload(&self, tree: &sled::Tree) -> Result<(), AlarmError> {
        let p = schema::ALARM_PREFIX.len();
        let mut set = BTreeSet::new();
        for kv in tree.scan_prefix(schema::ALARM_PREFIX) {
            let (k, _) = kv?;
            if k.len() != p + 12 {
                return Err(AlarmError::BadKey(k.escape_ascii().to_string()));
            }
            let id = u64::from_be_bytes(k[p..p + 8].try_into().expect("8 bytes"));
            let at = i32::from_be_bytes(k[p + 8..].try_into().expect("4 bytes"));
            set.insert((at, id));
        }
        *self.write() = set;
        Ok(())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeSet<(i32, u64)>> {
        self.active.write().unwrap_or_else(|e| e.into_inner())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeSet<(i32, u64)>> {
        self.active.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The active alarms of type `alarm`, every active alarm for `NONE` (etcd `Get`), sorted
    /// by type then member ID.
    pub fn get(&self, alarm: AlarmType) -> Vec<AlarmMember> {
        self.read()
            .iter()
            .filter(|(at, _)| alarm == AlarmType::None || *at == alarm as i32)
            .map(member)
            .collect()
    }

    /// Whether any member has an alarm of type `alarm` raised.
    pub fn is_active(&self, alarm: AlarmType) -> bool {
        self.read().iter().any(|(at, _)| *at == alarm as i32)
    }

    /// Whether `member_id` has raised `alarm`.
    pub fn has(&self, member_id: u64, alarm: AlarmType) -> bool {
        self.read().contains(&(alarm as i32, member_id))
    }

    /// Applies one `Maintenance.Alarm` request (etcd `applierV3backend.Alarm`): GET lists;
    /// ACTIVATE raises (an already raised alarm is answered as is, `NONE` is ignored);
    /// DEACTIVATE clears the member's alarm (nothing when it is not raised: member 0 is not a
    /// wildcard). Changes are staged into `batch` and visible in memory at once.
    pub fn apply(&self, batch: &mut Batch, req: &AlarmRequest) -> AlarmResponse {
        let wanted = AlarmType::try_from(req.alarm).unwrap_or(AlarmType::None);
        let pair = (req.alarm, req.member_id);
        let alarms = match AlarmAction::try_from(req.action) {
            Ok(AlarmAction::Get) => self.get(wanted),
            Ok(AlarmAction::Activate) if wanted != AlarmType::None => {
                if self.write().insert(pair) {
                    batch.insert(key(req.member_id, req.alarm), Vec::<u8>::new());
                    tracing::warn!(member = %format!("{:x}", req.member_id), alarm = ?wanted, "alarm raised");
                }
                vec![member(&pair)]
            }
            Ok(AlarmAction::Deactivate) => {
                if self.write().remove(&pair) {
                    batch.remove(key(req.member_id, req.alarm));
                    tracing::info!(member = %format!("{:x}", req.member_id), alarm = ?wanted, "alarm cleared");
                    vec![member(&pair)]
                } else {
                    Vec::new()
                }
            }
            _ => Vec::new(),
        };
        // etcd 3.4 answers Alarm without a header.
        AlarmResponse {
            header: None,
            alarms,
        }
    }

    /// The error apply answers `req` with while an alarm is active, if any: CORRUPT refuses
    /// every write, NOSPACE the requests that add data ([`quota::adds_data`]).
    pub fn refusal(&self, req: &Rq) -> Option<EtcdError> {
        let active = self.read();
        if active.is_empty() {
            return None;
        }
        let raised = |at: AlarmType| active.iter().any(|(a, _)| *a == at as i32);
        let write = matches!(
            req,
            Rq::Put(_)
                | Rq::DeleteRange(_)
                | Rq::Txn(_)
                | Rq::Compaction(_)
                | Rq::LeaseGrant(_)
                | Rq::LeaseRevoke(_)
                | Rq::LeaseExpire(_)
        );
        if write && raised(AlarmType::Corrupt) {
            return Some(EtcdError::Corrupt);
        }
        if quota::adds_data(req) && raised(AlarmType::Nospace) {
            return Some(EtcdError::NoSpace);
        }
        None
    }

    /// The active alarms as `Maintenance.Status` lists them in `errors`: gogo-proto's compact
    /// text of each `AlarmMember` (etcd `v3_server.go` `Status`: `a.String()`), e.g.
    /// `memberID:10276657743932975437 alarm:NOSPACE `.
    pub fn status_errors(&self) -> Vec<String> {
        self.get(AlarmType::None)
            .iter()
            .map(|m| {
                let name = AlarmType::try_from(m.alarm)
                    .map(|a| a.as_str_name().to_string())
                    .unwrap_or_else(|_| m.alarm.to_string());
                // gogo's text format omits a zero field.
                if m.member_id == 0 {
                    format!("alarm:{name} ")
                } else {
                    format!("memberID:{} alarm:{name} ", m.member_id)
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
