//! Typed KV calls (etcd `KV` service: Range, Put, DeleteRange, Txn, Compact).

use keel_proto::etcdserverpb::kv_client::KvClient;
use keel_proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, TxnRequest, TxnResponse, request_op,
};

use tonic::Status;

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

    /// etcd 3.7 `RangeStream`, merged: the same `RangeResponse` as [`Client::range`], read
    /// as chunks at one pinned revision, so neither the member nor one gRPC message has to
    /// hold a large range whole (use it for big lists). Members without RangeStream (etcd
    /// ≤ 3.6, older Keel) answer `Unimplemented` and get a unary `Range` instead, as
    /// kube-apiserver falls back; so do a custom sort order and revision filters, which
    /// RangeStream refuses. Each chunk must arrive within the request timeout; a transient
    /// failure restarts the whole read on another member.
    pub async fn range_stream(&self, req: RangeRequest) -> Result<RangeResponse, ClientError> {
        let timeout = self.options().request_timeout;
        let merged = self
            .call(true, |ch| {
                let mut request = self.request(req.clone());
                // The per-chunk deadline below bounds the call instead of one overall one.
                request.metadata_mut().remove("grpc-timeout");
                async move {
                    match read_chunks(ch, request, timeout).await {
                        Err(s) if s.code() == tonic::Code::Unimplemented => Ok(None),
                        other => other.map(Some),
                    }
                }
            })
            .await?;
        match merged {
            Some(resp) => Ok(resp),
            None => self.range(req).await,
        }
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

/// `proto.Merge` of one RangeStream chunk into `out`: kvs append; a set header, `more` or
/// `count` replaces the one before (they are on the final chunk only).
fn merge(out: &mut RangeResponse, chunk: RangeResponse) {
    out.kvs.extend(chunk.kvs);
    if chunk.header.is_some() {
        out.header = chunk.header;
    }
    out.more |= chunk.more;
    if chunk.count != 0 {
        out.count = chunk.count;
    }
}

/// Reads one RangeStream call to its end and merges its chunks; each chunk within `timeout`.
async fn read_chunks(
    ch: tonic::transport::Channel,
    request: tonic::Request<RangeRequest>,
    timeout: std::time::Duration,
) -> Result<RangeResponse, Status> {
    let mut chunks = KvClient::new(ch)
        .max_decoding_message_size(usize::MAX)
        .range_stream(request)
        .await?
        .into_inner();
    let mut out = RangeResponse::default();
    loop {
        let chunk = tokio::time::timeout(timeout, chunks.message())
            .await
            .map_err(|_| Status::deadline_exceeded("RangeStream chunk timed out"))??;
        match chunk {
            Some(c) => merge(&mut out, c.range_response.unwrap_or_default()),
            None => return Ok(out),
        }
    }
}
