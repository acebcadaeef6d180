//! openraft glue: the type configuration, log storage on the WAL (with the newest entries in
//! memory, [`log_tail`]), the state machine that
//! drives the applied state ([`AppliedState`], implemented above by `apply`), snapshot files,
//! and the peer transport: pooled connections ([`peers`]), the dial override
//! ([`dial_override`]) and openraft's network over tonic ([`network`]).

pub mod append_stream;
pub mod dial_override;
pub mod export;
pub mod force_new_cluster;
pub mod leader_calls;
pub mod log_store;
pub mod log_tail;
pub mod network;
pub mod peers;
pub mod proposer;
pub mod rebuild;
pub mod retention;
pub mod snapshot;
pub mod state_machine;
pub mod stream_table;
pub mod trace;
pub mod types;
pub mod wait;

#[cfg(test)]
mod append_stream_test;
#[cfg(test)]
mod force_new_cluster_test;
#[cfg(test)]
mod leader_calls_test;
#[cfg(test)]
mod long_apply_test;
#[cfg(test)]
mod recovery_test;
#[cfg(test)]
mod snapshot_race_test;
#[cfg(test)]
mod storage_suite_test;
#[cfg(test)]
mod test_support;

pub use log_store::LogStore;
pub use network::PeerNetwork;
pub use peers::Peers;
pub use state_machine::{AppliedState, StateMachine};
pub use wait::wait_applied;
