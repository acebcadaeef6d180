//! The error every client-facing server path returns: one of etcd's catalogued errors, or a
//! Keel-internal failure.
//!
//! Every error a client can see carries etcd's gRPC status code and etcd's exact message, so
//! etcdctl and clientv3 react to Keel's errors as they do to etcd's. The codes and texts are
//! defined once, in [`keel_proto::rpctypes`] (etcd `api/v3rpc/rpctypes/error.go`), which the
//! client shares.

use std::fmt;

use keel_proto::rpctypes::RpcError;
use tonic::{Code, Status};

/// An etcd API error: a gRPC status code plus etcd's message text.
///
/// The associated constants (`EtcdError::Compacted`, `EtcdError::NoLeader`, ...) name the
/// catalogue entries Keel returns; they work as values and in patterns. Another entry is
/// `EtcdError::from(RpcError::X)`.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
pub enum EtcdError {
    /// One of etcd's errors, with the catalogue's code and text.
    #[error(transparent)]
    Rpc(RpcError),
    /// A Keel-internal failure (storage I/O, a broken invariant). The text is Keel's own.
    #[error("{0}")]
    Internal(String),
    /// A request etcd rejects with `InvalidArgument` and a message of its own.
    #[error("{0}")]
    InvalidArgument(String),
    /// A request refused with `FailedPrecondition` and a message of Keel's own (the cluster
    /// version gate, `version::gates`).
    #[error("{0}")]
    FailedPrecondition(String),
}

/// The catalogue entries Keel returns today, under the names the server code uses.
#[allow(non_upper_case_globals)]
impl EtcdError {
    /// [`RpcError::EmptyKey`].
    pub const EmptyKey: EtcdError = EtcdError::Rpc(RpcError::EmptyKey);
    /// [`RpcError::KeyNotFound`].
    pub const KeyNotFound: EtcdError = EtcdError::Rpc(RpcError::KeyNotFound);
    /// [`RpcError::ValueProvided`].
    pub const ValueProvided: EtcdError = EtcdError::Rpc(RpcError::ValueProvided);
    /// [`RpcError::LeaseProvided`].
    pub const LeaseProvided: EtcdError = EtcdError::Rpc(RpcError::LeaseProvided);
    /// [`RpcError::TooManyOps`].
    pub const TooManyOps: EtcdError = EtcdError::Rpc(RpcError::TooManyOps);
    /// [`RpcError::DuplicateKey`].
    pub const DuplicateKey: EtcdError = EtcdError::Rpc(RpcError::DuplicateKey);
    /// [`RpcError::RequestTooLarge`].
    pub const RequestTooLarge: EtcdError = EtcdError::Rpc(RpcError::RequestTooLarge);
    /// [`RpcError::TooManyRequests`].
    pub const TooManyRequests: EtcdError = EtcdError::Rpc(RpcError::TooManyRequests);
    /// [`RpcError::Compacted`].
    pub const Compacted: EtcdError = EtcdError::Rpc(RpcError::Compacted);
    /// [`RpcError::FutureRev`].
    pub const FutureRev: EtcdError = EtcdError::Rpc(RpcError::FutureRev);
    /// [`RpcError::NoSpace`].
    pub const NoSpace: EtcdError = EtcdError::Rpc(RpcError::NoSpace);
    /// [`RpcError::LeaseNotFound`].
    pub const LeaseNotFound: EtcdError = EtcdError::Rpc(RpcError::LeaseNotFound);
    /// [`RpcError::LeaseExist`].
    pub const LeaseExist: EtcdError = EtcdError::Rpc(RpcError::LeaseExist);
    /// [`RpcError::LeaseTtlTooLarge`].
    pub const LeaseTtlTooLarge: EtcdError = EtcdError::Rpc(RpcError::LeaseTtlTooLarge);
    /// [`RpcError::MemberExist`].
    pub const MemberExist: EtcdError = EtcdError::Rpc(RpcError::MemberExist);
    /// [`RpcError::PeerUrlExist`].
    pub const PeerUrlExist: EtcdError = EtcdError::Rpc(RpcError::PeerUrlExist);
    /// [`RpcError::MemberNotEnoughStarted`].
    pub const MemberNotEnoughStarted: EtcdError = EtcdError::Rpc(RpcError::MemberNotEnoughStarted);
    /// [`RpcError::MemberBadUrls`].
    pub const MemberBadUrls: EtcdError = EtcdError::Rpc(RpcError::MemberBadUrls);
    /// [`RpcError::MemberNotFound`].
    pub const MemberNotFound: EtcdError = EtcdError::Rpc(RpcError::MemberNotFound);
    /// [`RpcError::MemberNotLearner`].
    pub const MemberNotLearner: EtcdError = EtcdError::Rpc(RpcError::MemberNotLearner);
    /// [`RpcError::LearnerNotReady`].
    pub const LearnerNotReady: EtcdError = EtcdError::Rpc(RpcError::LearnerNotReady);
    /// [`RpcError::TooManyLearners`].
    pub const TooManyLearners: EtcdError = EtcdError::Rpc(RpcError::TooManyLearners);
    /// [`RpcError::NoLeader`].
    pub const NoLeader: EtcdError = EtcdError::Rpc(RpcError::NoLeader);
    /// [`RpcError::NotLeader`].
    pub const NotLeader: EtcdError = EtcdError::Rpc(RpcError::NotLeader);
    /// [`RpcError::LeaderChanged`].
    pub const LeaderChanged: EtcdError = EtcdError::Rpc(RpcError::LeaderChanged);
    /// [`RpcError::Stopped`].
    pub const Stopped: EtcdError = EtcdError::Rpc(RpcError::Stopped);
    /// [`RpcError::Timeout`].
    pub const Timeout: EtcdError = EtcdError::Rpc(RpcError::Timeout);
    /// [`RpcError::BadLeaderTransferee`].
    pub const BadLeaderTransferee: EtcdError = EtcdError::Rpc(RpcError::BadLeaderTransferee);
    /// [`RpcError::TimeoutLeaderTransfer`].
    pub const TimeoutLeaderTransfer: EtcdError = EtcdError::Rpc(RpcError::TimeoutLeaderTransfer);
    /// [`RpcError::TimeoutDueToLeaderFail`].
    pub const TimeoutDueToLeaderFail: EtcdError = EtcdError::Rpc(RpcError::TimeoutDueToLeaderFail);
    /// [`RpcError::Unhealthy`].
    pub const Unhealthy: EtcdError = EtcdError::Rpc(RpcError::Unhealthy);
    /// [`RpcError::NotSupportedForLearner`].
    pub const NotSupportedForLearner: EtcdError = EtcdError::Rpc(RpcError::NotSupportedForLearner);
    /// [`RpcError::Corrupt`].
    pub const Corrupt: EtcdError = EtcdError::Rpc(RpcError::Corrupt);
    /// [`RpcError::AuthNotEnabled`].
    pub const AuthNotEnabled: EtcdError = EtcdError::Rpc(RpcError::AuthNotEnabled);
    /// [`RpcError::InvalidAuthToken`].
    pub const InvalidAuthToken: EtcdError = EtcdError::Rpc(RpcError::InvalidAuthToken);
    /// [`RpcError::PermissionDenied`].
    pub const PermissionDenied: EtcdError = EtcdError::Rpc(RpcError::PermissionDenied);
}

impl EtcdError {
    /// The gRPC status code etcd uses for this error.
    pub fn code(&self) -> Code {
        match self {
            EtcdError::Rpc(e) => e.code(),
            EtcdError::Internal(_) => Code::Internal,
            EtcdError::InvalidArgument(_) => Code::InvalidArgument,
            EtcdError::FailedPrecondition(_) => Code::FailedPrecondition,
        }
    }

    /// Rebuilds an error from the (code, message) pair carried in a raft response or a peer's
    /// answer: a catalogued message gives its entry (matched by text alone, as clientv3
    /// does); unknown pairs keep their text, as `InvalidArgument` when that was the code and
    /// `Internal` otherwise.
    pub fn from_parts(code: i32, message: &str) -> EtcdError {
        if let Some(e) = RpcError::from_message(message) {
            EtcdError::Rpc(e)
        } else if code == Code::InvalidArgument as i32 {
            EtcdError::InvalidArgument(message.to_string())
        } else if code == Code::FailedPrecondition as i32 {
            EtcdError::FailedPrecondition(message.to_string())
        } else {
            EtcdError::Internal(message.to_string())
        }
    }
}

/// Like the catalogue entry's name (`Compacted`), so logs and test failures read as before
/// the catalogue moved to `keel-proto`.
impl fmt::Debug for EtcdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EtcdError::Rpc(e) => fmt::Debug::fmt(e, f),
            EtcdError::Internal(s) => f.debug_tuple("Internal").field(s).finish(),
            EtcdError::InvalidArgument(s) => f.debug_tuple("InvalidArgument").field(s).finish(),
            EtcdError::FailedPrecondition(s) => {
                f.debug_tuple("FailedPrecondition").field(s).finish()
            }
        }
    }
}

impl From<RpcError> for EtcdError {
    fn from(e: RpcError) -> EtcdError {
        EtcdError::Rpc(e)
    }
}

impl From<EtcdError> for Status {
    fn from(e: EtcdError) -> Status {
        Status::new(e.code(), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_carries_etcd_code_and_text() {
        let s: Status = EtcdError::Compacted.into();
        assert_eq!(s.code(), Code::OutOfRange);
        assert_eq!(
            s.message(),
            "etcdserver: mvcc: required revision has been compacted"
        );
        let s: Status = EtcdError::EmptyKey.into();
        assert_eq!(s.code(), Code::InvalidArgument);
        assert_eq!(s.message(), "etcdserver: key is not provided");
    }

    #[test]
    fn from_parts_round_trips_known_errors() {
        for e in [
            EtcdError::DuplicateKey,
            EtcdError::FutureRev,
            EtcdError::LeaseNotFound,
        ] {
            assert_eq!(EtcdError::from_parts(e.code() as i32, &e.to_string()), e);
        }
        assert_eq!(
            EtcdError::from_parts(Code::InvalidArgument as i32, "odd"),
            EtcdError::InvalidArgument("odd".into())
        );
    }

    #[test]
    fn every_catalogue_entry_round_trips_and_keeps_its_debug_name() {
        for &r in RpcError::ALL {
            let e = EtcdError::from(r);
            assert_eq!(
                (e.code(), e.to_string()),
                (r.code(), r.message().to_string())
            );
            assert_eq!(EtcdError::from_parts(e.code() as i32, &e.to_string()), e);
            assert_eq!(format!("{e:?}"), format!("{r:?}"));
        }
        assert_eq!(format!("{:?}", EtcdError::Compacted), "Compacted");
        assert_eq!(
            format!("{:?}", EtcdError::Internal("disk".into())),
            "Internal(\"disk\")"
        );
        assert_eq!(
            EtcdError::from_parts(Code::Internal as i32, "disk on fire"),
            EtcdError::Internal("disk on fire".into())
        );
    }
}
