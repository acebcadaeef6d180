//! etcd's client-facing error catalogue.
//!
//! Every error a client can see carries etcd's gRPC status code and etcd's exact message, so
//! etcdctl and clientv3 react to Keel's errors as they do to etcd's. Source of the texts and
//! codes: etcd `api/v3rpc/rpctypes/error.go` (`ErrGRPC*`), unchanged from 3.4 to 3.6.

use tonic::{Code, Status};

/// An etcd API error: a gRPC status code plus etcd's message text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EtcdError {
    #[error("etcdserver: key is not provided")]
    EmptyKey,
    #[error("etcdserver: key not found")]
    KeyNotFound,
    #[error("etcdserver: value is provided")]
    ValueProvided,
    #[error("etcdserver: lease is provided")]
    LeaseProvided,
    #[error("etcdserver: too many operations in txn request")]
    TooManyOps,
    #[error("etcdserver: duplicate key given in txn request")]
    DuplicateKey,
    #[error("etcdserver: request is too large")]
    RequestTooLarge,
    #[error("etcdserver: too many requests")]
    TooManyRequests,
    #[error("etcdserver: mvcc: required revision has been compacted")]
    Compacted,
    #[error("etcdserver: mvcc: required revision is a future revision")]
    FutureRev,
    #[error("etcdserver: mvcc: database space exceeded")]
    NoSpace,
    #[error("etcdserver: requested lease not found")]
    LeaseNotFound,
    #[error("etcdserver: lease already exists")]
    LeaseExist,
    #[error("etcdserver: too large lease TTL")]
    LeaseTtlTooLarge,
    #[error("etcdserver: member ID already exist")]
    MemberExist,
    #[error("etcdserver: Peer URLs already exists")]
    PeerUrlExist,
    #[error("etcdserver: re-configuration failed due to not enough started members")]
    MemberNotEnoughStarted,
    #[error("etcdserver: given member URLs are invalid")]
    MemberBadUrls,
    #[error("etcdserver: member not found")]
    MemberNotFound,
    #[error("etcdserver: can only promote a learner member")]
    MemberNotLearner,
    #[error("etcdserver: can only promote a learner member which is in sync with leader")]
    LearnerNotReady,
    #[error("etcdserver: too many learner members in cluster")]
    TooManyLearners,
    #[error("etcdserver: no leader")]
    NoLeader,
    #[error("etcdserver: not leader")]
    NotLeader,
    #[error("etcdserver: leader changed")]
    LeaderChanged,
    #[error("etcdserver: server stopped")]
    Stopped,
    #[error("etcdserver: request timed out")]
    Timeout,
    #[error("etcdserver: bad leader transferee")]
    BadLeaderTransferee,
    #[error("etcdserver: request timed out, leader transfer took too long")]
    TimeoutLeaderTransfer,
    #[error("etcdserver: request timed out, possibly due to previous leader failure")]
    TimeoutDueToLeaderFail,
    #[error("etcdserver: unhealthy cluster")]
    Unhealthy,
    #[error("etcdserver: rpc not supported for learner")]
    NotSupportedForLearner,
    #[error("etcdserver: corrupt cluster")]
    Corrupt,
    #[error("etcdserver: authentication is not enabled")]
    AuthNotEnabled,
    #[error("etcdserver: invalid auth token")]
    InvalidAuthToken,
    #[error("etcdserver: permission denied")]
    PermissionDenied,
    /// A Keel-internal failure (storage I/O, a broken invariant). The text is Keel's own.
    #[error("{0}")]
    Internal(String),
    /// A request etcd rejects with `InvalidArgument` and a message of its own.
    #[error("{0}")]
    InvalidArgument(String),
}

impl EtcdError {
    /// The gRPC status code etcd uses for this error.
    pub fn code(&self) -> Code {
        use EtcdError::*;
        match self {
            EmptyKey | KeyNotFound | ValueProvided | LeaseProvided | TooManyOps | DuplicateKey
            | RequestTooLarge | MemberBadUrls | InvalidArgument(_) => Code::InvalidArgument,
            Compacted | FutureRev | LeaseTtlTooLarge => Code::OutOfRange,
            NoSpace | TooManyRequests => Code::ResourceExhausted,
            LeaseNotFound | MemberNotFound => Code::NotFound,
            LeaseExist
            | MemberExist
            | PeerUrlExist
            | MemberNotEnoughStarted
            | MemberNotLearner
            | LearnerNotReady
            | TooManyLearners
            | NotLeader
            | BadLeaderTransferee
            | AuthNotEnabled => Code::FailedPrecondition,
            NoLeader
            | LeaderChanged
            | Stopped
            | Timeout
            | NotSupportedForLearner
            | TimeoutLeaderTransfer
            | TimeoutDueToLeaderFail
            | Unhealthy => Code::Unavailable,
            Corrupt => Code::DataLoss,
            InvalidAuthToken => Code::Unauthenticated,
            PermissionDenied => Code::PermissionDenied,
            Internal(_) => Code::Internal,
        }
    }

    /// Rebuilds an error from the (code, message) pair carried in a raft response.
    /// Unknown pairs keep their code and text.
    pub fn from_parts(code: i32, message: &str) -> EtcdError {
        use EtcdError::*;
        const KNOWN: &[EtcdError] = &[
            EmptyKey,
            KeyNotFound,
            ValueProvided,
            LeaseProvided,
            TooManyOps,
            DuplicateKey,
            RequestTooLarge,
            Compacted,
            FutureRev,
            NoSpace,
            LeaseNotFound,
            LeaseExist,
            LeaseTtlTooLarge,
            MemberExist,
            PeerUrlExist,
            MemberNotEnoughStarted,
            MemberBadUrls,
            MemberNotFound,
            MemberNotLearner,
            LearnerNotReady,
            TooManyLearners,
            NoLeader,
            NotLeader,
            LeaderChanged,
            Stopped,
            Timeout,
            BadLeaderTransferee,
            TimeoutLeaderTransfer,
            TimeoutDueToLeaderFail,
            Unhealthy,
            NotSupportedForLearner,
            Corrupt,
            AuthNotEnabled,
            InvalidAuthToken,
            PermissionDenied,
        ];
        if let Some(e) = KNOWN.iter().find(|e| e.to_string() == message) {
            return e.clone();
        }
        if code == Code::InvalidArgument as i32 {
            InvalidArgument(message.to_string())
        } else {
            Internal(message.to_string())
        }
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
}
