#!/usr/bin/env bash
# Keel vs etcd 3.4.23, side by side on this machine, interleaved (issue 6).
#
#   1. installs etcd 3.4.23 (apt: etcd-server, etcd-client) and builds etcd's own Go load
#      generator `benchmark` (tools/benchmark of Debian's etcd 3.4.23 source package, GOPATH
#      mode with Debian's Go and golang-etcd-server-dev, offline) into $KEEL_BENCH_DIR;
#   2. builds `keel` and `keel-bench` in release (or takes KEEL_BIN / KEEL_BENCH_BIN);
#   3. for each topology (1 and 3 members on 127.0.0.1) and each round, starts a fresh etcd
#      cluster, runs the workloads, stops it, then does the same with Keel (etcd, Keel, etcd,
#      Keel, ...), with etcd's `benchmark` and/or `keel-bench` as the load generator;
#   4. measures server CPU µs per request from /proc/<pid>/stat (utime + stime of all members);
#   5. prints a markdown table of medians [min-max] and the Keel/etcd ratio per row, and keeps
#      every raw output under $OUT.
# `bench-vs-etcd.sh setup` does steps 1 and 2 only. Steps already done (etcd installed,
# benchmark built) are skipped. Only the processes this
# script started are stopped (by PID, also on exit or Ctrl-C).
#
# Workloads (16 B keys from a 100k key space, 256 B values, as etcd's performance docs):
#   put-c1 (1 client, 1 conn), put-c64 (64 clients, 16 conns), put-c256 (256 clients, 64
#   conns), range-l-c64 / range-s-c64 (linearizable / serializable single-key range, 64
#   clients, 16 conns).
#
# Environment (defaults in brackets):
#   ROUNDS [3]            rounds per (topology, server); the table shows medians over rounds
#   GENERATOR [both]      etcd | keel | both: the load generator(s)
#   TOPOLOGIES ["1 3"]    cluster sizes to run
#   ROWS [all five]       e.g. "put-c64 put-c256" to run some workloads only
#   QUICK [0]             1: small totals, a full run fits in a few minutes
#   PORT_BASE [32379]     client port of member i is PORT_BASE+2i, peer port PORT_BASE+2i+1
#   KEEL_BENCH_DIR [~/.cache/keel-bench]  etcd source, benchmark binary, results
#   OUT [$KEEL_BENCH_DIR/results/<UTC time>]  raw outputs, results.tsv, table.md
#   KEEL_BIN, KEEL_BENCH_BIN  prebuilt binaries (skip the cargo build)
#   ETCD_BENCH_BIN        a prebuilt etcd `benchmark` (skips building it)
#   SEQ_TOTAL [5000] PUT_TOTAL_64 [30000] PUT_TOTAL_256 [40000] RANGE_TOTAL [60000]
#   RUN_TIMEOUT [300]     seconds one load-generator run may take
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KEEL_BENCH_DIR="${KEEL_BENCH_DIR:-$HOME/.cache/keel-bench}"
ROUNDS="${ROUNDS:-3}"
GENERATOR="${GENERATOR:-both}"
TOPOLOGIES="${TOPOLOGIES:-1 3}"
ROWS="${ROWS:-put-c1 put-c64 put-c256 range-l-c64 range-s-c64}"
QUICK="${QUICK:-0}"
PORT_BASE="${PORT_BASE:-32379}"
RUN_TIMEOUT="${RUN_TIMEOUT:-300}"
KEY_SIZE=16
VAL_SIZE=256
KEY_SPACE=100000
if [ "$QUICK" = 1 ]; then
    SEQ_TOTAL="${SEQ_TOTAL:-1000}" PUT_TOTAL_64="${PUT_TOTAL_64:-3000}"
    PUT_TOTAL_256="${PUT_TOTAL_256:-5000}" RANGE_TOTAL="${RANGE_TOTAL:-5000}"
else
    SEQ_TOTAL="${SEQ_TOTAL:-5000}" PUT_TOTAL_64="${PUT_TOTAL_64:-30000}"
    PUT_TOTAL_256="${PUT_TOTAL_256:-40000}" RANGE_TOTAL="${RANGE_TOTAL:-60000}"
fi
ETCD_VERSION=3.4.23
ETCD_SRC_VERSION=3.4.23-4
ETCD_ORIG_SHA256=055c608c4898d25f23aefbc845ff074bf5e8a07e61ed41dbd5cc4d4f59c93093
ETCD_BENCH_BIN="${ETCD_BENCH_BIN:-$KEEL_BENCH_DIR/etcd-benchmark}"
OUT="${OUT:-$KEEL_BENCH_DIR/results/$(date -u +%Y%m%dT%H%M%SZ)}"
READY_TIMEOUT_S=30
CLK_TCK="$(getconf CLK_TCK)"

case "$GENERATOR" in etcd | keel | both) ;; *) echo "GENERATOR must be etcd, keel or both" >&2; exit 2 ;; esac
setup_only=0
case "${1:-}" in
    "") ;;
    setup) setup_only=1 ;;
    -h | --help) sed -n '2,42p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "usage: $0 [setup | --help]" >&2; exit 2 ;;
esac

log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }
mkdir -p "$KEEL_BENCH_DIR" "$OUT"
workdir="$(mktemp -d "${TMPDIR:-/tmp}/keel-vs-etcd.XXXXXX")"

# ---------------------------------------------------------------------------------------------
# processes we started, stopped by PID only

server_pids=()
stop_servers() {
    local p
    for p in "${server_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${server_pids[@]}"; do
        for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    server_pids=()
}
cleanup() {
    stop_servers
    rm -rf "$workdir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------------------------------------
# 1. etcd 3.4.23 and its `benchmark`

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
apt_updated=0
apt_install() { # installs the packages that are not installed yet (never upgrades others)
    local pkg missing=()
    for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
    [ "${#missing[@]}" -gt 0 ] || return 0
    set -- "${missing[@]}"
    if [ "$apt_updated" = 0 ]; then as_root apt-get update -qq; apt_updated=1; fi
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends "$@"
}

install_etcd() {
    if command -v etcd >/dev/null && etcd --version 2>/dev/null | grep -q "etcd Version: $ETCD_VERSION" &&
        command -v etcdctl >/dev/null; then
        return 0
    fi
    log "installing etcd $ETCD_VERSION (apt: etcd-server etcd-client)"
    apt_install etcd-server etcd-client
    etcd --version | grep -q "etcd Version: $ETCD_VERSION" ||
        { echo "apt installed $(etcd --version | head -1), not $ETCD_VERSION" >&2; exit 1; }
}

build_etcd_benchmark() {
    if [ -x "$ETCD_BENCH_BIN" ] && "$ETCD_BENCH_BIN" --help >/dev/null 2>&1; then return 0; fi
    log "building etcd's benchmark tool into $ETCD_BENCH_BIN"
    # tools/benchmark is not in golang-etcd-server-dev, but its imports (clientv3, pkg/report,
    # grpc, cobra, pb.v1, ...) are: build it in GOPATH mode with those packages.
    apt_install golang-go golang-etcd-server-dev
    local src="$KEEL_BENCH_DIR/src" orig
    orig="$src/etcd_${ETCD_VERSION}.orig.tar.gz"
    mkdir -p "$src/apt/lists/partial" "$src/apt/cache/archives/partial"
    if ! echo "$ETCD_ORIG_SHA256  $orig" | sha256sum -c - >/dev/null 2>&1; then
        # A private apt configuration with a deb-src line for the archive and release this
        # machine already uses; the system's sources stay untouched.
        local uri suite
        uri=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
        [ -n "$uri" ] || uri=$(awk '$1=="deb"{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
        suite=$(. /etc/os-release && echo "$VERSION_CODENAME")
        echo "deb-src $uri $suite main" >"$src/apt/sources.list"
        local opts=(-o "Dir::Etc::SourceList=$src/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
            -o "Dir::State::Lists=$src/apt/lists" -o "Dir::Cache=$src/apt/cache")
        apt-get "${opts[@]}" update -qq
        (cd "$src" && apt-get "${opts[@]}" source --download-only "etcd=$ETCD_SRC_VERSION")
        echo "$ETCD_ORIG_SHA256  $orig" | sha256sum -c -
    fi
    local gopath="$src/gopath"
    rm -rf "$gopath" "$src/etcd-$ETCD_VERSION"
    mkdir -p "$gopath/src/go.etcd.io/etcd/tools"
    tar xzf "$orig" -C "$src" "etcd-$ETCD_VERSION/tools/benchmark"
    cp -r "$src/etcd-$ETCD_VERSION/tools/benchmark" "$gopath/src/go.etcd.io/etcd/tools/"
    (cd "$gopath/src/go.etcd.io/etcd/tools/benchmark" &&
        GO111MODULE=off GOPATH="$gopath:/usr/share/gocode" GOCACHE="$src/gocache" GOFLAGS= \
            go build -o "$ETCD_BENCH_BIN" .)
    "$ETCD_BENCH_BIN" --help >/dev/null
}

# ---------------------------------------------------------------------------------------------
# 2. keel and keel-bench

build_keel() {
    if [ -n "${KEEL_BIN:-}" ] && [ -n "${KEEL_BENCH_BIN:-}" ]; then return 0; fi
    log "building keel and keel-bench (release)"
    (cd "$REPO" && cargo build --release -p keel-server --bin keel -p keel-benches --bin keel-bench)
    local target
    target="$(cd "$REPO" && cargo metadata --format-version 1 --no-deps |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
    KEEL_BIN="${KEEL_BIN:-$target/release/keel}"
    KEEL_BENCH_BIN="${KEEL_BENCH_BIN:-$target/release/keel-bench}"
}

# ---------------------------------------------------------------------------------------------
# 3. clusters

endpoints_of() { # n -> host:port,...
    local i eps=()
    for ((i = 0; i < $1; i++)); do eps+=("127.0.0.1:$((PORT_BASE + 2 * i))"); done
    (IFS=,; echo "${eps[*]}")
}

start_cluster() { # server n
    local server=$1 n=$2 i initial="" bin
    for ((i = 0; i < n; i++)); do initial+="${initial:+,}m$i=http://127.0.0.1:$((PORT_BASE + 2 * i + 1))"; done
    if [ "$server" = etcd ]; then bin=etcd; else bin="$KEEL_BIN"; fi
    local dir="$workdir/$server-$n-$RANDOM"
    mkdir -p "$dir"
    for ((i = 0; i < n; i++)); do
        local c="http://127.0.0.1:$((PORT_BASE + 2 * i))" p="http://127.0.0.1:$((PORT_BASE + 2 * i + 1))"
        local extra=()
        if [ "$server" = etcd ]; then extra=(--logger zap --log-outputs stderr --log-level warn); fi
        "$bin" --name "m$i" --data-dir "$dir/m$i" \
            --listen-client-urls "$c" --advertise-client-urls "$c" \
            --listen-peer-urls "$p" --initial-advertise-peer-urls "$p" \
            --initial-cluster "$initial" --initial-cluster-state new \
            --initial-cluster-token "bench-$server-$n" "${extra[@]}" >"$dir/m$i.log" 2>&1 &
        server_pids+=($!)
    done
    local eps deadline=$(($(date +%s) + READY_TIMEOUT_S))
    eps="$(endpoints_of "$n")"
    while ! ETCDCTL_API=3 etcdctl --endpoints="$eps" --dial-timeout=1s --command-timeout=2s \
        endpoint health >/dev/null 2>&1; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            echo "$server ($n members) not healthy within ${READY_TIMEOUT_S}s; logs:" >&2
            tail -n 20 "$dir"/*.log >&2
            exit 1
        fi
        sleep 0.2
    done
    # The single-key range rows read this key.
    ETCDCTL_API=3 etcdctl --endpoints="$eps" put bench-range-key "$(head -c "$VAL_SIZE" /dev/zero | tr '\0' v)" >/dev/null
}

server_cpu_ticks() { # utime + stime of every member we started, clock ticks
    local p t=0
    for p in "${server_pids[@]}"; do
        if [ -r "/proc/$p/stat" ]; then
            # Fields after the ")" that ends the command name: utime and stime are 12th/13th.
            t=$((t + $(sed 's/^.*) //' "/proc/$p/stat" | awk '{print $12 + $13}')))
        fi
    done
    echo "$t"
}

# ---------------------------------------------------------------------------------------------
# 4. workloads

row_args() { # generator row -> the load generator's arguments (without endpoints)
    local gen=$1 row=$2
    local put=(put --key-size="$KEY_SIZE" --val-size="$VAL_SIZE" --key-space-size="$KEY_SPACE")
    case "$row" in
        put-c1) echo --clients=1 --conns=1 "${put[@]}" --total="$SEQ_TOTAL" ;;
        put-c64) echo --clients=64 --conns=16 "${put[@]}" --total="$PUT_TOTAL_64" ;;
        put-c256) echo --clients=256 --conns=64 "${put[@]}" --total="$PUT_TOTAL_256" ;;
        range-l-c64 | range-s-c64)
            local c=${row#range-}
            c=${c%%-*}
            if [ "$gen" = etcd ]; then
                echo --clients=64 --conns=16 range bench-range-key --consistency="$c" --total="$RANGE_TOTAL"
            else
                echo --clients=64 --conns=16 range bench-range-key --consistency="$c" --total="$RANGE_TOTAL"
            fi
            ;;
        *) echo "unknown row $row" >&2; return 1 ;;
    esac
}

# Runs one row; appends "gen members row server round req/s p50 p99 p99.9 cpu_us_op errors"
# to results.tsv (latencies in ms).
run_row() { # gen n row server round
    local gen=$1 n=$2 row=$3 server=$4 round=$5 eps args raw
    eps="$(endpoints_of "$n")"
    read -r -a args <<<"$(row_args "$gen" "$row")"
    raw="$OUT/$gen.$n-member.$row.$server.round$round.txt"
    local c0 c1
    c0=$(server_cpu_ticks)
    if [ "$gen" = etcd ]; then
        # stderr holds grpc-go's connection log: keep it apart from the report.
        timeout "$RUN_TIMEOUT" "$ETCD_BENCH_BIN" --endpoints="$eps" --precise "${args[@]}" 2>"$raw.stderr" |
            tr '\r' '\n' | grep -v -E '^\s*$|[0-9]+ / [0-9]+' >"$raw" || true
    else
        timeout "$RUN_TIMEOUT" "$KEEL_BENCH_BIN" --endpoints="$eps" --json "${args[@]}" >"$raw" 2>&1 || true
    fi
    c1=$(server_cpu_ticks)
    local line
    if ! line="$(python3 - "$gen" "$raw" "$((c1 - c0))" "$CLK_TCK" "${args[@]}" <<'EOF'
import json, re, sys
gen, path, ticks, tck = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
total = next(int(a.split("=", 1)[1]) for a in sys.argv[5:] if a.startswith("--total="))
text = open(path).read()
if gen == "keel":
    r = json.loads(text[text.index("{"):])
    ok, rps = r["ok"], r["requests_per_s"]
    lat = r["latency_ms"]
    p50, p99, p999 = lat["p50"], lat["p99"], lat["p99_9"]
    errors = sum(r["errors"].values())
else:
    def secs(pat, optional=False):
        m = re.search(pat, text, re.M)
        if not m:
            if optional:
                return float("nan")
            raise SystemExit(f"no {pat!r} in {path}")
        return float(m.group(1))
    rps = secs(r"Requests/sec:\s+([0-9.]+)")
    p50 = secs(r"^\s*50% in ([0-9.]+) secs") * 1000
    p99 = secs(r"^\s*99% in ([0-9.]+) secs") * 1000
    # etcd prints the 99.9th percentile only from 1,000 requests on.
    p999 = secs(r"^\s*99\.9% in ([0-9.]+) secs", optional=True) * 1000
    dist = text.split("Error distribution:", 1)
    errors = sum(int(n) for n in re.findall(r"\[(\d+)\]", dist[1])) if len(dist) > 1 else 0
    ok = total - errors
cpu_us = ticks * 1e6 / tck / max(ok, 1)
print(f"{rps:.1f}\t{p50:.3f}\t{p99:.3f}\t{p999:.3f}\t{cpu_us:.1f}\t{errors}")
EOF
)"; then
        log "could not read $raw (see it for the load generator's output)"
        return 0
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$gen" "$n" "$row" "$server" "$round" "$line" >>"$OUT/results.tsv"
    log "$server, $n member(s), $row by $gen's generator, round $round: $(echo "$line" | awk -F'\t' '{printf "%s req/s, p50 %s ms, p99 %s ms, p99.9 %s ms, %s µs CPU/op, %s errors", $1, $2, $3, $4, $5, $6}')"
}

# ---------------------------------------------------------------------------------------------
# 5. the table

print_table() {
    python3 - "$OUT/results.tsv" <<'EOF'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    gen, n, row, server, rnd, rps, p50, p99, p999, cpu, errors = line.rstrip("\n").split("\t")
    rows[(gen, int(n), row, server)].append(
        dict(rps=float(rps), p50=float(p50), p99=float(p99), p999=float(p999), cpu=float(cpu),
             errors=int(errors)))
metrics = [("rps", "req/s", 0), ("p50", "p50 ms", 2), ("p99", "p99 ms", 1),
           ("p999", "p99.9 ms", 1), ("cpu", "CPU µs/op", 0)]
def cell(vals, digits):
    f = lambda v: f"{v:,.{digits}f}"
    return f"{f(statistics.median(vals))} [{f(min(vals))}–{f(max(vals))}]"
head = "| generator | members | workload | " + " | ".join(
    f"{label} etcd | {label} Keel | Keel/etcd" for _, label, _ in metrics) + " | errors etcd/Keel |"
print(head)
print("|" + "---|" * (head.count("|") - 1))
order = ["put-c1", "put-c64", "put-c256", "range-l-c64", "range-s-c64"]
for gen, n, row in sorted({k[:3] for k in rows}, key=lambda k: (k[0], k[1], order.index(k[2]) if k[2] in order else 99)):
    e, k = rows.get((gen, n, row, "etcd"), []), rows.get((gen, n, row, "keel"), [])
    cells = []
    for key, _, digits in metrics:
        ev, kv = [r[key] for r in e], [r[key] for r in k]
        ratio = (f"{statistics.median(kv) / statistics.median(ev):.2f}×"
                 if ev and kv and statistics.median(ev) else "–")
        cells += [cell(ev, digits) if ev else "–", cell(kv, digits) if kv else "–", ratio]
    errs = f"{sum(r['errors'] for r in e)}/{sum(r['errors'] for r in k)}"
    print(f"| {gen} | {n} | {row} | " + " | ".join(cells) + f" | {errs} |")
rounds = max((len(v) for v in rows.values()), default=0)
print(f"\nMedian [min–max] over {rounds} round(s); ratios are Keel/etcd of the medians "
      "(above 1 is better for req/s, below 1 is better for latency and CPU).")
EOF
}

# ---------------------------------------------------------------------------------------------
# main

install_etcd
[ "$GENERATOR" = keel ] || build_etcd_benchmark
build_keel
if [ "$setup_only" = 1 ]; then
    log "ready: etcd $(etcd --version | head -1), $ETCD_BENCH_BIN, $KEEL_BIN, $KEEL_BENCH_BIN"
    exit 0
fi
generators=()
[ "$GENERATOR" = keel ] || generators+=(etcd)
[ "$GENERATOR" = etcd ] || generators+=(keel)
read -r -a rows <<<"$ROWS"
{
    echo "# date: $(date -u +%FT%TZ)"
    echo "# host: $(nproc) cores, $(uname -r); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "# etcd: $(etcd --version | head -1); keel: $KEEL_BIN ($(cd "$REPO" && git rev-parse --short HEAD 2>/dev/null || echo '?'))"
    echo "# rounds $ROUNDS, generators ${generators[*]}, topologies $TOPOLOGIES, rows ${rows[*]}, quick $QUICK"
} | tee "$OUT/meta.txt" >&2
: >"$OUT/results.tsv"
for n in $TOPOLOGIES; do
    for ((round = 1; round <= ROUNDS; round++)); do
        for server in etcd keel; do
            log "round $round/$ROUNDS: $server, $n member(s)"
            start_cluster "$server" "$n"
            for gen in "${generators[@]}"; do
                for row in "${rows[@]}"; do run_row "$gen" "$n" "$row" "$server" "$round"; done
            done
            stop_servers
        done
    done
done
print_table | tee "$OUT/table.md"
echo >&2
log "raw outputs, results.tsv and table.md in $OUT"
