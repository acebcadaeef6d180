//! Keel patch: log appends are submitted to the log store without waiting for their flush.
//!
//! openraft 0.9.25 awaited every append's flush inside `RaftCore`, so the core did nothing
//! else meanwhile: a leader sent no AppendEntries before its own fsync ended, and a follower
//! took no next AppendEntries before the previous one's fsync ended. Now every append gets a
//! sequence number and reports its flush to the core as `Notify::LocalLogFlushed` (in
//! submission order: the log store's flushes are prefix-durable and reported in order).
//!
//! Invariants (Raft thesis §10.2.1; Raft paper Figure 2, "updated on stable storage before
//! responding to RPCs"):
//! - a leader counts its own entries toward the commit quorum only once they are flushed;
//! - no response leaves the core while an append submitted before it is not flushed (an
//!   AppendEntries or Initialize response says the entries are stored; a vote response was
//!   preceded by a flushed vote, which by prefix durability flushed every earlier append too).

use std::collections::VecDeque;

use crate::engine::Respond;
use crate::RaftTypeConfig;

/// Appends submitted and flushed, and the responses held until the appends before them are
/// flushed.
pub(crate) struct LogIo<C>
where C: RaftTypeConfig
{
    /// Sequence number of the last submitted append (0: none yet).
    submitted: u64,
    /// Every append with a sequence number up to this one is flushed.
    flushed: u64,
    /// Responses in command order, each with the append it must wait for.
    held: VecDeque<(u64, Respond<C>)>,
}

impl<C> Default for LogIo<C>
where C: RaftTypeConfig
{
    fn default() -> Self {
        Self {
            submitted: 0,
            flushed: 0,
            held: VecDeque::new(),
        }
    }
}

impl<C> LogIo<C>
where C: RaftTypeConfig
{
    /// Registers a new append and returns its sequence number.
    pub(crate) fn submit(&mut self) -> u64 {
        self.submitted += 1;
        self.submitted
    }

    /// Records that every append up to `seq` is flushed and sends the responses that waited
    /// for them, in order.
    pub(crate) fn flushed(&mut self, seq: u64) {
        assert!(
            seq <= self.submitted,
            "flush of append {} reported, only {} submitted",
            seq,
            self.submitted
        );
        self.flushed = std::cmp::max(self.flushed, seq);
        while self.held.front().is_some_and(|(need, _)| *need <= self.flushed) {
            let (_, resp) = self.held.pop_front().unwrap();
            resp.send();
        }
    }

    /// Sends `resp` now if every append submitted so far is flushed (and nothing is held
    /// before it), else holds it until they are.
    pub(crate) fn respond(&mut self, resp: Respond<C>) {
        if self.flushed >= self.submitted && self.held.is_empty() {
            resp.send();
        } else {
            self.held.push_back((self.submitted, resp));
        }
    }
}
