//! `LeaderCalls` against small in-process `keelpb.Peer` servers: calls on one stream get their
//! own answers in any order, a leader's error comes back as that error, a stream that fails
//! fails its calls as ambiguous and the next call opens another, a caller's deadline gives
//! `Timeout`, and a leader without the stream (0.1.0) gets unary calls with nothing sent.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::Stream;
use keel_proto::etcdserverpb::{
    LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use keel_proto::keelpb::peer_server::{Peer, PeerServer};
use keel_proto::keelpb::{
    ForwardAnswer, PeerAnswer, PeerCall, PeerError, RaftPayload, RaftRequest, RaftResponse,
    ReadIndexRequest, ReadIndexResponse, peer_answer, peer_call,
};
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status, Streaming};

use super::leader_calls::{CallError, CallStream, Opened};
use super::peers::{PeerFailure, Peers};
use crate::error::EtcdError;

type Answers = Pin<Box<dyn Stream<Item = Result<PeerAnswer, Status>> + Send>>;

/// A leader stand-in for `LeaderCalls`.
#[derive(Clone, Copy)]
enum Mode {
    /// Answers a forward of request id `n` with revision `n` at log index `10 n`, after a delay
    /// that shrinks from call to call (so later calls are answered first); a read index from
    /// member `m` with index `m + 1`; a renewal of lease `l` with TTL `2 l`, a TimeToLive of
    /// it with TTL `3 l`.
    Answer,
    /// Answers every call with etcd's "not leader".
    NotLeader,
    /// Answers forwards of odd request ids with etcd's "request timed out" (an `Unavailable`
    /// status), the others as [`Mode::Answer`].
    TimeoutOdd,
    /// Answers `n` calls of every stream, then ends it with `Unavailable`.
    FailAfter(usize),
    /// Answers `n` calls of every stream, then ends it with etcd's "not leader", as a
    /// stopping Keel member ends a drained stream (`api::peer_calls`).
    DrainAfter(usize),
    /// Reads calls and answers none.
    Silent,
    /// Serves no stream (a 0.1.0 member); counts the unary calls it gets.
    NoStream,
    /// Refuses the stream as a member of another cluster does.
    Refuse,
}

struct Fake {
    mode: Mode,
    streams_opened: Arc<AtomicUsize>,
    calls_seen: Arc<AtomicUsize>,
}

fn answer_for(mode: Mode, call: &PeerCall) -> peer_answer::Answer {
    let refusal = match (mode, &call.call) {
        (Mode::NotLeader, _) => Some(EtcdError::NotLeader),
        (Mode::TimeoutOdd, Some(peer_call::Call::Forward(r))) if r.id % 2 == 1 => {
            Some(EtcdError::Timeout)
        }
        _ => None,
    };
    match (refusal, &call.call) {
        (Some(e), _) => {
            let status = Status::from(e);
            peer_answer::Answer::Error(PeerError {
                code: status.code() as i32,
                message: status.message().to_string(),
            })
        }
        (_, Some(peer_call::Call::Forward(r))) => peer_answer::Answer::Forward(ForwardAnswer {
            response: Some(RaftResponse {
                revision: r.id as i64,
                response: None,
            }),
            log_index: r.id * 10,
        }),
        (_, Some(peer_call::Call::ReadIndex(r))) => {
            peer_answer::Answer::ReadIndex(ReadIndexResponse {
                read_index: r.member_id + 1,
                term: 1,
            })
        }
        (_, Some(peer_call::Call::LeaseRenew(r))) => {
            peer_answer::Answer::LeaseRenew(LeaseKeepAliveResponse {
                id: r.id,
                ttl: r.id * 2,
                ..Default::default()
            })
        }
        (_, Some(peer_call::Call::LeaseTimeToLive(r))) => {
            peer_answer::Answer::LeaseTimeToLive(LeaseTimeToLiveResponse {
                id: r.id,
                ttl: r.id * 3,
                ..Default::default()
            })
        }
        (_, None) => panic!("an empty call"),
    }
}

#[tonic::async_trait]
impl Peer for Fake {
    async fn forward(&self, r: Request<RaftRequest>) -> Result<Response<RaftResponse>, Status> {
        self.calls_seen.fetch_add(1, Ordering::SeqCst);
        Ok(Response::new(RaftResponse {
            revision: r.get_ref().id as i64,
            response: None,
        }))
    }

    async fn leader_calls(
        &self,
        r: Request<Streaming<PeerCall>>,
    ) -> Result<Response<Answers>, Status> {
        let mode = self.mode;
        match mode {
            Mode::NoStream => return Err(Status::unimplemented("Not yet implemented")),
            Mode::Refuse => return Err(Status::failed_precondition("cluster ID mismatch")),
            _ => {}
        }
        self.streams_opened.fetch_add(1, Ordering::SeqCst);
        let seen = self.calls_seen.clone();
        let mut inbound = r.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move {
            let mut running = futures::stream::FuturesUnordered::new();
            let mut answered = 0usize;
            let mut n = 0u64;
            loop {
                tokio::select! {
                    Some(answer) = running.next(), if !running.is_empty() => {
                        let end = match mode {
                            Mode::FailAfter(limit) if answered == limit => {
                                Some(Status::unavailable("leader went away"))
                            }
                            Mode::DrainAfter(limit) if answered == limit => {
                                Some(Status::from(EtcdError::NotLeader))
                            }
                            _ => None,
                        };
                        if let Some(status) = end {
                            let _ = tx.send(Err(status)).await;
                            return;
                        }
                        answered += 1;
                        if tx.send(Ok(answer)).await.is_err() {
                            return;
                        }
                    }
                    msg = inbound.next() => match msg {
                        Some(Ok(call)) => {
                            seen.fetch_add(1, Ordering::SeqCst);
                            if matches!(mode, Mode::Silent) {
                                continue;
                            }
                            let delay = Duration::from_millis(40u64.saturating_sub(n * 2));
                            n += 1;
                            running.push(async move {
                                tokio::time::sleep(delay).await;
                                PeerAnswer {
                                    seq: call.seq,
                                    answer: Some(answer_for(mode, &call)),
                                }
                            });
                        }
                        _ => break,
                    },
                }
            }
            while let Some(answer) = running.next().await {
                let _ = tx.send(Ok(answer)).await;
            }
            // Silent: hold the stream open until the caller's side goes away.
            tx.closed().await;
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn append_entries(
        &self,
        _r: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
}

struct Served {
    url: String,
    streams_opened: Arc<AtomicUsize>,
    calls_seen: Arc<AtomicUsize>,
}

/// Serves `mode` on a free loopback port.
async fn serve(mode: Mode) -> Served {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let fake = Fake {
        mode,
        streams_opened: Arc::default(),
        calls_seen: Arc::default(),
    };
    let served = Served {
        url,
        streams_opened: fake.streams_opened.clone(),
        calls_seen: fake.calls_seen.clone(),
    };
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(PeerServer::new(fake))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    served
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(5)
}

async fn open(peers: &Peers, url: &str) -> Arc<CallStream> {
    match peers.leader_calls().open(peers, url, soon()).await {
        Opened::Stream(s) => s,
        Opened::Unary => panic!("expected a stream, got the unary fallback"),
        Opened::Failed(f) => panic!("expected a stream, got {f:?}"),
    }
}

fn forward(id: u64) -> peer_call::Call {
    peer_call::Call::Forward(RaftRequest {
        id,
        ..Default::default()
    })
}

#[tokio::test]
async fn each_call_gets_its_own_answer_on_one_stream() {
    let leader = serve(Mode::Answer).await;
    let peers = Arc::new(Peers::default());
    let mut tasks = Vec::new();
    for i in 0..30u64 {
        let peers = peers.clone();
        let url = leader.url.clone();
        tasks.push(tokio::spawn(async move {
            let stream = open(&peers, &url).await;
            let call = match i % 4 {
                0 => peer_call::Call::ReadIndex(ReadIndexRequest { member_id: i }),
                1 => peer_call::Call::LeaseRenew(LeaseKeepAliveRequest { id: i as i64 }),
                2 => peer_call::Call::LeaseTimeToLive(LeaseTimeToLiveRequest {
                    id: i as i64,
                    keys: false,
                }),
                _ => forward(i),
            };
            (i, stream.call(call, soon()).await.expect("answered"))
        }));
    }
    for t in tasks {
        match t.await.unwrap() {
            (i, peer_answer::Answer::ReadIndex(r)) if i % 4 == 0 => {
                assert_eq!(r.read_index, i + 1, "call {i} got another's read index")
            }
            (i, peer_answer::Answer::LeaseRenew(r)) if i % 4 == 1 => {
                assert_eq!((r.id, r.ttl), (i as i64, 2 * i as i64), "call {i}")
            }
            (i, peer_answer::Answer::LeaseTimeToLive(r)) if i % 4 == 2 => {
                assert_eq!((r.id, r.ttl), (i as i64, 3 * i as i64), "call {i}")
            }
            (i, peer_answer::Answer::Forward(a)) if i % 4 == 3 => {
                assert_eq!(a.response.unwrap().revision, i as i64, "call {i}");
                assert_eq!(a.log_index, i * 10, "call {i}");
            }
            (i, other) => panic!("call {i} got {other:?}"),
        }
    }
    assert_eq!(leader.streams_opened.load(Ordering::SeqCst), 1);
    assert_eq!(leader.calls_seen.load(Ordering::SeqCst), 30);
}

#[tokio::test]
async fn a_leaders_error_answer_is_that_error() {
    let leader = serve(Mode::NotLeader).await;
    let peers = Peers::default();
    let stream = open(&peers, &leader.url).await;
    let err = stream.call(forward(1), soon()).await.unwrap_err();
    assert_eq!(
        err.into_failure(&peers, &leader.url),
        PeerFailure::Answer(EtcdError::NotLeader)
    );
}

/// A stream of a leader in `mode` (which ends the stream after one answer) whose first call
/// was answered, and the error of the second call, which the stream's end failed.
async fn second_call_after_the_end(mode: Mode) -> (Served, Peers, Arc<CallStream>, CallError) {
    let leader = serve(mode).await;
    let peers = Peers::default();
    let stream = open(&peers, &leader.url).await;
    let first = stream.call(forward(1), soon()).await.unwrap();
    assert!(matches!(first, peer_answer::Answer::Forward(a) if a.log_index == 10));
    let err = stream.call(forward(2), soon()).await.unwrap_err();
    (leader, peers, stream, err)
}

#[tokio::test]
async fn a_stream_a_stopping_leader_drained_refuses_its_unanswered_calls_as_not_leader() {
    let (leader, peers, _stream, err) = second_call_after_the_end(Mode::DrainAfter(1)).await;
    assert!(
        matches!(&err, CallError::Failed(s) if s.message() == "etcdserver: not leader"),
        "{err:?}"
    );
    // Not ambiguous: the caller asks again (the next leader) instead of failing its client.
    assert_eq!(
        err.into_failure(&peers, &leader.url),
        PeerFailure::Answer(EtcdError::NotLeader)
    );
}

#[tokio::test]
async fn a_failed_stream_fails_its_calls_as_ambiguous_and_the_next_call_opens_another() {
    let (leader, peers, stream, err) = second_call_after_the_end(Mode::FailAfter(1)).await;
    assert!(
        matches!(&err, CallError::Failed(s) if s.message() == "leader went away"),
        "{err:?}"
    );
    assert_eq!(
        err.into_failure(&peers, &leader.url),
        PeerFailure::Ambiguous
    );
    // The ended stream takes no call; the next open gives a new one.
    assert!(matches!(
        stream.call(forward(3), soon()).await,
        Err(CallError::NotSent)
    ));
    let again = open(&peers, &leader.url).await;
    let got = again.call(forward(4), soon()).await.unwrap();
    assert!(matches!(got, peer_answer::Answer::Forward(a) if a.log_index == 40));
    assert_eq!(leader.streams_opened.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_call_past_its_deadline_is_a_timeout() {
    let leader = serve(Mode::Silent).await;
    let peers = Peers::default();
    let stream = open(&peers, &leader.url).await;
    let started = Instant::now();
    let err = stream
        .call(forward(1), Instant::now() + Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(
        err.into_failure(&peers, &leader.url),
        PeerFailure::Answer(EtcdError::Timeout)
    );
    assert_eq!(leader.calls_seen.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_leader_without_the_stream_gets_unary_calls_and_loses_none() {
    let leader = serve(Mode::NoStream).await;
    let peers = Peers::default();
    for _ in 0..2 {
        assert!(matches!(
            peers.leader_calls().open(&peers, &leader.url, soon()).await,
            Opened::Unary
        ));
    }
    // Nothing was sent on a stream: the caller still holds its call.
    assert_eq!(leader.calls_seen.load(Ordering::SeqCst), 0);
    assert_eq!(leader.streams_opened.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn an_unreachable_leader_got_nothing() {
    // A port nothing listens on: bind one, then free it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let peers = Peers::default();
    match peers
        .leader_calls()
        .open(&peers, &format!("http://127.0.0.1:{port}"), soon())
        .await
    {
        Opened::Failed(f) => assert_eq!(f, PeerFailure::NotDelivered),
        Opened::Stream(_) => panic!("a stream to nothing"),
        Opened::Unary => panic!("an unreachable leader is not a 0.1.0 one"),
    }
}

#[tokio::test]
async fn a_reset_ends_the_stream_and_the_next_open_reconnects() {
    let leader = serve(Mode::Answer).await;
    let peers = Peers::default();
    let stream = open(&peers, &leader.url).await;
    stream.call(forward(1), soon()).await.unwrap();
    peers.reset(&leader.url);
    assert!(matches!(
        stream.call(forward(2), soon()).await,
        Err(CallError::NotSent)
    ));
    let again = open(&peers, &leader.url).await;
    assert!(again.call(forward(3), soon()).await.is_ok());
    assert_eq!(leader.streams_opened.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_refused_stream_gives_the_refusal_and_sends_nothing() {
    let leader = serve(Mode::Refuse).await;
    let peers = Peers::default();
    match peers.leader_calls().open(&peers, &leader.url, soon()).await {
        Opened::Failed(PeerFailure::Answer(e)) => {
            let status = Status::from(e);
            assert_eq!(status.code(), tonic::Code::FailedPrecondition);
            assert_eq!(status.message(), "cluster ID mismatch");
        }
        Opened::Failed(f) => panic!("expected the refusal, got {f:?}"),
        Opened::Stream(_) => panic!("a refused stream"),
        Opened::Unary => panic!("a refusal is not a 0.1.0 leader"),
    }
    assert_eq!(leader.calls_seen.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn an_error_answer_fails_its_call_only_and_keeps_the_stream() {
    let leader = serve(Mode::TimeoutOdd).await;
    let peers = Peers::default();
    let stream = open(&peers, &leader.url).await;
    let (odd, even) = tokio::join!(
        stream.call(forward(1), soon()),
        stream.call(forward(2), soon())
    );
    let err = odd.unwrap_err();
    assert!(
        matches!(&err, CallError::Answered(s) if s.message() == "etcdserver: request timed out"),
        "{err:?}"
    );
    assert_eq!(
        err.into_failure(&peers, &leader.url),
        PeerFailure::Answer(EtcdError::Timeout)
    );
    assert!(matches!(even.unwrap(), peer_answer::Answer::Forward(a) if a.log_index == 20));
    // The answer did not reset the stream: the next call goes on the same one.
    let again = open(&peers, &leader.url).await;
    assert!(Arc::ptr_eq(&stream, &again));
    let got = again.call(forward(4), soon()).await.unwrap();
    assert!(matches!(got, peer_answer::Answer::Forward(a) if a.log_index == 40));
    assert_eq!(leader.streams_opened.load(Ordering::SeqCst), 1);
}
