//! The deploy recipes of docs/deploy/ (issue 14 part 7) stay valid: the Kubernetes manifests
//! parse and carry what a StatefulSet behind a headless Service needs (probes on /livez and
//! /readyz, the ports the flags name), and every `keel` command line in the systemd unit,
//! the Procfile and the StatefulSet is accepted by Keel's flag parser. No process starts.

use std::path::PathBuf;

use clap::Parser;
use keel_server::config::Config;
use serde_norway::Value;

fn deploy(file: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../docs/deploy")
        .join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn yaml(file: &str) -> Value {
    serde_norway::from_str(&deploy(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// `v` at the path of keys (`"spec.template.spec"`), or a panic naming the missing part.
fn at<'v>(v: &'v Value, path: &str) -> &'v Value {
    path.split('.').fold(v, |v, key| {
        let next = match key.parse::<usize>() {
            Ok(i) => v.get(i),
            Err(_) => v.get(key),
        };
        next.unwrap_or_else(|| panic!("missing {key} of {path}"))
    })
}

fn str_at<'v>(v: &'v Value, path: &str) -> &'v str {
    at(v, path)
        .as_str()
        .unwrap_or_else(|| panic!("{path} is not a string"))
}

/// Parses `keel` arguments as the binary does (`Config::normalize` included).
fn accepts(args: &[String]) -> Config {
    let mut argv = vec!["keel".to_string()];
    argv.extend(args.iter().cloned());
    let mut config = Config::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    config
        .normalize()
        .unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    config
}

#[test]
fn the_statefulset_and_its_headless_service_have_what_kubernetes_needs() {
    let svc = yaml("k8s/service.yaml");
    assert_eq!(
        (str_at(&svc, "apiVersion"), str_at(&svc, "kind")),
        ("v1", "Service")
    );
    assert_eq!(str_at(&svc, "spec.clusterIP"), "None", "headless");
    let sts = yaml("k8s/statefulset.yaml");
    assert_eq!(
        (str_at(&sts, "apiVersion"), str_at(&sts, "kind")),
        ("apps/v1", "StatefulSet")
    );
    assert_eq!(
        str_at(&sts, "spec.serviceName"),
        str_at(&svc, "metadata.name")
    );
    let labels = at(&sts, "spec.template.metadata.labels");
    assert_eq!(at(&sts, "spec.selector.matchLabels"), labels);
    assert_eq!(at(&svc, "spec.selector"), labels);
    let replicas = at(&sts, "spec.replicas").as_u64().unwrap();

    let c = at(&sts, "spec.template.spec.containers.0");
    let port_of = |name: &str| {
        at(c, "ports")
            .as_sequence()
            .unwrap()
            .iter()
            .find(|p| str_at(p, "name") == name)
            .and_then(|p| at(p, "containerPort").as_u64())
            .unwrap_or_else(|| panic!("no container port {name}"))
    };
    for (probe, path) in [
        ("livenessProbe", "/livez"),
        ("readinessProbe", "/readyz"),
        ("startupProbe", "/livez"),
    ] {
        assert_eq!(str_at(c, &format!("{probe}.httpGet.path")), path);
        port_of(str_at(c, &format!("{probe}.httpGet.port")));
    }
    let mount = str_at(c, "volumeMounts.0.mountPath");
    assert_eq!(
        str_at(c, "volumeMounts.0.name"),
        str_at(&sts, "spec.volumeClaimTemplates.0.metadata.name")
    );

    let args: Vec<String> = at(c, "args")
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    let config = accepts(&args);
    assert!(config.data_dir().starts_with(mount), "data on the volume");
    for (urls, port) in [
        (&config.listen_client_urls, port_of("client")),
        (&config.listen_peer_urls, port_of("peer")),
        (&config.operator.listen_metrics_urls, port_of("metrics")),
    ] {
        assert!(
            urls.ends_with(&format!(":{port}")),
            "{urls} listens on {port}"
        );
    }
    let members = config.initial_cluster.split(',').count() as u64;
    assert_eq!(members, replicas, "one --initial-cluster entry per replica");
    for i in 0..replicas {
        assert!(
            config
                .initial_cluster
                .contains(&format!("keel-{i}=http://keel-{i}.keel."))
        );
    }
}

#[test]
fn the_systemd_unit_and_the_procfile_run_commands_keel_accepts() {
    let unit = deploy("keel.service");
    for key in [
        "[Unit]",
        "[Service]",
        "[Install]",
        "Type=simple",
        "ExecStart=/usr/local/bin/keel",
    ] {
        assert!(unit.contains(key), "keel.service lacks {key}");
    }
    let exec = unit
        .split("ExecStart=")
        .nth(1)
        .unwrap()
        .split("\nRestart=")
        .next()
        .unwrap()
        .replace("\\\n", " ");
    let args: Vec<String> = exec.split_whitespace().skip(1).map(String::from).collect();
    let config = accepts(&args);
    assert_eq!(config.initial_cluster.split(',').count(), 3);

    let procfile = deploy("Procfile");
    let lines: Vec<&str> = procfile.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(lines.len(), 3, "three members");
    let mut client_urls = Vec::new();
    for line in lines {
        let (_, command) = line.split_once(": ").unwrap();
        let args: Vec<String> = command
            .split_whitespace()
            .skip(1)
            .map(String::from)
            .collect();
        let config = accepts(&args);
        client_urls.push(config.listen_client_urls.clone());
        assert!(
            config
                .initial_cluster
                .contains(&format!("{}=", config.name)),
            "{} is in its own --initial-cluster",
            config.name
        );
    }
    client_urls.dedup();
    assert_eq!(client_urls.len(), 3, "distinct client URLs");
}

/// Every metric the Grafana dashboard (`docs/deploy/grafana/keel.json`) queries is one Keel
/// exports (its `# TYPE` line in the registry's text, histogram series by their base name).
#[test]
fn the_grafana_dashboard_queries_only_exported_metrics() {
    let dashboard: serde_json::Value = serde_json::from_str(&deploy("grafana/keel.json")).unwrap();
    // Labelled families appear once they have a series: one RPC served, one sent to a peer,
    // the QoS series every scrape sets.
    keel_server::metrics::keel()
        .qos_requests
        .with_label_values(&["", "refused_overload"]);
    keel_server::metrics::grpc::enable_handling_histogram();
    keel_server::metrics::grpc::Call::start("/etcdserverpb.KV/Range")
        .unwrap()
        .finish(0);
    keel_server::metrics::network().record_rpc(
        "2",
        10,
        Some(5),
        std::time::Duration::from_millis(1),
    );
    let text = keel_server::metrics::encode();
    let exported: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 10);
    let mut checked = 0;
    for panel in panels {
        let expr = panel["targets"][0]["expr"].as_str().unwrap();
        for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            let known_prefix = ["etcd_", "grpc_", "keel_", "process_"]
                .iter()
                .any(|p| word.starts_with(p));
            let label = ["grpc_type", "grpc_service", "grpc_method", "grpc_code"].contains(&word);
            if !known_prefix || label {
                continue;
            }
            let base = ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| word.strip_suffix(s))
                .unwrap_or(word);
            assert!(
                exported.contains(&word) || exported.contains(&base),
                "panel {:?} queries {word}, which Keel does not export",
                panel["title"]
            );
            checked += 1;
        }
    }
    assert!(checked >= panels.len(), "every panel names a metric");
}
