//! The etcd `Auth` service (rpc.proto `service Auth`, etcd `v3_server.go`): every RPC goes
//! through the raft log as one auth entry, stamped with the caller's identity; apply makes
//! the admin check and the change (`apply/auth.rs`), so every member decides the same way.
//!
//! bcrypt never runs under a lock and never at apply:
//! - UserAdd (unless `no_password`) and UserChangePassword hash the password here, on the
//!   blocking pool, with `--bcrypt-cost`; the entry carries `hashedPassword` only.
//! - Authenticate (etcd `EtcdServer.Authenticate`): a linearizable read point, then the
//!   user's hash and the auth revision are copied out under the store's read lock, the lock
//!   is released, bcrypt checks the password on the blocking pool, and an
//!   `InternalAuthenticate` entry (no password) issues the token. If the auth revision moved
//!   meanwhile (a password change, a delete), the whole check runs again.

use std::sync::Arc;

use keel_proto::etcdserverpb::auth_server::Auth;
use keel_proto::etcdserverpb::{
    AuthDisableRequest, AuthDisableResponse, AuthEnableRequest, AuthEnableResponse,
    AuthRoleAddRequest, AuthRoleAddResponse, AuthRoleDeleteRequest, AuthRoleDeleteResponse,
    AuthRoleGetRequest, AuthRoleGetResponse, AuthRoleGrantPermissionRequest,
    AuthRoleGrantPermissionResponse, AuthRoleListRequest, AuthRoleListResponse,
    AuthRoleRevokePermissionRequest, AuthRoleRevokePermissionResponse, AuthStatusRequest,
    AuthStatusResponse, AuthUserAddRequest, AuthUserAddResponse, AuthUserChangePasswordRequest,
    AuthUserChangePasswordResponse, AuthUserDeleteRequest, AuthUserDeleteResponse,
    AuthUserGetRequest, AuthUserGetResponse, AuthUserGrantRoleRequest, AuthUserGrantRoleResponse,
    AuthUserListRequest, AuthUserListResponse, AuthUserRevokeRoleRequest,
    AuthUserRevokeRoleResponse, AuthenticateRequest, AuthenticateResponse,
};
use keel_proto::rpctypes::RpcError;
use tonic::{Request, Response, Status};

use super::credentials::auth_info;
use crate::auth::apply::AuthReply;
use crate::auth::{AuthError, AuthInfo, AuthRequest, InternalAuthenticate, password};
use crate::error::EtcdError;
use crate::node::Node;

/// Auth service of one member.
pub struct AuthService {
    node: Arc<Node>,
}

impl AuthService {
    /// Serves auth requests through `node`.
    pub fn new(node: Arc<Node>) -> AuthService {
        AuthService { node }
    }

    /// Proposes `req` as `ai` and answers with its applied response and etcd's header.
    async fn run<A: AuthReply>(&self, ai: &AuthInfo, req: AuthRequest) -> Result<A, Status> {
        let resp = self.node.propose_as(ai, req.into_raft()).await?;
        let mut reply = resp.response.and_then(A::from_raft).ok_or_else(|| {
            Status::from(EtcdError::Internal(
                "keel: apply returned an unexpected response type".into(),
            ))
        })?;
        reply.set_header(self.node.header(resp.revision));
        Ok(reply)
    }

    /// Resolves the caller, then proposes `wrap(request)`.
    async fn call<Q, A: AuthReply>(
        &self,
        request: Request<Q>,
        wrap: fn(Q) -> AuthRequest,
    ) -> Result<Response<A>, Status> {
        let ai = auth_info(&self.node, &request).await?;
        Ok(Response::new(
            self.run(&ai, wrap(request.into_inner())).await?,
        ))
    }

    /// bcrypt of `password` on the blocking pool, as `hashedPassword` carries it.
    async fn hash(&self, password: String) -> Result<String, Status> {
        let cost = self.node.config.effective_bcrypt_cost();
        tokio::task::spawn_blocking(move || password::hash(&password, cost))
            .await
            .map_err(|e| EtcdError::Internal(format!("keel: bcrypt task: {e}")))?
            .map_err(Status::from)
    }

    /// etcd `EtcdServer.Authenticate` (module docs).
    async fn authenticate_loop(
        &self,
        req: AuthenticateRequest,
    ) -> Result<AuthenticateResponse, Status> {
        self.node.read_barrier().await?;
        let deadline = tokio::time::Instant::now() + self.node.request_timeout();
        loop {
            let checked = self.node.auth.password_check(&req.name)?;
            let (password, hash) = (req.password.clone(), checked.hash);
            let ok = tokio::task::spawn_blocking(move || password::verify(&password, &hash))
                .await
                .map_err(|e| EtcdError::Internal(format!("keel: bcrypt task: {e}")))?;
            if !ok {
                return Err(AuthError::from(RpcError::AuthFailed).into());
            }
            let entry = AuthRequest::Authenticate(InternalAuthenticate {
                name: req.name.clone(),
                simple_token: self.node.auth.tokens().gen_prefix(),
            });
            // The entry needs no credentials (etcd: Authenticate is never refused for them).
            let resp: AuthenticateResponse = self.run(&AuthInfo::default(), entry).await?;
            if self.node.auth.revision() == checked.revision {
                return Ok(resp);
            }
            tracing::info!(user = %req.name, "auth revision moved while the password was checked; retrying");
            if tokio::time::Instant::now() >= deadline {
                return Err(EtcdError::Timeout.into());
            }
        }
    }
}

#[tonic::async_trait]
impl Auth for AuthService {
    async fn auth_enable(
        &self,
        request: Request<AuthEnableRequest>,
    ) -> Result<Response<AuthEnableResponse>, Status> {
        self.call(request, AuthRequest::Enable).await
    }

    async fn auth_disable(
        &self,
        request: Request<AuthDisableRequest>,
    ) -> Result<Response<AuthDisableResponse>, Status> {
        self.call(request, AuthRequest::Disable).await
    }

    async fn auth_status(
        &self,
        request: Request<AuthStatusRequest>,
    ) -> Result<Response<AuthStatusResponse>, Status> {
        self.call(request, AuthRequest::Status).await
    }

    async fn authenticate(
        &self,
        request: Request<AuthenticateRequest>,
    ) -> Result<Response<AuthenticateResponse>, Status> {
        Ok(Response::new(
            self.authenticate_loop(request.into_inner()).await?,
        ))
    }

    async fn user_add(
        &self,
        request: Request<AuthUserAddRequest>,
    ) -> Result<Response<AuthUserAddResponse>, Status> {
        let ai = auth_info(&self.node, &request).await?;
        let mut req = request.into_inner();
        if !req.options.is_some_and(|o| o.no_password) {
            req.hashed_password = self.hash(std::mem::take(&mut req.password)).await?;
        }
        Ok(Response::new(
            self.run(&ai, AuthRequest::UserAdd(req)).await?,
        ))
    }

    async fn user_get(
        &self,
        request: Request<AuthUserGetRequest>,
    ) -> Result<Response<AuthUserGetResponse>, Status> {
        self.call(request, AuthRequest::UserGet).await
    }

    async fn user_list(
        &self,
        request: Request<AuthUserListRequest>,
    ) -> Result<Response<AuthUserListResponse>, Status> {
        self.call(request, AuthRequest::UserList).await
    }

    async fn user_delete(
        &self,
        request: Request<AuthUserDeleteRequest>,
    ) -> Result<Response<AuthUserDeleteResponse>, Status> {
        self.call(request, AuthRequest::UserDelete).await
    }

    async fn user_change_password(
        &self,
        request: Request<AuthUserChangePasswordRequest>,
    ) -> Result<Response<AuthUserChangePasswordResponse>, Status> {
        let ai = auth_info(&self.node, &request).await?;
        let mut req = request.into_inner();
        req.hashed_password = self.hash(std::mem::take(&mut req.password)).await?;
        Ok(Response::new(
            self.run(&ai, AuthRequest::UserChangePassword(req)).await?,
        ))
    }

    async fn user_grant_role(
        &self,
        request: Request<AuthUserGrantRoleRequest>,
    ) -> Result<Response<AuthUserGrantRoleResponse>, Status> {
        self.call(request, AuthRequest::UserGrantRole).await
    }

    async fn user_revoke_role(
        &self,
        request: Request<AuthUserRevokeRoleRequest>,
    ) -> Result<Response<AuthUserRevokeRoleResponse>, Status> {
        self.call(request, AuthRequest::UserRevokeRole).await
    }

    async fn role_add(
        &self,
        request: Request<AuthRoleAddRequest>,
    ) -> Result<Response<AuthRoleAddResponse>, Status> {
        self.call(request, AuthRequest::RoleAdd).await
    }

    async fn role_get(
        &self,
        request: Request<AuthRoleGetRequest>,
    ) -> Result<Response<AuthRoleGetResponse>, Status> {
        self.call(request, AuthRequest::RoleGet).await
    }

    async fn role_list(
        &self,
        request: Request<AuthRoleListRequest>,
    ) -> Result<Response<AuthRoleListResponse>, Status> {
        self.call(request, AuthRequest::RoleList).await
    }

    async fn role_delete(
        &self,
        request: Request<AuthRoleDeleteRequest>,
    ) -> Result<Response<AuthRoleDeleteResponse>, Status> {
        self.call(request, AuthRequest::RoleDelete).await
    }

    async fn role_grant_permission(
        &self,
        request: Request<AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<AuthRoleGrantPermissionResponse>, Status> {
        self.call(request, AuthRequest::RoleGrantPermission).await
    }

    async fn role_revoke_permission(
        &self,
        request: Request<AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<AuthRoleRevokePermissionResponse>, Status> {
        self.call(request, AuthRequest::RoleRevokePermission).await
    }
}
