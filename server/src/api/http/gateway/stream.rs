//! The gateway's streams: Watch and LeaseKeepAlive (bidirectional), Observe and Snapshot
//! (server streaming), answered as newline-delimited JSON, one `{"result":{…}}` object a
//! message (grpc-gateway's stream convention, checked on etcd 3.4.23), and an error object
//! ([`super::error::stream_line`]) when the stream fails ([`respond`]).
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

/// The request messages of `body`: its JSON values ([`super::body`]) up to the first that
/// is not a message
/// (grpc-gateway decodes one at a time and stops sending at the first failure: etcd 3.4.23
/// creates the watch of `{"create_request":{…}} trailing`), or one default message for an
/// empty body.
///
/// Errors: a first value that is not the message: `Unknown` with serde's text.
/// grpc-gateway's streaming handlers fail that way (etcd 3.4.23: `{bad` on `/v3/watch` or
/// `/v3/lease/keepalive` answers 500, `"code":2`), where unary routes answer 400, code 3.
fn decode_all<Req: DeserializeOwned + Default>(body: &[u8]) -> Result<Vec<Req>, Status> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(vec![Req::default()]);
    }
    let mut messages = Vec::new();
    for value in super::body::messages::<Req>(body) {
        match value {
            Ok(message) => messages.push(message),
            Err(e) if messages.is_empty() => return Err(Status::unknown(e.to_string())),
            Err(_) => break,
        }
    }
    Ok(messages)
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
    respond(call(request).await).await
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
    respond(call(request).await).await
}

/// The NDJSON answer for a stream, as grpc-gateway's `ForwardResponseStream` writes it: the
/// headers go with the first message, so a stream that fails before its first message (a
/// learner's refusal, an auth error) answers the error's HTTP status with one error object,
/// and a later failure ends a `200` body with it. An error object has no newline after it
/// (grpc-gateway writes the delimiter after messages only; etcd 3.4.23 and 3.5.1 checked
/// with a learner's `/v3/watch`: 503, `{"error":{"grpc_code":14,…}}`).
async fn respond<Resp, S>(result: Result<tonic::Response<S>, Status>) -> Response
where
    Resp: Serialize + Send + 'static,
    S: Stream<Item = Result<Resp, Status>> + Send + 'static,
{
    let mut responses = match result {
        Ok(resp) => Box::pin(resp.into_inner()),
        Err(status) => return error::stream_response(&status),
    };
    let first = match responses.next().await {
        Some(Ok(message)) => message,
        Some(Err(status)) => return error::stream_response(&status),
        None => return ndjson(Body::empty()),
    };
    let first = futures::stream::once(std::future::ready(Ok(first)));
    // Stop after the first error object: the service ends the stream there.
    let lines = first.chain(responses).scan(false, |failed, item| {
        if *failed {
            return std::future::ready(None);
        }
        let line = match item {
            Ok(message) => {
                let mut line = serde_json::to_vec(&Chunk { result: &message }).unwrap_or_default();
                line.push(b'\n');
                line
            }
            Err(status) => {
                *failed = true;
                error::stream_line(&status)
            }
        };
        std::future::ready(Some(Ok::<_, std::convert::Infallible>(Bytes::from(line))))
    });
    ndjson(Body::from_stream(lines))
}

/// A `200` stream answer with `body`.
fn ndjson(body: Body) -> Response {
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(body)
        .unwrap_or_default()
}
