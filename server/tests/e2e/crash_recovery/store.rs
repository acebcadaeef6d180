//! The store as read back after recovery.

use std::collections::BTreeMap;

use keel_proto::mvccpb::KeyValue;

use keel_testkit::grpc;

/// Every key of the store (key -> KeyValue) and the `header.revision` of that read.
pub struct Store {
    pub kvs: BTreeMap<Vec<u8>, KeyValue>,
    pub revision: i64,
}

impl Store {
    /// Reads every key (`key = "\0"`, `range_end = "\0"`) with one linearizable Range and
    /// checks the Range's own bookkeeping (`count`, `more`) on the way.
    pub async fn read(endpoint: &str) -> Store {
        let mut kv = grpc::kv(endpoint).await;
        let response = grpc::range(&mut kv, &[0], &[0]).await;
        let revision = response
            .header
            .as_ref()
            .expect("RangeResponse.header")
            .revision;
        assert!(!response.more, "an unlimited Range returned more=true");
        assert_eq!(
            response.count as usize,
            response.kvs.len(),
            "count of an unlimited Range"
        );
        let kvs = response
            .kvs
            .into_iter()
            .map(|kv| (kv.key.clone(), kv))
            .collect();
        Store { kvs, revision }
    }
}
