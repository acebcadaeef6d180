//! What kube-apiserver relies on (docs/kubernetes.md), end to end against real `keel`
//! processes: require-leader requests, watches and keep-alives on a member cut off from its quorum
//! (etcd `v3rpc/interceptor.go`), and progress requests answered only once every watcher of
//! the stream is synced (etcd ≥ 3.5.13 `RequestProgressAll`).

use std::time::{Duration, Instant};

use keel_proto::etcdserverpb::kv_client::KvClient;
use keel_proto::etcdserverpb::lease_client::LeaseClient;
use keel_proto::etcdserverpb::watch_client::WatchClient;
use keel_proto::etcdserverpb::watch_request::RequestUnion;
use keel_proto::etcdserverpb::{
    LeaseGrantRequest, LeaseKeepAliveRequest, PutRequest, RangeRequest, WatchCreateRequest,
    WatchProgressRequest, WatchRequest, WatchResponse,
};
use keel_testkit::grpc::{self, runtime};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Request, Status, Streaming};

use crate::{cluster, member};

/// etcd's default `--election-timeout`, which the members run with.
const ELECTION_TIMEOUT: Duration = Duration::from_millis(1000);

/// `request` with clientv3 `WithRequireLeader`'s metadata when `require`.
fn with_leader<T>(request: T, require: bool) -> Request<T> {
    let mut r = Request::new(request);
    if require {
        r.metadata_mut()
            .insert("hasleader", "true".parse().expect("ascii"));
    }
    r
}

fn is_no_leader(s: &Status) -> bool {
    s.code() == Code::Unavailable && s.message() == "etcdserver: no leader"
}

/// A watch stream with its request sender.
struct Conn {
    tx: mpsc::Sender<WatchRequest>,
    rx: Streaming<WatchResponse>,
}

async fn open_watch(endpoint: &str, require: bool) -> Result<Conn, Status> {
    let (tx, requests) = mpsc::channel(16);
    let mut client = WatchClient::new(grpc::stream_channel(endpoint).await);
    let rx = client
        .watch(with_leader(ReceiverStream::new(requests), require))
        .await?
        .into_inner();
    Ok(Conn { tx, rx })
}

impl Conn {
    async fn send(&self, request: RequestUnion) {
        self.tx
            .send(WatchRequest {
                request_union: Some(request),
            })
            .await
            .expect("stream open");
    }

    /// The next response, or the status the stream ended with.
    async fn next(&mut self, within: Duration) -> Result<WatchResponse, Status> {
        match tokio::time::timeout(within, self.rx.message()).await {
            Ok(Ok(Some(r))) => Ok(r),
            Ok(Ok(None)) => Err(Status::cancelled("stream ended without a status")),
            Ok(Err(s)) => Err(s),
            Err(_) => Err(Status::deadline_exceeded("no response in time")),
        }
    }
}

async fn range_with(
    kv: &mut KvClient<Channel>,
    serializable: bool,
    require: bool,
) -> Result<i64, Status> {
    let req = RangeRequest {
        key: b"k".to_vec(),
        serializable,
        ..Default::default()
    };
    kv.range(with_leader(req, require))
        .await
        .map(|r| r.into_inner().header.map_or(0, |h| h.revision))
}

/// Stops the two members other than `keep` of a three-member cluster, then checks what
/// `keep` answers: require-leader requests fail with `etcdserver: no leader` (once it
/// notices), others behave as before; a require-leader watch opened before is ended with
/// that status after three election timeouts, a plain one stays open.
fn isolated_member_refuses_require_leader(keep_leader: bool) {
    let (_alone, mut cluster) = cluster(3, &[]);
    let leader = cluster.leader(Duration::from_secs(20));
    let keep = if keep_leader {
        leader
    } else {
        (leader + 1) % 3
    };
    let ep = cluster.members[keep].endpoint();
    runtime().block_on(async {
        let mut kv = KvClient::new(grpc::stream_channel(&ep).await);
        // With a leader, the metadata changes nothing.
        range_with(&mut kv, false, true)
            .await
            .expect("range with a leader");
        kv.put(with_leader(
            PutRequest {
                key: b"k".to_vec(),
                value: b"v".to_vec(),
                ..Default::default()
            },
            true,
        ))
        .await
        .expect("put with a leader");
        let mut required = open_watch(&ep, true).await.expect("watch with a leader");
        let mut plain = open_watch(&ep, false).await.expect("plain watch");
        for conn in [&mut required, &mut plain] {
            conn.send(RequestUnion::CreateRequest(WatchCreateRequest {
                key: b"k".to_vec(),
                ..Default::default()
            }))
            .await;
            assert!(conn.next(Duration::from_secs(10)).await.unwrap().created);
        }

        // A require-leader keep-alive stream, answered while there is a leader.
        let mut lease = LeaseClient::new(grpc::stream_channel(&ep).await);
        let id = lease
            .lease_grant(LeaseGrantRequest { ttl: 600, id: 0 })
            .await
            .unwrap()
            .into_inner()
            .id;
        let (ka_tx, ka_rx) = mpsc::channel(4);
        ka_tx.send(LeaseKeepAliveRequest { id }).await.unwrap();
        let mut keep_alive = lease
            .lease_keep_alive(with_leader(ReceiverStream::new(ka_rx), true))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(keep_alive.message().await.unwrap().unwrap().id, id);

        for (i, m) in cluster.members.iter_mut().enumerate() {
            if i != keep {
                m.kill9();
            }
        }
        let cut = Instant::now();

        // New require-leader requests fail once the member notices it has no leader
        // (a follower becomes a candidate; a leader loses its quorum acknowledgements).
        let refused = loop {
            let attempt =
                tokio::time::timeout(Duration::from_millis(500), range_with(&mut kv, true, true))
                    .await;
            if let Ok(Err(s)) = attempt {
                break s;
            }
            assert!(
                cut.elapsed() < 4 * ELECTION_TIMEOUT,
                "still served: {attempt:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(is_no_leader(&refused), "{refused:?}");
        let noticed = cut.elapsed();
        let put = kv
            .put(with_leader(
                PutRequest {
                    key: b"k".to_vec(),
                    value: b"w".to_vec(),
                    ..Default::default()
                },
                true,
            ))
            .await
            .unwrap_err();
        assert!(is_no_leader(&put), "{put:?}");
        let opened = open_watch(&ep, true)
            .await
            .err()
            .expect("a watch is refused");
        assert!(is_no_leader(&opened), "{opened:?}");
        // Without the metadata: a serializable read is still served locally.
        assert!(range_with(&mut kv, true, false).await.unwrap() >= 2);

        // The open require-leader watch ends after three leaderless election timeouts.
        let ended = required.next(8 * ELECTION_TIMEOUT).await.unwrap_err();
        assert!(is_no_leader(&ended), "{ended:?}");
        let after = cut.elapsed();
        assert!(
            after >= 3 * ELECTION_TIMEOUT,
            "canceled after {after:?}, before 3 election timeouts"
        );
        eprintln!(
            "keep_leader={keep_leader}: refused after {noticed:?}, watch ended after {after:?}"
        );
        // The plain watch is still served: a progress request is answered.
        plain
            .send(RequestUnion::ProgressRequest(WatchProgressRequest {}))
            .await;
        let progress = plain
            .next(Duration::from_secs(5))
            .await
            .expect("plain watch open");
        assert_eq!(progress.watch_id, -1);
    });
}

#[test]
fn an_isolated_leader_refuses_require_leader_requests_and_ends_such_watches() {
    isolated_member_refuses_require_leader(true);
}

#[test]
fn an_isolated_follower_refuses_require_leader_requests_and_ends_such_watches() {
    isolated_member_refuses_require_leader(false);
}

/// A progress request on a stream whose watcher is still catching up from far behind is
/// answered once, after every event up to its revision, with watch ID -1; one on a stream
/// of synced watchers is answered at once.
#[test]
fn a_progress_request_waits_for_an_unsynced_watcher() {
    let (_guard, keel) = member(&[]);
    let ep = keel.endpoint();
    runtime().block_on(async {
        let mut kv = KvClient::new(grpc::stream_channel(&ep).await);
        let value = vec![b'x'; 4096];
        let mut last = 0;
        for i in 0..1500 {
            last = grpc::put(&mut kv, &format!("p/{i:05}"), &value).await;
        }
        let mut conn = open_watch(&ep, false).await.unwrap();
        conn.send(RequestUnion::CreateRequest(WatchCreateRequest {
            key: b"p/".to_vec(),
            range_end: grpc::prefix_end(b"p/"),
            start_revision: 2,
            ..Default::default()
        }))
        .await;
        // Asked right away, while the watcher still has ~6 MB of history to read.
        conn.send(RequestUnion::ProgressRequest(WatchProgressRequest {}))
            .await;
        let (mut seen, mut progress) = (0i64, Vec::new());
        let deadline = Instant::now() + Duration::from_secs(60);
        while progress.is_empty() || seen < last {
            assert!(
                Instant::now() < deadline,
                "seen {seen} of {last}, {progress:?}"
            );
            let r = conn.next(Duration::from_secs(10)).await.unwrap();
            if r.created {
                continue;
            }
            if r.watch_id == -1 {
                let rev = r.header.as_ref().unwrap().revision;
                assert_eq!(seen, last, "progress at {rev} before every event was sent");
                progress.push(rev);
                continue;
            }
            for e in &r.events {
                let rev = e.kv.as_ref().unwrap().mod_revision;
                assert!(rev > seen, "out of order: {rev} after {seen}");
                seen = rev;
            }
        }
        assert_eq!(progress, vec![last], "one answer, at the current revision");
        // Now synced: the next request is answered at once.
        conn.send(RequestUnion::ProgressRequest(WatchProgressRequest {}))
            .await;
        let r = conn.next(Duration::from_secs(5)).await.unwrap();
        assert_eq!((r.watch_id, r.header.unwrap().revision), (-1, last));
    });
}
