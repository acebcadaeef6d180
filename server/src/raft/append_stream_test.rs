//! `AppendStreams` against small in-process `keelpb.Peer` servers: responses reach the request
//! they answer, a failed stream fails its waiters and the next request opens a new one, and a
//! peer without the stream (a 0.1.0 member) gets unary RPCs.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::Stream;
use keel_proto::keelpb::RaftPayload;
use keel_proto::keelpb::peer_server::{Peer, PeerServer};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Code, Request, Response, Status, Streaming};

use super::append_stream::{MAX_ABANDONED, OnGiveUp, Sent};
use super::peers::Peers;

type Answers = Pin<Box<dyn Stream<Item = Result<RaftPayload, Status>> + Send>>;

/// A follower stand-in. `Echo`: answers each request with its bytes reversed, after a delay
/// that shrinks from request to request (so a later answer is ready first, as a later
/// AppendEntries can be when its batch is small). `FailAfter(n)`: answers `n` requests of
/// every stream, then ends it with `Unavailable`. `NoStream`: serves no stream (0.1.0).
#[derive(Clone, Copy)]
enum Mode {
    Echo,
    FailAfter(usize),
    NoStream,
    /// The first stream answers nothing (a paused follower); later ones echo. Counts the
    /// first stream's response being dropped by the server (the leader reset it) in `resets`.
    HoldFirst,
}

struct Fake {
    mode: Mode,
    streams_opened: Arc<AtomicUsize>,
    resets: Arc<AtomicUsize>,
}

fn reversed(p: &RaftPayload) -> RaftPayload {
    RaftPayload {
        data: p.data.iter().rev().copied().collect(),
    }
}

#[tonic::async_trait]
impl Peer for Fake {
    async fn append_entries(
        &self,
        r: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        Ok(Response::new(reversed(r.get_ref())))
    }

    async fn append_entries_stream(
        &self,
        r: Request<Streaming<RaftPayload>>,
    ) -> Result<Response<Answers>, Status> {
        let mode = self.mode;
        if matches!(mode, Mode::NoStream) {
            return Err(Status::unimplemented("Not yet implemented"));
        }
        let nth = self.streams_opened.fetch_add(1, Ordering::SeqCst);
        let mut inbound = r.into_inner();
        if matches!(mode, Mode::HoldFirst) && nth == 0 {
            let resets = self.resets.clone();
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<RaftPayload, Status>>(1);
            tokio::spawn(async move {
                // The requests are read and never answered. The response stays open until the
                // server drops it, which it does when the leader resets the HTTP/2 stream (a
                // clean end of the requests would leave it open).
                tokio::spawn(async move { while inbound.next().await.is_some() {} });
                tx.closed().await;
                resets.fetch_add(1, Ordering::SeqCst);
            });
            return Ok(Response::new(Box::pin(
                tokio_stream::wrappers::ReceiverStream::new(rx),
            )));
        }
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move {
            let mut pending = futures::stream::FuturesOrdered::new();
            let mut answered = 0usize;
            let mut n = 0u64;
            loop {
                tokio::select! {
                    Some(answer) = pending.next(), if !pending.is_empty() => {
                        if matches!(mode, Mode::FailAfter(limit) if answered == limit) {
                            let _ = tx.send(Err(Status::unavailable("follower went away"))).await;
                            return;
                        }
                        answered += 1;
                        if tx.send(Ok(answer)).await.is_err() {
                            return;
                        }
                    }
                    msg = inbound.next() => match msg {
                        Some(Ok(p)) => {
                            let delay = Duration::from_millis(20u64.saturating_sub(n * 2));
                            n += 1;
                            pending.push_back(async move {
                                tokio::time::sleep(delay).await;
                                reversed(&p)
                            });
                        }
                        _ => break,
                    },
                }
            }
            while let Some(answer) = pending.next().await {
                let _ = tx.send(Ok(answer)).await;
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

/// Serves `mode` on a free loopback port; returns its URL and the count of streams opened.
async fn serve(mode: Mode) -> (String, Arc<AtomicUsize>) {
    let (url, opened, _) = serve_counting(mode).await;
    (url, opened)
}

/// [`serve`], also returning the count of streams the leader reset ([`Mode::HoldFirst`]).
async fn serve_counting(mode: Mode) -> (String, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let opened = Arc::new(AtomicUsize::new(0));
    let resets = Arc::new(AtomicUsize::new(0));
    let fake = Fake {
        mode,
        streams_opened: opened.clone(),
        resets: resets.clone(),
    };
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(PeerServer::new(fake))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    (url, opened, resets)
}

fn payload(i: u32) -> RaftPayload {
    RaftPayload {
        data: i.to_be_bytes().to_vec(),
    }
}

fn answer(sent: Sent) -> Result<RaftPayload, Status> {
    match sent {
        Sent::Answer(a) => a,
        Sent::Unary(_) => panic!("expected an answer on the stream, got a unary fallback"),
    }
}

#[tokio::test]
async fn each_request_gets_its_own_answer_on_one_stream() {
    let (url, opened) = serve(Mode::Echo).await;
    let peers = Arc::new(Peers::default());
    let mut tasks = Vec::new();
    for i in 0..40u32 {
        let peers = peers.clone();
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let got = answer(
                peers
                    .append_streams()
                    .send(&peers, &url, payload(i), OnGiveUp::CancelStream)
                    .await,
            );
            (i, got.expect("answered"))
        }));
        if i % 4 == 0 {
            tokio::task::yield_now().await;
        }
    }
    for t in tasks {
        let (i, got) = t.await.unwrap();
        assert_eq!(
            got,
            reversed(&payload(i)),
            "request {i} got another's answer"
        );
    }
    assert_eq!(
        opened.load(Ordering::SeqCst),
        1,
        "all requests share one stream"
    );
}

#[tokio::test]
async fn a_failed_stream_fails_its_waiters_and_the_next_request_opens_another() {
    let (url, opened) = serve(Mode::FailAfter(1)).await;
    let peers = Peers::default();
    let streams = peers.append_streams();
    assert_eq!(
        answer(
            streams
                .send(&peers, &url, payload(1), OnGiveUp::CancelStream)
                .await
        )
        .unwrap(),
        reversed(&payload(1))
    );
    let err = answer(
        streams
            .send(&peers, &url, payload(2), OnGiveUp::CancelStream)
            .await,
    )
    .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert_eq!(err.message(), "follower went away");
    // The next request must not join the dead stream (it would wait forever).
    let got = tokio::time::timeout(
        Duration::from_secs(5),
        streams.send(&peers, &url, payload(3), OnGiveUp::CancelStream),
    )
    .await
    .expect("a new stream answers");
    assert_eq!(answer(got).unwrap(), reversed(&payload(3)));
    assert_eq!(opened.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_peer_without_the_stream_gets_unary_rpcs() {
    let (url, opened) = serve(Mode::NoStream).await;
    let peers = Peers::default();
    let streams = peers.append_streams();
    let err = answer(
        streams
            .send(&peers, &url, payload(1), OnGiveUp::CancelStream)
            .await,
    )
    .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
    match streams
        .send(&peers, &url, payload(2), OnGiveUp::CancelStream)
        .await
    {
        Sent::Unary(p) => assert_eq!(p, payload(2), "the payload comes back to be sent"),
        Sent::Answer(a) => panic!("expected the unary fallback, got {a:?}"),
    }
    assert_eq!(opened.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_reset_closes_the_stream_and_the_next_request_reopens_it() {
    let (url, opened) = serve(Mode::Echo).await;
    let peers = Peers::default();
    let streams = peers.append_streams();
    answer(
        streams
            .send(&peers, &url, payload(1), OnGiveUp::CancelStream)
            .await,
    )
    .unwrap();
    peers.reset(&url);
    assert_eq!(
        answer(
            streams
                .send(&peers, &url, payload(2), OnGiveUp::CancelStream)
                .await
        )
        .unwrap(),
        reversed(&payload(2))
    );
    assert_eq!(opened.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_caller_that_gives_up_resets_the_stream() {
    let (url, opened, resets) = serve_counting(Mode::HoldFirst).await;
    let peers = Arc::new(Peers::default());
    // Two requests in flight to a follower that answers nothing; the first caller gives up.
    let second = {
        let peers = peers.clone();
        let url = url.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            answer(
                peers
                    .append_streams()
                    .send(&peers, &url, payload(2), OnGiveUp::CancelStream)
                    .await,
            )
        })
    };
    let first = tokio::time::timeout(
        Duration::from_millis(200),
        peers
            .append_streams()
            .send(&peers, &url, payload(1), OnGiveUp::CancelStream),
    )
    .await;
    assert!(first.is_err(), "the held stream answered");
    assert_cancelled(second).await;
    assert_reset_then_reopened(&peers, &url, &opened, &resets).await;
}

type Waiting = tokio::task::JoinHandle<Result<RaftPayload, Status>>;

/// Asserts `waiting` fails with `DeadlineExceeded` within 5 s: another caller cancelled its
/// stream.
async fn assert_cancelled(waiting: Waiting) {
    let err = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter is failed at once")
        .unwrap()
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
}

/// Asserts the follower sees its first stream reset within 5 s (not a clean end it would
/// answer in full), and that the next request opens a second stream and gets its answer.
async fn assert_reset_then_reopened(
    peers: &Peers,
    url: &str,
    opened: &AtomicUsize,
    resets: &AtomicUsize,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while resets.load(Ordering::SeqCst) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stream was not reset"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let streams = peers.append_streams();
    let got = answer(
        streams
            .send(peers, url, payload(3), OnGiveUp::CancelStream)
            .await,
    );
    assert_eq!(got.unwrap(), reversed(&payload(3)));
    assert_eq!(opened.load(Ordering::SeqCst), 2);
}

/// Waits up to 5 s for `n` waiters on the stream to `url` (requests sent, not answered).
async fn queued(peers: &Peers, url: &str, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while peers.append_streams().waiters(url) < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {n} requests queued",
            peers.append_streams().waiters(url)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_heartbeat_that_gives_up_leaves_the_stream_and_its_entries_alone() {
    let (url, opened, resets) = serve_counting(Mode::HoldFirst).await;
    let peers = Arc::new(Peers::default());
    // Entries in flight to a follower that has not answered yet, then a heartbeat behind them
    // whose caller gives up.
    let entries = {
        let (peers, url) = (peers.clone(), url.clone());
        tokio::spawn(async move {
            let streams = peers.append_streams();
            answer(
                streams
                    .send(&peers, &url, payload(1), OnGiveUp::CancelStream)
                    .await,
            )
        })
    };
    queued(&peers, &url, 1).await;
    let heartbeat = tokio::time::timeout(
        Duration::from_millis(100),
        peers
            .append_streams()
            .send(&peers, &url, payload(2), OnGiveUp::LeaveQueued),
    )
    .await;
    assert!(heartbeat.is_err(), "the held stream answered");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!entries.is_finished(), "the entries' request was failed");
    assert_eq!(peers.append_streams().waiters(&url), 2);
    assert_eq!(resets.load(Ordering::SeqCst), 0, "the stream was reset");
    assert_eq!(opened.load(Ordering::SeqCst), 1);
    entries.abort();
}

#[tokio::test]
async fn heartbeats_piling_up_past_the_bound_cancel_the_stream() {
    let (url, opened, resets) = serve_counting(Mode::HoldFirst).await;
    let peers = Arc::new(Peers::default());
    let held: Vec<_> = (0..MAX_ABANDONED as u32)
        .map(|i| {
            let (peers, url) = (peers.clone(), url.clone());
            tokio::spawn(async move {
                let streams = peers.append_streams();
                answer(
                    streams
                        .send(&peers, &url, payload(i), OnGiveUp::LeaveQueued)
                        .await,
                )
            })
        })
        .collect();
    queued(&peers, &url, MAX_ABANDONED).await;
    let last = tokio::time::timeout(
        Duration::from_millis(100),
        peers
            .append_streams()
            .send(&peers, &url, payload(9999), OnGiveUp::LeaveQueued),
    )
    .await;
    assert!(last.is_err(), "the held stream answered");
    for h in held {
        assert_cancelled(h).await;
    }
    assert_reset_then_reopened(&peers, &url, &opened, &resets).await;
}
