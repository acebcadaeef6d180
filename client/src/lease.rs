//! Typed lease calls (etcd `Lease` service: LeaseGrant, LeaseRevoke, LeaseKeepAlive).

use keel_proto::etcdserverpb::lease_client::LeaseClient;
use keel_proto::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseRevokeRequest, LeaseRevokeResponse,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use crate::client::Client;
use crate::error::ClientError;

/// An open `LeaseKeepAlive` stream for one lease (etcd clientv3 keeps one stream per
/// client; benchmarks open one per worker).
pub struct LeaseKeepAlive {
    id: i64,
    endpoint: String,
    requests: mpsc::Sender<LeaseKeepAliveRequest>,
    responses: Streaming<LeaseKeepAliveResponse>,
}

impl LeaseKeepAlive {
    /// The lease this stream renews.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// Renews the lease once and returns the answer; `ttl` is the new remaining TTL in
    /// seconds, or 0 if the lease expired or was revoked (etcd semantics).
    ///
    /// Errors: [`ClientError::ConnectionLost`] if the stream ended, else the stream's status.
    pub async fn keep_alive_once(&mut self) -> Result<LeaseKeepAliveResponse, ClientError> {
        let lost = || ClientError::ConnectionLost {
            message: format!("lease keep-alive stream to {} closed", self.endpoint),
        };
        self.requests
            .send(LeaseKeepAliveRequest { id: self.id })
            .await
            .map_err(|_| lost())?;
        match self.responses.message().await {
            Ok(Some(r)) => Ok(r),
            Ok(None) => Err(lost()),
            Err(s) => Err(ClientError::from_status(&s, &self.endpoint)),
        }
    }
}

impl Client {
    /// Grants a lease of `ttl_s` seconds with a server-chosen ID (etcd `LeaseGrant`, ID 0).
    /// Not idempotent (each grant creates a lease): retried only when not applied.
    pub async fn lease_grant(&self, ttl_s: i64) -> Result<LeaseGrantResponse, ClientError> {
        let req = LeaseGrantRequest { ttl: ttl_s, id: 0 };
        self.unary(false, req, |ch, r| async move {
            LeaseClient::new(ch).lease_grant(r).await
        })
        .await
    }

    /// Revokes lease `id` and deletes its keys (etcd `LeaseRevoke`).
    pub async fn lease_revoke(&self, id: i64) -> Result<LeaseRevokeResponse, ClientError> {
        let req = LeaseRevokeRequest { id };
        self.unary(false, req, |ch, r| async move {
            LeaseClient::new(ch).lease_revoke(r).await
        })
        .await
    }

    /// Opens a `LeaseKeepAlive` stream for lease `id` on the next connection.
    ///
    /// Errors: the status of opening the stream, classified.
    pub async fn lease_keep_alive(&self, id: i64) -> Result<LeaseKeepAlive, ClientError> {
        let (channel, endpoint) = self.next_channel_at();
        let (tx, rx) = mpsc::channel(16);
        let responses = LeaseClient::new(channel)
            .lease_keep_alive(ReceiverStream::new(rx))
            .await
            .map_err(|s| ClientError::from_status(&s, &endpoint))?
            .into_inner();
        Ok(LeaseKeepAlive {
            id,
            endpoint,
            requests: tx,
            responses,
        })
    }
}
