//! Typed KV calls (etcd `KV` service: Range, Put, DeleteRange, Txn, Compact).

use keel_proto::etcdserverpb::kv_client::KvClient;
use keel_proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, TxnRequest, TxnResponse, request_op,
};

use crate::client::Client;
use crate::error::ClientError;

/// Read consistency of a range (etcd `RangeRequest.serializable`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consistency {
    /// Linearizable (etcd's default): the member confirms with the leader (ReadIndex)
    /// before answering, so the read sees every write acknowledged before it started.
    Linearizable,
    /// Serializable: the member answers from its own applied state, possibly stale.
    Serializable,
}

impl Client {
    /// Puts `value` at `key` (etcd `Put`). Retried only when the error proves it was not
    /// applied (a put with `prev_kv` or a lease is not idempotent in its answer or effect).
    pub async fn put(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
    ) -> Result<PutResponse, ClientError> {
        self.put_request(PutRequest {
            key: key.into(),
            value: value.into(),
            ..Default::default()
        })
        .await
    }

    /// etcd `Put` with every field of `PutRequest` (lease, prev_kv, ignore_value, ...).
    pub async fn put_request(&self, req: PutRequest) -> Result<PutResponse, ClientError> {
        self.unary(
            false,
            req,
            |ch, r| async move { KvClient::new(ch).put(r).await },
        )
        .await
    }

    /// Reads one key (etcd `Range` with an empty `range_end`). Retried on another member on
    /// transient errors.
    pub async fn get(
        &self,
        key: impl Into<Vec<u8>>,
        consistency: Consistency,
    ) -> Result<RangeResponse, ClientError> {
        self.range(RangeRequest {
            key: key.into(),
            serializable: consistency == Consistency::Serializable,
            ..Default::default()
        })
        .await
    }

    /// etcd `Range` with every field of `RangeRequest`. Reads are idempotent: retried on
    /// another member on transient errors.
    pub async fn range(&self, req: RangeRequest) -> Result<RangeResponse, ClientError> {
        self.unary(true, req, |ch, r| async move {
            KvClient::new(ch).range(r).await
        })
        .await
    }

    /// Deletes one key (etcd `DeleteRange` with an empty `range_end`); `deleted` is 0 or 1.
    pub async fn delete(
        &self,
        key: impl Into<Vec<u8>>,
    ) -> Result<DeleteRangeResponse, ClientError> {
        self.delete_range(DeleteRangeRequest {
            key: key.into(),
            ..Default::default()
        })
        .await
    }

    /// etcd `DeleteRange` with every field. A write: retried only when not applied.
    pub async fn delete_range(
        &self,
        req: DeleteRangeRequest,
    ) -> Result<DeleteRangeResponse, ClientError> {
        self.unary(false, req, |ch, r| async move {
            KvClient::new(ch).delete_range(r).await
        })
        .await
    }

    /// etcd `Txn`. A txn whose branches only read is retried like a read; any other txn
    /// only when the error proves it was not applied.
    pub async fn txn(&self, req: TxnRequest) -> Result<TxnResponse, ClientError> {
        let read_only = req
            .success
            .iter()
            .chain(req.failure.iter())
            .all(|op| matches!(op.request, Some(request_op::Request::RequestRange(_))));
        self.unary(read_only, req, |ch, r| async move {
            KvClient::new(ch).txn(r).await
        })
        .await
    }

    /// etcd `Compact`: discards revisions below `revision`; `physical` waits until the
    /// compacted records are removed from the backend. Compacting twice at one revision
    /// fails with [`crate::EtcdText::Compacted`], so it is retried only when not applied.
    pub async fn compact(
        &self,
        revision: i64,
        physical: bool,
    ) -> Result<CompactionResponse, ClientError> {
        let req = CompactionRequest { revision, physical };
        self.unary(false, req, |ch, r| async move {
            KvClient::new(ch).compact(r).await
        })
        .await
    }
}
