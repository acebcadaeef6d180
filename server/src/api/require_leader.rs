//! Require-leader requests (clientv3 `WithRequireLeader`: gRPC metadata `hasleader: true`),
//! as etcd's `v3rpc/interceptor.go` serves them:
//!
//! - every request carrying it, unary or stream, is refused with `etcdserver: no leader`
//!   (`Unavailable`) while the member has no leader ([`interceptor`], before the service
//!   sees the request);
//! - a watch stream carrying it ends with the same status once the member has been
//!   leaderless for three election timeouts ([`until_leader_lost`],
//!   `cluster::leadership::monitor`), so the client re-dials a member that has a leader.
//!
//! Requests without the metadata are served as before, leader or not.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::{Future, Stream};
use keel_proto::rpctypes::{METADATA_HAS_LEADER, METADATA_REQUIRE_LEADER_KEY};
use tokio::sync::watch;
use tonic::metadata::MetadataMap;
use tonic::{Request, Status};

use crate::cluster::Cluster;
use crate::error::EtcdError;

/// Whether the request asks to be served only with a leader (`hasleader: true`).
pub fn requested(metadata: &MetadataMap) -> bool {
    metadata
        .get(METADATA_REQUIRE_LEADER_KEY)
        .is_some_and(|v| v.as_bytes() == METADATA_HAS_LEADER.as_bytes())
}

/// The interceptor for every client service: refuses a require-leader request while
/// `cluster` has no leader.
pub fn interceptor(
    cluster: Arc<Cluster>,
) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone + Send + Sync + 'static {
    move |request: Request<()>| {
        if requested(request.metadata()) && !cluster.has_leader() {
            return Err(EtcdError::NoLeader.into());
        }
        Ok(request)
    }
}

/// `inner`, ended by an `etcdserver: no leader` status once `lost` turns true (etcd cancels
/// the stream's context with `ErrGRPCNoLeader`). Dropping the inner stream there is what
/// releases its watchers.
pub fn until_leader_lost<S, T>(inner: S, lost: watch::Receiver<bool>) -> UntilLeaderLost<S>
where
    S: Stream<Item = Result<T, Status>> + Unpin,
{
    let mut lost = lost;
    UntilLeaderLost {
        inner: Some(inner),
        lost: Box::pin(async move {
            // A dropped sender (member shutting down) ends the stream another way.
            if lost.wait_for(|l| *l).await.is_err() {
                futures::future::pending::<()>().await;
            }
        }),
    }
}

/// The stream of [`until_leader_lost`].
pub struct UntilLeaderLost<S> {
    inner: Option<S>,
    lost: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl<S, T> Stream for UntilLeaderLost<S>
where
    S: Stream<Item = Result<T, Status>> + Unpin,
{
    type Item = Result<T, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        if this.lost.as_mut().poll(cx).is_ready() {
            this.inner = None;
            return Poll::Ready(Some(Err(EtcdError::NoLeader.into())));
        }
        Pin::new(inner).poll_next(cx)
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    #[test]
    fn only_hasleader_true_requires_a_leader() {
        let mut md = MetadataMap::new();
        assert!(!requested(&md));
        md.insert("hasleader", "false".parse().unwrap());
        assert!(!requested(&md));
        md.insert("hasleader", "true".parse().unwrap());
        assert!(requested(&md));
    }

    #[tokio::test]
    async fn the_stream_ends_with_no_leader_when_the_signal_rises() {
        let (tx, rx) = watch::channel(false);
        let (item_tx, item_rx) = futures::channel::mpsc::unbounded::<Result<u32, Status>>();
        let mut s = until_leader_lost(item_rx, rx);
        item_tx.unbounded_send(Ok(1)).unwrap();
        assert_eq!(s.next().await.unwrap().unwrap(), 1);
        tx.send(true).unwrap();
        let err = s.next().await.unwrap().unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable);
        assert_eq!(err.message(), "etcdserver: no leader");
        assert!(s.next().await.is_none());
        assert!(
            item_tx.unbounded_send(Ok(2)).is_err(),
            "inner stream dropped"
        );
    }
}
