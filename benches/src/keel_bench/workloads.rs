//! One request of each KV and lease workload, as a [`Worker`].

use keel_client::etcdserverpb::{
    Compare, PutRequest, RangeRequest, RequestOp, TxnRequest, compare, request_op,
};
use keel_client::{Client, ClientError, LeaseKeepAlive};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::keys::{KeyGen, random_value};
use super::runner::Worker;

/// What a [`KvWorker`] sends.
#[derive(Debug, Clone)]
pub enum KvRequest {
    /// A put of a random key.
    Put,
    /// A range of `key` (to `end` if not empty) or of a random key when `key` is `None`.
    Range {
        key: Option<Vec<u8>>,
        end: Vec<u8>,
        serializable: bool,
        /// Through `RangeStream` (keel-client `range_stream`).
        stream: bool,
        /// `limit`, `keys_only` and `count_only` of the request.
        shape: RangeShape,
    },
    /// A txn of `ops` puts of random keys.
    TxnPut { ops: usize },
    /// A txn with one range (share `read_share` of requests) or one put of a random key.
    TxnMixed { read_share: f64, serializable: bool },
    /// A read-only txn on a random key: `mod_revision(key) > 0 ? range key : range key`.
    TxnRead { serializable: bool },
    /// A range (share `read_share`) or a put of a random key.
    Mixed { read_share: f64, serializable: bool },
}

/// The result-shaping fields of a range (etcd `RangeRequest`): `limit` (0 = none),
/// `keys_only`, `count_only`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RangeShape {
    /// `RangeRequest.limit`.
    pub limit: i64,
    /// `RangeRequest.keys_only`.
    pub keys_only: bool,
    /// `RangeRequest.count_only`.
    pub count_only: bool,
}

/// A worker of the KV workloads.
pub struct KvWorker {
    client: Client,
    request: KvRequest,
    keys: KeyGen,
    value: Vec<u8>,
    rng: StdRng,
}

impl KvWorker {
    /// Worker number `index` sending `request`s with keys from `keys` and a value of
    /// `val_size` random bytes.
    pub fn new(
        client: Client,
        request: KvRequest,
        keys: KeyGen,
        val_size: usize,
        index: u64,
    ) -> Self {
        let mut rng = StdRng::seed_from_u64(0x6b65_656c ^ index);
        let value = random_value(val_size, &mut rng);
        KvWorker {
            client,
            request,
            keys,
            value,
            rng,
        }
    }

    fn put_op(&mut self) -> PutRequest {
        PutRequest {
            key: self.keys.key(&mut self.rng),
            value: self.value.clone(),
            ..Default::default()
        }
    }

    fn range_op(&mut self, key: Option<&[u8]>, end: &[u8], serializable: bool) -> RangeRequest {
        RangeRequest {
            key: key.map_or_else(|| self.keys.key(&mut self.rng), <[u8]>::to_vec),
            range_end: end.to_vec(),
            serializable,
            ..Default::default()
        }
    }
}

fn txn_of(ops: Vec<request_op::Request>) -> TxnRequest {
    TxnRequest {
        compare: vec![],
        success: ops
            .into_iter()
            .map(|r| RequestOp { request: Some(r) })
            .collect(),
        failure: vec![],
    }
}

impl Worker for KvWorker {
    async fn request(&mut self) -> Result<(), ClientError> {
        match self.request.clone() {
            KvRequest::Put => {
                let put = self.put_op();
                self.client.put_request(put).await.map(drop)
            }
            KvRequest::Range {
                key,
                end,
                serializable,
                stream,
                shape,
            } => {
                let range = RangeRequest {
                    limit: shape.limit,
                    keys_only: shape.keys_only,
                    count_only: shape.count_only,
                    ..self.range_op(key.as_deref(), &end, serializable)
                };
                if stream {
                    self.client.range_stream(range).await.map(drop)
                } else {
                    self.client.range(range).await.map(drop)
                }
            }
            KvRequest::TxnPut { ops } => {
                // Distinct keys: etcd refuses a txn that puts one key twice (DuplicateKey).
                // Bounded draws, so a key space smaller than `ops` gives a smaller txn.
                let mut seen = std::collections::HashSet::new();
                let mut puts = Vec::with_capacity(ops.max(1));
                for _ in 0..ops.max(1) * 16 {
                    if puts.len() == ops.max(1) {
                        break;
                    }
                    let put = self.put_op();
                    if seen.insert(put.key.clone()) {
                        puts.push(request_op::Request::RequestPut(put));
                    }
                }
                self.client.txn(txn_of(puts)).await.map(drop)
            }
            KvRequest::TxnMixed {
                read_share,
                serializable,
            } => {
                let op = if self.rng.gen_bool(read_share) {
                    request_op::Request::RequestRange(self.range_op(None, &[], serializable))
                } else {
                    request_op::Request::RequestPut(self.put_op())
                };
                self.client.txn(txn_of(vec![op])).await.map(drop)
            }
            KvRequest::TxnRead { serializable } => {
                let range = self.range_op(None, &[], serializable);
                let compare = Compare {
                    result: compare::CompareResult::Greater as i32,
                    target: compare::CompareTarget::Mod as i32,
                    key: range.key.clone(),
                    range_end: vec![],
                    target_union: Some(compare::TargetUnion::ModRevision(0)),
                };
                let op = || RequestOp {
                    request: Some(request_op::Request::RequestRange(range.clone())),
                };
                let txn = TxnRequest {
                    compare: vec![compare],
                    success: vec![op()],
                    failure: vec![op()],
                };
                self.client.txn(txn).await.map(drop)
            }
            KvRequest::Mixed {
                read_share,
                serializable,
            } => {
                if self.rng.gen_bool(read_share) {
                    let range = self.range_op(None, &[], serializable);
                    self.client.range(range).await.map(drop)
                } else {
                    let put = self.put_op();
                    self.client.put_request(put).await.map(drop)
                }
            }
        }
    }
}

/// `reads / (reads + 1)` for a reads-per-write ratio (etcd `--rw-ratio`), clamped to 0..=1.
pub fn read_share(rw_ratio: f64) -> f64 {
    if !rw_ratio.is_finite() || rw_ratio <= 0.0 {
        return 0.0;
    }
    (rw_ratio / (rw_ratio + 1.0)).clamp(0.0, 1.0)
}

/// A worker of `lease-keepalive`: renews its own lease on its own stream.
pub struct LeaseWorker {
    stream: LeaseKeepAlive,
}

impl LeaseWorker {
    /// Grants a lease of `ttl_s` seconds and opens its keep-alive stream.
    ///
    /// Errors: those of the grant or of opening the stream.
    pub async fn start(client: &Client, ttl_s: i64) -> Result<LeaseWorker, ClientError> {
        let lease = client.lease_grant(ttl_s).await?;
        Ok(LeaseWorker {
            stream: client.lease_keep_alive(lease.id).await?,
        })
    }
}

impl Worker for LeaseWorker {
    async fn request(&mut self) -> Result<(), ClientError> {
        let r = self.stream.keep_alive_once().await?;
        if r.ttl <= 0 {
            return Err(ClientError::Rejected {
                code: tonic::Code::NotFound,
                message: "lease expired".into(),
            });
        }
        Ok(())
    }
}

/// A worker of `authenticate`: one `Auth.Authenticate` per request (etcd clientv3's
/// connect-time call; its cost is the server's bcrypt check and one raft entry).
pub struct AuthWorker {
    client: Client,
    name: String,
    password: String,
}

impl AuthWorker {
    /// Authenticates as `name` / `password` through `client`.
    pub fn new(client: Client, name: &str, password: &str) -> AuthWorker {
        AuthWorker {
            client,
            name: name.to_string(),
            password: password.to_string(),
        }
    }
}

impl Worker for AuthWorker {
    async fn request(&mut self) -> Result<(), ClientError> {
        let req = keel_client::etcdserverpb::AuthenticateRequest {
            name: self.name.clone(),
            password: self.password.clone(),
        };
        let endpoint = self.client.endpoints()[0].clone();
        self.client
            .auth()
            .authenticate(req)
            .await
            .map(drop)
            .map_err(|s| ClientError::from_status(&s, &endpoint))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rw_ratio_to_read_share() {
        assert_eq!(read_share(1.0), 0.5);
        assert_eq!(read_share(3.0), 0.75);
        assert_eq!(read_share(0.0), 0.0);
        assert_eq!(read_share(f64::NAN), 0.0);
    }
}
