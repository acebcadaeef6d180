#!/usr/bin/env bash
# A local Keel cluster of 3 or 5 members on 127.0.0.1, for trying things out.
#
#   scripts/cluster.sh start [3|5] [--tls]   start N members (default 3) and print the client
#                                    endpoints; --tls: a CA generated with openssl in
#                                    $KEEL_CLUSTER_DIR/tls, https:// client and peer URLs with
#                                    client and peer certificate auth (docs/security.md)
#   scripts/cluster.sh status        etcdctl endpoint status of every member
#   scripts/cluster.sh stop          SIGTERM every member (SIGKILL after 15 s) and remove the state
#
# Member i (1..N) is named keel<i>, serves clients on 127.0.0.1:<CLIENT_BASE+i> and peers on
# 127.0.0.1:<PEER_BASE+i>, keeps its data in $KEEL_CLUSTER_DIR/keel<i> and logs to
# $KEEL_CLUSTER_DIR/keel<i>.log. All members get the same --initial-cluster and
# --initial-cluster-state new, so they form one cluster.
#
# Environment: KEEL_CLUSTER_DIR (default /tmp/keel-cluster), KEEL_BIN (default: the release
# binary, built with `cargo build --release --bin keel` when missing), CLIENT_BASE (default
# 22378: member i gets 22378+i), PEER_BASE (default 22478), KEEL_ARGS (extra flags for every member).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${KEEL_CLUSTER_DIR:-/tmp/keel-cluster}"
CLIENT_BASE="${CLIENT_BASE:-22378}"
PEER_BASE="${PEER_BASE:-22478}"
READY_TIMEOUT_S=30
STOP_TIMEOUT_S=15

die() { echo "cluster.sh: $*" >&2; exit 1; }

keel_bin() {
    if [ -n "${KEEL_BIN:-}" ]; then echo "$KEEL_BIN"; return; fi
    local target="${CARGO_TARGET_DIR:-$REPO/target}"
    local bin="$target/release/keel"
    if [ ! -x "$bin" ]; then
        echo "building $bin ..." >&2
        (cd "$REPO" && cargo build --release --bin keel -j "${CARGO_BUILD_JOBS:-2}" >&2)
    fi
    echo "$bin"
}

scheme() { if [ -e "$DIR/tls/ca.pem" ]; then echo https; else echo http; fi; }

endpoints() { # endpoints <n>
    local out=() i s; s="$(scheme)"
    for i in $(seq 1 "$1"); do out+=("$s://127.0.0.1:$((CLIENT_BASE + i))"); done
    (IFS=,; echo "${out[*]}")
}

# etcdctl's TLS flags for this cluster (none without --tls).
ctl_tls() {
    [ -e "$DIR/tls/ca.pem" ] || return 0
    echo "--cacert=$DIR/tls/ca.pem --cert=$DIR/tls/client.pem --key=$DIR/tls/client-key.pem"
}

# A CA, one certificate per member (server and peer, SANs 127.0.0.1 and localhost) and a
# client certificate (CN root), all EC P-256, valid for 30 days.
make_certs() { # make_certs <n>
    local d="$DIR/tls" i
    command -v openssl >/dev/null || die "--tls needs openssl (apt-get install -y openssl)"
    mkdir -p "$d"
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n' >"$d/ext.cnf"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
        -subj "/CN=keel-local-ca" -keyout "$d/ca-key.pem" -out "$d/ca.pem" 2>/dev/null
    for name in $(for i in $(seq 1 "$1"); do echo "keel$i"; done) client; do
        local cn="$name"; [ "$name" = client ] && cn=root
        openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$cn" \
            -keyout "$d/$name-key.pem" -out "$d/$name.csr" 2>/dev/null
        openssl x509 -req -in "$d/$name.csr" -CA "$d/ca.pem" -CAkey "$d/ca-key.pem" \
            -CAcreateserial -days 30 -extfile "$d/ext.cnf" -out "$d/$name.pem" 2>/dev/null
    done
}

members() { cat "$DIR/members" 2>/dev/null || echo 0; }

start() {
    local n="${1:-3}" tls="${2:-}"
    [ "$n" = 3 ] || [ "$n" = 5 ] || die "start takes 3 or 5 members, not $n"
    [ -z "$tls" ] || [ "$tls" = --tls ] || die "unknown option $tls (only --tls)"
    [ "$(members)" = 0 ] || die "a cluster is already running in $DIR (scripts/cluster.sh stop first)"
    local bin; bin="$(keel_bin)"
    mkdir -p "$DIR"
    [ -z "$tls" ] || make_certs "$n"
    local s; s="$(scheme)"
    local initial=() i
    for i in $(seq 1 "$n"); do initial+=("keel$i=$s://127.0.0.1:$((PEER_BASE + i))"); done
    local initial_cluster; initial_cluster="$(IFS=,; echo "${initial[*]}")"
    for i in $(seq 1 "$n"); do
        local client="$s://127.0.0.1:$((CLIENT_BASE + i))" peer="$s://127.0.0.1:$((PEER_BASE + i))"
        local tls_flags=()
        if [ -n "$tls" ]; then
            local d="$DIR/tls"
            tls_flags=(--cert-file="$d/keel$i.pem" --key-file="$d/keel$i-key.pem"
                --trusted-ca-file="$d/ca.pem" --client-cert-auth
                --peer-cert-file="$d/keel$i.pem" --peer-key-file="$d/keel$i-key.pem"
                --peer-trusted-ca-file="$d/ca.pem" --peer-client-cert-auth)
        fi
        # shellcheck disable=SC2086 # KEEL_ARGS is a flag list on purpose
        nohup "$bin" --name "keel$i" --data-dir "$DIR/keel$i" \
            --listen-client-urls "$client" --advertise-client-urls "$client" \
            --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
            --initial-cluster "$initial_cluster" --initial-cluster-state new \
            --initial-cluster-token keel-local "${tls_flags[@]}" ${KEEL_ARGS:-} \
            >"$DIR/keel$i.log" 2>&1 </dev/null &
        echo $! >"$DIR/keel$i.pid"
    done
    echo "$n" >"$DIR/members"
    local eps; eps="$(endpoints "$n")"
    local deadline=$(($(date +%s) + READY_TIMEOUT_S))
    # shellcheck disable=SC2046 # ctl_tls is a flag list on purpose
    until ETCDCTL_API=3 etcdctl --endpoints="$eps" $(ctl_tls) --dial-timeout=1s \
        --command-timeout=2s endpoint health >/dev/null 2>&1; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            echo "cluster.sh: not healthy within ${READY_TIMEOUT_S}s; logs in $DIR" >&2
            tail -n 5 "$DIR"/keel*.log >&2 || true
            exit 1
        fi
        sleep 0.3
    done
    echo "started $n members (data and logs in $DIR)"
    echo "client endpoints: $eps"
    echo "try: ETCDCTL_API=3 etcdctl --endpoints=$eps $(ctl_tls) member list -w table"
}

status() {
    local n; n="$(members)"
    [ "$n" != 0 ] || die "no cluster is running in $DIR"
    # shellcheck disable=SC2046 # ctl_tls is a flag list on purpose
    ETCDCTL_API=3 etcdctl --endpoints="$(endpoints "$n")" $(ctl_tls) endpoint status -w table
}

stop() {
    local pidfile pid
    for pidfile in "$DIR"/keel*.pid; do
        [ -e "$pidfile" ] || continue
        pid="$(cat "$pidfile")"
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pidfile in "$DIR"/keel*.pid; do
        [ -e "$pidfile" ] || continue
        pid="$(cat "$pidfile")"
        local deadline=$(($(date +%s) + STOP_TIMEOUT_S))
        while kill -0 "$pid" 2>/dev/null; do
            if [ "$(date +%s)" -ge "$deadline" ]; then kill -KILL "$pid" 2>/dev/null || true; break; fi
            sleep 0.1
        done
    done
    rm -rf "$DIR"
    echo "stopped"
}

case "${1:-}" in
    start) if [ "${2:-}" = --tls ]; then start 3 --tls; else start "${2:-3}" "${3:-}"; fi ;;
    status) status ;;
    stop) stop ;;
    *) sed -n '2,17p' "${BASH_SOURCE[0]}"; exit 2 ;;
esac
