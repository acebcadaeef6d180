//! `keel-bench`: etcd-`benchmark`-style load generator (see `keel_benches::keel_bench`).
//!
//! ```sh
//! keel-bench --endpoints 127.0.0.1:2379,127.0.0.1:22379 --clients 64 --conns 8 \
//!     --total 100000 --key-size 16 --key-space-size 100000 --val-size 256 put
//! keel-bench --duration 10s --clients 64 range foo --consistency s --json
//! keel-bench --clients 64 --total 30000 put --hdr-out put.hgrm   # + percentile distribution
//! ```

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use hdrhistogram::Histogram;
use keel_benches::keel_bench::cli::{Cli, ConsistencyArg, Workload};
use keel_benches::keel_bench::keys::KeyGen;
use keel_benches::keel_bench::report::{
    Latency, Summary, over_slow_share, write_percentile_distribution,
};
use keel_benches::keel_bench::runner::{self, Plan, Stop};
use keel_benches::keel_bench::watch;
use keel_benches::keel_bench::workloads::{
    AuthWorker, KvRequest, KvWorker, LeaseWorker, RangeShape, read_share,
};
use keel_client::{Client, ClientError, ClientOptions, RetryPolicy};

/// Lease TTL of `lease-keepalive`, seconds (long enough never to expire during a run).
const LEASE_TTL_S: i64 = 300;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let hdr_out = cli.global.hdr_out.clone();
    match run(cli).await {
        Ok((summary, latency_us)) => {
            if let Some(path) = hdr_out
                && let Err(e) = write_percentile_distribution(&path, &latency_us)
            {
                eprintln!("keel-bench: cannot write {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
            if summary.ok == 0 {
                eprintln!("keel-bench: no request succeeded");
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("keel-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--user name:password` split at the first `:`.
fn user_and_password(user: &str) -> (&str, &str) {
    user.split_once(':').unwrap_or((user, ""))
}

/// Runs the workload and prints the report; returns it with the request latency histogram (µs).
async fn run(cli: Cli) -> Result<(Summary, Histogram<u64>), ClientError> {
    let g = &cli.global;
    let clients = g.clients.max(1);
    let mut options = ClientOptions {
        conns: g.conns.max(1),
        request_timeout: g.request_timeout,
        // A benchmark counts every error; retries would hide them.
        retry: RetryPolicy::none(),
        tls: g.tls(),
        ..Default::default()
    };
    if let Some(user) = &g.user {
        // etcd's benchmark authenticates once and sends the token with every request.
        let (name, password) = user_and_password(user);
        let plain = Client::connect(&g.endpoints, options.clone()).await?;
        let token = plain
            .auth()
            .authenticate(keel_client::etcdserverpb::AuthenticateRequest {
                name: name.into(),
                password: password.into(),
            })
            .await
            .map_err(|s| ClientError::from_status(&s, &g.endpoints[0]))?
            .into_inner()
            .token;
        options.token = Some(token);
    }
    let client = Client::connect(&g.endpoints, options).await?;
    let plan = Plan {
        stop: g.duration.map_or(Stop::Total(g.total), Stop::Duration),
        rate: (g.rate > 0.0).then_some(g.rate),
        progress: !g.json && std::io::stderr().is_terminal(),
    };
    // Workers start at spread-out positions so sequential keys do not collide.
    let keys = |i: usize| {
        KeyGen::new(
            g.key_size,
            g.key_space_size,
            g.sequential_keys,
            i as u64 * g.key_space_size / clients as u64,
        )
        .with_prefix(g.key_prefix.as_bytes())
    };
    let kv = |request: KvRequest| -> Vec<KvWorker> {
        (0..clients)
            .map(|i| {
                KvWorker::new(
                    client.clone(),
                    request.clone(),
                    keys(i),
                    g.val_size,
                    i as u64,
                )
            })
            .collect()
    };
    let serializable = |c: ConsistencyArg| c == ConsistencyArg::S;
    let (outcome, events) = match &cli.workload {
        Workload::Put => (runner::run(&plan, kv(KvRequest::Put)).await, None),
        Workload::Range {
            key,
            end,
            consistency,
            stream,
            from_key,
            limit,
            keys_only,
            count_only,
        } => {
            // etcdctl `--from-key`: `range_end` "\0", and an absent or empty KEY is "\0".
            let (key, end) = if *from_key {
                let k = key.as_deref().filter(|k| !k.is_empty()).unwrap_or("\0");
                (Some(k.as_bytes().to_vec()), vec![0])
            } else {
                let k = key.as_ref().map(|k| k.as_bytes().to_vec());
                (k, end.as_deref().unwrap_or("").as_bytes().to_vec())
            };
            let request = KvRequest::Range {
                key,
                end,
                serializable: serializable(*consistency),
                stream: *stream,
                shape: RangeShape {
                    limit: *limit,
                    keys_only: *keys_only,
                    count_only: *count_only,
                },
            };
            (runner::run(&plan, kv(request)).await, None)
        }
        Workload::TxnPut { txn_ops } => {
            let request = KvRequest::TxnPut { ops: *txn_ops };
            (runner::run(&plan, kv(request)).await, None)
        }
        Workload::TxnMixed {
            rw_ratio,
            consistency,
        } => {
            let request = KvRequest::TxnMixed {
                read_share: read_share(*rw_ratio),
                serializable: serializable(*consistency),
            };
            (runner::run(&plan, kv(request)).await, None)
        }
        Workload::TxnRead { consistency } => {
            let request = KvRequest::TxnRead {
                serializable: serializable(*consistency),
            };
            (runner::run(&plan, kv(request)).await, None)
        }
        Workload::Mixed {
            rw_ratio,
            consistency,
        } => {
            let request = KvRequest::Mixed {
                read_share: read_share(*rw_ratio),
                serializable: serializable(*consistency),
            };
            (runner::run(&plan, kv(request)).await, None)
        }
        Workload::Watch { watchers } => {
            let (outcome, events) =
                watch::run(&client, *watchers, clients, keys(0), g.val_size, &plan).await?;
            (outcome, Some(events))
        }
        Workload::Authenticate => {
            let (name, password) = user_and_password(g.user.as_deref().unwrap_or("root:"));
            let workers = (0..clients)
                .map(|_| AuthWorker::new(client.clone(), name, password))
                .collect();
            (runner::run(&plan, workers).await, None)
        }
        Workload::LeaseKeepalive => {
            let mut workers = Vec::with_capacity(clients);
            for _ in 0..clients {
                workers.push(LeaseWorker::start(&client, LEASE_TTL_S).await?);
            }
            (runner::run(&plan, workers).await, None)
        }
    };
    let rec = &outcome.recorder;
    let summary = Summary {
        workload: cli.workload.name().to_string(),
        endpoints: client.endpoints().to_vec(),
        clients,
        conns: client.conns(),
        rate: plan.rate,
        ok: rec.ok_count(),
        errors: rec.errors.clone(),
        elapsed_s: outcome.elapsed.as_secs_f64(),
        requests_per_s: rec.ok_count() as f64 / outcome.elapsed.as_secs_f64().max(1e-9),
        latency_ms: Latency::of(&rec.latency_us),
        over_30ms_share: over_slow_share(&rec.latency_us),
        events,
    };
    if g.json {
        match serde_json::to_string_pretty(&summary) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("keel-bench: cannot encode the report: {e}"),
        }
    } else {
        print!("{}", summary.text());
    }
    Ok((summary, outcome.recorder.latency_us))
}
