//! `KV.RangeStream` (etcd 3.7, KEP-5966): a range answered as a stream of chunks whose
//! `proto.Merge` is the `RangeResponse` `Range` gives (etcd `v3_server.go` `RangeStream`).
//!
//! - Checks as `Range` (key, auth READ on the range, QoS), then etcd's `Unimplemented`
//!   answers: any order but the default (`NONE`, or `ASCEND` by `KEY`) is
//!   `RangeStream does not support custom sort orders`; a min/max mod/create revision is
//!   `RangeStream does not support revision filters` (the sort check comes first).
//! - One ReadIndex up front unless `serializable`; `count_only` is one message.
//! - Otherwise the revision is pinned at the start (`revision` 0 → the current one), so
//!   writes during the stream are invisible. Chunks are disjoint, in key order; the next
//!   starts at the last key + `\0`. The first holds at most [`FIRST_CHUNK_LIMIT`] keys;
//!   each next one doubles the limit while a chunk is below half of `--max-request-bytes`
//!   and halves it above twice that (never below 1), within the client's total `limit`.
//! - `header`, `more` and `count` are on the final chunk only: the header is the one a
//!   `Range` at the start would carry (its revision is the pinned read's store revision),
//!   `count` is the keys sent plus, when the client's `limit` cut the range (`more`), the
//!   keys left.
//! - Memory: a chunk is read from the index only when gRPC asks for the next message, i.e.
//!   as HTTP/2 flow control lets the previous ones go out; a stream holds one chunk.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use keel_proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use keel_proto::etcdserverpb::{RangeRequest, RangeResponse, RangeStreamResponse};
use keel_proto::rpctypes::RpcError;
use prost::Message;
use tonic::{Request, Response, Status};

use super::credentials::{auth_info, still_current};
use super::{admit, kv_validate};
use crate::auth::check;
use crate::error::EtcdError;
use crate::node::Node;
use crate::qos::Permit;

/// etcd's limit of the first chunk.
pub const FIRST_CHUNK_LIMIT: i64 = 10;

/// etcd's message for a non-default order.
pub const CUSTOM_SORT: &str = "RangeStream does not support custom sort orders";

/// etcd's message for a min/max mod/create revision filter.
pub const REVISION_FILTERS: &str = "RangeStream does not support revision filters";

/// The response stream of `RangeStream`.
pub type RangeStreamBody =
    Pin<Box<dyn Stream<Item = Result<RangeStreamResponse, Status>> + Send + 'static>>;

/// etcd `adjustChunkLimit`: the next chunk's limit after one of `last_size` bytes with
/// `last_limit` keys, aiming at `target` bytes (`--max-request-bytes`).
pub fn adjust_chunk_limit(last_limit: i64, last_size: usize, target: usize) -> i64 {
    let next = if last_size < target / 2 {
        last_limit.saturating_mul(2)
    } else if last_size > target.saturating_mul(2) {
        last_limit / 2
    } else {
        last_limit
    };
    next.max(1)
}

/// etcd `checkRangeStreamRequest` after `checkRangeRequest`.
///
/// Errors: `EmptyKey`, `InvalidSortOption` (an unknown order or target), then
/// `Unimplemented` ([`CUSTOM_SORT`], [`REVISION_FILTERS`]).
pub fn check(req: &RangeRequest) -> Result<(), Status> {
    kv_validate::check_range(req)?;
    let (Ok(order), Ok(target)) = (
        SortOrder::try_from(req.sort_order),
        SortTarget::try_from(req.sort_target),
    ) else {
        return Err(EtcdError::Rpc(RpcError::InvalidSortOption).into());
    };
    if order != SortOrder::None && !(order == SortOrder::Ascend && target == SortTarget::Key) {
        return Err(Status::unimplemented(CUSTOM_SORT));
    }
    if req.min_mod_revision != 0
        || req.max_mod_revision != 0
        || req.min_create_revision != 0
        || req.max_create_revision != 0
    {
        return Err(Status::unimplemented(REVISION_FILTERS));
    }
    Ok(())
}

/// Serves one `RangeStream` call (module docs).
///
/// Errors (before the first chunk): those of [`check`], auth, QoS, the read barrier and the
/// revision (`FutureRev`, `Compacted`); a compaction past the pinned revision during the
/// stream ends it with `Compacted`.
pub async fn serve(
    node: Arc<Node>,
    request: Request<RangeRequest>,
) -> Result<Response<RangeStreamBody>, Status> {
    let ai = auth_info(&node, &request).await?;
    let user = admit::user(&ai);
    let req = request.into_inner();
    check(&req)?;
    let permit = admit::range(&node, &req, user).await?;
    if !req.serializable {
        node.read_barrier().await?;
    }
    check::range(&node.auth.read(), &ai, &req)?;
    let store = node.store.get();
    if req.count_only {
        let mut resp = store.range(&req)?;
        still_current(&node, &ai)?;
        let revision = resp.header.as_ref().map_or(0, |h| h.revision);
        resp.header = Some(node.header(revision));
        let one = RangeStreamResponse {
            range_response: Some(resp),
        };
        return Ok(Response::new(Box::pin(futures::stream::iter([Ok(one)]))));
    }
    // Pin: the revision the first read resolves to, checked now (future, compacted).
    let header_revision = store.current_revision();
    let mut pinned = req.clone();
    pinned.revision = if req.revision > 0 {
        req.revision
    } else {
        header_revision
    };
    pinned.limit = 0;
    store.range_chunk(&pinned, 1)?;
    still_current(&node, &ai)?;
    let state = Chunker {
        node,
        req: pinned,
        total_limit: (req.limit > 0).then_some(req.limit),
        sent: 0,
        chunk_limit: FIRST_CHUNK_LIMIT,
        header_revision,
        done: false,
        _permit: permit,
    };
    let chunks = futures::stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        let item = st.next_chunk();
        if item.is_err() {
            st.done = true;
        }
        Some((item, st))
    });
    Ok(Response::new(Box::pin(chunks)))
}

/// The state of one stream between chunks.
struct Chunker {
    node: Arc<Node>,
    /// The range left to send: `key` moves past each chunk; `revision` is pinned.
    req: RangeRequest,
    /// The client's `limit`, if any.
    total_limit: Option<i64>,
    /// Keys sent so far.
    sent: i64,
    /// The next chunk's limit.
    chunk_limit: i64,
    /// The store revision when the stream started (the final header's).
    header_revision: i64,
    done: bool,
    /// The QoS slot, held for the stream's life.
    _permit: Permit,
}

impl Chunker {
    /// Reads and builds the next chunk; marks the stream done after the final one.
    fn next_chunk(&mut self) -> Result<RangeStreamResponse, Status> {
        let left = self.total_limit.map_or(i64::MAX, |t| t - self.sent);
        let limit = self.chunk_limit.min(left).max(1);
        let store = self.node.store.get();
        let (kvs, rest) = store.range_chunk(&self.req, usize::try_from(limit).unwrap_or(1))?;
        self.sent += kvs.len() as i64;
        let cut = rest && self.total_limit.is_some_and(|t| self.sent >= t);
        let next_key = kvs.last().map(|kv| {
            let mut k = kv.key.clone();
            k.push(0);
            k
        });
        let mut resp = RangeResponse {
            kvs,
            ..Default::default()
        };
        if !rest || cut {
            self.done = true;
            resp.more = cut;
            resp.count = self.sent;
            if cut && let Some(key) = next_key {
                let remainder = RangeRequest {
                    key,
                    count_only: true,
                    ..self.req.clone()
                };
                resp.count += store.range(&remainder)?.count;
            }
            resp.header = Some(self.node.header(self.header_revision));
        } else {
            let size = resp.encoded_len();
            let target = self.node.config.max_request_bytes as usize;
            self.chunk_limit = adjust_chunk_limit(limit, size, target);
            self.req.key = next_key.expect("a chunk with keys left after it is not empty");
        }
        Ok(RangeStreamResponse {
            range_response: Some(resp),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chunk_limit_doubles_below_half_and_halves_above_twice_the_target() {
        let t = 1000;
        assert_eq!(adjust_chunk_limit(10, 499, t), 20);
        assert_eq!(adjust_chunk_limit(10, 500, t), 10);
        assert_eq!(adjust_chunk_limit(10, 2000, t), 10);
        assert_eq!(adjust_chunk_limit(10, 2001, t), 5);
        assert_eq!(adjust_chunk_limit(1, 5000, t), 1, "never below 1");
    }

    #[test]
    fn unsupported_shapes_are_unimplemented_with_etcds_messages() {
        let base = RangeRequest {
            key: b"a".to_vec(),
            range_end: b"b".to_vec(),
            ..Default::default()
        };
        let code = |r: &RangeRequest| check(r).map_err(|s| (s.code(), s.message().to_string()));
        assert_eq!(code(&base), Ok(()));
        let asc_key = RangeRequest {
            sort_order: SortOrder::Ascend as i32,
            ..base.clone()
        };
        assert_eq!(code(&asc_key), Ok(()));
        // NONE with another target is the natural order.
        let none_mod = RangeRequest {
            sort_target: SortTarget::Mod as i32,
            ..base.clone()
        };
        assert_eq!(code(&none_mod), Ok(()));
        let unimpl = |m: &str| Err((tonic::Code::Unimplemented, m.to_string()));
        let desc = RangeRequest {
            sort_order: SortOrder::Descend as i32,
            ..base.clone()
        };
        assert_eq!(code(&desc), unimpl(CUSTOM_SORT));
        let asc_mod = RangeRequest {
            sort_order: SortOrder::Ascend as i32,
            sort_target: SortTarget::Mod as i32,
            ..base.clone()
        };
        assert_eq!(code(&asc_mod), unimpl(CUSTOM_SORT));
        for f in 0..4 {
            let mut r = base.clone();
            *[
                &mut r.min_mod_revision,
                &mut r.max_mod_revision,
                &mut r.min_create_revision,
                &mut r.max_create_revision,
            ][f] = 3;
            assert_eq!(code(&r), unimpl(REVISION_FILTERS));
            r.sort_order = SortOrder::Descend as i32;
            assert_eq!(code(&r), unimpl(CUSTOM_SORT), "the sort check comes first");
        }
        let bad = RangeRequest {
            sort_order: 99,
            ..base.clone()
        };
        assert_eq!(
            code(&bad),
            Err((
                tonic::Code::InvalidArgument,
                "etcdserver: invalid sort option".into()
            ))
        );
        let empty = RangeRequest::default();
        assert_eq!(
            code(&empty),
            Err((
                tonic::Code::InvalidArgument,
                "etcdserver: key is not provided".into()
            ))
        );
    }
}
