//! Deciding an operation's [`Outcome`] from a gRPC error.
//!
//! An operation may be recorded [`Outcome::Failed`] only when the error proves it was never
//! applied; anything else is [`Outcome::Unknown`] (the checker then lets it take effect at any
//! time after its invoke, or never). Evidence, from Keel's sources:
//!
//! - Reads (`Range`) change nothing, so a failed read is always `Failed`.
//! - A TCP connect error (`tcp connect error`, `Connection refused`, also when only its text
//!   survived in the status) means no byte of the request left the client.
//! - Otherwise keel-client's [`ClientError::may_have_applied`] decides: it is the project's
//!   one record of which etcd errors Keel returns before proposing (`InvalidArgument` from
//!   `api/kv_validate.rs`, `NoSpace` from the quota check, "not supported for learner", ...)
//!   and which may follow an append (`NoLeader`, `Timeout`, `TimeoutDueToLeaderFail`,
//!   `Stopped`, deadline expiry, broken connections): those are `Unknown`.

use keel_client::ClientError;
use keel_proto::rpctypes;
use tonic::{Code, Status};

use crate::history::{Input, Outcome};

/// The outcome of `input` that ended with `status`. See the module docs.
pub fn classify(input: &Input, status: &Status) -> Outcome {
    let what = format!("{:?}: {}", status.code(), status.message());
    if !input.is_write()
        || is_connect_error(status)
        || !ClientError::from_status(status, "").may_have_applied()
    {
        Outcome::Failed(what)
    } else {
        Outcome::Unknown(what)
    }
}

/// Whether the error is a failed TCP connect (nothing was sent on it).
pub fn is_connect_error(status: &Status) -> bool {
    let text = format!("{} {:?}", status.message(), status);
    text.contains("tcp connect error") || text.contains("Connection refused")
}

/// Whether the error came from the transport rather than from Keel (the cached connection
/// should be dropped and re-established).
pub fn is_transport_error(status: &Status) -> bool {
    !rpctypes::is_etcd_message(status.message())
        && matches!(
            status.code(),
            Code::Unavailable | Code::Unknown | Code::Cancelled | Code::Internal
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put() -> Input {
        Input::Put {
            key: "k".into(),
            value: "v".into(),
        }
    }

    #[test]
    fn failed_only_with_proof() {
        let get = Input::Get {
            key: "k".into(),
            linearizable: true,
        };
        let timeout = Status::unavailable("etcdserver: request timed out");
        assert!(matches!(classify(&get, &timeout), Outcome::Failed(_)));
        assert!(matches!(classify(&put(), &timeout), Outcome::Unknown(_)));
        let no_leader = Status::unavailable("etcdserver: no leader");
        assert!(matches!(classify(&put(), &no_leader), Outcome::Unknown(_)));
        let invalid = Status::invalid_argument("etcdserver: key is not provided");
        assert!(matches!(classify(&put(), &invalid), Outcome::Failed(_)));
        let quota = Status::resource_exhausted("etcdserver: mvcc: database space exceeded");
        assert!(matches!(classify(&put(), &quota), Outcome::Failed(_)));
        let learner = Status::unavailable("etcdserver: rpc not supported for learner");
        assert!(matches!(classify(&put(), &learner), Outcome::Failed(_)));
        let refused = Status::unavailable("tcp connect error: Connection refused (os error 111)");
        assert!(matches!(classify(&put(), &refused), Outcome::Failed(_)));
        let reset = Status::unavailable("error reading a body from connection");
        assert!(matches!(classify(&put(), &reset), Outcome::Unknown(_)));
        assert!(is_transport_error(&reset));
        assert!(!is_transport_error(&no_leader));
    }
}
