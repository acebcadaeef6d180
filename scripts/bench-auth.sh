#!/usr/bin/env bash
# Auth benchmark (issue 12; docs/benchmarks.md "Auth"): put throughput without auth and as a
# non-root user with auth on (one permission-cache lookup per put), and Authenticate at 16
# clients, on one Keel member and one etcd 3.4.23 member, both on 127.0.0.1, both with
# bcrypt cost 10 and simple tokens.
#
#   KEEL_BIN=target/release/keel KEEL_BENCH_BIN=target/release/keel-bench scripts/bench-auth.sh
#
# Knobs: TOTAL (puts per run, 20000), CLIENTS (64), CONNS (16), AUTHS (Authenticates, 320),
# PORT (client port; the peer port is PORT+1), ETCD_BIN (/usr/bin/etcd). Prints one TSV line
# per run: server, workload, requests/s, p50 ms, p99 ms, errors.
set -euo pipefail
KEEL_BIN=${KEEL_BIN:-target/release/keel}
BENCH=${KEEL_BENCH_BIN:-target/release/keel-bench}
ETCD_BIN=${ETCD_BIN:-/usr/bin/etcd}
TOTAL=${TOTAL:-20000}
CLIENTS=${CLIENTS:-64}
CONNS=${CONNS:-16}
AUTHS=${AUTHS:-320}
PORT=${PORT:-34379}
EP=127.0.0.1:$PORT
work=$(mktemp -d)
pid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

ctl() { ETCDCTL_API=3 etcdctl --endpoints="$EP" "$@" >/dev/null; }

start() { # start <name> <binary>
    local peer=http://127.0.0.1:$((PORT + 1))
    "$2" --name "$1" --data-dir "$work/$1" --listen-client-urls "http://$EP" \
        --advertise-client-urls "http://$EP" --listen-peer-urls "$peer" \
        --initial-advertise-peer-urls "$peer" --initial-cluster "$1=$peer" \
        >"$work/$1.log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do
        ctl get probe 2>/dev/null && return 0
        sleep 0.1
    done
    echo "$1 did not start" >&2
    tail "$work/$1.log" >&2
    exit 1
}

stop() { kill "$pid" && wait "$pid" 2>/dev/null || true; pid=; }

bench() { # bench <server> <label> <keel-bench args...>
    local server=$1 label=$2
    shift 2
    "$BENCH" --endpoints "$EP" --json "$@" | python3 -c '
import json, sys
r = json.load(sys.stdin)
lat = r["latency_ms"]
row = [sys.argv[1], sys.argv[2], round(r["requests_per_s"]), round(lat["p50"], 2),
       round(lat["p99"], 2), sum(r["errors"].values())]
print("\t".join(str(x) for x in row))
' "$server" "$label"
}

echo -e "server\tworkload\treq/s\tp50 ms\tp99 ms\terrors"
for server in keel etcd; do
    bin=$KEEL_BIN
    [ "$server" = etcd ] && bin=$ETCD_BIN
    start "$server" "$bin"
    put=(--clients "$CLIENTS" --conns "$CONNS" --total "$TOTAL" --key-size 16
        --key-space-size 100000 --val-size 256 put)
    bench "$server" "put, auth off" "${put[@]}"
    ctl user add root --new-user-password=rootpw
    ctl role add all
    ctl role grant-permission all readwrite --from-key ''
    ctl user add bench --new-user-password=benchpw
    ctl user grant-role bench all
    ctl auth enable
    bench "$server" "put, auth on, user bench" --user bench:benchpw "${put[@]}"
    bench "$server" "authenticate, 16 clients" --user bench:benchpw --clients 16 --conns 4 \
        --total "$AUTHS" authenticate
    stop
done
