//! etcd services whose issues have not landed yet (Lock, Election).
//! They are registered so clients get a gRPC `UNIMPLEMENTED` status, not a transport error;
//! every method uses the generated default ("Not yet implemented").

use keel_proto::v3electionpb::election_server::Election;
use keel_proto::v3lockpb::lock_server::Lock;

/// Placeholder for the services listed in the module doc.
pub struct NotYet;

#[tonic::async_trait]
impl Lock for NotYet {}

#[tonic::async_trait]
impl Election for NotYet {}
