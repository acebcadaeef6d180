//! The lease part of apply: maps the lease entries of `keelpb.RaftRequest` to
//! [`Lessor`] changes and their responses, and checks the lease of a plain put.
//!
//! Called by `apply::Applier` inside the entry's MVCC write view; the returned
//! [`ApplyOutcome`] goes to [`Lessor::publish`] once the batch committed.

use keel_proto::etcdserverpb::{
    LeaseCheckpointResponse, LeaseGrantResponse, LeaseRevokeResponse, PutRequest,
};
use keel_proto::keelpb::{
    LeaseExpireResponse, raft_request::Request as Rq, raft_response::Response as Rs,
};

use super::{ApplyOutcome, Lessor, NO_LEASE};
use crate::error::EtcdError;
use crate::mvcc::WriteTxn;

impl Lessor {
    /// etcd `applierV3backend.checkPut` for a plain put: a non-zero lease must exist.
    ///
    /// Errors: `LeaseNotFound`.
    pub fn check_put(&self, req: &PutRequest) -> Result<(), EtcdError> {
        if req.lease != NO_LEASE && !self.contains(req.lease) {
            return Err(EtcdError::LeaseNotFound);
        }
        Ok(())
    }

    /// Applies a lease entry through `w`; returns its response and the outcome to publish.
    ///
    /// Errors: the etcd errors of [`Lessor::apply_grant`] and [`Lessor::apply_revoke`];
    /// `Internal` for a request that is not a lease entry.
    pub fn apply_request(
        &self,
        w: &mut WriteTxn<'_>,
        req: &Rq,
    ) -> Result<(Rs, ApplyOutcome), EtcdError> {
        match req {
            Rq::LeaseGrant(r) => {
                let outcome = self.apply_grant(w, r)?;
                let resp = LeaseGrantResponse {
                    id: r.id,
                    ttl: r.ttl,
                    ..Default::default()
                };
                Ok((Rs::LeaseGrant(resp), outcome))
            }
            Rq::LeaseRevoke(r) => {
                let outcome = self.apply_revoke(w, &[r.id], true)?;
                Ok((Rs::LeaseRevoke(LeaseRevokeResponse::default()), outcome))
            }
            Rq::LeaseExpire(r) => {
                let outcome = self.apply_revoke(w, &r.ids, false)?;
                let revoked = match &outcome {
                    ApplyOutcome::Revoked(ids) => ids.len() as i64,
                    _ => 0,
                };
                Ok((Rs::LeaseExpire(LeaseExpireResponse { revoked }), outcome))
            }
            Rq::LeaseCheckpoint(r) => {
                let outcome = self.apply_checkpoint(w, &r.checkpoints);
                Ok((
                    Rs::LeaseCheckpoint(LeaseCheckpointResponse::default()),
                    outcome,
                ))
            }
            _ => Err(EtcdError::Internal("keel: not a lease request".into())),
        }
    }
}
