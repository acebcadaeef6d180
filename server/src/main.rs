//! `keel`: one Keel member. Flags follow etcd's (`keel --help`); with no flags it starts a
//! single-member cluster on http://localhost:2379 with data in `default.keel`.

use std::process::ExitCode;

use keel_server::config::{Config, bind_addr, is_https, listener_tls, split_urls};
use keel_server::tls::server::with_http1;
use keel_server::{api, node::Node};
use tokio::sync::watch;

/// How long a stopping member waits for its peer connections to close once its peer server
/// stopped (peers' in-flight answers need milliseconds; a paused peer would need forever).
const PEER_CLOSE_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// mimalloc instead of glibc malloc: the request path allocates many small, short-lived
/// buffers (protobuf messages, HTTP/2 frames, index blocks) across threads, where glibc's
/// arenas spent ~12% of a member's CPU under a 64-client put load (docs/benchmarks.md).
/// Built with `no_thp` (workspace `Cargo.toml`): mimalloc otherwise asks for transparent huge
/// pages on its arenas, and every arena range it purged and touched again faulted in a whole
/// 2 MiB page, zeroed (up to half of the persist thread's CPU under 256-client puts).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // Failpoint builds take their configuration from `FAILPOINTS` (docs/failpoints.md).
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    let config = match Config::load() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("keel: {e}");
            return ExitCode::from(e.exit_code());
        }
    };
    if let Err(e) = keel_server::logging::init(&config.log_level, &config.operator) {
        eprintln!("keel: {e}");
        return ExitCode::from(2);
    }
    for warning in config.operator.warnings() {
        tracing::warn!("{warning}");
    }
    if config.operator.extensive_metrics() {
        keel_server::metrics::grpc::enable_handling_histogram();
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    // Without the LIFO slot a task woken by another runs after what is already queued, not
    // next. A response wakes its HTTP/2 connection task; through the slot that task ran at
    // once and wrote each response alone, now it writes the responses of every request that
    // finished together (an apply group's puts) in one go: 0.68 writes per put instead of
    // 1.5, 10-20 % less CPU per put and per linearizable read (docs/benchmarks.md, "Without
    // the LIFO slot"). `KEEL_LIFO_SLOT=1` keeps tokio's default, for comparisons.
    #[cfg(tokio_unstable)]
    if std::env::var_os("KEEL_LIFO_SLOT").is_none() {
        builder.disable_lifo_slot();
    }
    // Members of a local cluster share this machine's cores instead of each running one
    // worker per core (docs/operations.md, "Worker threads"); `TOKIO_WORKER_THREADS` wins.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    match std::env::var_os("TOKIO_WORKER_THREADS") {
        // Checked here: tokio panics on a value it cannot use.
        Some(v) => match v.to_str().and_then(|s| s.trim().parse::<usize>().ok()) {
            Some(n) if n > 0 => {
                builder.worker_threads(n);
            }
            _ => {
                eprintln!("keel: TOKIO_WORKER_THREADS must be a positive integer, got {v:?}");
                return ExitCode::from(2);
            }
        },
        None => {
            if let Some(n) = config.runtime_worker_threads(cores) {
                builder.worker_threads(n);
                tracing::info!(
                    worker_threads = n,
                    cores,
                    "members of the initial cluster share this machine: fewer runtime worker threads"
                );
            }
        }
    }
    let runtime = match builder.build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("keel: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("keel: {}", error_text(&e));
            // etcd exits 0 once removed, so a supervisor with `Restart=on-failure` does not
            // start a removed member again (only to stop it again).
            if e.downcast_ref::<Removed>().is_some() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// The end of a member that was removed from the cluster (`cluster::removal`).
#[derive(Debug)]
struct Removed;

impl std::fmt::Display for Removed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the member has been permanently removed from the cluster")
    }
}

impl std::error::Error for Removed {}

/// `e` and its causes, joined by ": " as `{:#}` joins them, leaving out a cause whose text
/// ends the text before it (an error that prints its source in its own message, as
/// `thiserror`'s `"…: {0}"` with `#[from]` does, would otherwise show it twice).
fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    let mut previous = String::new();
    for cause in e.chain() {
        let this = cause.to_string();
        if !previous.is_empty() && previous.ends_with(&this) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&this);
        previous = this;
    }
    text
}

/// The outcome of a server task that ended before the member was told to stop.
fn server_ended(res: Result<anyhow::Result<()>, tokio::task::JoinError>) -> anyhow::Result<()> {
    res.map_err(anyhow::Error::from).and_then(|r| r)
}

async fn run(mut config: Config) -> anyhow::Result<()> {
    let client_urls = split_urls(&config.listen_client_urls);
    let peer_urls = split_urls(&config.listen_peer_urls);
    let client_addrs = client_urls
        .iter()
        .map(|u| bind_addr(u))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    let metrics_urls = split_urls(&config.operator.listen_metrics_urls);
    let metrics_addrs = metrics_urls
        .iter()
        .map(|u| bind_addr(u))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    let peer_addrs = peer_urls
        .iter()
        .map(|u| bind_addr(u))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;

    // Listen first: a busy port must fail the start before the data dir is bootstrapped.
    let mut peer_listeners = Vec::new();
    for addr in peer_addrs {
        peer_listeners.push(api::bind(addr).await?);
    }
    let mut client_listeners = Vec::new();
    for addr in client_addrs {
        client_listeners.push((addr, api::bind(addr).await?));
    }
    let mut metrics_listeners = Vec::new();
    for addr in metrics_addrs {
        metrics_listeners.push((addr, api::bind(addr).await?));
    }

    // TLS (docs/security.md): auto TLS writes its pairs into the data dir, so only now.
    config.prepare_auto_tls()?;
    // The client and metrics URLs also serve HTTP/1.1 (etcd's HTTP endpoints).
    let client_tls = match client_urls.iter().chain(&metrics_urls).any(|u| is_https(u)) {
        true => {
            let tls: std::sync::Arc<rustls::ServerConfig> = listener_tls(&config.client_tls()?)?;
            Some(with_http1(&tls))
        }
        false => None,
    };
    let peer_tls = match peer_urls.iter().any(|u| is_https(u)) {
        true => Some(listener_tls(&config.peer_tls()?)?),
        false => None,
    };

    // Failpoint builds: `<data-dir>/failpoints` changes failpoints at run time.
    #[cfg(feature = "failpoints")]
    keel_server::failpoint::watch_file(config.data_dir().join("failpoints"));
    let node = Node::start(config).await?;
    tracing::info!(
        member_id = format!("{:x}", node.id),
        cluster_id = format!("{:x}", node.cluster_id),
        data_dir = %node.data_dir().display(),
        "keel member started"
    );

    api::http::metrics::spawn_leader_watch(&node);

    // Two stop signals: clients (and /metrics) first; peers once the client requests and the
    // leader calls this member runs are answered (`cluster::drain`).
    let (stop_tx, stop_rx) = watch::channel(false);
    let (peer_stop_tx, peer_stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let mut peer_servers = tokio::task::JoinSet::new();
    for (url, listener) in peer_urls.iter().zip(peer_listeners) {
        let tls = peer_tls.clone().filter(|_| is_https(url));
        peer_servers.spawn(api::serve_peer_listener(
            node.clone(),
            listener,
            tls,
            stopped(peer_stop_rx.clone()),
        ));
    }
    // Peers can reach this member now; compare data with them before serving clients.
    node.initial_corrupt_check().await?;
    let mut servers = tokio::task::JoinSet::new();
    for (url, (addr, listener)) in client_urls.iter().zip(client_listeners) {
        let tls = client_tls.clone().filter(|_| is_https(url));
        tracing::info!(%addr, tls = tls.is_some(), "serving etcd v3 API");
        servers.spawn(api::serve_client_listener(
            node.clone(),
            listener,
            tls,
            stopped(stop_rx.clone()),
        ));
    }
    for (url, (addr, listener)) in metrics_urls.iter().zip(metrics_listeners) {
        let tls = client_tls.clone().filter(|_| is_https(url));
        tracing::info!(%addr, tls = tls.is_some(), "serving /metrics and /health");
        servers.spawn(api::serve_metrics_listener(
            node.clone(),
            listener,
            tls,
            stopped(stop_rx.clone()),
        ));
    }

    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let result = tokio::select! {
        _ = sigterm.recv() => { tracing::info!("SIGTERM: shutting down"); Ok(()) }
        _ = tokio::signal::ctrl_c() => { tracing::info!("SIGINT: shutting down"); Ok(()) }
        _ = keel_server::cluster::removal::removed(&node.cluster) => {
            Err(anyhow::Error::new(Removed))
        }
        fence = keel_server::fence::fenced(&node) => {
            // As etcd's `lg.Fatal`: no graceful shutdown, whose store flush would hit the
            // failed disk (and may hang on it). Everything acknowledged is in the WAL.
            eprintln!(
                "keel: stopping after a disk failure ({}); restart the member to recover from its WAL",
                fence.reason
            );
            std::process::exit(1)
        }
        Some(res) = servers.join_next() => server_ended(res),
        Some(res) = peer_servers.join_next() => server_ended(res),
    };
    // No campaigns from now on: a stopping member must not take leadership, and once its peer
    // listener closes it hears no leader.
    node.cluster.stop_elections();
    // A leader hands over first (etcd's `Stop`), while its peers can still reach it.
    if result.is_ok() {
        keel_server::cluster::transfer::hand_over_on_stop(&node.cluster).await;
    }
    let drain_until = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    // The peer server keeps serving raft while the leader calls this member runs are answered:
    // a write forwarded to it just before a hand-over commits under the new leader, and only
    // the new leader's AppendEntries tell this member so.
    // The same holds for a put on this member in flight: it waits until this member applied
    // its entry (read-your-writes), which a follower learns only from the leader.
    node.cluster.calls.begin();
    // Client streams end (watches, keepalives, observes), so the servers' graceful
    // shutdown waits only for requests in flight.
    node.begin_stop();
    let _ = stop_tx.send(true);
    let clients = async {
        while servers.join_next().await.is_some() {}
        node.cluster.calls.wait_idle().await;
    };
    let _ = tokio::time::timeout_at(drain_until, clients).await;
    let _ = peer_stop_tx.send(true);
    // This member's raft streams end with the peer server; what is left are connections
    // closing, and a paused peer never closes its own (it held the exit until it resumed).
    let peers_until = drain_until.min(tokio::time::Instant::now() + PEER_CLOSE_GRACE);
    let peers = async { while peer_servers.join_next().await.is_some() {} };
    if tokio::time::timeout_at(peers_until, peers).await.is_err() {
        tracing::info!("stopped waiting for peer connections to close");
    }
    node.shutdown().await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_already_in_its_errors_text_is_printed_once() {
        let io = std::io::Error::from_raw_os_error(28);
        let wal = keel_server::wal::WalError::from(io);
        let e = anyhow::Error::from(wal).context("cannot open WAL in /d/member/wal");
        assert_eq!(
            error_text(&e),
            "cannot open WAL in /d/member/wal: WAL I/O error: No space left on device (os error 28)"
        );
        // Causes not repeated by their error are all kept, as `{:#}` keeps them.
        let e = anyhow::anyhow!("inner").context("middle").context("outer");
        assert_eq!(error_text(&e), "outer: middle: inner");
        assert_eq!(error_text(&e), format!("{e:#}"));
    }
}
