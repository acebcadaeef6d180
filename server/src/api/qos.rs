//! Keel's QoS admin service (`keelpb.Qos`, proto/keel/qos.proto; docs/qos.md "The runtime
//! API"): lists the rules in force and changes them through raft, so every member applies
//! the same rules at the same log index and they survive restarts.
//!
//! Rules arrive as text in the `--qos-config` format (YAML or JSON). A malformed rule or
//! change is answered with `InvalidArgument` and a message naming the field
//! (`rule.rate: must be > 0`), before anything is proposed; the rules in force stay as they
//! were.

use std::sync::Arc;

use keel_proto::keelpb::qos_server::Qos;
use keel_proto::keelpb::{
    QosRuleAddRequest, QosRuleChangeResponse, QosRuleListRequest, QosRuleListResponse,
    QosRuleRemoveRequest, QosRuleReplaceRequest, QosRuleUpdateRequest,
};
use tonic::{Request, Response, Status};

use super::credentials;
use crate::auth::AuthInfo;
use crate::auth::check::Rpc;
use crate::error::EtcdError;
use crate::node::Node;
use crate::qos::{Rule, RuleChange, RuleError, rules};

/// QoS admin service of one member.
pub struct QosService {
    node: Arc<Node>,
}

impl QosService {
    /// Serves the QoS admin RPCs through `node`.
    pub fn new(node: Arc<Node>) -> QosService {
        QosService { node }
    }

    async fn change<T>(
        &self,
        request: &Request<T>,
        change: Result<RuleChange, RuleError>,
    ) -> Result<Response<QosRuleChangeResponse>, Status> {
        let ai = authorize(&self.node, request).await?;
        let change = change.map_err(invalid)?;
        let version = self.node.propose_qos(Some(&ai), &change).await?;
        Ok(Response::new(QosRuleChangeResponse { version }))
    }
}

/// Who may call the QoS admin RPCs: with auth on, only root may change or list rules (a
/// request without credentials gets `etcdserver: user name is empty`, another user
/// `etcdserver: permission denied`, as every etcd admin RPC). Changes are checked again at
/// apply from the entry's auth header, so every member decides the same way.
async fn authorize<T>(node: &Node, request: &Request<T>) -> Result<AuthInfo, Status> {
    credentials::authorize(node, request, Rpc::QosAdmin).await
}

fn invalid(e: RuleError) -> Status {
    EtcdError::InvalidArgument(e.to_string()).into()
}

#[tonic::async_trait]
impl Qos for QosService {
    async fn rule_list(
        &self,
        request: Request<QosRuleListRequest>,
    ) -> Result<Response<QosRuleListResponse>, Status> {
        authorize(&self.node, &request).await?;
        let set = self.node.qos.rules();
        Ok(Response::new(QosRuleListResponse {
            version: set.version(),
            rules: rules::to_file(set.rules()),
        }))
    }

    async fn rule_add(
        &self,
        request: Request<QosRuleAddRequest>,
    ) -> Result<Response<QosRuleChangeResponse>, Status> {
        let r = request.get_ref();
        let change = Rule::from_yaml(&r.rule).map(|rule| RuleChange::Add {
            rule,
            before: (!r.before.is_empty()).then(|| r.before.clone()),
        });
        self.change(&request, change).await
    }

    async fn rule_update(
        &self,
        request: Request<QosRuleUpdateRequest>,
    ) -> Result<Response<QosRuleChangeResponse>, Status> {
        let change =
            Rule::from_yaml(&request.get_ref().rule).map(|rule| RuleChange::Update { rule });
        self.change(&request, change).await
    }

    async fn rule_remove(
        &self,
        request: Request<QosRuleRemoveRequest>,
    ) -> Result<Response<QosRuleChangeResponse>, Status> {
        let name = request.get_ref().name.clone();
        self.change(&request, Ok(RuleChange::Remove { name })).await
    }

    async fn rule_replace(
        &self,
        request: Request<QosRuleReplaceRequest>,
    ) -> Result<Response<QosRuleChangeResponse>, Status> {
        let change =
            rules::parse_file(&request.get_ref().rules).map(|rules| RuleChange::Replace { rules });
        self.change(&request, change).await
    }
}
