//! A client that writes unique keys through the etcd v3 KV gRPC API until told to stop,
//! reconnecting across member crashes, and records every attempt.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use keel_proto::etcdserverpb::kv_client::KvClient;
use keel_proto::etcdserverpb::{Compare, PutRequest, RequestOp, TxnRequest, compare, request_op};
use tonic::transport::Channel;

use super::history::{Attempt, Outcome, Write};
use keel_testkit::grpc;

/// Deadline of one write RPC; a member that is being killed makes RPCs fail, not hang.
const WRITE_TIMEOUT: Duration = Duration::from_secs(3);
/// Pause after a failed connect or RPC, so a down member is not hammered.
const RETRY_BACKOFF: Duration = Duration::from_millis(30);
/// Every third write is a pair txn, the others are puts.
const TXN_EVERY: u64 = 3;

/// Shared controls of the writers.
pub struct Control {
    pub endpoint: String,
    /// Set by the test to end the writers (each finishes its in-flight RPC first).
    pub stop: AtomicBool,
    /// Number of acknowledged writes so far, over all writers.
    pub acked: AtomicU64,
}

/// [`run`] writers spawned on a runtime, with their shared [`Control`].
pub struct Writers {
    pub control: Arc<Control>,
    tasks: Vec<tokio::task::JoinHandle<Vec<Attempt>>>,
}

impl Writers {
    /// Spawns `n` writers (ids `0..n`) on `rt` against `endpoint`.
    pub fn start(rt: &tokio::runtime::Runtime, endpoint: &str, n: usize) -> Writers {
        let control = Arc::new(Control {
            endpoint: endpoint.to_string(),
            stop: AtomicBool::new(false),
            acked: AtomicU64::new(0),
        });
        let tasks = (0..n)
            .map(|id| rt.spawn(run(id, Arc::clone(&control))))
            .collect();
        Writers { control, tasks }
    }

    /// Acknowledged writes so far, over all writers.
    pub fn acked(&self) -> u64 {
        self.control.acked.load(Ordering::SeqCst)
    }

    /// Sets the stop flag and waits up to `timeout` for every writer (one in-flight RPC each);
    /// returns all their attempts. Panics if they do not stop in time or one panicked.
    pub fn stop(self, rt: &tokio::runtime::Runtime, timeout: Duration) -> Vec<Attempt> {
        self.control.stop.store(true, Ordering::SeqCst);
        rt.block_on(async {
            let joined = tokio::time::timeout(timeout, futures::future::join_all(self.tasks))
                .await
                .unwrap_or_else(|_| panic!("writers did not stop within {timeout:?}"));
            joined
                .into_iter()
                .flat_map(|r| r.expect("writer task panicked"))
                .collect()
        })
    }
}

/// Writes until `control.stop` is set and returns the attempts in the order they were sent.
/// Keys are `crash/w<writer>/p<seq>` (puts) and `crash/w<writer>/t<seq>/{a,b}` (pair txns).
pub async fn run(writer: usize, control: Arc<Control>) -> Vec<Attempt> {
    let mut history = Vec::new();
    let mut client: Option<KvClient<Channel>> = None;
    let mut seq = 0u64;
    while !control.stop.load(Ordering::SeqCst) {
        let kv = match client.as_mut() {
            Some(kv) => kv,
            None => match grpc::channel(&control.endpoint, WRITE_TIMEOUT).await {
                Ok(channel) => client.insert(KvClient::new(channel)),
                Err(_) => {
                    // Nothing was sent: not an attempt.
                    tokio::time::sleep(RETRY_BACKOFF).await;
                    continue;
                }
            },
        };
        seq += 1;
        let write = next_write(writer, seq);
        let sent = Instant::now();
        let result = match tokio::time::timeout(WRITE_TIMEOUT * 2, send(kv, &write)).await {
            Ok(result) => result,
            Err(_) => Err(format!("no answer within {:?}", WRITE_TIMEOUT * 2)),
        };
        let done = Instant::now();
        let outcome = match result {
            Ok(revision) => {
                control.acked.fetch_add(1, Ordering::SeqCst);
                Outcome::Acked { revision }
            }
            Err(error) => {
                client = None;
                tokio::time::sleep(RETRY_BACKOFF).await;
                Outcome::Unknown { error }
            }
        };
        history.push(Attempt {
            writer,
            write,
            sent,
            done,
            outcome,
        });
    }
    history
}

fn next_write(writer: usize, seq: u64) -> Write {
    let value = format!("value-of-w{writer}-{seq}").into_bytes();
    if seq.is_multiple_of(TXN_EVERY) {
        let key = |side: &str| format!("crash/w{writer}/t{seq:08}/{side}").into_bytes();
        Write::PairTxn {
            a: key("a"),
            b: key("b"),
            value,
        }
    } else {
        Write::Put {
            key: format!("crash/w{writer}/p{seq:08}").into_bytes(),
            value,
        }
    }
}

/// Sends one write and returns its acknowledged revision (`header.revision`).
///
/// `Err` means the outcome is unknown (transport error, deadline, member down). An acknowledged
/// response that breaks the etcd response contract (no header, a fresh-key txn taking the
/// failure branch) panics: that is a server bug, not an unknown outcome.
async fn send(kv: &mut KvClient<Channel>, write: &Write) -> Result<i64, String> {
    match write {
        Write::Put { key, value } => {
            let request = PutRequest {
                key: key.clone(),
                value: value.clone(),
                ..Default::default()
            };
            let response = kv
                .put(request)
                .await
                .map_err(|s| format!("put: {s:?}"))?
                .into_inner();
            Ok(response
                .header
                .expect("acknowledged PutResponse has a header")
                .revision)
        }
        Write::PairTxn { a, b, value } => {
            let put = |key: &Vec<u8>| RequestOp {
                request: Some(request_op::Request::RequestPut(PutRequest {
                    key: key.clone(),
                    value: value.clone(),
                    ..Default::default()
                })),
            };
            let request = TxnRequest {
                compare: vec![Compare {
                    result: compare::CompareResult::Equal as i32,
                    target: compare::CompareTarget::Create as i32,
                    key: a.clone(),
                    range_end: Vec::new(),
                    target_union: Some(compare::TargetUnion::CreateRevision(0)),
                }],
                success: vec![put(a), put(b)],
                failure: Vec::new(),
            };
            let response = kv
                .txn(request)
                .await
                .map_err(|s| format!("txn: {s:?}"))?
                .into_inner();
            assert!(
                response.succeeded,
                "txn on a never-written key {:?} took the failure branch: {response:?}",
                String::from_utf8_lossy(a)
            );
            Ok(response
                .header
                .expect("acknowledged TxnResponse has a header")
                .revision)
        }
    }
}
