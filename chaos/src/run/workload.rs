//! The KV workload: concurrent clients, each issuing one operation at a time (put, get —
//! mostly linearizable, sometimes serializable —, delete, and a compare-and-set txn) on a
//! small hot key set, to a member picked at random per operation, with a deadline per
//! operation. Values are unique (`c<client>-<seq>`), so every read names the write it saw.
//! Every operation is recorded with its invoke/return times and [`Outcome`]
//! (see [`super::outcome`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use keel_proto::etcdserverpb::kv_client::KvClient;
use keel_proto::etcdserverpb::request_op::Request as OpRequest;
use keel_proto::etcdserverpb::{
    Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;
use tonic::Status;
use tonic::transport::Channel;

use super::cluster::Cluster;
use super::outcome::{classify, is_transport_error};
use super::rpc::connect;
use crate::history::{Input, Operation, Outcome, Output};

/// Workload settings.
#[derive(Clone, Debug)]
pub struct WorkloadSpec {
    /// Concurrent clients.
    pub clients: usize,
    /// Hot keys (`key-0` .. `key-<n-1>`).
    pub keys: usize,
    /// Deadline of one operation (connect included).
    pub op_timeout: Duration,
    /// Per-client RNG seeds derive from it.
    pub seed: u64,
}

/// The prefix of every workload key; watchers watch `[KEY_PREFIX, KEY_RANGE_END)`.
pub const KEY_PREFIX: &str = "key-";
/// `KEY_PREFIX` with its last byte incremented: the end of the prefix range.
pub const KEY_RANGE_END: &str = "key.";

/// The recorded operations and member revisions, shared by the clients.
#[derive(Default)]
pub struct OpLog {
    pub operations: Mutex<Vec<Operation>>,
    /// (member, epoch, at_ns, revision) of linearizable reads (see `History`).
    pub member_revisions: Mutex<Vec<(usize, u32, u64, i64)>>,
    /// Per member: the return time of the last read recorded in `member_revisions`.
    last_recorded: Mutex<HashMap<usize, u64>>,
}

impl OpLog {
    /// Records a linearizable read's header revision for the per-member monotonicity check,
    /// but only when the read was invoked after the previously recorded read on that member
    /// returned. Two overlapping reads may legitimately see revisions in either order (each
    /// reads at some instant between its invoke and return), so the recorded reads must form
    /// a chain in real time for "later answer, lower revision" to be a violation.
    fn record_member_revision(
        &self,
        member: usize,
        epoch: u32,
        invoke_ns: u64,
        return_ns: u64,
        revision: i64,
    ) {
        let mut last = self.last_recorded.lock().expect("op log lock");
        if last.get(&member).is_some_and(|&prev| invoke_ns <= prev) {
            return;
        }
        last.insert(member, return_ns);
        self.member_revisions
            .lock()
            .expect("op log lock")
            .push((member, epoch, return_ns, revision));
    }
}

/// Runs client `id` until `until`, recording into `log`. `t0` is the run's time origin.
pub async fn run_client(
    id: u32,
    cluster: Arc<Cluster>,
    spec: WorkloadSpec,
    t0: Instant,
    until: Instant,
    log: Arc<OpLog>,
) {
    let mut client = Client {
        id,
        rng: StdRng::seed_from_u64(
            spec.seed ^ (u64::from(id) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        ),
        channels: vec![None; cluster.len()],
        seq: 0,
        last_seen: HashMap::new(),
    };
    while Instant::now() < until {
        let input = client.next_input(spec.keys);
        let member = client.rng.gen_range(0..cluster.len());
        let epoch = cluster.members[member].epoch();
        let invoke_ns = t0.elapsed().as_nanos() as u64;
        let outcome = client
            .execute(&cluster, member, &input, spec.op_timeout)
            .await;
        let return_ns = t0.elapsed().as_nanos() as u64;
        if let Outcome::Ok(out) = &outcome {
            client.learn(&input, out);
            if let (
                Input::Get {
                    linearizable: true, ..
                },
                Output::Get { revision, .. },
            ) = (&input, out)
                && cluster.members[member].epoch() == epoch
            {
                log.record_member_revision(member, epoch, invoke_ns, return_ns, *revision);
            }
        }
        if !matches!(outcome, Outcome::Ok(_)) {
            // Do not hammer a member that is down.
            tokio::time::sleep(Duration::from_millis(client.rng.gen_range(5..50))).await;
        }
        log.operations.lock().expect("op log lock").push(Operation {
            client: id,
            member,
            input,
            outcome,
            invoke_ns,
            return_ns,
        });
    }
}

struct Client {
    id: u32,
    rng: StdRng,
    /// One connection per member, dropped after transport errors.
    channels: Vec<Option<Channel>>,
    seq: u64,
    /// The value this client last saw per key (for CAS expectations).
    last_seen: HashMap<String, Option<String>>,
}

impl Client {
    /// Picks the next operation: 30% put, 25% linearizable get, 5% serializable get,
    /// 10% delete, 30% CAS from the last value seen.
    fn next_input(&mut self, keys: usize) -> Input {
        let key = format!("{KEY_PREFIX}{}", self.rng.gen_range(0..keys));
        self.seq += 1;
        let value = format!("c{}-{}", self.id, self.seq);
        match self.rng.gen_range(0..100) {
            0..30 => Input::Put { key, value },
            30..55 => Input::Get {
                key,
                linearizable: true,
            },
            55..60 => Input::Get {
                key,
                linearizable: false,
            },
            60..70 => Input::Delete { key },
            _ => {
                let expect = self.last_seen.get(&key).cloned().flatten();
                Input::Cas { key, expect, value }
            }
        }
    }

    /// Remembers what an answer says about a key's current value.
    fn learn(&mut self, input: &Input, out: &Output) {
        let key = input.key().to_string();
        match (input, out) {
            (_, Output::Get { kv, .. }) => {
                self.last_seen
                    .insert(key, kv.as_ref().map(|(v, _)| v.clone()));
            }
            (Input::Put { value, .. }, _) => {
                self.last_seen.insert(key, Some(value.clone()));
            }
            (
                Input::Cas { value, .. },
                Output::Cas {
                    succeeded: true, ..
                },
            ) => {
                self.last_seen.insert(key, Some(value.clone()));
            }
            (Input::Delete { .. }, _) => {
                self.last_seen.insert(key, None);
            }
            _ => {}
        }
    }

    async fn execute(
        &mut self,
        cluster: &Cluster,
        member: usize,
        input: &Input,
        timeout: Duration,
    ) -> Outcome {
        let started = Instant::now();
        let channel = match &self.channels[member] {
            Some(c) => c.clone(),
            None => match connect(&cluster.members[member].client_url, timeout).await {
                Ok(c) => {
                    self.channels[member] = Some(c.clone());
                    c
                }
                // Nothing was sent.
                Err(e) => return Outcome::Failed(format!("connect: {e}")),
            },
        };
        let left = timeout.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, send(KvClient::new(channel), input)).await {
            Ok(Ok(out)) => Outcome::Ok(out),
            Ok(Err(status)) => {
                if is_transport_error(&status) {
                    self.channels[member] = None;
                }
                classify(input, &status)
            }
            Err(_) => {
                // The connection may be stuck (paused member, blackholed link).
                self.channels[member] = None;
                let what = format!("no answer within {timeout:?}");
                if input.is_write() {
                    Outcome::Unknown(what)
                } else {
                    Outcome::Failed(what)
                }
            }
        }
    }
}

/// Sends one operation and converts the answer.
async fn send(mut kv: KvClient<Channel>, input: &Input) -> Result<Output, Status> {
    match input {
        Input::Get { key, linearizable } => {
            let r = kv
                .range(RangeRequest {
                    key: key.clone().into_bytes(),
                    serializable: !linearizable,
                    ..Default::default()
                })
                .await?
                .into_inner();
            let kv = r.kvs.first().map(|kv| {
                (
                    String::from_utf8_lossy(&kv.value).into_owned(),
                    kv.mod_revision,
                )
            });
            Ok(Output::Get {
                kv,
                revision: revision(r.header.as_ref()),
            })
        }
        Input::Put { key, value } => {
            let r = kv.put(put_request(key, value)).await?.into_inner();
            Ok(Output::Put {
                revision: revision(r.header.as_ref()),
            })
        }
        Input::Delete { key } => {
            let r = kv
                .delete_range(DeleteRangeRequest {
                    key: key.clone().into_bytes(),
                    ..Default::default()
                })
                .await?
                .into_inner();
            Ok(Output::Delete {
                deleted: r.deleted,
                revision: revision(r.header.as_ref()),
            })
        }
        Input::Cas { key, expect, value } => {
            let compare = match expect {
                // etcd's "key does not exist": compare(create_revision, =, 0).
                None => Compare {
                    result: CompareResult::Equal as i32,
                    target: CompareTarget::Create as i32,
                    key: key.clone().into_bytes(),
                    target_union: Some(TargetUnion::CreateRevision(0)),
                    ..Default::default()
                },
                Some(v) => Compare {
                    result: CompareResult::Equal as i32,
                    target: CompareTarget::Value as i32,
                    key: key.clone().into_bytes(),
                    target_union: Some(TargetUnion::Value(v.clone().into_bytes())),
                    ..Default::default()
                },
            };
            let r = kv
                .txn(TxnRequest {
                    compare: vec![compare],
                    success: vec![RequestOp {
                        request: Some(OpRequest::RequestPut(put_request(key, value))),
                    }],
                    failure: vec![],
                })
                .await?
                .into_inner();
            Ok(Output::Cas {
                succeeded: r.succeeded,
                revision: revision(r.header.as_ref()),
            })
        }
    }
}

fn put_request(key: &str, value: &str) -> PutRequest {
    PutRequest {
        key: key.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
        ..Default::default()
    }
}

fn revision(h: Option<&keel_proto::etcdserverpb::ResponseHeader>) -> i64 {
    h.map(|h| h.revision).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_revisions_form_a_real_time_chain() {
        let log = OpLog::default();
        log.record_member_revision(0, 1, 10, 20, 5);
        // Overlaps the first read (invoked before it returned): not comparable, left out.
        log.record_member_revision(0, 1, 15, 25, 4);
        // Another member has its own chain.
        log.record_member_revision(1, 1, 15, 25, 4);
        log.record_member_revision(0, 1, 21, 30, 6);
        assert_eq!(
            *log.member_revisions.lock().unwrap(),
            vec![(0, 1, 20, 5), (1, 1, 25, 4), (0, 1, 30, 6)]
        );
    }
}
