//! Client streams end when their member stops (SIGTERM, its removal; `Node::begin_stop`).
//!
//! Watch, LeaseKeepAlive and Observe streams run until their clients close them, so a
//! graceful shutdown that waits for them waited its whole drain bound (5 s) whenever a
//! client held one: a single member with one `etcdctl watch` took 6.4 s to exit on SIGTERM,
//! etcd 3.4.23 1.6 s. Each such stream therefore ends with `etcdserver: server stopped`
//! (`Unavailable`, etcd's `ErrGRPCStopped`) once the member stops: clientv3 takes it as a
//! transient error and resumes the stream on another endpoint, as it does when etcd's
//! stopping server closes its transports.

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use tonic::Status;

use crate::error::EtcdError;

/// `inner`'s items until `stopped` resolves, then `etcdserver: server stopped` and the end.
/// An `inner` that ends first ends the stream as usual.
pub fn until_stopped<S, T>(
    inner: S,
    stopped: futures::future::BoxFuture<'static, ()>,
) -> BoxStream<'static, Result<T, Status>>
where
    S: Stream<Item = Result<T, Status>> + Send + 'static,
    T: Send + 'static,
{
    let state = Some((Box::pin(inner), stopped));
    futures::stream::unfold(state, |state| async move {
        let (mut inner, mut stopped) = state?;
        tokio::select! {
            biased;
            item = inner.next() => item.map(|item| (item, Some((inner, stopped)))),
            () = &mut stopped => Some((Err(EtcdError::Stopped.into()), None)),
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stop_ends_the_stream_with_server_stopped_after_what_was_ready() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let stopped = Box::pin(async move {
            let _ = rx.await;
        });
        let (items_tx, items_rx) = tokio::sync::mpsc::channel::<Result<u32, Status>>(4);
        let mut stream = until_stopped(
            tokio_stream::wrappers::ReceiverStream::new(items_rx),
            stopped,
        );
        items_tx.send(Ok(1)).await.unwrap();
        assert_eq!(stream.next().await.unwrap().unwrap(), 1);
        items_tx.send(Ok(2)).await.unwrap();
        tx.send(()).unwrap();
        // An item already waiting goes out first, then the stop.
        assert_eq!(stream.next().await.unwrap().unwrap(), 2);
        let end = stream.next().await.unwrap().unwrap_err();
        assert_eq!(end.code(), tonic::Code::Unavailable);
        assert_eq!(end.message(), "etcdserver: server stopped");
        assert!(stream.next().await.is_none());
        drop(items_tx);
    }

    #[tokio::test]
    async fn an_inner_end_ends_the_stream_without_an_error() {
        let stopped = Box::pin(std::future::pending::<()>());
        let mut stream = until_stopped(futures::stream::iter([Ok::<u32, Status>(7)]), stopped);
        assert_eq!(stream.next().await.unwrap().unwrap(), 7);
        assert!(stream.next().await.is_none());
    }
}
