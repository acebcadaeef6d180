//! `KV.RangeStream` (etcd 3.7) against a real `keel`: the merge of the chunks equals `Range`
//! at 1, 10 and 10,000 keys (1,000,000 in an ignored test), with a limit, keys only and an
//! older revision; the revision is pinned at the start; `header`, `more` and `count` are on
//! the final chunk only; chunk sizes follow `--max-request-bytes`; etcd's `Unimplemented`
//! answers.

use std::time::Instant;

use keel_proto::etcdserverpb::kv_client::KvClient;
use keel_proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use keel_proto::etcdserverpb::{RangeRequest, RangeResponse};
use keel_testkit::grpc::{self, prefix_end, runtime};
use prost::Message;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::member;

async fn kv(endpoint: &str) -> KvClient<Channel> {
    KvClient::new(grpc::stream_channel(endpoint).await).max_decoding_message_size(usize::MAX)
}

/// Puts `n` keys `<prefix><i:07>` with `value_len`-byte values, up to 128 (and 32 KiB of
/// values) per txn.
async fn fill(kv: &mut KvClient<Channel>, prefix: &str, n: usize, value_len: usize) {
    let value = vec![b'v'; value_len];
    let per_txn = (32 * 1024 / value_len.max(1)).clamp(1, 128);
    let kvs = (0..n).map(|i| (format!("{prefix}{i:07}").into_bytes(), value.clone()));
    grpc::put_all(kv, kvs, per_txn).await;
}

/// Every chunk of one RangeStream call.
async fn chunks(
    kv: &mut KvClient<Channel>,
    req: RangeRequest,
) -> Result<Vec<RangeResponse>, Status> {
    let mut stream = kv.range_stream(req).await?.into_inner();
    let mut out = Vec::new();
    while let Some(c) = stream.message().await? {
        out.push(c.range_response.expect("range_response is set"));
    }
    Ok(out)
}

/// `proto.Merge` of the chunks, after checking their shape: only the last one carries
/// header, more and count; kvs are disjoint and ascending across chunks.
fn merged(chunks: Vec<RangeResponse>) -> RangeResponse {
    let n = chunks.len();
    assert!(n >= 1, "at least one chunk");
    let mut out = RangeResponse::default();
    for (i, c) in chunks.into_iter().enumerate() {
        if i + 1 < n {
            assert!(
                c.header.is_none() && !c.more && c.count == 0,
                "chunk {i} of {n}"
            );
            assert!(!c.kvs.is_empty(), "an inner chunk is not empty");
        } else {
            assert!(c.header.is_some(), "the last chunk has the header");
        }
        if let (Some(prev), Some(first)) = (out.kvs.last(), c.kvs.first()) {
            assert!(prev.key < first.key, "chunks are disjoint and ascending");
        }
        out.kvs.extend(c.kvs);
        out.header = c.header.or(out.header);
        out.more |= c.more;
        if c.count != 0 {
            out.count = c.count;
        }
    }
    out
}

fn prefix(p: &str) -> RangeRequest {
    RangeRequest {
        key: p.as_bytes().to_vec(),
        range_end: prefix_end(p.as_bytes()),
        ..Default::default()
    }
}

async fn assert_merge_equals_range(kv: &mut KvClient<Channel>, req: RangeRequest) -> usize {
    let want = kv.range(req.clone()).await.unwrap().into_inner();
    let got = chunks(kv, req.clone()).await.unwrap();
    let n = got.len();
    assert_eq!(merged(got), want, "{req:?}");
    n
}

#[test]
fn the_merge_of_the_chunks_equals_range() {
    let (_guard, keel) = member(&[]);
    runtime().block_on(async {
        let mut kv = kv(&keel.endpoint()).await;
        fill(&mut kv, "one/", 1, 100).await;
        fill(&mut kv, "ten/", 10, 100).await;
        fill(&mut kv, "big/", 10_000, 100).await;
        let older = kv.range(prefix("big/")).await.unwrap().into_inner();
        fill(&mut kv, "big/", 100, 50).await; // new versions of the first 100 keys
        for p in ["one/", "ten/", "big/", "none/"] {
            let n = assert_merge_equals_range(&mut kv, prefix(p)).await;
            eprintln!("{p}: {n} chunks");
            if p == "big/" {
                assert!(n > 5, "10,000 keys come in several chunks: {n}");
            }
        }
        // One key, and every key.
        let one = RangeRequest {
            key: b"ten/0000003".to_vec(),
            ..Default::default()
        };
        assert_eq!(assert_merge_equals_range(&mut kv, one).await, 1);
        let all = RangeRequest {
            key: vec![0],
            range_end: vec![0],
            ..Default::default()
        };
        assert_merge_equals_range(&mut kv, all).await;
        // The client's limit: more and count as Range says.
        for limit in [1, 10, 11, 25, 9_999, 10_000, 20_000] {
            let req = RangeRequest {
                limit,
                ..prefix("big/")
            };
            assert_merge_equals_range(&mut kv, req).await;
        }
        for req in [
            RangeRequest {
                keys_only: true,
                ..prefix("big/")
            },
            RangeRequest {
                serializable: true,
                ..prefix("big/")
            },
            RangeRequest {
                sort_order: SortOrder::Ascend as i32,
                sort_target: SortTarget::Key as i32,
                ..prefix("ten/")
            },
            RangeRequest {
                count_only: true,
                ..prefix("big/")
            },
        ] {
            assert_merge_equals_range(&mut kv, req).await;
        }
        // An older revision: the values before the rewrite.
        let rev = older.header.as_ref().unwrap().revision;
        let at = RangeRequest {
            revision: rev,
            ..prefix("big/")
        };
        assert_merge_equals_range(&mut kv, at.clone()).await;
        let got = merged(chunks(&mut kv, at).await.unwrap());
        assert_eq!(got.kvs, older.kvs);
        // count_only is one message.
        let c = chunks(
            &mut kv,
            RangeRequest {
                count_only: true,
                ..prefix("big/")
            },
        )
        .await
        .unwrap();
        assert_eq!((c.len(), c[0].count), (1, 10_000));
    });
}

#[test]
fn the_revision_is_pinned_at_the_start() {
    let (_guard, keel) = member(&[]);
    runtime().block_on(async {
        let mut kv = kv(&keel.endpoint()).await;
        // 4 MB: more than the client's HTTP/2 window, so the member cannot have read every
        // chunk before the writes below.
        fill(&mut kv, "pin/", 4_000, 1024).await;
        let before = kv.range(prefix("pin/")).await.unwrap().into_inner();
        let mut stream = kv.range_stream(prefix("pin/")).await.unwrap().into_inner();
        let first = stream.message().await.unwrap().unwrap();
        // Writes during the stream: new values and a new key.
        let mut writer = self::kv(&keel.endpoint()).await;
        fill(&mut writer, "pin/", 4_001, 10).await;
        let mut got = vec![first.range_response.unwrap()];
        while let Some(c) = stream.message().await.unwrap() {
            got.push(c.range_response.unwrap());
        }
        assert_eq!(merged(got), before, "later writes are invisible");
    });
}

#[test]
fn chunks_grow_and_shrink_with_max_request_bytes() {
    // 64 KiB target, 1 KiB values: 10 keys ≈ 10 KiB < 32 KiB doubles, 20 doubles, 40 keys
    // ≈ 41 KiB is inside [32, 128] KiB and stays.
    let (_guard, keel) = member(&["--max-request-bytes", "65536"]);
    runtime().block_on(async {
        let mut kv = kv(&keel.endpoint()).await;
        fill(&mut kv, "c/", 1_000, 1024).await;
        let got = chunks(&mut kv, prefix("c/")).await.unwrap();
        let sizes: Vec<usize> = got.iter().map(|c| c.kvs.len()).collect();
        assert_eq!(&sizes[..4], &[10, 20, 40, 40], "{sizes:?}");
        assert_eq!(sizes.iter().sum::<usize>(), 1_000);
        assert!(
            got.iter().all(|c| c.encoded_len() <= 2 * 65536),
            "{sizes:?}"
        );
        // Keys only: 100-byte kvs grow the limit further.
        let keys = chunks(
            &mut kv,
            RangeRequest {
                keys_only: true,
                ..prefix("c/")
            },
        )
        .await
        .unwrap();
        let sizes: Vec<usize> = keys.iter().map(|c| c.kvs.len()).collect();
        assert_eq!(&sizes[..5], &[10, 20, 40, 80, 160], "{sizes:?}");
    });
}

#[test]
fn custom_orders_and_revision_filters_are_unimplemented() {
    let (_guard, keel) = member(&[]);
    runtime().block_on(async {
        let mut kv = kv(&keel.endpoint()).await;
        fill(&mut kv, "u/", 3, 10).await;
        let cases = [
            (
                RangeRequest {
                    sort_order: SortOrder::Descend as i32,
                    ..prefix("u/")
                },
                Code::Unimplemented,
                "RangeStream does not support custom sort orders",
            ),
            (
                RangeRequest {
                    sort_order: SortOrder::Ascend as i32,
                    sort_target: SortTarget::Mod as i32,
                    ..prefix("u/")
                },
                Code::Unimplemented,
                "RangeStream does not support custom sort orders",
            ),
            (
                RangeRequest {
                    min_mod_revision: 1,
                    ..prefix("u/")
                },
                Code::Unimplemented,
                "RangeStream does not support revision filters",
            ),
            (
                RangeRequest {
                    max_create_revision: 9,
                    sort_order: SortOrder::Descend as i32,
                    ..prefix("u/")
                },
                Code::Unimplemented,
                "RangeStream does not support custom sort orders",
            ),
            (
                RangeRequest::default(),
                Code::InvalidArgument,
                "etcdserver: key is not provided",
            ),
            (
                RangeRequest {
                    revision: 1_000_000,
                    ..prefix("u/")
                },
                Code::OutOfRange,
                "etcdserver: mvcc: required revision is a future revision",
            ),
        ];
        for (req, code, message) in cases {
            let err = chunks(&mut kv, req.clone()).await.unwrap_err();
            assert_eq!((err.code(), err.message()), (code, message), "{req:?}");
        }
    });
}

/// 1,000,000 keys: the merge equals Range, and the member's peak RSS (`VmHWM`) grows by much
/// less while streaming than while answering the unary Range. Minutes in a debug build:
/// `cargo test --release -p keel-server --test e2e range_stream_million -- --ignored`.
#[test]
#[ignore]
fn range_stream_million_keys() {
    let (_guard, keel) = member(&[]);
    let pid = keel.pid().expect("running");
    runtime().block_on(async {
        let mut kv = kv(&keel.endpoint()).await;
        let t = Instant::now();
        fill(&mut kv, "m/", 1_000_000, 100).await;
        eprintln!("filled 1M keys in {:?}", t.elapsed());
        let rss0 = peak_rss_kib(pid);
        let t = Instant::now();
        let got = chunks(&mut kv, prefix("m/")).await.unwrap();
        let n = got.len();
        let stream_took = t.elapsed();
        let rss_stream = peak_rss_kib(pid);
        let merged = merged(got);
        let t = Instant::now();
        let want = kv.range(prefix("m/")).await.unwrap().into_inner();
        let range_took = t.elapsed();
        let rss_range = peak_rss_kib(pid);
        eprintln!(
            "RangeStream: {n} chunks in {stream_took:?}, peak RSS {rss0} -> {rss_stream} KiB; \
             Range: {range_took:?}, peak RSS -> {rss_range} KiB"
        );
        assert!(
            rss_stream - rss0 < (rss_range - rss_stream) / 4,
            "streaming grew the peak by {} KiB, Range by {} KiB",
            rss_stream - rss0,
            rss_range - rss_stream
        );
        assert_eq!(merged.kvs.len(), 1_000_000);
        assert_eq!(merged, want);
    });
}

/// The peak resident set size of `pid` (`VmHWM` in `/proc/<pid>/status`), in KiB.
fn peak_rss_kib(pid: u32) -> i64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}
