//! Each component's settings, derived from the flags: the components below `config` take
//! these plain structs and never read [`Config`] (dependencies point down).

use std::time::Duration;

use super::{Config, GRPC_OVERHEAD_BYTES, auth_token, split_urls, url_host};
use crate::auth::{AuthError, TokenProvider, password};
use crate::cluster::bootstrap;
use crate::cluster::timing::{self, RaftTimers, Timing};
use crate::lease::PrimaryConfig;
use crate::lease::runner::{
    DEFAULT_CHECKPOINT_BATCH, DEFAULT_EXPIRE_BATCH, DEFAULT_MAX_IN_FLIGHT, RunnerConfig,
};
use crate::mvcc::PersistPolicy;
use crate::watch::{WatchConfig, progress};

impl Config {
    /// etcd's request timeout: 5 s plus twice the election timeout.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(5000 + 2 * self.election_timeout)
    }

    /// openraft's timers for `--heartbeat-interval` and `--election-timeout`.
    pub fn raft_timers(&self) -> RaftTimers {
        timing::raft_timers(self.heartbeat_interval, self.election_timeout)
    }

    /// The token provider of `--auth-token` and `--auth-token-ttl` (a start-up error stops
    /// the member).
    ///
    /// Errors: `auth: invalid auth options` and the JWT key errors ([`TokenProvider::new`]).
    pub fn token_provider(&self) -> Result<TokenProvider, AuthError> {
        let options = auth_token::parse(&self.auth_token)?;
        TokenProvider::new(&options, Duration::from_secs(self.auth_token_ttl))
    }

    /// The bcrypt cost passwords are hashed with (`--bcrypt-cost`, etcd's range rule).
    pub fn effective_bcrypt_cost(&self) -> u32 {
        password::effective_cost(self.bcrypt_cost)
    }

    /// When the member's MVCC store commits its pending writes to sled: etcd's
    /// `--backend-batch-interval` and `--backend-batch-limit` (0 = etcd's defaults, 100 ms
    /// and 10,000), at most 4 MiB pending, committed on the store's own thread.
    pub fn persist_policy(&self) -> PersistPolicy {
        let interval = self.backend_batch_interval.0;
        PersistPolicy {
            max_writes: match self.backend_batch_limit {
                0 => PersistPolicy::BATCHED.max_writes,
                n => usize::try_from(n).unwrap_or(usize::MAX),
            },
            max_age: match interval.is_zero() {
                true => PersistPolicy::BATCHED.max_age,
                false => interval,
            },
            ..PersistPolicy::BATCHED
        }
    }

    /// Tokio worker threads for this member when members of `--initial-cluster` share this
    /// machine: `cores / local members`, at least 1, when this member's peer URLs
    /// (`--initial-advertise-peer-urls`) and those of at least one other member are all on
    /// loopback addresses. `None` otherwise: tokio's default, one thread per core (etcd's
    /// `GOMAXPROCS`), or `TOKIO_WORKER_THREADS` when set.
    ///
    /// Why: three members on two cores each ran two workers plus their own I/O threads, and
    /// the six workers took turns on two cores; one worker per member used 5-20 % less CPU
    /// per put and per read (docs/benchmarks.md, "One worker per member on a shared box").
    pub fn runtime_worker_threads(&self, cores: usize) -> Option<usize> {
        let all_loopback =
            |urls: &[String]| !urls.is_empty() && urls.iter().all(|u| is_loopback_url(u));
        if !all_loopback(&split_urls(&self.initial_advertise_peer_urls)) {
            return None;
        }
        let members = crate::membership::parse_initial_cluster(&self.initial_cluster).ok()?;
        let local = members
            .iter()
            .filter(|m| all_loopback(&m.peer_urls))
            .count();
        (local > 1).then(|| (cores / local).max(1))
    }

    /// The cluster layer's timers and timeouts.
    pub fn timing(&self) -> Timing {
        Timing {
            raft: self.raft_timers(),
            election_timeout: Duration::from_millis(self.election_timeout),
            request_timeout: self.request_timeout(),
        }
    }
}

/// Whether `url`'s host is a loopback address (`localhost`, `127.0.0.0/8`, `::1`).
fn is_loopback_url(url: &str) -> bool {
    let host = url_host(url);
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

impl WatchConfig {
    /// The watch limits of a member's flags.
    pub fn from_config(config: &Config) -> WatchConfig {
        WatchConfig {
            buffer_len: config.watch_buffer_len.max(1),
            stream_buffer_bytes: config.watch_stream_buffer_bytes.max(1),
            progress_interval: progress::effective_interval(
                config.experimental_watch_progress_notify_interval.0,
            ),
            max_response_bytes: config.max_request_bytes as usize + GRPC_OVERHEAD_BYTES,
            ..WatchConfig::default()
        }
    }
}

impl RunnerConfig {
    /// The lease loop settings of a member with `config`: TTL extension = election timeout
    /// (etcd `Promote(electionTimeout)`), revocation retry = etcd's request timeout, the
    /// rate and checkpoint interval from the flags.
    pub fn from_config(config: &Config) -> RunnerConfig {
        let interval = config.lease_checkpoint_interval;
        RunnerConfig {
            primary: PrimaryConfig {
                extend: Duration::from_millis(config.election_timeout),
                checkpoint_interval: (interval > 0).then(|| Duration::from_millis(interval)),
                revoke_retry: config.request_timeout(),
            },
            revoke_rate: config.lease_revoke_rate.max(1),
            batch: DEFAULT_EXPIRE_BATCH,
            checkpoint_batch: DEFAULT_CHECKPOINT_BATCH,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
        }
    }
}

impl bootstrap::Flags {
    /// The identity flags of a member with `config`.
    pub fn from_config(config: &Config) -> bootstrap::Flags {
        bootstrap::Flags {
            name: config.name.clone(),
            initial_cluster: config.initial_cluster.clone(),
            advertise_peer_urls: split_urls(&config.initial_advertise_peer_urls),
            token: config.initial_cluster_token.clone(),
            new_cluster: config.initial_cluster_state == "new",
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn default_flags_give_the_components_defaults() {
        let c = Config::default();
        assert_eq!(WatchConfig::from_config(&c), WatchConfig::default());
        assert_eq!(c.request_timeout(), Duration::from_millis(7000));
        let r = RunnerConfig::from_config(&c);
        assert_eq!(r.primary.extend, Duration::from_millis(1000));
        assert_eq!(r.primary.revoke_retry, Duration::from_millis(7000));
        assert_eq!(
            r.primary.checkpoint_interval,
            Some(Duration::from_secs(300))
        );
        assert_eq!(r.revoke_rate, 100_000);
        let f = bootstrap::Flags::from_config(&c);
        assert_eq!(
            f.advertise_peer_urls,
            vec!["http://localhost:2380".to_string()]
        );
        assert!(f.new_cluster);
        assert_eq!(f.token, "etcd-cluster");
    }

    #[test]
    fn members_on_one_box_divide_its_cores_between_their_runtimes() {
        let member = |name: &str, me: &str, cluster: &str| {
            Config::parse_from([
                "keel",
                "--name",
                name,
                "--initial-advertise-peer-urls",
                me,
                "--initial-cluster",
                cluster,
            ])
        };
        let local3 = "a=http://127.0.0.1:2380,b=http://localhost:2381,c=http://[::1]:2382";
        let remote = "a=http://10.0.0.1:2380,b=http://10.0.0.2:2380,c=http://10.0.0.3:2380";
        let mixed = "a=http://127.0.0.1:2380,b=http://127.0.0.1:2381,c=http://10.0.0.3:2380";
        let half = "a=http://127.0.0.1:2380,b=http://127.0.0.1:2381,b=http://10.0.0.2:2380";
        // (why, this member, its peer URL, --initial-cluster, cores, workers)
        let cases = [
            (
                "3 members, 2 cores",
                "a",
                "http://127.0.0.1:2380",
                local3,
                2,
                Some(1),
            ),
            (
                "3 members, 8 cores",
                "a",
                "http://127.0.0.1:2380",
                local3,
                8,
                Some(2),
            ),
            (
                "3 members, 1 core",
                "a",
                "http://127.0.0.1:2380",
                local3,
                1,
                Some(1),
            ),
            (
                "no member on loopback",
                "a",
                "http://10.0.0.1:2380",
                remote,
                2,
                None,
            ),
            // Two of three members on this box (the third elsewhere): two share its cores.
            (
                "2 local of 3",
                "a",
                "http://127.0.0.1:2380",
                mixed,
                4,
                Some(2),
            ),
            // This member is not on loopback: nothing says the others share its machine.
            (
                "this member remote",
                "c",
                "http://10.0.0.3:2380",
                mixed,
                4,
                None,
            ),
            // A member with one loopback and one other peer URL is not counted as local.
            (
                "half local peer",
                "a",
                "http://127.0.0.1:2380",
                half,
                2,
                None,
            ),
        ];
        for (why, name, me, cluster, cores, want) in cases {
            assert_eq!(
                member(name, me, cluster).runtime_worker_threads(cores),
                want,
                "{why}"
            );
        }
        // A member on its own machine (the README's single member included) keeps tokio's
        // default, one worker per core.
        assert_eq!(Config::default().runtime_worker_threads(2), None);
    }

    #[test]
    fn a_repeated_flag_keeps_its_last_value_as_in_etcd() {
        let c = Config::parse_from([
            "keel",
            "--name",
            "a",
            "--snapshot-count",
            "5",
            "--name=b",
            "--snapshot-count",
            "7",
        ]);
        assert_eq!(c.name, "b");
        assert_eq!(c.snapshot_count, 7);
    }

    #[test]
    fn flags_reach_the_watch_and_lease_settings() {
        let c = Config::parse_from([
            "keel",
            "--watch-buffer-len",
            "0",
            "--max-request-bytes",
            "100",
            "--experimental-watch-progress-notify-interval",
            "10ms",
            "--lease-checkpoint-interval",
            "0",
            "--initial-cluster-state",
            "existing",
        ]);
        let w = WatchConfig::from_config(&c);
        assert_eq!(w.buffer_len, 1, "at least one response");
        assert_eq!(w.max_response_bytes, 100 + GRPC_OVERHEAD_BYTES);
        assert_eq!(w.progress_interval, progress::MIN_PROGRESS_INTERVAL);
        assert_eq!(
            RunnerConfig::from_config(&c).primary.checkpoint_interval,
            None
        );
        assert!(!bootstrap::Flags::from_config(&c).new_cluster);
    }

    #[test]
    fn etcds_backend_batch_flags_set_the_persist_policy() {
        let c = Config::parse_from([
            "keel",
            "--backend-batch-interval",
            "25ms",
            "--backend-batch-limit",
            "500",
        ]);
        let p = c.persist_policy();
        assert_eq!((p.max_writes, p.max_age), (500, Duration::from_millis(25)));
        assert!(p.background);
        let zero = Config::parse_from([
            "keel",
            "--backend-batch-interval",
            "0s",
            "--backend-batch-limit",
            "0",
        ]);
        assert_eq!(
            zero.persist_policy(),
            PersistPolicy::BATCHED,
            "0 = etcd's defaults"
        );
    }
}
