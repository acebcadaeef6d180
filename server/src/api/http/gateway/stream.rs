//! The gateway's streams: Watch and LeaseKeepAlive (bidirectional), Observe and Snapshot
//! (server streaming), answered as newline-delimited JSON, one `{"result":{…}}` object a
//! message (grpc-gateway's stream convention, checked on etcd 3.4.23), and an error line
//! ([`super::error::stream_line`]) when the stream fails.
//!
//! A bidirectional call reads the HTTP body as a sequence of JSON request messages
//! (whitespace-separated), encodes them as gRPC frames and hands them to the service as its
//! inbound `tonic::Streaming`; the inbound then half-closes, which both services take as
//! "no more requests" while their responses keep flowing. The response streams until the
//! service ends it or the HTTP client goes away (dropping the body drops the service's
//! stream, as a gRPC cancel would).

use std::future::Future;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use futures::{Stream, StreamExt};
use prost::Message;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::Status;
use tonic::codec::{Codec, Streaming};

use super::{error, grpc_request};

/// One streamed message: `{"result":{…}}`.
#[derive(Serialize)]
struct Chunk<'a, T> {
    result: &'a T,
}

/// The request messages of `body`: a sequence of JSON objects, or one default message for
/// an empty body.
///
/// Errors: JSON that is not the message: `Unknown` with serde's text. grpc-gateway's
/// streaming handlers fail that way (etcd 3.4.23: `{bad` on `/v3/watch` or
/// `/v3/lease/keepalive` answers 500, `"code":2`), where unary routes answer 400, code 3.
fn decode_all<Req: DeserializeOwned + Default>(body: &[u8]) -> Result<Vec<Req>, Status> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(vec![Req::default()]);
    }
    serde_json::Deserializer::from_slice(body)
        .into_iter::<Req>()
        .collect::<Result<_, _>>()
        .map_err(|e| Status::unknown(e.to_string()))
}

/// `messages` as the body of a gRPC request: each one framed (uncompressed flag, 4-byte
/// big-endian length, the protobuf encoding).
fn grpc_frames<Req: Message>(messages: &[Req]) -> Bytes {
    let mut out = Vec::new();
    for m in messages {
        let encoded = m.encode_to_vec();
        out.push(0u8);
        out.extend_from_slice(&(encoded.len() as u32).to_be_bytes());
        out.extend_from_slice(&encoded);
    }
    Bytes::from(out)
}

/// A bidirectional call: `body`'s messages in, the responses out as NDJSON.
pub async fn bidi<Req, Resp, S, F, Fut>(headers: &HeaderMap, body: &[u8], call: F) -> Response
where
    Req: DeserializeOwned + Default + Message + Send + 'static,
    Resp: Serialize + Send + 'static,
    S: Stream<Item = Result<Resp, Status>> + Send + 'static,
    F: FnOnce(tonic::Request<Streaming<Req>>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<S>, Status>>,
{
    let inbound = match decode_all::<Req>(body) {
        Ok(messages) => {
            let decoder = tonic_prost::ProstCodec::<Req, Req>::default().decoder();
            Streaming::new_request(decoder, Body::from(grpc_frames(&messages)), None, None)
        }
        Err(status) => return error::response(&status),
    };
    let request = match grpc_request(headers, inbound) {
        Ok(request) => request,
        Err(status) => return error::response(&status),
    };
    respond(call(request).await)
}

/// A server-streaming call: `body`'s message in, the responses out as NDJSON.
pub async fn server<Req, Resp, S, F, Fut>(headers: &HeaderMap, body: &[u8], call: F) -> Response
where
    Req: DeserializeOwned + Default,
    Resp: Serialize + Send + 'static,
    S: Stream<Item = Result<Resp, Status>> + Send + 'static,
    F: FnOnce(tonic::Request<Req>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<S>, Status>>,
{
    let request = match super::decode(body).and_then(|m| grpc_request(headers, m)) {
        Ok(request) => request,
        Err(status) => return error::response(&status),
    };
    respond(call(request).await)
}

/// The NDJSON answer for a stream, or the unary error body when the call failed before
/// streaming (as grpc-gateway answers an error before the first message).
fn respond<Resp, S>(result: Result<tonic::Response<S>, Status>) -> Response
where
    Resp: Serialize + Send + 'static,
    S: Stream<Item = Result<Resp, Status>> + Send + 'static,
{
    let responses = match result {
        Ok(resp) => resp.into_inner(),
        Err(status) => return error::response(&status),
    };
    // Stop after the first error line: the service ends the stream there.
    let lines = responses.scan(false, |failed, item| {
        if *failed {
            return std::future::ready(None);
        }
        let mut line = match item {
            Ok(message) => serde_json::to_vec(&Chunk { result: &message }).unwrap_or_default(),
            Err(status) => {
                *failed = true;
                error::stream_line(&status)
            }
        };
        line.push(b'\n');
        std::future::ready(Some(Ok::<_, std::convert::Infallible>(Bytes::from(line))))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(lines))
        .unwrap_or_default()
}
