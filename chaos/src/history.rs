//! The recorded history of a chaos run: every KV operation with its invoke and return times and
//! its outcome, and every watch stream's received events. The harness (`run`) writes it; the
//! checkers (`check`) read it. It serialises to JSON so a failing run can be re-checked offline.
//!
//! Model (Jepsen/porcupine): an operation takes effect atomically at some instant between its
//! `invoke_ns` and `return_ns`. An operation whose outcome is [`Outcome::Unknown`] (timeout,
//! connection lost after sending) may or may not have taken effect, at any instant after its
//! invoke: its return time is treated as +infinity by the linearizability checker.

use serde::{Deserialize, Serialize};

/// A key of the hot key set, as UTF-8 (the workload only uses printable keys).
pub type Key = String;

/// What a client asked for. Values written by a run are unique (client id + sequence number),
/// so a read names exactly the write it observed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Input {
    /// `Range` of one key; `linearizable = false` is etcd's serializable read
    /// (RangeRequest.serializable = true), which the checker does not hold to linearizability.
    Get { key: Key, linearizable: bool },
    /// `Put` of one key without a lease.
    Put { key: Key, value: String },
    /// `DeleteRange` of one key.
    Delete { key: Key },
    /// A compare-and-set `Txn`: `if value(key) == expect then put(key, value)` where
    /// `expect = None` means "the key does not exist" (etcd: `compare(create_revision, =, 0)`).
    Cas {
        key: Key,
        expect: Option<String>,
        value: String,
    },
}

impl Input {
    /// The single key an operation touches (histories are partitioned by it).
    pub fn key(&self) -> &str {
        match self {
            Input::Get { key, .. }
            | Input::Put { key, .. }
            | Input::Delete { key }
            | Input::Cas { key, .. } => key,
        }
    }

    /// True for operations that may change the store.
    pub fn is_write(&self) -> bool {
        !matches!(self, Input::Get { .. })
    }
}

/// What the cluster answered. Revisions are etcd revisions (ResponseHeader.revision,
/// KeyValue.mod_revision).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Output {
    /// `Get`: the value and mod_revision of the key, or `None` when it does not exist; `revision`
    /// is the response header's store revision.
    Get {
        kv: Option<(String, i64)>,
        revision: i64,
    },
    /// `Put`: the header revision, which is the new mod_revision of the key.
    Put { revision: i64 },
    /// `Delete`: how many keys were deleted (0 or 1) and the header revision.
    Delete { deleted: i64, revision: i64 },
    /// `Cas`: whether the compare held (and the put ran), and the header revision.
    Cas { succeeded: bool, revision: i64 },
}

impl Output {
    /// The revision at which this answer says the store changed: a put, a CAS whose compare
    /// held, a delete that removed a key; `None` for a get and for a write that changed
    /// nothing.
    pub fn write_revision(&self) -> Option<i64> {
        match *self {
            Output::Put { revision }
            | Output::Cas {
                succeeded: true,
                revision,
            }
            | Output::Delete {
                deleted: 1..,
                revision,
            } => Some(revision),
            Output::Get { .. } | Output::Cas { .. } | Output::Delete { .. } => None,
        }
    }
}

/// How an operation ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// The cluster answered.
    Ok(Output),
    /// The operation certainly did not take effect (refused before it reached raft, e.g. a
    /// connection refused before sending, or an error proving it was not applied). The checker
    /// drops it.
    Failed(String),
    /// The operation may or may not have taken effect (deadline exceeded, connection lost after
    /// sending, leader lost while proposing).
    Unknown(String),
}

/// One client operation. Times are nanoseconds since the start of the run (monotonic clock).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Operation {
    /// The workload client that issued it (a client issues one operation at a time).
    pub client: u32,
    /// Index of the member the client sent it to.
    pub member: usize,
    pub input: Input,
    pub outcome: Outcome,
    /// When the request was sent (ns since run start).
    pub invoke_ns: u64,
    /// When the answer (or the error) arrived (ns since run start).
    pub return_ns: u64,
}

/// The kind of a watch event (mvccpb.Event.EventType).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    Put,
    Delete,
}

/// One event received on a watch (mvccpb.Event with its KeyValue).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchEvent {
    pub kind: EventKind,
    pub key: Key,
    /// The value for a put; empty for a delete.
    pub value: String,
    /// KeyValue.mod_revision: the revision of this change.
    pub mod_revision: i64,
    pub create_revision: i64,
    pub version: i64,
}

/// One WatchResponse as the watcher saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchResponseRecord {
    /// When it arrived (ns since run start).
    pub at_ns: u64,
    /// ResponseHeader.revision.
    pub header_revision: i64,
    /// Empty for a progress notification.
    pub events: Vec<WatchEvent>,
    /// WatchResponse.compact_revision when the watch was cancelled because its start revision
    /// was compacted; 0 otherwise.
    pub compact_revision: i64,
}

/// One watch stream: created on `member` for keys in `[key, range_end)` from `start_revision`
/// (0 = "from now"), and everything it received until it ended. A watch that is resumed after
/// an error is a new record whose `start_revision` is the last seen revision + 1.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchRecord {
    pub watcher: u32,
    pub member: usize,
    pub key: Key,
    pub range_end: Key,
    pub start_revision: i64,
    /// Header revision of the created response (the watch covers revisions after it when
    /// `start_revision` is 0).
    pub created_revision: i64,
    pub responses: Vec<WatchResponseRecord>,
    /// Why the stream ended (`None` while it was still open at the end of the run).
    pub ended: Option<String>,
}

/// The end-of-run state of one member, for the convergence checks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberFinal {
    pub member: usize,
    /// HashKVResponse.hash at `revision`, with its compact revision.
    pub hash: u32,
    pub revision: i64,
    pub compact_revision: i64,
}

/// A whole run's record.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    pub operations: Vec<Operation>,
    pub watches: Vec<WatchRecord>,
    pub finals: Vec<MemberFinal>,
    /// Header revisions of linearizable answers, for the per-member monotonicity check:
    /// (member, epoch, at_ns, revision). `epoch` counts the member's process starts, because a
    /// member restarted after SIGKILL may briefly serve an older applied revision while it
    /// replays its log.
    pub member_revisions: Vec<(usize, u32, u64, i64)>,
}

/// One key/value as a list returned it (the fields a watch cache keeps).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CachedKv {
    pub key: Key,
    pub value: String,
    pub mod_revision: i64,
}

/// A fresh paginated list at `revision`, taken when the cache's watch reported progress at
/// that revision (a progress notification: every event at or below it was delivered).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheCheckpoint {
    pub revision: i64,
    pub fresh: Vec<CachedKv>,
}

/// One kube-apiserver-style watch cache (`--traffic kubernetes`): a paginated list of
/// `prefix` at `list_revision`, then every event its watches (from `list_revision + 1`,
/// re-dialled from the last seen revision + 1 after errors) delivered, in arrival order, and
/// the checkpoints to compare the rebuilt state with. A compaction cancel ends the record
/// (the cache relists: a new record).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheRecord {
    pub cache: u32,
    pub prefix: Key,
    pub list_revision: i64,
    pub listed: Vec<CachedKv>,
    pub events: Vec<WatchEvent>,
    pub checkpoints: Vec<CacheCheckpoint>,
    /// Watch streams opened after the first one (re-dials after errors and stalls).
    pub redials: u32,
}
