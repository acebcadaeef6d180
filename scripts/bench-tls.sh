#!/usr/bin/env bash
# TLS cost on 3 members: put and linearizable range throughput with keel-bench, plaintext vs
# TLS (https client and peer URLs, client and peer certificate auth: scripts/cluster.sh start 3
# --tls), rounds alternating plain, tls, plain, tls... on fresh clusters (docs/benchmarks.md).
#
#   scripts/bench-tls.sh            ROUNDS (default 2) x {plain, tls} x {put, range-l}
#
# Environment: KEEL_BIN, KEEL_BENCH_BIN (default: release binaries in $CARGO_TARGET_DIR or
# target/), ROUNDS, DURATION (default 15s per run), CLIENTS (64), CONNS (16), OUT (results dir,
# default /tmp/keel-bench-tls). Prints one TSV line per run: mode workload round req/s p50 p99
# errors, and the members' CPU per request (utime + stime of the 3 processes over the run,
# from /proc/<pid>/stat, divided by the successful requests), µs.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TARGET="${CARGO_TARGET_DIR:-$REPO/target}"
export KEEL_BIN="${KEEL_BIN:-$TARGET/release/keel}"
BENCH="${KEEL_BENCH_BIN:-$TARGET/release/keel-bench}"
ROUNDS="${ROUNDS:-2}" DURATION="${DURATION:-15s}" CLIENTS="${CLIENTS:-64}" CONNS="${CONNS:-16}"
OUT="${OUT:-/tmp/keel-bench-tls}"
export KEEL_CLUSTER_DIR="$OUT/cluster" CLIENT_BASE="${CLIENT_BASE:-33370}" PEER_BASE="${PEER_BASE:-33470}"
mkdir -p "$OUT"
trap 'bash "$REPO/scripts/cluster.sh" stop >/dev/null 2>&1 || true' EXIT
# CPU ticks (utime + stime) of every member process now.
cpu_ticks() {
    local total=0 f
    for f in "$KEEL_CLUSTER_DIR"/keel*.pid; do
        total=$((total + $(awk '{print $14 + $15}' "/proc/$(cat "$f")/stat")))
    done
    echo "$total"
}
HZ="$(getconf CLK_TCK)"
printf 'mode\tworkload\tround\treq_per_s\tp50_ms\tp99_ms\terrors\tcpu_us_per_op\n'
for round in $(seq 1 "$ROUNDS"); do
    for mode in plain tls; do
        flag=(); [ "$mode" = tls ] && flag=(--tls)
        bash "$REPO/scripts/cluster.sh" start 3 "${flag[@]}" >/dev/null
        eps="127.0.0.1:$((CLIENT_BASE + 1)),127.0.0.1:$((CLIENT_BASE + 2)),127.0.0.1:$((CLIENT_BASE + 3))"
        tls=(); d="$KEEL_CLUSTER_DIR/tls"
        [ "$mode" = tls ] && tls=(--cacert "$d/ca.pem" --cert "$d/client.pem" --key "$d/client-key.pem")
        for workload in put range-l; do
            args=(put); [ "$workload" = range-l ] && args=(range foo --consistency l)
            json="$OUT/$mode-$workload-$round.json"
            before="$(cpu_ticks)"
            "$BENCH" --endpoints "$eps" "${tls[@]}" --clients "$CLIENTS" --conns "$CONNS" \
                --duration "$DURATION" --key-size 16 --val-size 256 --key-space-size 100000 \
                --json "${args[@]}" >"$json"
            ticks=$(($(cpu_ticks) - before))
            python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); l=s["latency_ms"]
cpu = int(sys.argv[5]) / int(sys.argv[6]) * 1e6 / max(s["ok"], 1)
print("\t".join([sys.argv[2], sys.argv[3], sys.argv[4], "%.0f" % s["requests_per_s"], "%.2f" % l["p50"], "%.2f" % l["p99"], str(sum(s["errors"].values())), "%.0f" % cpu]))' \
                "$json" "$mode" "$workload" "$round" "$ticks" "$HZ"
        done
        bash "$REPO/scripts/cluster.sh" stop >/dev/null
    done
done
