//! Peer protocol messages (bincode openraft RPCs in `keelpb.RaftPayload`, decoded by
//! `api::peer` and `raft::network`): damaged or random payloads decode to an error, never a
//! panic or a huge allocation, whichever message type the receiver expects.

use keel_server::raft::types::{MemberNode, NodeId, TypeConfig};
use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{CommittedLeaderId, LogId, SnapshotMeta, Vote};
use proptest::prelude::*;

use crate::{alloc, budget, mutate};

fn seeds() -> Vec<Vec<u8>> {
    let log_id = LogId::new(CommittedLeaderId::new(4, 1), 77);
    let append = AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(4, 1),
        prev_log_id: Some(log_id),
        entries: vec![openraft::Entry {
            log_id: LogId::new(CommittedLeaderId::new(4, 1), 78),
            payload: openraft::EntryPayload::Blank,
        }],
        leader_commit: Some(log_id),
    };
    let snapshot = InstallSnapshotRequest::<TypeConfig> {
        vote: Vote::new_committed(4, 1),
        meta: SnapshotMeta::<NodeId, MemberNode> {
            last_log_id: Some(log_id),
            last_membership: Default::default(),
            snapshot_id: "4-77-1".into(),
        },
        offset: 0,
        data: vec![1; 300],
        done: false,
    };
    let vote_response: Result<VoteResponse<NodeId>, RaftError<NodeId>> = Ok(VoteResponse {
        vote: Vote::new(5, 2),
        vote_granted: true,
        last_log_id: Some(log_id),
    });
    let append_response: Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>> =
        Ok(AppendEntriesResponse::Success);
    vec![
        bincode::serialize(&append).expect("encode"),
        bincode::serialize(&VoteRequest::new(Vote::new(5, 2), Some(log_id))).expect("encode"),
        bincode::serialize(&snapshot).expect("encode"),
        bincode::serialize(&vote_response).expect("encode"),
        bincode::serialize(&append_response).expect("encode"),
    ]
}

#[test]
fn damaged_peer_messages_decode_to_errors() {
    let seeds = seeds();
    let strategy = (0..seeds.len()).prop_flat_map(move |i| mutate::mutated(seeds[i].clone()));
    budget::fuzz("peer messages", strategy, |bytes| {
        let b = bytes.as_slice();
        alloc::bounded("peer decode", || {
            let _ = bincode::deserialize::<AppendEntriesRequest<TypeConfig>>(b);
            let _ = bincode::deserialize::<VoteRequest<NodeId>>(b);
            let _ = bincode::deserialize::<InstallSnapshotRequest<TypeConfig>>(b);
            let _ =
                bincode::deserialize::<Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>>(b);
            let _ = bincode::deserialize::<Result<VoteResponse<NodeId>, RaftError<NodeId>>>(b);
            let _ = bincode::deserialize::<
                Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>,
            >(b);
        })?;
        Ok(())
    });
}
