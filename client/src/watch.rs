//! Typed watch streams (etcd `Watch` service).

use keel_proto::etcdserverpb::watch_client::WatchClient;
use keel_proto::etcdserverpb::{WatchCreateRequest, WatchRequest, WatchResponse, watch_request};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use crate::client::Client;
use crate::error::ClientError;

/// One watch on its own `Watch` stream, created and confirmed (etcd `WatchResponse.created`).
pub struct WatchStream {
    watch_id: i64,
    endpoint: String,
    // Kept so the server does not see the request side close (which ends the stream).
    _requests: mpsc::Sender<WatchRequest>,
    responses: Streaming<WatchResponse>,
}

impl WatchStream {
    /// The server-assigned watch ID.
    pub fn watch_id(&self) -> i64 {
        self.watch_id
    }

    /// The next response with events or a progress notification; `Ok(None)` when the
    /// server closed the stream.
    ///
    /// Errors: [`ClientError::WatchCanceled`] when the server cancels the watch (e.g. its
    /// start revision was compacted), else the stream's status.
    pub async fn next(&mut self) -> Result<Option<WatchResponse>, ClientError> {
        match self.responses.message().await {
            Ok(Some(r)) if r.canceled => Err(ClientError::WatchCanceled {
                reason: r.cancel_reason,
                compact_revision: r.compact_revision,
            }),
            Ok(r) => Ok(r),
            Err(s) => Err(ClientError::from_status(&s, &self.endpoint)),
        }
    }
}

impl Client {
    /// Watches `key` (and keys up to `range_end` if not empty) from `start_revision` (0 =
    /// from the next revision) on a new stream on the next connection, and waits for the
    /// server to confirm the watch.
    ///
    /// Errors: the status of opening the stream; [`ClientError::WatchCanceled`] if the
    /// server refuses the watch (e.g. a compacted start revision).
    pub async fn watch_key(
        &self,
        key: impl Into<Vec<u8>>,
        range_end: impl Into<Vec<u8>>,
        start_revision: i64,
    ) -> Result<WatchStream, ClientError> {
        self.watch_with(WatchCreateRequest {
            key: key.into(),
            range_end: range_end.into(),
            start_revision,
            ..Default::default()
        })
        .await
    }

    /// Opens a watch with every field of `WatchCreateRequest` (filters, prev_kv,
    /// progress_notify, fragment).
    pub async fn watch_with(&self, create: WatchCreateRequest) -> Result<WatchStream, ClientError> {
        let (channel, endpoint) = self.next_channel_at();
        let (tx, rx) = mpsc::channel(4);
        let request = WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(create)),
        };
        let lost = |what: &str| ClientError::ConnectionLost {
            message: format!("watch stream {what}"),
        };
        tx.send(request).await.map_err(|_| lost("closed"))?;
        let mut responses = WatchClient::new(channel)
            .watch(ReceiverStream::new(rx))
            .await
            .map_err(|s| ClientError::from_status(&s, &endpoint))?
            .into_inner();
        match responses.message().await {
            Ok(Some(r)) if r.canceled => Err(ClientError::WatchCanceled {
                reason: r.cancel_reason,
                compact_revision: r.compact_revision,
            }),
            Ok(Some(r)) if r.created => Ok(WatchStream {
                watch_id: r.watch_id,
                endpoint: endpoint.clone(),
                _requests: tx,
                responses,
            }),
            Ok(_) => Err(lost("ended before the watch was created")),
            Err(s) => Err(ClientError::from_status(&s, &endpoint)),
        }
    }
}
