//! gRPC plumbing to one member: connecting with bounded waits, and the Maintenance/Cluster
//! calls the harness uses to find leaders and member IDs (etcd's api/etcdserverpb/rpc.proto).

use std::sync::OnceLock;
use std::time::Duration;

use keel_proto::etcdserverpb::cluster_client::ClusterClient;
use keel_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use keel_proto::etcdserverpb::{MemberListRequest, StatusRequest, StatusResponse};
use keel_testkit::tls::ClientTls;
use tonic::transport::{Channel, Endpoint};

/// How long a harness-internal RPC (status, member list, ...) may take.
pub const ADMIN_TIMEOUT: Duration = Duration::from_secs(3);

/// The TLS client of every harness connection, when the members serve TLS.
static TLS: OnceLock<ClientTls> = OnceLock::new();

/// From now on every [`connect`] speaks TLS as `client` (set once, at start-up).
pub fn set_tls(client: ClientTls) {
    let _ = TLS.set(client);
}

/// Opens one HTTP/2 connection to `url` (`http://host:port`; `https` and the [`set_tls`]
/// client when set), waiting at most `timeout` for the TCP connect. An error here proves
/// nothing was sent.
pub async fn connect(url: &str, timeout: Duration) -> Result<Channel, tonic::transport::Error> {
    let endpoint = match TLS.get() {
        Some(client) => {
            let rest = url.strip_prefix("http://").unwrap_or(url);
            Endpoint::from_shared(format!("https://{rest}"))?.tls_config(client.tonic_config())?
        }
        None => Endpoint::from_shared(url.to_string())?,
    };
    endpoint
        .connect_timeout(timeout)
        .tcp_nodelay(true)
        .connect()
        .await
}

/// `Maintenance.Status` of the member at `url`, bounded by [`ADMIN_TIMEOUT`].
pub async fn status(url: &str) -> anyhow::Result<StatusResponse> {
    bounded(async {
        let ch = connect(url, ADMIN_TIMEOUT).await?;
        Ok(MaintenanceClient::new(ch)
            .status(StatusRequest {})
            .await?
            .into_inner())
    })
    .await
}

/// `Cluster.MemberList` (linearizable) at `url`: `(member ID, peer URLs)` pairs.
pub async fn member_list(url: &str) -> anyhow::Result<Vec<(u64, Vec<String>)>> {
    bounded(async {
        let ch = connect(url, ADMIN_TIMEOUT).await?;
        let resp = ClusterClient::new(ch)
            .member_list(MemberListRequest { linearizable: true })
            .await?
            .into_inner();
        Ok(resp
            .members
            .into_iter()
            .map(|m| (m.id, m.peer_ur_ls))
            .collect())
    })
    .await
}

/// Runs `f` within [`ADMIN_TIMEOUT`].
pub async fn bounded<T>(f: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::time::timeout(ADMIN_TIMEOUT, f)
        .await
        .map_err(|_| anyhow::anyhow!("no answer within {ADMIN_TIMEOUT:?}"))?
}
