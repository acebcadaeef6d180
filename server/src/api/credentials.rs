//! Who a client request runs as: the one place the API turns a request's verified identity
//! into an [`AuthInfo`] (etcd `AuthInfoFromCtx`).
//!
//! Order, as etcd: the token in gRPC metadata [`TOKEN_METADATA`] first; without one, the
//! verified TLS client certificate's common name (etcd `AuthInfoFromTLS`,
//! [`crate::tls::identity::client_common_name`]); otherwise no credentials
//! (`AuthInfo::default()`, which the checks answer with `etcdserver: user name is empty`).
//! With auth disabled every request runs without credentials and nothing is checked.
//!
//! Every service resolves the identity with [`auth_info`] (or [`RequestIdentity`] for
//! streams, per message) and stamps it into its proposals ([`Node::propose_as`]); the
//! resolved `AuthInfo::username` is what other API layers (QoS) key on.

use keel_proto::rpctypes::RpcError;
use tonic::Request;
use tonic::metadata::MetadataMap;

use crate::auth::check::{self, Rpc};
use crate::auth::{AuthError, AuthInfo};
use crate::error::EtcdError;
use crate::node::Node;

/// gRPC metadata key of the auth token (etcd `rpctypes.TokenFieldNameGRPC`).
pub const TOKEN_METADATA: &str = "token";

/// How long a member waits to apply the entry that issued a simple token it has not applied
/// yet, when that entry is not even in its log (a lagging follower, or a forged index).
const UNSEEN_TOKEN_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The identity a request presents, before it is verified against the auth store: kept by
/// streams (Watch, LeaseKeepAlive), which resolve it again for every message, as etcd does
/// with the stream's context.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestIdentity {
    /// The `token` metadata value, if any.
    pub token: Option<String>,
    /// The verified TLS client certificate's common name (`None` on plaintext listeners and
    /// without `--client-cert-auth`).
    pub common_name: Option<String>,
}

impl RequestIdentity {
    /// The identity `request` presents.
    ///
    /// Errors: a `token` value that is not ASCII (`etcdserver: invalid auth token`).
    pub fn of<T>(request: &Request<T>) -> Result<RequestIdentity, EtcdError> {
        Ok(RequestIdentity {
            token: token_of(request.metadata())?,
            common_name: crate::tls::identity::client_common_name(request),
        })
    }

    /// Who this identity is now: the token's user (at the store's revision for a simple
    /// token, the signed one for a JWT), else the common name's user at the current
    /// revision, else no credentials.
    ///
    /// Errors: a token that does not resolve (unknown, expired, forged, or dropped by a
    /// password change or user delete): `etcdserver: invalid auth token`.
    pub async fn resolve(&self, node: &Node) -> Result<AuthInfo, EtcdError> {
        if !node.auth.is_enabled() {
            return Ok(AuthInfo::default());
        }
        if let Some(token) = &self.token {
            return token_info(node, token).await;
        }
        if let Some(cn) = &self.common_name {
            return Ok(AuthInfo::new(cn.clone(), node.auth.revision()));
        }
        Ok(AuthInfo::default())
    }
}

/// Who `request` runs as (module docs). The API's entry point for every unary RPC.
///
/// Errors: as [`RequestIdentity::resolve`].
pub async fn auth_info<T>(node: &Node, request: &Request<T>) -> Result<AuthInfo, EtcdError> {
    RequestIdentity::of(request)?.resolve(node).await
}

/// Resolves `request`'s identity and checks it may call `rpc` (`check::rpc`: credentials
/// or role `root`), for the RPCs whose permission does not depend on keys.
///
/// Errors: as [`auth_info`], then the check's error.
pub async fn authorize<T>(
    node: &Node,
    request: &Request<T>,
    rpc: Rpc,
) -> Result<AuthInfo, tonic::Status> {
    let ai = auth_info(node, request).await?;
    check::rpc(&node.auth.read(), &ai, rpc)?;
    Ok(ai)
}

/// Fails with `etcdserver: revision of auth store is old` when the auth revision moved
/// after a read was checked as `ai` (etcd `doSerialize`).
///
/// Errors: [`RpcError::AuthOldRevision`].
pub fn still_current(node: &Node, ai: &AuthInfo) -> Result<(), AuthError> {
    if ai.revision != 0 && ai.revision != node.auth.revision() {
        return Err(RpcError::AuthOldRevision.into());
    }
    Ok(())
}

fn token_of(metadata: &MetadataMap) -> Result<Option<String>, EtcdError> {
    match metadata.get(TOKEN_METADATA) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .map(|t| Some(t.to_string()))
            .map_err(|_| EtcdError::InvalidAuthToken),
    }
}

/// A token's user, once this member applied the entry that issued it (etcd's
/// `indexWaiter`).
async fn token_info(node: &Node, token: &str) -> Result<AuthInfo, EtcdError> {
    if let Some(index) = node.auth.tokens().required_index(token) {
        let in_log = node.raft.metrics().borrow().last_log_index.unwrap_or(0) >= index;
        let wait = if in_log {
            node.request_timeout()
        } else {
            UNSEEN_TOKEN_WAIT
        };
        // A token whose entry never applies here is judged (and refused) after the wait.
        let _ = crate::raft::wait_applied(&node.raft, index, wait, "auth token issued").await;
    }
    node.auth.lookup(token).ok_or(EtcdError::InvalidAuthToken)
}
