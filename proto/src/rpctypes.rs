//! etcd's error catalogue: every etcd error a client can see, defined once with its gRPC
//! status code and exact message text, for the server (which sends them) and the client
//! (which recognises them), as etcd shares `api/v3rpc/rpctypes/error.go` between
//! `etcdserver` and `clientv3`.
//!
//! Invariants (pinned by the tests below):
//! - every [`RpcError::message`] is byte for byte etcd's (`ErrGRPC*` in `rpctypes/error.go`,
//!   identical in 3.4, 3.5 and 3.6 where the constant exists), because etcd's clientv3 and
//!   etcdctl recognise errors by message alone ([`RpcError::from_message`] is clientv3's
//!   `rpctypes.Error`);
//! - no two entries share a message, so a message maps back to exactly one entry;
//! - codes are etcd 3.4/3.5's. etcd 3.6 moved three of them from `Unavailable` to
//!   `FailedPrecondition` ([`RpcError::NotSupportedForLearner`], [`RpcError::NotCapable`],
//!   [`RpcError::ClusterVersionUnavailable`]); each entry says so.
//!
//! Besides the gRPC errors, etcd puts two `mvcc` texts in `WatchResponse.cancel_reason`
//! instead of a status: [`WATCH_EMPTY_RANGE`] and [`WATCH_DUPLICATE_ID`].

// The crate allows these for its generated code; this module is written by hand.
#![warn(missing_docs, clippy::all)]

use std::fmt;

use tonic::{Code, Status};

/// The prefix of every message in the catalogue: how etcd marks a status as its own answer
/// rather than a transport failure.
pub const PREFIX: &str = "etcdserver: ";

/// Whether `message` is written like one of etcd's errors (starts with [`PREFIX`]), whether
/// or not it is in this catalogue.
pub fn is_etcd_message(message: &str) -> bool {
    message.starts_with(PREFIX)
}

/// etcd `mvcc.ErrEmptyWatcherRange`: the `cancel_reason` of a watch create whose
/// `range_end` is set but not after `key` (`server/storage/mvcc/watcher.go`).
pub const WATCH_EMPTY_RANGE: &str = "mvcc: watcher range is empty";

/// etcd `mvcc.ErrWatcherDuplicateID`: the `cancel_reason` of a watch create whose
/// client-chosen `watch_id` is already in use on the stream (`server/storage/mvcc/watcher.go`).
pub const WATCH_DUPLICATE_ID: &str = "mvcc: duplicate watch ID provided on the WatchStream";

/// etcd `rpctypes.MetadataRequireLeaderKey`: the gRPC metadata key clientv3's
/// `WithRequireLeader` sets (kube-apiserver sets it on every watch).
pub const METADATA_REQUIRE_LEADER_KEY: &str = "hasleader";

/// etcd `rpctypes.MetadataHasLeader`: the value of [`METADATA_REQUIRE_LEADER_KEY`] that asks
/// the member to refuse the request with `etcdserver: no leader` while it has no leader.
pub const METADATA_HAS_LEADER: &str = "true";

/// Declares [`RpcError`] from one table, so each entry's name, etcd constant, code and text
/// are written exactly once.
macro_rules! catalogue {
    ($(
        $(#[$doc:meta])*
        $name:ident: $etcd:literal, $code:ident, $text:literal;
    )+) => {
        /// One of etcd's client-facing errors. Its code and text are [`RpcError::code`] and
        /// [`RpcError::message`]; each variant's doc names the etcd constant.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum RpcError {
            $(
                $(#[$doc])*
                #[doc = ""]
                #[doc = concat!("etcd `", $etcd, "`: `", stringify!($code), "`, \"", $text, "\".")]
                $name,
            )+
        }

        impl RpcError {
            /// Every entry, in catalogue order.
            pub const ALL: &'static [RpcError] = &[$(RpcError::$name),+];

            /// The exact message etcd sends (the gRPC status message).
            pub const fn message(self) -> &'static str {
                match self {
                    $(RpcError::$name => $text,)+
                }
            }

            /// The gRPC status code etcd sends with it.
            pub const fn code(self) -> Code {
                match self {
                    $(RpcError::$name => Code::$code,)+
                }
            }

            /// The name of the etcd constant that defines it, e.g. `ErrGRPCEmptyKey`.
            pub const fn etcd_name(self) -> &'static str {
                match self {
                    $(RpcError::$name => $etcd,)+
                }
            }
        }
    };
}

catalogue! {
    // --- requests (api/v3rpc/key.go checks, mvcc)
    /// A request without a key.
    EmptyKey: "ErrGRPCEmptyKey", InvalidArgument, "etcdserver: key is not provided";
    /// `ignore_value`/`ignore_lease` on a key that does not exist.
    KeyNotFound: "ErrGRPCKeyNotFound", InvalidArgument, "etcdserver: key not found";
    /// A put with `ignore_value` that also carries a value.
    ValueProvided: "ErrGRPCValueProvided", InvalidArgument, "etcdserver: value is provided";
    /// A put with `ignore_lease` that also carries a lease.
    LeaseProvided: "ErrGRPCLeaseProvided", InvalidArgument, "etcdserver: lease is provided";
    /// A txn with more operations than `--max-txn-ops`.
    TooManyOps: "ErrGRPCTooManyOps", InvalidArgument, "etcdserver: too many operations in txn request";
    /// A txn that writes the same key twice in one branch.
    DuplicateKey: "ErrGRPCDuplicateKey", InvalidArgument, "etcdserver: duplicate key given in txn request";
    /// A request newer than the cluster's API version (etcd 3.6 only).
    InvalidClientApiVersion: "ErrGRPCInvalidClientAPIVersion", InvalidArgument, "etcdserver: invalid client api version";
    /// A range with an unknown sort order or target (etcd 3.6 only).
    InvalidSortOption: "ErrGRPCInvalidSortOption", InvalidArgument, "etcdserver: invalid sort option";
    /// A read or watch at a revision below the compacted one.
    Compacted: "ErrGRPCCompacted", OutOfRange, "etcdserver: mvcc: required revision has been compacted";
    /// A read at a revision above the current one.
    FutureRev: "ErrGRPCFutureRev", OutOfRange, "etcdserver: mvcc: required revision is a future revision";
    /// The backend reached its quota (the NOSPACE alarm is raised).
    NoSpace: "ErrGRPCNoSpace", ResourceExhausted, "etcdserver: mvcc: database space exceeded";
    /// A request larger than `--max-request-bytes`.
    RequestTooLarge: "ErrGRPCRequestTooLarge", InvalidArgument, "etcdserver: request is too large";
    /// Too many proposals are committed but not applied yet.
    TooManyRequests: "ErrGRPCRequestTooManyRequests", ResourceExhausted, "etcdserver: too many requests";

    // --- leases
    /// No lease with that ID.
    LeaseNotFound: "ErrGRPCLeaseNotFound", NotFound, "etcdserver: requested lease not found";
    /// A grant with the ID of an existing lease.
    LeaseExist: "ErrGRPCLeaseExist", FailedPrecondition, "etcdserver: lease already exists";
    /// A grant with a TTL above the maximum.
    LeaseTtlTooLarge: "ErrGRPCLeaseTTLTooLarge", OutOfRange, "etcdserver: too large lease TTL";

    // --- watch
    /// A watch stream the server canceled.
    WatchCanceled: "ErrGRPCWatchCanceled", Cancelled, "etcdserver: watch canceled";

    // --- membership
    /// A member ID already in the cluster.
    MemberExist: "ErrGRPCMemberExist", FailedPrecondition, "etcdserver: member ID already exist";
    /// A peer URL another member already has.
    PeerUrlExist: "ErrGRPCPeerURLExist", FailedPrecondition, "etcdserver: Peer URLs already exists";
    /// A reconfiguration that would leave too few started members for quorum.
    MemberNotEnoughStarted: "ErrGRPCMemberNotEnoughStarted", FailedPrecondition, "etcdserver: re-configuration failed due to not enough started members";
    /// Peer URLs that do not parse.
    MemberBadUrls: "ErrGRPCMemberBadURLs", InvalidArgument, "etcdserver: given member URLs are invalid";
    /// No member with that ID.
    MemberNotFound: "ErrGRPCMemberNotFound", NotFound, "etcdserver: member not found";
    /// A promote of a voting member.
    MemberNotLearner: "ErrGRPCMemberNotLearner", FailedPrecondition, "etcdserver: can only promote a learner member";
    /// A promote of a learner that lags the leader.
    LearnerNotReady: "ErrGRPCLearnerNotReady", FailedPrecondition, "etcdserver: can only promote a learner member which is in sync with leader";
    /// A learner add beyond the learner limit.
    TooManyLearners: "ErrGRPCTooManyLearners", FailedPrecondition, "etcdserver: too many learner members in cluster";
    /// A request from a member of another cluster.
    ClusterIdMismatch: "ErrGRPCClusterIdMismatch", FailedPrecondition, "etcdserver: cluster ID mismatch";

    // --- auth
    /// Auth enable without a `root` user.
    RootUserNotExist: "ErrGRPCRootUserNotExist", FailedPrecondition, "etcdserver: root user does not exist";
    /// Auth enable while the `root` user lacks the `root` role.
    RootRoleNotExist: "ErrGRPCRootRoleNotExist", FailedPrecondition, "etcdserver: root user does not have root role";
    /// A user add with a name in use.
    UserAlreadyExist: "ErrGRPCUserAlreadyExist", FailedPrecondition, "etcdserver: user name already exists";
    /// An empty user name; also what a request without a token gets while auth is on.
    UserEmpty: "ErrGRPCUserEmpty", InvalidArgument, "etcdserver: user name is empty";
    /// No user with that name.
    UserNotFound: "ErrGRPCUserNotFound", FailedPrecondition, "etcdserver: user name not found";
    /// A role add with a name in use.
    RoleAlreadyExist: "ErrGRPCRoleAlreadyExist", FailedPrecondition, "etcdserver: role name already exists";
    /// No role with that name.
    RoleNotFound: "ErrGRPCRoleNotFound", FailedPrecondition, "etcdserver: role name not found";
    /// An empty role name.
    RoleEmpty: "ErrGRPCRoleEmpty", InvalidArgument, "etcdserver: role name is empty";
    /// Authenticate with a wrong user or password.
    AuthFailed: "ErrGRPCAuthFailed", InvalidArgument, "etcdserver: authentication failed, invalid user ID or password";
    /// A role grant without a permission.
    PermissionNotGiven: "ErrGRPCPermissionNotGiven", InvalidArgument, "etcdserver: permission not given";
    /// The user's roles do not allow the request.
    PermissionDenied: "ErrGRPCPermissionDenied", PermissionDenied, "etcdserver: permission denied";
    /// A role revoke of a role the user does not have.
    RoleNotGranted: "ErrGRPCRoleNotGranted", FailedPrecondition, "etcdserver: role is not granted to the user";
    /// A permission revoke of a permission the role does not have.
    PermissionNotGranted: "ErrGRPCPermissionNotGranted", FailedPrecondition, "etcdserver: permission is not granted to the role";
    /// An auth request while auth is disabled.
    AuthNotEnabled: "ErrGRPCAuthNotEnabled", FailedPrecondition, "etcdserver: authentication is not enabled";
    /// An unknown or expired token (clientv3 re-authenticates and retries).
    InvalidAuthToken: "ErrGRPCInvalidAuthToken", Unauthenticated, "etcdserver: invalid auth token";
    /// A change that would break auth (delete root, revoke root's root role).
    InvalidAuthMgmt: "ErrGRPCInvalidAuthMgmt", InvalidArgument, "etcdserver: invalid auth management";
    /// A request checked against an older auth revision (clientv3 re-authenticates and
    /// retries).
    AuthOldRevision: "ErrGRPCAuthOldRevision", InvalidArgument, "etcdserver: revision of auth store is old";

    // --- leadership and availability
    /// No leader is known.
    NoLeader: "ErrGRPCNoLeader", Unavailable, "etcdserver: no leader";
    /// A leader-only request on a follower.
    NotLeader: "ErrGRPCNotLeader", FailedPrecondition, "etcdserver: not leader";
    /// The leader changed while the request was in flight.
    LeaderChanged: "ErrGRPCLeaderChanged", Unavailable, "etcdserver: leader changed";
    /// A feature the cluster version does not enable yet. `FailedPrecondition` in etcd 3.6.
    NotCapable: "ErrGRPCNotCapable", Unavailable, "etcdserver: not capable";
    /// The member is shutting down.
    Stopped: "ErrGRPCStopped", Unavailable, "etcdserver: server stopped";
    /// The request did not finish in time; it may still be applied.
    Timeout: "ErrGRPCTimeout", Unavailable, "etcdserver: request timed out";
    /// A timeout likely caused by the previous leader's failure.
    TimeoutDueToLeaderFail: "ErrGRPCTimeoutDueToLeaderFail", Unavailable, "etcdserver: request timed out, possibly due to previous leader failure";
    /// A timeout likely caused by a lost peer connection.
    TimeoutDueToConnectionLost: "ErrGRPCTimeoutDueToConnectionLost", Unavailable, "etcdserver: request timed out, possibly due to connection lost";
    /// A read whose wait for the applied index timed out.
    TimeoutWaitAppliedIndex: "ErrGRPCTimeoutWaitAppliedIndex", Unavailable, "etcdserver: request timed out, waiting for the applied index took too long";
    /// A leadership transfer that did not complete in time. Not in `rpctypes`: etcd's
    /// MoveLeader sends this `server/etcdserver/errors` text through `togRPCError`'s
    /// fallback, with code `Unknown`, and so does Keel. (Keel sent `Unavailable` before,
    /// which clientv3 retries: etcdctl sent the MoveLeader again for its whole 5 s command
    /// timeout and printed `context deadline exceeded`; found by a fresh-user check.)
    TimeoutLeaderTransfer: "ErrTimeoutLeaderTransfer", Unknown, "etcdserver: request timed out, leader transfer took too long";
    /// Too few healthy members for the request (e.g. a member remove).
    Unhealthy: "ErrGRPCUnhealthy", Unavailable, "etcdserver: unhealthy cluster";
    /// The CORRUPT alarm is active.
    Corrupt: "ErrGRPCCorrupt", DataLoss, "etcdserver: corrupt cluster";
    /// A request a learner does not serve. etcd 3.4/3.5 spell the constant
    /// `ErrGPRCNotSupportedForLearner`; 3.6 renames it and sends `FailedPrecondition`.
    NotSupportedForLearner: "ErrGRPCNotSupportedForLearner", Unavailable, "etcdserver: rpc not supported for learner";
    /// A MoveLeader target that is not a voting member.
    BadLeaderTransferee: "ErrGRPCBadLeaderTransferee", FailedPrecondition, "etcdserver: bad leader transferee";

    // --- downgrade (etcd 3.5+)
    /// A downgrade target that is not `major.minor`.
    WrongDowngradeVersionFormat: "ErrGRPCWrongDowngradeVersionFormat", InvalidArgument, "etcdserver: wrong downgrade target version format";
    /// A downgrade target that is not one minor version below the cluster's.
    InvalidDowngradeTargetVersion: "ErrGRPCInvalidDowngradeTargetVersion", InvalidArgument, "etcdserver: invalid downgrade target version";
    /// A downgrade before the cluster version is known. `FailedPrecondition` in etcd 3.6.
    ClusterVersionUnavailable: "ErrGRPCClusterVersionUnavailable", Unavailable, "etcdserver: cluster version not found during downgrade";
    /// A downgrade enable while one is running.
    DowngradeInProcess: "ErrGRPCDowngradeInProcess", FailedPrecondition, "etcdserver: cluster has a downgrade job in progress";
    /// A downgrade cancel with no downgrade running.
    NoInflightDowngrade: "ErrGRPCNoInflightDowngrade", FailedPrecondition, "etcdserver: no inflight downgrade job";

    // --- request context (etcd 3.5+)
    /// The client canceled the request.
    Canceled: "ErrGRPCCanceled", Cancelled, "etcdserver: request canceled";
    /// The request's deadline passed on the server.
    DeadlineExceeded: "ErrGRPCDeadlineExceeded", DeadlineExceeded, "etcdserver: context deadline exceeded";
}

impl RpcError {
    /// The entry whose message is exactly `message`, as clientv3's `rpctypes.Error` looks a
    /// received status up by its text alone; `None` for any other text.
    pub fn from_message(message: &str) -> Option<RpcError> {
        RpcError::ALL
            .iter()
            .copied()
            .find(|e| e.message() == message)
    }

    /// The gRPC status etcd answers with.
    pub fn status(self) -> Status {
        Status::new(self.code(), self.message())
    }
}

impl fmt::Display for RpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for RpcError {}

impl From<RpcError> for Status {
    fn from(e: RpcError) -> Status {
        e.status()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    /// (entry, etcd constant, code, message) exactly as `api/v3rpc/rpctypes/error.go` spells
    /// them (etcd v3.4.45 and v3.5.33; v3.6.14 where the constant is new), plus
    /// `server/etcdserver/errors.ErrTimeoutLeaderTransfer`.
    #[rustfmt::skip]
    const ETCD: &[(RpcError, &str, Code, &str)] = &[
        (RpcError::EmptyKey, "ErrGRPCEmptyKey", Code::InvalidArgument, "etcdserver: key is not provided"),
        (RpcError::KeyNotFound, "ErrGRPCKeyNotFound", Code::InvalidArgument, "etcdserver: key not found"),
        (RpcError::ValueProvided, "ErrGRPCValueProvided", Code::InvalidArgument, "etcdserver: value is provided"),
        (RpcError::LeaseProvided, "ErrGRPCLeaseProvided", Code::InvalidArgument, "etcdserver: lease is provided"),
        (RpcError::TooManyOps, "ErrGRPCTooManyOps", Code::InvalidArgument, "etcdserver: too many operations in txn request"),
        (RpcError::DuplicateKey, "ErrGRPCDuplicateKey", Code::InvalidArgument, "etcdserver: duplicate key given in txn request"),
        (RpcError::InvalidClientApiVersion, "ErrGRPCInvalidClientAPIVersion", Code::InvalidArgument, "etcdserver: invalid client api version"),
        (RpcError::InvalidSortOption, "ErrGRPCInvalidSortOption", Code::InvalidArgument, "etcdserver: invalid sort option"),
        (RpcError::Compacted, "ErrGRPCCompacted", Code::OutOfRange, "etcdserver: mvcc: required revision has been compacted"),
        (RpcError::FutureRev, "ErrGRPCFutureRev", Code::OutOfRange, "etcdserver: mvcc: required revision is a future revision"),
        (RpcError::NoSpace, "ErrGRPCNoSpace", Code::ResourceExhausted, "etcdserver: mvcc: database space exceeded"),
        (RpcError::RequestTooLarge, "ErrGRPCRequestTooLarge", Code::InvalidArgument, "etcdserver: request is too large"),
        (RpcError::TooManyRequests, "ErrGRPCRequestTooManyRequests", Code::ResourceExhausted, "etcdserver: too many requests"),
        (RpcError::LeaseNotFound, "ErrGRPCLeaseNotFound", Code::NotFound, "etcdserver: requested lease not found"),
        (RpcError::LeaseExist, "ErrGRPCLeaseExist", Code::FailedPrecondition, "etcdserver: lease already exists"),
        (RpcError::LeaseTtlTooLarge, "ErrGRPCLeaseTTLTooLarge", Code::OutOfRange, "etcdserver: too large lease TTL"),
        (RpcError::WatchCanceled, "ErrGRPCWatchCanceled", Code::Cancelled, "etcdserver: watch canceled"),
        (RpcError::MemberExist, "ErrGRPCMemberExist", Code::FailedPrecondition, "etcdserver: member ID already exist"),
        (RpcError::PeerUrlExist, "ErrGRPCPeerURLExist", Code::FailedPrecondition, "etcdserver: Peer URLs already exists"),
        (RpcError::MemberNotEnoughStarted, "ErrGRPCMemberNotEnoughStarted", Code::FailedPrecondition, "etcdserver: re-configuration failed due to not enough started members"),
        (RpcError::MemberBadUrls, "ErrGRPCMemberBadURLs", Code::InvalidArgument, "etcdserver: given member URLs are invalid"),
        (RpcError::MemberNotFound, "ErrGRPCMemberNotFound", Code::NotFound, "etcdserver: member not found"),
        (RpcError::MemberNotLearner, "ErrGRPCMemberNotLearner", Code::FailedPrecondition, "etcdserver: can only promote a learner member"),
        (RpcError::LearnerNotReady, "ErrGRPCLearnerNotReady", Code::FailedPrecondition, "etcdserver: can only promote a learner member which is in sync with leader"),
        (RpcError::TooManyLearners, "ErrGRPCTooManyLearners", Code::FailedPrecondition, "etcdserver: too many learner members in cluster"),
        (RpcError::ClusterIdMismatch, "ErrGRPCClusterIdMismatch", Code::FailedPrecondition, "etcdserver: cluster ID mismatch"),
        (RpcError::RootUserNotExist, "ErrGRPCRootUserNotExist", Code::FailedPrecondition, "etcdserver: root user does not exist"),
        (RpcError::RootRoleNotExist, "ErrGRPCRootRoleNotExist", Code::FailedPrecondition, "etcdserver: root user does not have root role"),
        (RpcError::UserAlreadyExist, "ErrGRPCUserAlreadyExist", Code::FailedPrecondition, "etcdserver: user name already exists"),
        (RpcError::UserEmpty, "ErrGRPCUserEmpty", Code::InvalidArgument, "etcdserver: user name is empty"),
        (RpcError::UserNotFound, "ErrGRPCUserNotFound", Code::FailedPrecondition, "etcdserver: user name not found"),
        (RpcError::RoleAlreadyExist, "ErrGRPCRoleAlreadyExist", Code::FailedPrecondition, "etcdserver: role name already exists"),
        (RpcError::RoleNotFound, "ErrGRPCRoleNotFound", Code::FailedPrecondition, "etcdserver: role name not found"),
        (RpcError::RoleEmpty, "ErrGRPCRoleEmpty", Code::InvalidArgument, "etcdserver: role name is empty"),
        (RpcError::AuthFailed, "ErrGRPCAuthFailed", Code::InvalidArgument, "etcdserver: authentication failed, invalid user ID or password"),
        (RpcError::PermissionNotGiven, "ErrGRPCPermissionNotGiven", Code::InvalidArgument, "etcdserver: permission not given"),
        (RpcError::PermissionDenied, "ErrGRPCPermissionDenied", Code::PermissionDenied, "etcdserver: permission denied"),
        (RpcError::RoleNotGranted, "ErrGRPCRoleNotGranted", Code::FailedPrecondition, "etcdserver: role is not granted to the user"),
        (RpcError::PermissionNotGranted, "ErrGRPCPermissionNotGranted", Code::FailedPrecondition, "etcdserver: permission is not granted to the role"),
        (RpcError::AuthNotEnabled, "ErrGRPCAuthNotEnabled", Code::FailedPrecondition, "etcdserver: authentication is not enabled"),
        (RpcError::InvalidAuthToken, "ErrGRPCInvalidAuthToken", Code::Unauthenticated, "etcdserver: invalid auth token"),
        (RpcError::InvalidAuthMgmt, "ErrGRPCInvalidAuthMgmt", Code::InvalidArgument, "etcdserver: invalid auth management"),
        (RpcError::AuthOldRevision, "ErrGRPCAuthOldRevision", Code::InvalidArgument, "etcdserver: revision of auth store is old"),
        (RpcError::NoLeader, "ErrGRPCNoLeader", Code::Unavailable, "etcdserver: no leader"),
        (RpcError::NotLeader, "ErrGRPCNotLeader", Code::FailedPrecondition, "etcdserver: not leader"),
        (RpcError::LeaderChanged, "ErrGRPCLeaderChanged", Code::Unavailable, "etcdserver: leader changed"),
        (RpcError::NotCapable, "ErrGRPCNotCapable", Code::Unavailable, "etcdserver: not capable"),
        (RpcError::Stopped, "ErrGRPCStopped", Code::Unavailable, "etcdserver: server stopped"),
        (RpcError::Timeout, "ErrGRPCTimeout", Code::Unavailable, "etcdserver: request timed out"),
        (RpcError::TimeoutDueToLeaderFail, "ErrGRPCTimeoutDueToLeaderFail", Code::Unavailable, "etcdserver: request timed out, possibly due to previous leader failure"),
        (RpcError::TimeoutDueToConnectionLost, "ErrGRPCTimeoutDueToConnectionLost", Code::Unavailable, "etcdserver: request timed out, possibly due to connection lost"),
        (RpcError::TimeoutWaitAppliedIndex, "ErrGRPCTimeoutWaitAppliedIndex", Code::Unavailable, "etcdserver: request timed out, waiting for the applied index took too long"),
        (RpcError::TimeoutLeaderTransfer, "ErrTimeoutLeaderTransfer", Code::Unknown, "etcdserver: request timed out, leader transfer took too long"),
        (RpcError::Unhealthy, "ErrGRPCUnhealthy", Code::Unavailable, "etcdserver: unhealthy cluster"),
        (RpcError::Corrupt, "ErrGRPCCorrupt", Code::DataLoss, "etcdserver: corrupt cluster"),
        (RpcError::NotSupportedForLearner, "ErrGRPCNotSupportedForLearner", Code::Unavailable, "etcdserver: rpc not supported for learner"),
        (RpcError::BadLeaderTransferee, "ErrGRPCBadLeaderTransferee", Code::FailedPrecondition, "etcdserver: bad leader transferee"),
        (RpcError::WrongDowngradeVersionFormat, "ErrGRPCWrongDowngradeVersionFormat", Code::InvalidArgument, "etcdserver: wrong downgrade target version format"),
        (RpcError::InvalidDowngradeTargetVersion, "ErrGRPCInvalidDowngradeTargetVersion", Code::InvalidArgument, "etcdserver: invalid downgrade target version"),
        (RpcError::ClusterVersionUnavailable, "ErrGRPCClusterVersionUnavailable", Code::Unavailable, "etcdserver: cluster version not found during downgrade"),
        (RpcError::DowngradeInProcess, "ErrGRPCDowngradeInProcess", Code::FailedPrecondition, "etcdserver: cluster has a downgrade job in progress"),
        (RpcError::NoInflightDowngrade, "ErrGRPCNoInflightDowngrade", Code::FailedPrecondition, "etcdserver: no inflight downgrade job"),
        (RpcError::Canceled, "ErrGRPCCanceled", Code::Cancelled, "etcdserver: request canceled"),
        (RpcError::DeadlineExceeded, "ErrGRPCDeadlineExceeded", Code::DeadlineExceeded, "etcdserver: context deadline exceeded"),
    ];

    #[test]
    fn every_entry_has_etcds_constant_code_and_text() {
        assert_eq!(
            RpcError::ALL,
            ETCD.iter().map(|(e, ..)| *e).collect::<Vec<_>>().as_slice(),
            "the table lists every entry once, in catalogue order"
        );
        for &(e, name, code, text) in ETCD {
            assert_eq!(e.etcd_name(), name, "{e:?}");
            assert_eq!(e.code(), code, "{e:?}");
            assert_eq!(e.message(), text, "{e:?}");
            assert_eq!(e.to_string(), text, "{e:?}");
            let status = Status::from(e);
            assert_eq!((status.code(), status.message()), (code, text), "{e:?}");
        }
    }

    #[test]
    fn messages_are_distinct_and_map_back_to_their_entry() {
        let texts: HashSet<&str> = RpcError::ALL.iter().map(|e| e.message()).collect();
        assert_eq!(texts.len(), RpcError::ALL.len(), "two entries share a text");
        for &e in RpcError::ALL {
            assert!(is_etcd_message(e.message()), "{e:?}");
            assert_eq!(RpcError::from_message(e.message()), Some(e));
        }
        // Exact match only, as clientv3 does.
        assert_eq!(RpcError::from_message("etcdserver: no leader "), None);
        assert_eq!(RpcError::from_message("etcdserver: No leader"), None);
        assert_eq!(RpcError::from_message("disk on fire"), None);
        assert!(!is_etcd_message("transport error"));
    }

    #[test]
    fn watch_cancel_reasons_are_etcds_mvcc_texts() {
        assert_eq!(WATCH_EMPTY_RANGE, "mvcc: watcher range is empty");
        assert_eq!(
            WATCH_DUPLICATE_ID,
            "mvcc: duplicate watch ID provided on the WatchStream"
        );
    }
}
