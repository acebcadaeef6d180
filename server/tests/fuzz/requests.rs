//! Every client request type, generated from the etcd protos (`arbitrary`, structure-aware)
//! and sent over gRPC to a live single-member `keel`: whatever the fields hold, the member
//! answers each call with a result or an etcd error, stays up and serving, and never
//! panics (its log is checked at the end).
//!
//! Left out of the mix, because they end the run's usefulness rather than test decoding:
//! AuthEnable (later calls would all fail authentication), membership changes (a second
//! voter that never starts takes the only member's quorum away), Defragment (slow, tested
//! in e2e), and alarm activation / downgrade enable (mapped to GET / VALIDATE: they would
//! gate every later write).

use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use keel_proto::etcdserverpb::auth_client::AuthClient;
use keel_proto::etcdserverpb::cluster_client::ClusterClient;
use keel_proto::etcdserverpb::kv_client::KvClient;
use keel_proto::etcdserverpb::lease_client::LeaseClient;
use keel_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use keel_proto::etcdserverpb::watch_client::WatchClient;
use keel_proto::etcdserverpb::*;
use keel_proto::v3electionpb::election_client::ElectionClient;
use keel_proto::v3electionpb::{CampaignRequest, LeaderRequest, ProclaimRequest, ResignRequest};
use keel_proto::v3lockpb::lock_client::LockClient;
use keel_proto::v3lockpb::{LockRequest, UnlockRequest};
use keel_testkit::Member;
use proptest::prelude::*;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::budget;

/// One client call, with the request the generator built.
#[derive(Debug, Arbitrary)]
enum Call {
    Range(RangeRequest),
    Put(PutRequest),
    DeleteRange(DeleteRangeRequest),
    Txn(TxnRequest),
    Compact(CompactionRequest),
    LeaseGrant(LeaseGrantRequest),
    LeaseRevoke(LeaseRevokeRequest),
    LeaseTimeToLive(LeaseTimeToLiveRequest),
    LeaseLeases(LeaseLeasesRequest),
    LeaseKeepAlive(LeaseKeepAliveRequest),
    Watch(WatchRequest),
    MemberList(MemberListRequest),
    Alarm(AlarmRequest),
    Status(StatusRequest),
    Hash(HashRequest),
    HashKv(HashKvRequest),
    MoveLeader(MoveLeaderRequest),
    Downgrade(DowngradeRequest),
    AuthDisable(AuthDisableRequest),
    AuthStatus(AuthStatusRequest),
    Authenticate(AuthenticateRequest),
    UserAdd(AuthUserAddRequest),
    UserGet(AuthUserGetRequest),
    UserList(AuthUserListRequest),
    UserDelete(AuthUserDeleteRequest),
    UserChangePassword(AuthUserChangePasswordRequest),
    UserGrantRole(AuthUserGrantRoleRequest),
    UserRevokeRole(AuthUserRevokeRoleRequest),
    RoleAdd(AuthRoleAddRequest),
    RoleGet(AuthRoleGetRequest),
    RoleList(AuthRoleListRequest),
    RoleDelete(AuthRoleDeleteRequest),
    RoleGrantPermission(AuthRoleGrantPermissionRequest),
    RoleRevokePermission(AuthRoleRevokePermissionRequest),
    Lock(LockRequest),
    Unlock(UnlockRequest),
    Campaign(CampaignRequest),
    Proclaim(ProclaimRequest),
    Leader(LeaderRequest),
    Resign(ResignRequest),
}

/// Every client of the member, on one channel.
struct Clients {
    kv: KvClient<Channel>,
    lease: LeaseClient<Channel>,
    watch: WatchClient<Channel>,
    cluster: ClusterClient<Channel>,
    maintenance: MaintenanceClient<Channel>,
    auth: AuthClient<Channel>,
    lock: LockClient<Channel>,
    election: ElectionClient<Channel>,
}

impl Clients {
    fn new(channel: Channel) -> Clients {
        Clients {
            kv: KvClient::new(channel.clone()),
            lease: LeaseClient::new(channel.clone()),
            watch: WatchClient::new(channel.clone()),
            cluster: ClusterClient::new(channel.clone()),
            maintenance: MaintenanceClient::new(channel.clone()),
            auth: AuthClient::new(channel.clone()),
            lock: LockClient::new(channel.clone()),
            election: ElectionClient::new(channel),
        }
    }

    /// Sends `call`; `Ok(())` for any answer, the status for an error.
    async fn send(&mut self, call: Call) -> Result<(), Status> {
        fn done<T>(r: Result<tonic::Response<T>, Status>) -> Result<(), Status> {
            r.map(|_| ())
        }
        match call {
            Call::Range(r) => done(self.kv.range(r).await),
            Call::Put(r) => done(self.kv.put(r).await),
            Call::DeleteRange(r) => done(self.kv.delete_range(r).await),
            Call::Txn(r) => done(self.kv.txn(r).await),
            Call::Compact(r) => done(self.kv.compact(r).await),
            Call::LeaseGrant(r) => done(self.lease.lease_grant(r).await),
            Call::LeaseRevoke(r) => done(self.lease.lease_revoke(r).await),
            Call::LeaseTimeToLive(r) => done(self.lease.lease_time_to_live(r).await),
            Call::LeaseLeases(r) => done(self.lease.lease_leases(r).await),
            Call::LeaseKeepAlive(r) => {
                let mut answers = self
                    .lease
                    .lease_keep_alive(tokio_stream::once(r))
                    .await?
                    .into_inner();
                answers.message().await.map(|_| ())
            }
            Call::Watch(r) => {
                let mut events = self.watch.watch(tokio_stream::once(r)).await?.into_inner();
                // The created (or cancelled) answer; a watch that stays open is dropped.
                match tokio::time::timeout(Duration::from_millis(200), events.message()).await {
                    Ok(answer) => answer.map(|_| ()),
                    Err(_) => Ok(()),
                }
            }
            Call::MemberList(r) => done(self.cluster.member_list(r).await),
            Call::Alarm(mut r) => {
                if r.action == alarm_request::AlarmAction::Activate as i32 {
                    r.action = alarm_request::AlarmAction::Get as i32;
                }
                done(self.maintenance.alarm(r).await)
            }
            Call::Status(r) => done(self.maintenance.status(r).await),
            Call::Hash(r) => done(self.maintenance.hash(r).await),
            Call::HashKv(r) => done(self.maintenance.hash_kv(r).await),
            Call::MoveLeader(r) => done(self.maintenance.move_leader(r).await),
            Call::Downgrade(mut r) => {
                if r.action == downgrade_request::DowngradeAction::Enable as i32 {
                    r.action = downgrade_request::DowngradeAction::Validate as i32;
                }
                done(self.maintenance.downgrade(r).await)
            }
            Call::AuthDisable(r) => done(self.auth.auth_disable(r).await),
            Call::AuthStatus(r) => done(self.auth.auth_status(r).await),
            Call::Authenticate(r) => done(self.auth.authenticate(r).await),
            Call::UserAdd(r) => done(self.auth.user_add(r).await),
            Call::UserGet(r) => done(self.auth.user_get(r).await),
            Call::UserList(r) => done(self.auth.user_list(r).await),
            Call::UserDelete(r) => done(self.auth.user_delete(r).await),
            Call::UserChangePassword(r) => done(self.auth.user_change_password(r).await),
            Call::UserGrantRole(r) => done(self.auth.user_grant_role(r).await),
            Call::UserRevokeRole(r) => done(self.auth.user_revoke_role(r).await),
            Call::RoleAdd(r) => done(self.auth.role_add(r).await),
            Call::RoleGet(r) => done(self.auth.role_get(r).await),
            Call::RoleList(r) => done(self.auth.role_list(r).await),
            Call::RoleDelete(r) => done(self.auth.role_delete(r).await),
            Call::RoleGrantPermission(r) => done(self.auth.role_grant_permission(r).await),
            Call::RoleRevokePermission(r) => done(self.auth.role_revoke_permission(r).await),
            Call::Lock(r) => done(self.lock.lock(r).await),
            Call::Unlock(r) => done(self.lock.unlock(r).await),
            Call::Campaign(r) => done(self.election.campaign(r).await),
            Call::Proclaim(r) => done(self.election.proclaim(r).await),
            Call::Leader(r) => done(self.election.leader(r).await),
            Call::Resign(r) => done(self.election.resign(r).await),
        }
    }
}

/// How long one call may take: a Lock or Campaign on a held name waits for its holder.
const CALL_TIMEOUT: Duration = Duration::from_secs(1);

/// Whether `status` says the connection broke (a handler that panicked or a member that
/// died), as opposed to an answer from the member.
fn is_broken_connection(status: &Status) -> bool {
    let m = status.message();
    matches!(
        status.code(),
        Code::Unknown | Code::Internal | Code::Unavailable
    ) && (m.contains("h2 protocol error")
        || m.contains("transport error")
        || m.contains("connection")
        || m.contains("stream no longer needed"))
}

#[test]
fn generated_client_requests_get_answers_and_the_member_survives() {
    let _guard = keel_testkit::schedule::shared();
    let mut member = Member::start_with(
        &keel_testkit::keel_binary!(),
        &["--bcrypt-cost", "4", "--max-txn-ops", "16"],
    );
    let rt = keel_testkit::grpc::runtime();
    let endpoint = member.endpoint();
    let channel = rt
        .block_on(keel_testkit::grpc::channel(
            &endpoint,
            Duration::from_secs(5),
        ))
        .expect("channel");
    let clients = std::sync::Mutex::new(Clients::new(channel));
    let codes = std::sync::Mutex::new(std::collections::BTreeMap::<String, u64>::new());
    let strategy = prop::collection::vec(any::<u8>(), 16..2048);
    budget::fuzz("client requests", strategy, |bytes| {
        let mut u = Unstructured::new(&bytes);
        let mut clients = clients.lock().unwrap_or_else(|e| e.into_inner());
        for _ in 0..8 {
            let Ok(call) = Call::arbitrary(&mut u) else {
                break;
            };
            let what = format!("{call:?}");
            let answer =
                rt.block_on(async { tokio::time::timeout(CALL_TIMEOUT, clients.send(call)).await });
            let code = match answer {
                Err(_) => "timeout".to_string(),
                Ok(Ok(())) => "ok".to_string(),
                Ok(Err(status)) => {
                    prop_assert!(
                        !is_broken_connection(&status),
                        "the connection broke on {what}: {status:?}"
                    );
                    prop_assert!(
                        !status.message().is_empty(),
                        "an error without a message on {what}"
                    );
                    format!("{:?}", status.code())
                }
            };
            *codes.lock().expect("codes").entry(code).or_default() += 1;
        }
        // Still serving after the calls.
        let status = rt.block_on(async {
            let status = clients.maintenance.status(StatusRequest {});
            tokio::time::timeout(Duration::from_secs(5), status).await
        });
        prop_assert!(
            matches!(status, Ok(Ok(_))),
            "Status failed after the calls: {status:?}"
        );
        Ok(())
    });
    eprintln!(
        "fuzz client requests, answers by code: {:?}",
        codes.lock().expect("codes")
    );
    member.assert_alive();
    let log = member.log();
    assert!(!log.contains("panicked"), "the member panicked:\n{log}");
}
