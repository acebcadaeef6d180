#!/usr/bin/env bash
# The QoS measurement of docs/benchmarks.md ("qos", issue 17): 3 members on 127.0.0.1, a noisy
# client keeping 64 puts in flight under /noisy/ and a good client writing /good/ keys one at a
# time, with the issue's rule `noisy-writers` (rate 200, burst 200) and without any rule.
# Both clients talk to the first member. Prints one JSON line per run.
#
#   scripts/qos-bench.sh [SECONDS]     (default 15 s per run)
#
# Environment: KEEL_BIN, KEEL_BENCH (default: the release binaries of $CARGO_TARGET_DIR or
# target/), CLIENT_BASE/PEER_BASE (default 23378/23478), KEEL_CLUSTER_DIR (default
# /tmp/keel-qos-bench), QOS_ARGS (extra flags of the rule round, e.g. `--qos-refusal-delay 0s`).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TARGET="${CARGO_TARGET_DIR:-$REPO/target}"
export KEEL_BIN="${KEEL_BIN:-$TARGET/release/keel}"
BENCH="${KEEL_BENCH:-$TARGET/release/keel-bench}"
export CLIENT_BASE="${CLIENT_BASE:-23378}" PEER_BASE="${PEER_BASE:-23478}"
export KEEL_CLUSTER_DIR="${KEEL_CLUSTER_DIR:-/tmp/keel-qos-bench}"
SECS="${1:-15}"
EP="127.0.0.1:$((CLIENT_BASE + 1))"
RULES="$(mktemp --suffix .yaml)"
trap 'bash "$REPO/scripts/cluster.sh" stop >/dev/null 2>&1 || true; rm -f "$RULES"' EXIT
cat >"$RULES" <<'YAML'
rules:
  - name: noisy-writers
    match:
      methods: [Put, Txn, DeleteRange]
      key_prefix: /noisy/
    rate: 200
    burst: 200
    priority: low
YAML

tag() { # tag <run> <client>: keel-bench's JSON report as one line with its labels
    python3 -c 'import json, sys; print(json.dumps({"run": sys.argv[1], "client": sys.argv[2], "summary": json.load(sys.stdin)}))' "$1" "$2"
}
good() { # good <label>
    "$BENCH" --endpoints "$EP" --clients 1 --conns 1 --key-prefix /good/ --key-size 8 \
        --key-space-size 1000000 --sequential-keys --val-size 256 --duration "${SECS}s" --json put |
        tag "$1" good
}
noisy() { # noisy <label>
    "$BENCH" --endpoints "$EP" --clients 64 --conns 4 --key-prefix /noisy/ --key-size 8 \
        --key-space-size 1000000 --val-size 256 --duration "$((SECS + 2))s" --json put |
        tag "$1" noisy
}
round() { # round <label> [keel args]
    local label="$1"; shift
    KEEL_ARGS="$*" bash "$REPO/scripts/cluster.sh" start 3 >/dev/null
    sleep 2 # the rule file is proposed once a leader is known
    good "$label-alone"
    noisy "$label" >"$KEEL_CLUSTER_DIR.noisy" &
    local pid=$!
    sleep 1
    good "$label-with-noisy"
    wait "$pid"
    cat "$KEEL_CLUSTER_DIR.noisy"
    rm -f "$KEEL_CLUSTER_DIR.noisy"
    bash "$REPO/scripts/cluster.sh" stop >/dev/null
}
# shellcheck disable=SC2086 # QOS_ARGS is a flag list on purpose
round rule --qos-config "$RULES" ${QOS_ARGS:-}
[ -n "${SKIP_NO_RULE:-}" ] || round no-rule
