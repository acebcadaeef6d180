//! Request bodies as grpc-gateway's decoder reads them (etcd 3.4/3.5: Go's
//! `encoding/json` under `jsonpb`), where serde would refuse what etcd accepts:
//! - a field set to `null` is unset (`{"key":"YQ==","limit":null}` is a range with no limit),
//!   and a `null` body value is the empty message;
//! - a field named twice keeps its last value (`{"key":"YQ==","key":"Yg=="}` reads `b`).
//!
//! Each value is read as a `serde_json::Value` (whose map keeps the last of repeated keys),
//! its nulls dropped, then turned into the message.

use serde::de::DeserializeOwned;
use serde_json::Value;

/// The JSON values of `body`, in order, each as the message `Req` or the error that stops
/// a decoder there (bad JSON ends the sequence).
pub fn messages<Req: DeserializeOwned + Default>(
    body: &[u8],
) -> impl Iterator<Item = Result<Req, serde_json::Error>> + '_ {
    serde_json::Deserializer::from_slice(body)
        .into_iter::<Value>()
        .map(|value| value.and_then(message))
}

/// `value` as the message `Req`, after dropping its nulls; `null` is the empty message.
fn message<Req: DeserializeOwned + Default>(value: Value) -> Result<Req, serde_json::Error> {
    match without_nulls(value) {
        Value::Null => Ok(Req::default()),
        value => serde_json::from_value(value),
    }
}

/// `value` with every object member whose value is `null` removed, at every depth.
fn without_nulls(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, without_nulls(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(without_nulls).collect()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use keel_proto::etcdserverpb::{RangeRequest, TxnRequest};

    use super::*;

    fn first<Req: DeserializeOwned + Default>(body: &str) -> Result<Req, String> {
        messages(body.as_bytes())
            .next()
            .unwrap()
            .map_err(|e| e.to_string())
    }

    #[test]
    fn nulls_are_unset_fields_and_a_null_value_is_the_empty_message() {
        let r: RangeRequest = first(r#"{"key":"YQ==","limit":null,"range_end":null}"#).unwrap();
        assert_eq!((r.key, r.limit, r.range_end), (b"a".to_vec(), 0, vec![]));
        assert_eq!(first::<RangeRequest>("null"), Ok(RangeRequest::default()));
        // In a nested message too.
        let t: TxnRequest =
            first(r#"{"success":[{"request_put":{"key":"YQ==","lease":null}}]}"#).unwrap();
        assert_eq!(t.success.len(), 1);
    }

    #[test]
    fn a_repeated_field_keeps_its_last_value() {
        let r: RangeRequest = first(r#"{"key":"YQ==","key":"Yg=="}"#).unwrap();
        assert_eq!(r.key, b"b".to_vec());
    }

    #[test]
    fn values_follow_one_another_until_bad_json() {
        let got: Vec<Result<RangeRequest, String>> =
            messages(br#"{"key":"YQ=="} {"limit":"2"} {bad"#)
                .map(|r| r.map_err(|e| e.to_string()))
                .collect();
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].as_ref().unwrap().key, b"a".to_vec());
        assert_eq!(got[1].as_ref().unwrap().limit, 2);
        assert!(got[2].is_err());
        // A type error is an error of that value.
        assert!(first::<RangeRequest>(r#"{"serializable":"true"}"#).is_err());
    }
}
