//! `keel-chaos`: a chaos-monkey harness for Keel clusters (real processes, TCP proxies between
//! peers, seeded faults), with a linearizability checker and a watch checker over the recorded
//! history. See docs/chaos.md.

pub mod check;
pub mod history;
pub mod run;
