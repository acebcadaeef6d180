//! A client's deadline (`grpc-timeout`, gRPC's HTTP/2 protocol spec) answered as etcd's
//! server answers it: `DeadlineExceeded` with Go's `context deadline exceeded`.
//!
//! tonic enforces `grpc-timeout` itself, outside every layer Keel adds, and ends an expired
//! call with `Cancelled`, `Timeout expired` (its `TimeoutExpired`): clients, their retry
//! logic and the `grpc_server_handled_total` counts read that as a cancel (a fresh-user
//! check saw it in etcdctl's retry log against a cluster without quorum). This layer runs
//! inside tonic's and ends the call [`EARLY`] before the deadline, so its answer is the one
//! sent. The deadline bounds the response head, as tonic's does: a stream's messages are
//! not cut off.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::http::{HeaderMap, Request, Response};
use futures::future::Either;
use tonic::Status;
use tower_layer::Layer;
use tower_service::Service;

/// How much earlier than the client's deadline the call ends: one tick of tokio's timer
/// (1 ms), so this sleep never fires after tonic's own.
pub const EARLY: Duration = Duration::from_millis(1);

/// Adds [`Deadline`] to a service.
#[derive(Clone, Copy, Default)]
pub struct DeadlineLayer;

impl<S> Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;

    fn layer(&self, inner: S) -> Deadline<S> {
        Deadline { inner }
    }
}

/// Ends a call whose `grpc-timeout` runs out with etcd's `DeadlineExceeded`.
#[derive(Clone)]
pub struct Deadline<S> {
    inner: S,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Deadline<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: Default,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = Either<S::Future, BoxFuture<Response<ResBody>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let timeout = grpc_timeout(req.headers());
        let call = self.inner.call(req);
        let Some(timeout) = timeout else {
            return Either::Left(call);
        };
        Either::Right(Box::pin(async move {
            tokio::select! {
                biased;
                answer = call => answer,
                () = tokio::time::sleep(timeout.saturating_sub(EARLY)) => {
                    Ok(Status::deadline_exceeded("context deadline exceeded").into_http())
                }
            }
        }))
    }
}

/// The `grpc-timeout` header as a duration: 1 to 8 ASCII digits and a unit, `H`ours,
/// `M`inutes, `S`econds, `m`illiseconds, `u`microseconds or `n`anoseconds (gRPC's HTTP/2
/// protocol spec). `None` when absent or malformed (the call then has no deadline here;
/// tonic refuses a malformed one itself).
pub fn grpc_timeout(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use axum::http::HeaderValue;
    use futures::future::{Pending, Ready, pending, ready};

    use super::*;

    /// A service that never answers.
    struct Never;

    impl Service<Request<()>> for Never {
        type Response = Response<String>;
        type Error = Infallible;
        type Future = Pending<Result<Response<String>, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<()>) -> Self::Future {
            pending()
        }
    }

    /// A service that answers `ok` at once.
    struct Ok200;

    impl Service<Request<()>> for Ok200 {
        type Response = Response<String>;
        type Error = Infallible;
        type Future = Ready<Result<Response<String>, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<()>) -> Self::Future {
            ready(Ok(Response::new("ok".to_string())))
        }
    }

    fn timeout(value: &str) -> Option<Duration> {
        let mut headers = HeaderMap::new();
        headers.insert("grpc-timeout", HeaderValue::from_str(value).unwrap());
        grpc_timeout(&headers)
    }

    #[test]
    fn grpc_timeout_parses_every_unit_and_refuses_the_rest() {
        assert_eq!(timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(timeout("4999994u"), Some(Duration::from_micros(4_999_994)));
        assert_eq!(timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(timeout("7n"), Some(Duration::from_nanos(7)));
        for bad in ["", "S", "5", "5s", "123456789S", "-5S", "5 S"] {
            assert_eq!(timeout(bad), None, "{bad:?}");
        }
        assert_eq!(grpc_timeout(&HeaderMap::new()), None);
    }

    /// A call that never answers, with a 50 ms deadline: etcd's DeadlineExceeded once the
    /// deadline (less [`EARLY`]) passed.
    #[tokio::test]
    async fn an_expired_call_answers_deadline_exceeded() {
        let mut svc = DeadlineLayer.layer(Never);
        let req = Request::builder()
            .header("grpc-timeout", "50m")
            .body(())
            .unwrap();
        let started = std::time::Instant::now();
        let answer = svc.call(req).await.unwrap();
        assert!(
            started.elapsed() >= Duration::from_millis(49),
            "{:?}",
            started.elapsed()
        );
        let status = Status::from_header_map(answer.headers()).unwrap();
        assert_eq!(
            (status.code(), status.message()),
            (tonic::Code::DeadlineExceeded, "context deadline exceeded")
        );
    }

    /// An answer within the deadline, and a call without one, pass through.
    #[tokio::test]
    async fn answers_in_time_pass_through() {
        let mut svc = DeadlineLayer.layer(Ok200);
        for with in [true, false] {
            let mut req = Request::builder();
            if with {
                req = req.header("grpc-timeout", "5S");
            }
            let answer = svc.call(req.body(()).unwrap()).await.unwrap();
            assert_eq!(answer.into_body(), "ok");
        }
    }
}
