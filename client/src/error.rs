//! Typed errors of Keel/etcd calls and whether the failed request may have been applied.
//!
//! A client that retries a write must know whether the first attempt could have taken
//! effect: retrying an applied put is harmless, retrying an applied txn or lease grant is
//! not. [`ClientError::may_have_applied`] answers from what each error proves, based on
//! where Keel returns it (evidence per variant below; server sources: `server/src/node.rs`
//! `propose`/`propose_entry`, `server/src/raft/proposer.rs`, `server/src/api/kv.rs`,
//! `server/src/api/lease_leader.rs`, `server/src/error.rs`). The etcd error texts and codes
//! come from [`keel_proto::rpctypes`], the catalogue Keel's server answers from (etcd's
//! `api/v3rpc/rpctypes/error.go`, verbatim).

use std::error::Error as _;

use keel_proto::rpctypes::RpcError;
use tonic::{Code, Status};

/// An etcd error text a client reacts to (etcd `rpctypes.ErrGRPC*`), recognised from the
/// gRPC status message: a group of [`RpcError`] catalogue entries ([`EtcdText::of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EtcdText {
    /// [`RpcError::NoLeader`] (Unavailable).
    NoLeader,
    /// [`RpcError::NotLeader`] (FailedPrecondition).
    NotLeader,
    /// [`RpcError::LeaderChanged`] (Unavailable).
    LeaderChanged,
    /// [`RpcError::Stopped`] (Unavailable).
    Stopped,
    /// [`RpcError::Timeout`] and its two variants naming a leader failure or a leadership
    /// transfer, [`RpcError::TimeoutDueToLeaderFail`] and [`RpcError::TimeoutLeaderTransfer`]
    /// (Unavailable).
    RequestTimedOut,
    /// [`RpcError::Unhealthy`] (Unavailable).
    Unhealthy,
    /// [`RpcError::NotSupportedForLearner`] (Unavailable).
    NotSupportedForLearner,
    /// [`RpcError::Compacted`] (OutOfRange).
    Compacted,
    /// [`RpcError::FutureRev`] (OutOfRange).
    FutureRevision,
    /// [`RpcError::NoSpace`] (ResourceExhausted, NOSPACE alarm).
    NoSpace,
    /// [`RpcError::TooManyRequests`] (ResourceExhausted).
    TooManyRequests,
    /// [`RpcError::LeaseNotFound`] (NotFound).
    LeaseNotFound,
    /// [`RpcError::RequestTooLarge`] (InvalidArgument).
    RequestTooLarge,
    /// [`RpcError::Corrupt`] (DataLoss).
    Corrupt,
}

impl EtcdText {
    /// Recognises an etcd error text (exact match, as etcd's clientv3 does).
    pub fn parse(message: &str) -> Option<EtcdText> {
        RpcError::from_message(message).and_then(EtcdText::of)
    }

    /// The text a catalogue entry belongs to, if the client reacts to it; the other entries
    /// (refusals of the request itself) are classified by their gRPC code.
    pub fn of(error: RpcError) -> Option<EtcdText> {
        Some(match error {
            RpcError::NoLeader => EtcdText::NoLeader,
            RpcError::NotLeader => EtcdText::NotLeader,
            RpcError::LeaderChanged => EtcdText::LeaderChanged,
            RpcError::Stopped => EtcdText::Stopped,
            RpcError::Timeout
            | RpcError::TimeoutDueToLeaderFail
            | RpcError::TimeoutLeaderTransfer => EtcdText::RequestTimedOut,
            RpcError::Unhealthy => EtcdText::Unhealthy,
            RpcError::NotSupportedForLearner => EtcdText::NotSupportedForLearner,
            RpcError::Compacted => EtcdText::Compacted,
            RpcError::FutureRev => EtcdText::FutureRevision,
            RpcError::NoSpace => EtcdText::NoSpace,
            RpcError::TooManyRequests => EtcdText::TooManyRequests,
            RpcError::LeaseNotFound => EtcdText::LeaseNotFound,
            RpcError::RequestTooLarge => EtcdText::RequestTooLarge,
            RpcError::Corrupt => EtcdText::Corrupt,
            _ => return None,
        })
    }

    /// A short stable name, e.g. `no_leader` (used as an error kind in reports).
    pub fn name(self) -> &'static str {
        match self {
            EtcdText::NoLeader => "no_leader",
            EtcdText::NotLeader => "not_leader",
            EtcdText::LeaderChanged => "leader_changed",
            EtcdText::Stopped => "server_stopped",
            EtcdText::RequestTimedOut => "request_timed_out",
            EtcdText::Unhealthy => "unhealthy_cluster",
            EtcdText::NotSupportedForLearner => "not_supported_for_learner",
            EtcdText::Compacted => "compacted",
            EtcdText::FutureRevision => "future_revision",
            EtcdText::NoSpace => "no_space",
            EtcdText::TooManyRequests => "too_many_requests",
            EtcdText::LeaseNotFound => "lease_not_found",
            EtcdText::RequestTooLarge => "request_too_large",
            EtcdText::Corrupt => "corrupt",
        }
    }

    /// Whether a request that got this answer may have been applied. Evidence in Keel:
    /// - `no leader`: **may**. Keel's `Node::propose_entry` loops on openraft's
    ///   `ForwardToLeader`, which openraft also returns when a leader steps down *after*
    ///   appending the entry (it may still commit under the next leader); the loop then waits
    ///   for a leader and answers `no leader` when none appears in time.
    /// - `leader changed`, `server stopped` (the proposer drops the reply of a queued or
    ///   proposed batch), `request timed out` (`propose_entry` deadline, a forward whose
    ///   outcome is unknown, a physical compaction still running after apply): **may**.
    /// - `not leader` (lease routes refuse before proposing), `not supported for learner`
    ///   (checked before the read barrier or proposal), `unhealthy cluster`: **not**.
    /// - `database space exceeded` (`Node::check_quota` runs before proposing),
    ///   `request is too large` (`Node::propose` checks the encoded size first),
    ///   `too many requests`: **not**.
    /// - `compacted`, `future revision`, `lease not found`: the request is validated against
    ///   the store (at apply for writes) and rejected without changing it: **not**.
    /// - `corrupt cluster`: nothing is known: **may**.
    pub fn may_have_applied(self) -> bool {
        matches!(
            self,
            EtcdText::NoLeader
                | EtcdText::LeaderChanged
                | EtcdText::Stopped
                | EtcdText::RequestTimedOut
                | EtcdText::Corrupt
        )
    }

    /// Whether the condition is transient: the same request may succeed on a retry, maybe
    /// on another member (leader elections, a member shutting down, a learner).
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            EtcdText::NoLeader
                | EtcdText::NotLeader
                | EtcdText::LeaderChanged
                | EtcdText::Stopped
                | EtcdText::RequestTimedOut
                | EtcdText::Unhealthy
                | EtcdText::NotSupportedForLearner
                | EtcdText::TooManyRequests
        )
    }
}

/// A failed call to a Keel or etcd member.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// No connection to the member could be established, so the request was never sent
    /// (tonic's `ConnectError` in the status' source chain: refused, unreachable, connect
    /// timeout).
    #[error("not sent, cannot connect to {endpoint}: {message}")]
    NotSent {
        /// `host:port` of the member.
        endpoint: String,
        /// The transport's explanation.
        message: String,
    },
    /// The server answered with one of etcd's error texts.
    #[error("{message}")]
    Etcd {
        /// Which etcd error.
        error: EtcdText,
        /// The gRPC status code it came with.
        code: Code,
        /// The exact text.
        message: String,
    },
    /// The call's deadline passed (the client's `grpc-timeout` expired locally, or the
    /// server answered `DeadlineExceeded`); the request may be in flight or applied.
    #[error("deadline exceeded: {message}")]
    DeadlineExceeded {
        /// The transport's or server's explanation.
        message: String,
    },
    /// The connection failed after the request may have been sent (reset, closed, HTTP/2
    /// error, keep-alive timeout).
    #[error("connection lost: {message}")]
    ConnectionLost {
        /// The transport's explanation.
        message: String,
    },
    /// The server refused the request itself (InvalidArgument, NotFound,
    /// FailedPrecondition, AlreadyExists, OutOfRange, PermissionDenied, Unauthenticated):
    /// retrying it unchanged fails the same way.
    #[error("rejected ({code:?}): {message}")]
    Rejected {
        /// gRPC status code.
        code: Code,
        /// The server's text.
        message: String,
    },
    /// Any other status (Internal, Unknown, Unavailable without an etcd text, ...).
    #[error("server error ({code:?}): {message}")]
    Server {
        /// gRPC status code.
        code: Code,
        /// The server's text.
        message: String,
    },
    /// The server canceled a watch (etcd `WatchResponse.canceled`), e.g. because its start
    /// revision was compacted (`compact_revision` > 0).
    #[error("watch canceled: {reason} (compact revision {compact_revision})")]
    WatchCanceled {
        /// `WatchResponse.cancel_reason`.
        reason: String,
        /// `WatchResponse.compact_revision`: the oldest revision still available, or 0.
        compact_revision: i64,
    },
}

impl ClientError {
    /// Classifies a tonic status from a call to `endpoint` (`host:port`).
    pub fn from_status(status: &Status, endpoint: &str) -> ClientError {
        if source_chain_has::<tonic::ConnectError>(status) {
            return ClientError::NotSent {
                endpoint: endpoint.to_string(),
                message: status.message().to_string(),
            };
        }
        if status.code() == Code::DeadlineExceeded
            || source_chain_has::<tonic::TimeoutExpired>(status)
        {
            return ClientError::DeadlineExceeded {
                message: status.message().to_string(),
            };
        }
        if status.source().is_some() {
            // Built by the client's transport, not received from the server.
            return ClientError::ConnectionLost {
                message: status.message().to_string(),
            };
        }
        if let Some(error) = EtcdText::parse(status.message()) {
            return ClientError::Etcd {
                error,
                code: status.code(),
                message: status.message().to_string(),
            };
        }
        let (code, message) = (status.code(), status.message().to_string());
        match code {
            Code::InvalidArgument
            | Code::NotFound
            | Code::FailedPrecondition
            | Code::AlreadyExists
            | Code::OutOfRange
            | Code::PermissionDenied
            | Code::Unauthenticated => ClientError::Rejected { code, message },
            _ => ClientError::Server { code, message },
        }
    }

    /// The etcd catalogue entry this error's message is, whatever its classification (also
    /// for refusals such as [`RpcError::UserAlreadyExist`] or [`RpcError::PermissionDenied`]),
    /// looked up by exact text as clientv3's `rpctypes.Error` does; `None` for other texts
    /// and for errors the client built itself.
    pub fn rpc_error(&self) -> Option<RpcError> {
        match self {
            ClientError::Etcd { message, .. }
            | ClientError::Rejected { message, .. }
            | ClientError::Server { message, .. } => RpcError::from_message(message),
            ClientError::NotSent { .. }
            | ClientError::DeadlineExceeded { .. }
            | ClientError::ConnectionLost { .. }
            | ClientError::WatchCanceled { .. } => None,
        }
    }

    /// Whether the request may have been applied (taken effect) despite this error. `false`
    /// is a proof that it was not (see [`EtcdText::may_have_applied`] for the evidence per
    /// etcd text); `true` means "unknown".
    pub fn may_have_applied(&self) -> bool {
        match self {
            ClientError::NotSent { .. } | ClientError::Rejected { .. } => false,
            ClientError::Etcd { error, .. } => error.may_have_applied(),
            // A watch is not a write; a canceled watch changed nothing.
            ClientError::WatchCanceled { .. } => false,
            ClientError::DeadlineExceeded { .. }
            | ClientError::ConnectionLost { .. }
            | ClientError::Server { .. } => true,
        }
    }

    /// Whether retrying (possibly on another member) may succeed: the failure is about the
    /// member, the connection or a leader election, not the request.
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::NotSent { .. }
            | ClientError::DeadlineExceeded { .. }
            | ClientError::ConnectionLost { .. } => true,
            ClientError::Etcd { error, .. } => error.is_transient(),
            ClientError::Server { code, .. } => {
                matches!(code, Code::Unavailable | Code::Unknown | Code::Cancelled)
            }
            ClientError::Rejected { .. } | ClientError::WatchCanceled { .. } => false,
        }
    }

    /// A short stable name for counting errors by kind, e.g. `not_sent`, `no_leader`,
    /// `deadline_exceeded`, `rejected_invalid_argument`.
    pub fn kind(&self) -> String {
        match self {
            ClientError::NotSent { .. } => "not_sent".into(),
            ClientError::Etcd { error, .. } => error.name().into(),
            ClientError::DeadlineExceeded { .. } => "deadline_exceeded".into(),
            ClientError::ConnectionLost { .. } => "connection_lost".into(),
            ClientError::Rejected { code, .. } => format!("rejected_{}", code_name(*code)),
            ClientError::Server { code, .. } => format!("server_{}", code_name(*code)),
            ClientError::WatchCanceled { .. } => "watch_canceled".into(),
        }
    }
}

fn code_name(code: Code) -> String {
    // `Code`'s Debug is its CamelCase name (e.g. `InvalidArgument`): make it snake_case.
    let mut out = String::new();
    for (i, c) in format!("{code:?}").chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

fn source_chain_has<E: std::error::Error + 'static>(status: &Status) -> bool {
    let mut source = status.source();
    while let Some(err) = source {
        if err.is::<E>() {
            return true;
        }
        source = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(code: Code, message: &str) -> ClientError {
        ClientError::from_status(&Status::new(code, message), "127.0.0.1:1")
    }

    #[test]
    fn etcd_texts_are_recognised_with_their_code() {
        let e = classify(Code::Unavailable, "etcdserver: no leader");
        assert_eq!(e.kind(), "no_leader");
        assert!(e.may_have_applied());
        assert!(e.is_transient());
        let e = classify(
            Code::Unavailable,
            "etcdserver: request timed out, possibly due to previous leader failure",
        );
        assert_eq!(e.kind(), "request_timed_out");
        assert!(e.may_have_applied());
        let e = classify(
            Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted",
        );
        assert_eq!(e.kind(), "compacted");
        assert!(!e.may_have_applied());
        assert!(!e.is_transient());
        let e = classify(
            Code::ResourceExhausted,
            "etcdserver: mvcc: database space exceeded",
        );
        assert_eq!(e.kind(), "no_space");
        assert!(!e.may_have_applied());
        let e = classify(Code::Unavailable, "etcdserver: leader changed");
        assert!(e.may_have_applied() && e.is_transient());
        let e = classify(
            Code::Unavailable,
            "etcdserver: rpc not supported for learner",
        );
        assert!(!e.may_have_applied() && e.is_transient());
    }

    /// Every text the client reacted to before the catalogue moved to `keel-proto`.
    #[rustfmt::skip]
    const RECOGNISED: &[(&str, EtcdText)] = &[
        ("etcdserver: no leader", EtcdText::NoLeader),
        ("etcdserver: not leader", EtcdText::NotLeader),
        ("etcdserver: leader changed", EtcdText::LeaderChanged),
        ("etcdserver: server stopped", EtcdText::Stopped),
        ("etcdserver: request timed out", EtcdText::RequestTimedOut),
        ("etcdserver: request timed out, possibly due to previous leader failure", EtcdText::RequestTimedOut),
        ("etcdserver: request timed out, leader transfer took too long", EtcdText::RequestTimedOut),
        ("etcdserver: unhealthy cluster", EtcdText::Unhealthy),
        ("etcdserver: rpc not supported for learner", EtcdText::NotSupportedForLearner),
        ("etcdserver: mvcc: required revision has been compacted", EtcdText::Compacted),
        ("etcdserver: mvcc: required revision is a future revision", EtcdText::FutureRevision),
        ("etcdserver: mvcc: database space exceeded", EtcdText::NoSpace),
        ("etcdserver: too many requests", EtcdText::TooManyRequests),
        ("etcdserver: requested lease not found", EtcdText::LeaseNotFound),
        ("etcdserver: request is too large", EtcdText::RequestTooLarge),
        ("etcdserver: corrupt cluster", EtcdText::Corrupt),
    ];

    #[test]
    fn every_recognised_text_maps_to_its_etcd_text() {
        for &(message, expected) in RECOGNISED {
            assert_eq!(EtcdText::parse(message), Some(expected), "{message}");
        }
        // Catalogued texts the client does not react to are classified by their code.
        assert_eq!(EtcdText::parse("etcdserver: key is not provided"), None);
        assert_eq!(
            EtcdText::parse("etcdserver: user name already exists"),
            None
        );
        assert_eq!(EtcdText::parse("etcdserver: no leader."), None);
    }

    #[test]
    fn received_statuses_map_back_to_catalogue_entries_by_text() {
        let e = classify(
            Code::FailedPrecondition,
            "etcdserver: user name already exists",
        );
        assert_eq!(e.kind(), "rejected_failed_precondition");
        assert_eq!(e.rpc_error(), Some(RpcError::UserAlreadyExist));
        let e = classify(Code::Unauthenticated, "etcdserver: invalid auth token");
        assert_eq!(e.rpc_error(), Some(RpcError::InvalidAuthToken));
        let e = classify(Code::Unavailable, "etcdserver: no leader");
        assert_eq!(e.rpc_error(), Some(RpcError::NoLeader));
        assert_eq!(classify(Code::Internal, "disk on fire").rpc_error(), None);
        let timeout = Status::from_error(Box::new(tonic::TimeoutExpired(())));
        assert_eq!(
            ClientError::from_status(&timeout, "127.0.0.1:1").rpc_error(),
            None
        );
    }

    #[test]
    fn server_refusals_are_not_applied_and_not_transient() {
        let e = classify(Code::InvalidArgument, "etcdserver: key is not provided");
        assert_eq!(e.kind(), "rejected_invalid_argument");
        assert!(!e.may_have_applied());
        assert!(!e.is_transient());
        let e = classify(Code::PermissionDenied, "etcdserver: permission denied");
        assert_eq!(e.kind(), "rejected_permission_denied");
        assert!(!e.may_have_applied());
    }

    #[test]
    fn unknown_server_errors_may_have_applied() {
        let e = classify(Code::Internal, "disk on fire");
        assert_eq!(e.kind(), "server_internal");
        assert!(e.may_have_applied());
        assert!(!e.is_transient());
        let e = classify(Code::DeadlineExceeded, "context deadline exceeded");
        assert_eq!(e.kind(), "deadline_exceeded");
        assert!(e.may_have_applied() && e.is_transient());
    }

    #[test]
    fn transport_errors_are_told_apart_by_their_source() {
        let connect = Status::from_error(Box::new(tonic::ConnectError(Box::new(
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        ))));
        let e = ClientError::from_status(&connect, "127.0.0.1:1");
        assert_eq!(e.kind(), "not_sent");
        assert!(!e.may_have_applied());
        assert!(e.is_transient());

        let timeout = Status::from_error(Box::new(tonic::TimeoutExpired(())));
        let e = ClientError::from_status(&timeout, "127.0.0.1:1");
        assert_eq!(e.kind(), "deadline_exceeded");
        assert!(e.may_have_applied());

        // A transport failure that is neither: the request may have reached the server.
        let mut reset = Status::unavailable("connection reset");
        reset.set_source(std::sync::Arc::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )));
        let e = ClientError::from_status(&reset, "127.0.0.1:1");
        assert_eq!(e.kind(), "connection_lost");
        assert!(e.may_have_applied());
    }
}
