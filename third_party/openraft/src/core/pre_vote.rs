//! Keel patch: the candidate's side of pre-vote (Raft thesis §9.6).
//!
//! Before an election started by the timer raises the term, the node asks every voter whether
//! it would vote for it at the next term (`RaftNetwork::pre_vote`, answered by
//! `Engine::handle_pre_vote_req` without any state change). Only when a quorum of the effective
//! membership would (the node counts itself) does it campaign. A node cut off from a quorum so
//! never raises its term, and when it rejoins it does not depose the leader with a higher one.
//!
//! Invariants:
//! - a round belongs to the vote the node held when it began, and to the node's silence: once
//!   that vote changes (a new leader, a vote granted to another candidate, this node's own
//!   election) or is refreshed (a message from the leader came after all, as etcd's
//!   pre-candidate becomes a follower again on the leader's heartbeat), the round is over and
//!   later answers are ignored;
//! - one round at a time: a new one may begin an election timeout after the last began, or at
//!   once when the vote changed;
//! - a round ends at its first quorum, so it starts at most one election;
//! - while a round runs that began after the node last heard from its leader (its vote was
//!   last modified or refreshed before the round began), the node is a pre-candidate and
//!   names no leader (`RaftCore::current_leader`), as etcd's `becomePreCandidate` clears
//!   `lead`: require-leader requests, `/health` and the `leader` of Status then see no leader,
//!   exactly as they did when such a node became a candidate.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::type_config::alias::InstantOf;
use crate::RaftTypeConfig;
use crate::Vote;

/// One pre-vote round in progress.
struct Round<C: RaftTypeConfig> {
    /// The round's number (`Command::SendPreVote::round`).
    number: u64,
    /// The node's vote when the round began.
    vote: Vote<C::NodeId>,
    /// When the round began.
    started: InstantOf<C>,
    /// The voters that would grant, the node itself included.
    granted: BTreeSet<C::NodeId>,
}

/// The pre-vote rounds of one node.
pub(crate) struct PreVote<C: RaftTypeConfig> {
    last_number: u64,
    current: Option<Round<C>>,
}

impl<C: RaftTypeConfig> Default for PreVote<C> {
    fn default() -> Self {
        Self {
            last_number: 0,
            current: None,
        }
    }
}

impl<C: RaftTypeConfig> PreVote<C> {
    /// Whether a round for `vote` began less than `timeout` before `now`: its answers may still
    /// come, so a new round would only duplicate it.
    pub(crate) fn in_progress(&self, vote: &Vote<C::NodeId>, now: InstantOf<C>, timeout: Duration) -> bool {
        self.current.as_ref().is_some_and(|r| &r.vote == vote && now < r.started + timeout)
    }

    /// Whether the node, holding `vote` last modified or refreshed at `vote_utime`, is a
    /// pre-candidate: a round for that vote began and no message from a leader came since.
    pub(crate) fn is_pre_candidate(&self, vote: &Vote<C::NodeId>, vote_utime: Option<InstantOf<C>>) -> bool {
        self.current.as_ref().is_some_and(|r| &r.vote == vote && vote_utime.is_none_or(|u| u <= r.started))
    }

    /// Begins a new round for `vote`, replacing any other, with `me` as its first grant; returns
    /// the round's number.
    pub(crate) fn begin(&mut self, vote: Vote<C::NodeId>, me: C::NodeId, now: InstantOf<C>) -> u64 {
        self.last_number += 1;
        self.current = Some(Round {
            number: self.last_number,
            vote,
            started: now,
            granted: BTreeSet::from([me]),
        });
        self.last_number
    }

    /// Records that `target` would grant round `number`, while the node's vote is `vote`, last
    /// modified or refreshed at `vote_utime`. Returns `true`, and ends the round, when the
    /// grants now form a quorum (`is_quorum`). An answer to an earlier round, or to a round
    /// whose vote has changed or been refreshed since it began, is ignored.
    pub(crate) fn grant(
        &mut self,
        number: u64,
        vote: &Vote<C::NodeId>,
        vote_utime: Option<InstantOf<C>>,
        target: C::NodeId,
        is_quorum: impl Fn(&BTreeSet<C::NodeId>) -> bool,
    ) -> bool {
        if !self.is_pre_candidate(vote, vote_utime) {
            return false;
        }
        let Some(round) = self.current.as_mut() else {
            return false;
        };
        if round.number != number {
            return false;
        }
        round.granted.insert(target);
        if !is_quorum(&round.granted) {
            return false;
        }
        self.current = None;
        true
    }
}
