//! [`MemberSpec`]: the command line (and environment) of one member, the only place in Keel's
//! tests, benchmarks and chaos harness that spells the member flags.
//!
//! The flags are etcd's (`etcd --help`, `server/embed/config.go`): a member is named by
//! `--name`, keeps its state in `--data-dir`, serves clients on `--listen-client-urls` and
//! advertises `--advertise-client-urls`, talks to peers on `--listen-peer-urls` and advertises
//! `--initial-advertise-peer-urls`; `--initial-cluster` (`name=peerURL,...`),
//! `--initial-cluster-state` (`new` or `existing`) and `--initial-cluster-token` describe the
//! cluster it bootstraps or joins. Keel-only: `--experimental-peer-dial-override`
//! (`ADVERTISED_PEER_URL=DIAL_URL,...`, how the chaos harness routes peer traffic through its
//! proxies) and the `FAILPOINTS` environment variable of a `--features failpoints` build
//! (docs/failpoints.md). The same names without `--` are etcd's YAML config keys
//! ([`MemberSpec::settings`]).
//!
//! Every setting is optional: a spec with none of them is `keel` with no flags at all (etcd's
//! defaults), which start-up tests rely on.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::tls::ServerTls;

/// `--initial-cluster-state`: bootstrap a new cluster, or join one that exists (after
/// `MemberAdd`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterState {
    /// `new`.
    New,
    /// `existing`.
    Existing,
}

impl ClusterState {
    /// The flag value: `new` or `existing`.
    pub fn as_str(self) -> &'static str {
        match self {
            ClusterState::New => "new",
            ClusterState::Existing => "existing",
        }
    }
}

/// The settings and environment of one member start. See the module docs.
#[derive(Clone, Debug, Default)]
pub struct MemberSpec {
    name: Option<String>,
    data_dir: Option<PathBuf>,
    listen_client_url: Option<String>,
    advertise_client_url: Option<String>,
    listen_peer_url: Option<String>,
    advertise_peer_url: Option<String>,
    initial_cluster: Option<String>,
    initial_cluster_state: Option<ClusterState>,
    initial_cluster_token: Option<String>,
    /// (flag name without `--`, value), in the order given; passed after the settings.
    flags: Vec<(String, String)>,
    /// Arguments passed as they are, after everything else (e.g. chaos's `--keel-arg`s).
    raw_args: Vec<String>,
    env: Vec<(String, String)>,
    /// Client TLS: `https://` client URLs, `--cert-file` and friends.
    client_tls: Option<ServerTls>,
    /// Peer TLS: `https://` peer URLs (also in `--initial-cluster`), `--peer-cert-file` ...
    peer_tls: Option<ServerTls>,
}

/// `http://127.0.0.1:<port>`.
pub fn loopback_url(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

/// An `--initial-cluster` value: `name=peerURL` pairs joined by commas.
pub fn initial_cluster<N: AsRef<str>, U: AsRef<str>>(
    members: impl IntoIterator<Item = (N, U)>,
) -> String {
    join_pairs(members)
}

/// `a=b` pairs joined by commas, the form of `--initial-cluster` and the dial override.
fn join_pairs<A: AsRef<str>, B: AsRef<str>>(pairs: impl IntoIterator<Item = (A, B)>) -> String {
    pairs
        .into_iter()
        .map(|(a, b)| format!("{}={}", a.as_ref(), b.as_ref()))
        .collect::<Vec<_>>()
        .join(",")
}

impl MemberSpec {
    /// No settings: `keel` with etcd's defaults.
    pub fn new() -> MemberSpec {
        MemberSpec::default()
    }

    /// Member `name` serving clients on `http://127.0.0.1:<client_port>` and peers on
    /// `http://127.0.0.1:<peer_port>` (listen and advertise URLs alike). No cluster settings.
    pub fn loopback(name: &str, client_port: u16, peer_port: u16) -> MemberSpec {
        MemberSpec::new()
            .name(name)
            .client_url(&loopback_url(client_port))
            .peer_url(&loopback_url(peer_port))
    }

    /// [`MemberSpec::loopback`] as a single-member cluster: `--initial-cluster name=<peer URL>`
    /// and `--initial-cluster-state new`.
    pub fn single(name: &str, client_port: u16, peer_port: u16) -> MemberSpec {
        let peer = loopback_url(peer_port);
        MemberSpec::loopback(name, client_port, peer_port)
            .initial_cluster(&initial_cluster([(name, peer.as_str())]))
            .initial_cluster_state(ClusterState::New)
    }

    /// `--name`.
    pub fn name(mut self, name: &str) -> MemberSpec {
        self.name = Some(name.to_string());
        self
    }

    /// `--data-dir`.
    pub fn data_dir(mut self, dir: impl AsRef<Path>) -> MemberSpec {
        self.data_dir = Some(dir.as_ref().to_path_buf());
        self
    }

    /// `--listen-client-urls` and `--advertise-client-urls`, both `url`.
    pub fn client_url(mut self, url: &str) -> MemberSpec {
        self.listen_client_url = Some(url.to_string());
        self.advertise_client_url = Some(url.to_string());
        self
    }

    /// `--listen-client-urls urls` only (e.g. an `https://` and an `http://` URL side by
    /// side), keeping the advertised client URL the harness talks to.
    pub fn listen_client_urls(mut self, urls: &str) -> MemberSpec {
        self.listen_client_url = Some(urls.to_string());
        self
    }

    /// `--listen-peer-urls` and `--initial-advertise-peer-urls`, both `url`.
    pub fn peer_url(self, url: &str) -> MemberSpec {
        self.peer_urls(url, url)
    }

    /// `--listen-peer-urls listen` and `--initial-advertise-peer-urls advertise` (they differ
    /// when peers must dial another address, see [`MemberSpec::peer_dial_override`]).
    pub fn peer_urls(mut self, listen: &str, advertise: &str) -> MemberSpec {
        self.listen_peer_url = Some(listen.to_string());
        self.advertise_peer_url = Some(advertise.to_string());
        self
    }

    /// `--initial-cluster` (build the value with [`initial_cluster`]).
    pub fn initial_cluster(mut self, cluster: &str) -> MemberSpec {
        self.initial_cluster = Some(cluster.to_string());
        self
    }

    /// `--initial-cluster-state`.
    pub fn initial_cluster_state(mut self, state: ClusterState) -> MemberSpec {
        self.initial_cluster_state = Some(state);
        self
    }

    /// `--initial-cluster-token`.
    pub fn initial_cluster_token(mut self, token: &str) -> MemberSpec {
        self.initial_cluster_token = Some(token.to_string());
        self
    }

    /// `--heartbeat-interval` (ms).
    pub fn heartbeat_interval(self, ms: u64) -> MemberSpec {
        self.flag("--heartbeat-interval", &ms.to_string())
    }

    /// `--election-timeout` (ms).
    pub fn election_timeout(self, ms: u64) -> MemberSpec {
        self.flag("--election-timeout", &ms.to_string())
    }

    /// `--log-level` (`debug`, `info`, `warn`, `error`).
    pub fn log_level(self, level: &str) -> MemberSpec {
        self.flag("--log-level", level)
    }

    /// Keel's `--experimental-peer-dial-override`: dial `dial` whenever a peer advertises
    /// `advertised`, for each `(advertised, dial)` pair. Replaces an earlier override.
    pub fn peer_dial_override<A: AsRef<str>, D: AsRef<str>>(
        self,
        pairs: impl IntoIterator<Item = (A, D)>,
    ) -> MemberSpec {
        let value = join_pairs(pairs);
        self.peer_dial_override_value(&value)
    }

    /// `--experimental-peer-dial-override value` as given (e.g. a malformed one, to test the
    /// flag's error).
    pub fn peer_dial_override_value(mut self, value: &str) -> MemberSpec {
        const FLAG: &str = "experimental-peer-dial-override";
        self.flags.retain(|(name, _)| name != FLAG);
        self.flags.push((FLAG.to_string(), value.to_string()));
        self
    }

    /// Any other flag, e.g. `flag("--snapshot-count", "200")`; passed after the settings, in
    /// the order given.
    pub fn flag(mut self, flag: &str, value: &str) -> MemberSpec {
        let name = flag.strip_prefix("--").unwrap_or(flag);
        self.flags.push((name.to_string(), value.to_string()));
        self
    }

    /// Extra arguments passed as they are, after everything else (e.g. `["--max-txn-ops",
    /// "2"]`, or the `--keel-arg`s of a chaos run).
    pub fn args<S: AsRef<str>>(mut self, args: impl IntoIterator<Item = S>) -> MemberSpec {
        self.raw_args
            .extend(args.into_iter().map(|a| a.as_ref().to_string()));
        self
    }

    /// Sets (`Some`) or removes (`None`) environment variable `key` of the member process.
    pub fn env(mut self, key: &str, value: Option<&str>) -> MemberSpec {
        self.set_env(key, value);
        self
    }

    /// [`MemberSpec::env`] in place.
    pub fn set_env(&mut self, key: &str, value: Option<&str>) {
        self.env.retain(|(k, _)| k != key);
        if let Some(v) = value {
            self.env.push((key.to_string(), v.to_string()));
        }
    }

    /// `FAILPOINTS=<spec>` (`None` removes it): the failpoints a `--features failpoints`
    /// build of `keel` configures at start (`name=action;...`, docs/failpoints.md).
    pub fn failpoints(self, spec: Option<&str>) -> MemberSpec {
        self.env(FAILPOINTS_ENV, spec)
    }

    /// Client TLS (etcd's `--cert-file`, `--key-file`, `--trusted-ca-file`,
    /// `--client-cert-auth`): the client URLs become `https://` (whatever scheme they were
    /// given with).
    pub fn client_tls(mut self, tls: ServerTls) -> MemberSpec {
        self.client_tls = Some(tls);
        self
    }

    /// Peer TLS (`--peer-cert-file`, `--peer-key-file`, `--peer-trusted-ca-file`,
    /// `--peer-client-cert-auth`): the peer URLs, and those of `--initial-cluster`, become
    /// `https://`.
    pub fn peer_tls(mut self, tls: ServerTls) -> MemberSpec {
        self.peer_tls = Some(tls);
        self
    }

    /// The client TLS settings, if any.
    pub fn get_client_tls(&self) -> Option<&ServerTls> {
        self.client_tls.as_ref()
    }

    /// `--name`, if set.
    pub fn get_name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// `--data-dir`, if set.
    pub fn get_data_dir(&self) -> Option<&Path> {
        self.data_dir.as_deref()
    }

    /// `--advertise-client-urls`, if set (`https://` with client TLS).
    pub fn get_client_url(&self) -> Option<String> {
        let https = self.client_tls.is_some();
        self.advertise_client_url
            .as_deref()
            .map(|u| scheme(u, https))
    }

    /// `--initial-advertise-peer-urls`, if set (`https://` with peer TLS).
    pub fn get_peer_url(&self) -> Option<String> {
        let https = self.peer_tls.is_some();
        self.advertise_peer_url.as_deref().map(|u| scheme(u, https))
    }

    /// The extra environment of the member process.
    pub fn get_env(&self) -> &[(String, String)] {
        &self.env
    }

    /// The settings that describe the member and its cluster (name, data dir, URLs, cluster)
    /// as (flag name without `--`, value) pairs, which are also etcd's YAML config keys. Other
    /// flags and raw arguments are not included.
    pub fn settings(&self) -> Vec<(&'static str, String)> {
        let data_dir = self.data_dir.as_ref().map(|d| d.display().to_string());
        let state = self.initial_cluster_state.map(|s| s.as_str().to_string());
        let client =
            |u: &Option<String>| u.as_deref().map(|u| scheme(u, self.client_tls.is_some()));
        let peer = |u: &Option<String>| u.as_deref().map(|u| scheme(u, self.peer_tls.is_some()));
        let cluster = self
            .initial_cluster
            .as_deref()
            .map(|c| match self.peer_tls {
                Some(_) => c.replace("=http://", "=https://"),
                None => c.to_string(),
            });
        [
            ("name", self.name.clone()),
            ("data-dir", data_dir),
            ("listen-client-urls", client(&self.listen_client_url)),
            ("advertise-client-urls", client(&self.advertise_client_url)),
            ("listen-peer-urls", peer(&self.listen_peer_url)),
            (
                "initial-advertise-peer-urls",
                peer(&self.advertise_peer_url),
            ),
            ("initial-cluster", cluster),
            ("initial-cluster-state", state),
            ("initial-cluster-token", self.initial_cluster_token.clone()),
        ]
        .into_iter()
        .filter_map(|(key, value)| Some((key, value?)))
        .collect()
    }

    /// The whole command line: [`MemberSpec::settings`] as `--flag value`, then the other
    /// flags, the TLS flags, then the raw arguments.
    pub fn to_args(&self) -> Vec<String> {
        let settings = self
            .settings()
            .into_iter()
            .map(|(key, value)| (key.to_string(), value));
        settings
            .chain(self.flags.iter().cloned())
            .flat_map(|(flag, value)| [format!("--{flag}"), value])
            .chain(self.tls_args())
            .chain(self.raw_args.iter().cloned())
            .collect()
    }

    /// The TLS flags of [`MemberSpec::client_tls`] and [`MemberSpec::peer_tls`], in etcd's
    /// `--flag=value` form (flags only: they are not part of [`MemberSpec::settings`]).
    fn tls_args(&self) -> Vec<String> {
        let side = |prefix: &str, tls: &ServerTls| {
            let mut args = vec![
                format!("--{prefix}cert-file={}", tls.files.cert.display()),
                format!("--{prefix}key-file={}", tls.files.key.display()),
                format!("--{prefix}trusted-ca-file={}", tls.ca.display()),
            ];
            if tls.client_cert_auth {
                args.push(format!("--{prefix}client-cert-auth"));
            }
            args
        };
        let mut args = Vec::new();
        if let Some(tls) = &self.client_tls {
            args.extend(side("", tls));
        }
        if let Some(tls) = &self.peer_tls {
            args.extend(side("peer-", tls));
        }
        args
    }

    /// A [`Command`] running `binary` with this command line and environment (stdio left to the
    /// caller).
    pub fn command(&self, binary: &Path) -> Command {
        let mut command = Command::new(binary);
        command
            .args(self.to_args())
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        command
    }
}

/// `url` with the `https` scheme when `https`, else as given.
fn scheme(url: &str, https: bool) -> String {
    match (https, url.strip_prefix("http://")) {
        (true, Some(rest)) => format!("https://{rest}"),
        _ => url.to_string(),
    }
}

/// The environment variable the `fail` crate reads in a failpoint build of `keel`.
pub const FAILPOINTS_ENV: &str = "FAILPOINTS";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_member_command_line_uses_etcds_flags() {
        let spec = MemberSpec::single("m1", 2379, 2380)
            .data_dir("/d")
            .initial_cluster_token("t")
            .election_timeout(1000)
            .args(["--max-txn-ops", "2"])
            .failpoints(Some("a=return"));
        assert_eq!(
            spec.to_args(),
            [
                "--name",
                "m1",
                "--data-dir",
                "/d",
                "--listen-client-urls",
                "http://127.0.0.1:2379",
                "--advertise-client-urls",
                "http://127.0.0.1:2379",
                "--listen-peer-urls",
                "http://127.0.0.1:2380",
                "--initial-advertise-peer-urls",
                "http://127.0.0.1:2380",
                "--initial-cluster",
                "m1=http://127.0.0.1:2380",
                "--initial-cluster-state",
                "new",
                "--initial-cluster-token",
                "t",
                "--election-timeout",
                "1000",
                "--max-txn-ops",
                "2",
            ]
        );
        assert_eq!(
            spec.get_env(),
            [("FAILPOINTS".to_string(), "a=return".to_string())]
        );
        assert!(spec.failpoints(None).get_env().is_empty());
    }

    #[test]
    fn tls_turns_urls_into_https_and_adds_etcds_flags() {
        use crate::tls::{CertFiles, ServerTls};
        let side = |name: &str| ServerTls {
            files: CertFiles {
                cert: format!("/{name}.pem").into(),
                key: format!("/{name}-key.pem").into(),
            },
            ca: "/ca.pem".into(),
            client_cert_auth: true,
        };
        let spec = MemberSpec::single("m1", 1, 2)
            .client_tls(side("c"))
            .peer_tls(side("p"));
        assert_eq!(
            spec.get_client_url().as_deref(),
            Some("https://127.0.0.1:1")
        );
        assert_eq!(spec.get_peer_url().as_deref(), Some("https://127.0.0.1:2"));
        let args = spec.to_args();
        assert!(
            args.windows(2)
                .any(|w| w == ["--initial-cluster", "m1=https://127.0.0.1:2"])
        );
        assert!(
            args.windows(2)
                .any(|w| w == ["--listen-peer-urls", "https://127.0.0.1:2"])
        );
        assert_eq!(
            args[args.len() - 8..],
            [
                "--cert-file=/c.pem",
                "--key-file=/c-key.pem",
                "--trusted-ca-file=/ca.pem",
                "--client-cert-auth",
                "--peer-cert-file=/p.pem",
                "--peer-key-file=/p-key.pem",
                "--peer-trusted-ca-file=/ca.pem",
                "--peer-client-cert-auth",
            ]
        );
    }

    #[test]
    fn unset_settings_are_left_out_and_an_override_replaces_the_last() {
        assert!(MemberSpec::new().to_args().is_empty());
        let spec = MemberSpec::new()
            .peer_dial_override([("http://a:1", "http://b:2"), ("http://c:3", "http://d:4")])
            .peer_dial_override_value("x")
            .peer_dial_override([("http://a:1", "http://b:2")]);
        assert_eq!(
            spec.to_args(),
            ["--experimental-peer-dial-override", "http://a:1=http://b:2"]
        );
    }
}
