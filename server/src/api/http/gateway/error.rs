//! The gateway's error answers, as etcd 3.4.23's grpc-gateway (v1) writes them (etcd 3.5.1
//! orders the body `error`, `code`, `message` and maps FailedPrecondition to 400; Keel
//! matches 3.4.23, docs/compat.md).
//!
//! Unary: HTTP status [`http_status`] of the gRPC code, body
//! `{"error":"<message>","message":"<message>","code":<code>}` (checked against etcd
//! 3.4.23: e.g. 404 `{"error":"etcdserver: requested lease not found",…,"code":5}`).
//! Streams: `{"error":{"grpc_code":…,"http_code":…,"message":…,"http_status":…}}`
//! (grpc-gateway v1 `StreamError`), with the code's HTTP status when it comes before the
//! first message (`super::stream`).

use axum::http::StatusCode;
use axum::response::Response;
use serde::Serialize;
use tonic::{Code, Status};

/// etcd's unary error body (grpc-gateway v1 `internal.Error`, `details` omitted when empty).
#[derive(Debug, Serialize)]
pub struct ErrorBody<'a> {
    /// The gRPC message.
    pub error: &'a str,
    /// The gRPC message again.
    pub message: &'a str,
    /// The gRPC code as a number.
    pub code: i32,
}

/// A streamed error (grpc-gateway v1 `internal.StreamError`).
#[derive(Debug, Serialize)]
pub struct StreamError<'a> {
    /// The gRPC code as a number.
    pub grpc_code: i32,
    /// The HTTP status code of [`http_status`].
    pub http_code: u16,
    /// The gRPC message.
    pub message: &'a str,
    /// The HTTP status text (`Not Found`).
    pub http_status: &'a str,
}

/// The HTTP status etcd 3.4's grpc-gateway (`runtime.HTTPStatusFromCode`)
/// answers for `code`; `FailedPrecondition` is 412 there (checked on etcd 3.4.23).
pub fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::Cancelled => StatusCode::REQUEST_TIMEOUT,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
        Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::FailedPrecondition => StatusCode::PRECONDITION_FAILED,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// The unary answer for `status`.
pub fn response(status: &Status) -> Response {
    let body = ErrorBody {
        error: status.message(),
        message: status.message(),
        code: status.code() as i32,
    };
    super::json(http_status(status.code()), &body)
}

/// The answer of a stream that failed before its first message: the HTTP status of
/// `status`' code and its stream error object ([`stream_line`]) as the whole body.
pub fn stream_response(status: &Status) -> Response {
    super::json(http_status(status.code()), &StreamErrorLine::of(status))
}

/// One streamed error object (no newline follows it) for `status`.
pub fn stream_line(status: &Status) -> Vec<u8> {
    serde_json::to_vec(&StreamErrorLine::of(status)).unwrap_or_default()
}

/// `{"error":{…}}`, the object grpc-gateway writes for a failed stream.
#[derive(Serialize)]
struct StreamErrorLine<'a> {
    error: StreamError<'a>,
}

impl<'a> StreamErrorLine<'a> {
    fn of(status: &'a Status) -> StreamErrorLine<'a> {
        let http = http_status(status.code());
        StreamErrorLine {
            error: StreamError {
                grpc_code: status.code() as i32,
                http_code: http.as_u16(),
                message: status.message(),
                http_status: http.canonical_reason().unwrap_or(""),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unary_body_is_etcds() {
        let status = Status::not_found("etcdserver: requested lease not found");
        let resp = response(&status);
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
        let body = ErrorBody {
            error: status.message(),
            message: status.message(),
            code: 5,
        };
        assert_eq!(
            serde_json::to_string(&body).unwrap(),
            r#"{"error":"etcdserver: requested lease not found","message":"etcdserver: requested lease not found","code":5}"#
        );
    }

    #[test]
    fn codes_map_as_grpc_gateway_v1() {
        assert_eq!(http_status(Code::FailedPrecondition).as_u16(), 412);
        assert_eq!(http_status(Code::OutOfRange).as_u16(), 400);
        assert_eq!(http_status(Code::Unavailable).as_u16(), 503);
        assert_eq!(http_status(Code::Unauthenticated).as_u16(), 401);
    }

    #[test]
    fn stream_error_line() {
        let line = stream_line(&Status::not_found("etcdserver: requested lease not found"));
        assert_eq!(
            String::from_utf8(line).unwrap(),
            r#"{"error":{"grpc_code":5,"http_code":404,"message":"etcdserver: requested lease not found","http_status":"Not Found"}}"#
        );
    }
}
