//! The `keel-bench` command line. Option names follow etcd's `benchmark` tool
//! (`tools/benchmark/cmd/root.go`, `put.go`, `range.go`, `txn_put.go`, `txn_mixed.go`,
//! `watch_latency.go`, `lease.go`) so one recipe drives both.

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Load generator for Keel and etcd v3 endpoints (etcd `benchmark` style).
#[derive(Debug, Parser)]
#[command(name = "keel-bench", version)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub workload: Workload,
}

/// Options shared by every workload.
#[derive(Debug, Args)]
pub struct Global {
    /// Comma-separated `host:port` endpoints; connections are spread over all of them.
    #[arg(
        long,
        global = true,
        value_delimiter = ',',
        default_value = "127.0.0.1:2379"
    )]
    pub endpoints: Vec<String>,
    /// TLS: CA file the members' certificates must chain to (etcd benchmark `--cacert`).
    #[arg(long, global = true)]
    pub cacert: Option<std::path::PathBuf>,
    /// TLS: client certificate file (etcd benchmark `--cert`).
    #[arg(long, global = true, requires = "cacert")]
    pub cert: Option<std::path::PathBuf>,
    /// TLS: client key file (etcd benchmark `--key`).
    #[arg(long, global = true, requires = "cert")]
    pub key: Option<std::path::PathBuf>,
    /// Concurrent requests in flight (etcd `--clients`; one worker each).
    #[arg(long, global = true, default_value_t = 1, value_parser = at_least_one)]
    pub clients: usize,
    /// HTTP/2 connections (etcd `--conns`), spread over the endpoints round robin.
    #[arg(long, global = true, default_value_t = 1, value_parser = at_least_one)]
    pub conns: usize,
    /// Requests to send in total (etcd `--total`).
    #[arg(
        long,
        global = true,
        default_value_t = 10_000,
        conflicts_with = "duration",
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub total: u64,
    /// Run for this long instead of a request count, e.g. `10s`, `1m`.
    #[arg(long, global = true, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// Key size in bytes (etcd `--key-size`).
    #[arg(long, global = true, default_value_t = 8, value_parser = at_least_one)]
    pub key_size: usize,
    /// Value size in bytes (etcd `--val-size`).
    #[arg(long, global = true, default_value_t = 8)]
    pub val_size: usize,
    /// Keel: a prefix put in front of every key of the put, range and txn workloads (e.g.
    /// `/noisy/`, to aim a run at a QoS rule's key prefix); `--key-size` counts the bytes
    /// after it.
    #[arg(long, global = true, default_value = "")]
    pub key_prefix: String,
    /// Number of distinct keys (etcd `--key-space-size`).
    #[arg(long, global = true, default_value_t = 1)]
    pub key_space_size: u64,
    /// Walk the key space in order instead of at random (etcd `--sequential-keys`).
    #[arg(long, global = true)]
    pub sequential_keys: bool,
    /// Open loop: requests per second over all clients, each with an intended send time;
    /// latency counts from that time, so stalls are not hidden (coordinated omission).
    /// 0 = closed loop (each client sends when its previous request finished).
    #[arg(long, global = true, default_value_t = 0.0, allow_negative_numbers = true, value_parser = non_negative_rate)]
    pub rate: f64,
    /// Deadline of one request (grpc-timeout).
    #[arg(long, global = true, value_parser = humantime::parse_duration, default_value = "10s")]
    pub request_timeout: Duration,
    /// Print one JSON object instead of the text report (and no progress bar).
    #[arg(long, global = true)]
    pub json: bool,
    /// Also save the run's request latency histogram (µs; for `watch`, the puts') to FILE as
    /// HdrHistogram's percentile distribution text (Java's `outputPercentileDistribution`,
    /// `.hgrm`): a header `Value Percentile TotalCount 1/(1-Percentile)`, one row per
    /// percentile step (5 per half distance to 100 %) with the value in µs, the percentile
    /// as a fraction, the count at or below the value and 1/(1-percentile), then
    /// `#[Mean ...]`, `#[Max ..., Total count ...]` footer lines. HdrHistogram's plotter and
    /// `scripts/bench-chart.py` read it; the value at quantile q is the Value of the first row
    /// whose TotalCount reaches ceil(q × Total count) (exact where that value has a row, else
    /// the next row's).
    #[arg(long, global = true, value_name = "FILE")]
    pub hdr_out: Option<std::path::PathBuf>,
    /// `name:password` to authenticate as before the run (etcd `--user`); every request
    /// then carries the token.
    #[arg(long, global = true)]
    pub user: Option<String>,
}

impl Global {
    /// The TLS files of `--cacert --cert --key` (`None`: plaintext).
    pub fn tls(&self) -> Option<keel_client::TlsFiles> {
        self.cacert.as_ref().map(|ca| keel_client::TlsFiles {
            ca: ca.clone(),
            cert: self.cert.clone(),
            key: self.key.clone(),
        })
    }
}

/// Read consistency of `range` (etcd `--consistency`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ConsistencyArg {
    /// Linearizable.
    L,
    /// Serializable.
    S,
}

/// The workloads.
#[derive(Debug, Subcommand)]
pub enum Workload {
    /// Put random keys (etcd `benchmark put`).
    Put,
    /// Read keys (etcd `benchmark range [KEY [END]]`): KEY or random keys of the key space.
    /// (Positional as in etcd: `--key` is the TLS key file.)
    Range {
        /// Read this key (etcd's positional KEY) instead of random keys.
        #[arg(id = "KEY")]
        key: Option<String>,
        /// Read up to this key (exclusive range end; etcd's positional END).
        #[arg(id = "END")]
        end: Option<String>,
        /// l (linearizable) or s (serializable).
        #[arg(long, value_enum, default_value = "l")]
        consistency: ConsistencyArg,
        /// Read through `KV.RangeStream` (etcd 3.7: chunks at one revision, for large
        /// ranges), merged by keel-client; `Range` where the member lacks it.
        #[arg(long)]
        stream: bool,
        /// Every key from KEY on (etcdctl `--from-key`; without KEY: from `\0`, all keys):
        /// `range_end` `\0`, END must be absent.
        #[arg(long, conflicts_with = "END")]
        from_key: bool,
        /// `RangeRequest.limit` (0 = no limit; etcdctl `--limit`).
        #[arg(long, default_value_t = 0)]
        limit: i64,
        /// `RangeRequest.keys_only` (etcdctl `--keys-only`).
        #[arg(long)]
        keys_only: bool,
        /// `RangeRequest.count_only` (etcdctl `--count-only`).
        #[arg(long)]
        count_only: bool,
    },
    /// Txns of `--txn-ops` puts on random keys (etcd `benchmark txn-put`).
    TxnPut {
        /// Puts per txn.
        #[arg(long, default_value_t = 1)]
        txn_ops: usize,
    },
    /// Txns that either read (a range) or write (a put) a random key (etcd `txn-mixed`).
    TxnMixed {
        /// Reads per write.
        #[arg(long, default_value_t = 1.0)]
        rw_ratio: f64,
        /// l (linearizable) or s (serializable) reads.
        #[arg(long, value_enum, default_value = "l")]
        consistency: ConsistencyArg,
    },
    /// Read-only txns on a random key: one compare (`mod_revision(key) > 0`) and one range of
    /// the key in both branches (Keel serves these without proposing them).
    TxnRead {
        /// l (linearizable) or s (serializable) ranges.
        #[arg(long, value_enum, default_value = "l")]
        consistency: ConsistencyArg,
    },
    /// Plain range and put requests on random keys, `--rw-ratio` reads per write.
    Mixed {
        /// Reads per write.
        #[arg(long, default_value_t = 1.0)]
        rw_ratio: f64,
        /// l (linearizable) or s (serializable) reads.
        #[arg(long, value_enum, default_value = "l")]
        consistency: ConsistencyArg,
    },
    /// `--watchers` watchers on the whole key space, each on its own stream; the clients put
    /// and the report adds the latency from sending a put to each watcher's event.
    Watch {
        /// Watchers (one stream each, spread over the connections).
        #[arg(long, default_value_t = 10)]
        watchers: usize,
    },
    /// Each client grants a lease and renews it on its keep-alive stream; one request is one
    /// renewal (etcd `benchmark lease-keepalive`).
    LeaseKeepalive,
    /// `Auth.Authenticate` as the `--user` (bcrypt on the server, a token through raft).
    Authenticate,
}

impl Workload {
    /// The workload's name as typed on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            Workload::Put => "put",
            Workload::Range { .. } => "range",
            Workload::TxnPut { .. } => "txn-put",
            Workload::TxnMixed { .. } => "txn-mixed",
            Workload::TxnRead { .. } => "txn-read",
            Workload::Mixed { .. } => "mixed",
            Workload::Watch { .. } => "watch",
            Workload::LeaseKeepalive => "lease-keepalive",
            Workload::Authenticate => "authenticate",
        }
    }
}

/// clap value parser for counts that must be at least 1 (`--clients`, `--conns`, `--key-size`).
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// clap value parser for `--rate`: requests per second, 0 (closed loop) or more.
fn non_negative_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if r.is_finite() && r >= 0.0 => Ok(r),
        Ok(_) => Err("must be a finite number >= 0 (0 = closed loop)".into()),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_an_etcd_style_command_line() {
        let cli = Cli::try_parse_from([
            "keel-bench",
            "--endpoints",
            "a:1,b:2",
            "--clients",
            "64",
            "range",
            "--consistency",
            "s",
            "--duration",
            "3s",
        ])
        .expect("parses");
        assert_eq!(cli.global.endpoints, ["a:1", "b:2"]);
        assert_eq!(cli.global.clients, 64);
        assert_eq!(cli.global.duration, Some(Duration::from_secs(3)));
        assert!(matches!(
            cli.workload,
            Workload::Range {
                consistency: ConsistencyArg::S,
                ..
            }
        ));
        // etcd's TLS flags beside a range of one key (etcd's positional KEY).
        let cli = Cli::try_parse_from([
            "keel-bench",
            "--cacert",
            "ca.pem",
            "--cert",
            "c.pem",
            "--key",
            "k.pem",
            "range",
            "foo",
            "--stream",
        ])
        .expect("parses");
        let tls = cli.global.tls().expect("TLS files");
        assert_eq!(tls.key.as_deref(), Some(std::path::Path::new("k.pem")));
        assert!(
            matches!(cli.workload, Workload::Range { key: Some(ref k), end: None, stream: true, .. } if k == "foo")
        );
        // The count query of issue 20: `etcdctl get "" --from-key --limit 1`.
        let cli = Cli::try_parse_from([
            "keel-bench",
            "range",
            "--from-key",
            "--limit",
            "1",
            "--keys-only",
        ])
        .expect("parses");
        assert!(matches!(
            cli.workload,
            Workload::Range {
                key: None,
                from_key: true,
                limit: 1,
                keys_only: true,
                count_only: false,
                ..
            }
        ));
        assert!(
            Cli::try_parse_from(["keel-bench", "range", "a", "b", "--from-key"]).is_err(),
            "--from-key and END exclude each other"
        );
        let cli = Cli::try_parse_from(["keel-bench", "put", "--hdr-out", "/tmp/put.hgrm"]).unwrap();
        assert_eq!(
            cli.global.hdr_out.as_deref(),
            Some(std::path::Path::new("/tmp/put.hgrm"))
        );
        assert!(
            Cli::try_parse_from(["keel-bench", "--total", "5", "--duration", "1s", "put"]).is_err(),
            "--total and --duration exclude each other"
        );
    }

    #[test]
    fn counts_and_rates_out_of_range_are_flag_errors() {
        for bad in [
            &["keel-bench", "--clients", "0", "put"][..],
            &["keel-bench", "--conns", "0", "put"],
            &["keel-bench", "--key-size", "0", "put"],
            &["keel-bench", "--total", "0", "put"],
            &["keel-bench", "--rate", "-5", "put"],
        ] {
            let err = Cli::try_parse_from(bad).expect_err("must be refused");
            assert_eq!(
                err.kind(),
                clap::error::ErrorKind::ValueValidation,
                "{bad:?}: {err}"
            );
        }
        let cli = Cli::try_parse_from(["keel-bench", "--rate", "0", "put"]).unwrap();
        assert_eq!(cli.global.rate, 0.0);
    }
}
