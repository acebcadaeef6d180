#!/usr/bin/env bash
# Keel's single test command (CI runs it through .ci/run).
#
#   1. installs what the tests need when it is missing: etcdctl and etcd (apt packages
#      etcd-client, etcd-server; KEEL_REQUIRE_ETCD=1 then makes tests that need them fail
#      instead of skipping), and a
#      Python venv at ~/.venv-conformance with the gRPC stubs of the conformance suite;
#   2. builds and tests the failpoint `keel` (`--features failpoints`, kept as
#      release/keel-failpoints, exported as KEEL_FAILPOINTS_BIN), then builds the workspace
#      once, in release, with the criterion benches (build only):
#      `cargo test --release --workspace --all-targets --no-run`;
#   3. runs `cargo test --release --workspace` (unit, proptest and end-to-end tests; the
#      end-to-end tests start the `keel` binary built in step 2; keel-chaos's tests run a 20 s
#      kill/pause/partition smoke, the stale-read proof and a 20 s `--traffic kubernetes`
#      run under partitions (docs/kubernetes.md); keel-bench's test runs it);
#   4. starts the release `keel` on a temp data dir and a free port, runs the etcd
#      conformance suite (../shared/conformance) for the areas in CONFORMANCE_AREAS, then a
#      few-second keel-bench smoke and openstack's etcd3gw client (tests/etcd3gw_check.py,
#      venv ~/.venv-etcd3gw) against it;
#   5. stops keel with SIGTERM (it must exit 0) and prints a summary.
# Exits non-zero if any step failed.
#
# Options: --skip-cargo (only conformance), --skip-conformance (only cargo tests).
# Environment: CARGO_TARGET_DIR and CARGO_BUILD_JOBS (default 2) are honoured;
# KEEL_SHARED_DIR overrides the location of shared/ (default: beside the repository);
# KEEL_BIN runs the conformance step against another binary with etcd's flags (no build needed
# with --skip-cargo), e.g. a real etcd to check the suite setup.
set -euo pipefail

# Conformance areas that must pass (directories of ../shared/conformance/cases).
CONFORMANCE_AREAS=(kv del txn compact badinput watch lease lockelect grpc-kv grpc-watch grpc-lease auth maint grpc-maint)
# KEEL_CONFORMANCE_AREAS="kv watch" runs other areas (e.g. while implementing one).
if [ -n "${KEEL_CONFORMANCE_AREAS:-}" ]; then read -r -a CONFORMANCE_AREAS <<<"$KEEL_CONFORMANCE_AREAS"; fi

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SHARED="${KEEL_SHARED_DIR:-$(dirname "$REPO")/shared}"
VENV="$HOME/.venv-conformance"
READY_TIMEOUT_S=30
STOP_TIMEOUT_S=15
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"

run_cargo=1
run_conformance=1
for arg in "$@"; do
    case "$arg" in
        --skip-cargo) run_cargo=0 ;;
        --skip-conformance) run_conformance=0 ;;
        -h | --help) sed -n '2,20p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "test.sh: unknown option $arg (see --help)" >&2; exit 2 ;;
    esac
done

started=$(date +%s)
summary=()
failed=0
note() { echo "==> $*"; }
phase_started=$started
phase() { # phase <name>: announce a phase; the summary shows how long each one took
    local now
    now=$(date +%s)
    if [ -n "${phase_name:-}" ]; then timings+=("$((now - phase_started)) s  $phase_name"); fi
    phase_name="$1"
    phase_started=$now
    note "$1"
}
timings=()
record() { # record <ok|skip|FAIL> <what>
    summary+=("$1  $2")
    if [ "$1" != ok ] && [ "$1" != skip ]; then failed=1; fi
}

# ---------------------------------------------------------------------------------------------
# 1. prerequisites

apt_updated=0
apt_install() {
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null || { echo "need root or sudo to apt-get install $*" >&2; return 1; }
        sudo="sudo"
    fi
    if [ "$apt_updated" -eq 0 ]; then
        $sudo apt-get update -qq
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@"
}

command -v cargo >/dev/null || { echo "cargo not found: install Rust (https://rustup.rs)" >&2; exit 1; }
if ! command -v etcdctl >/dev/null; then
    note "installing etcdctl (apt package etcd-client)"
    apt_install etcd-client
fi
# etcd 3.4.23 is the reference the snapshot tests restore Keel's snapshots into (issue 15);
# with it installed they must run, not skip.
if ! command -v etcd >/dev/null; then
    note "installing etcd (apt package etcd-server)"
    apt_install etcd-server
fi
export KEEL_REQUIRE_ETCD="${KEEL_REQUIRE_ETCD:-1}"
# gdb prints the stacks of a hung test binary before the watchdog kills it (below).
if ! command -v gdb >/dev/null; then
    note "installing gdb (for the test-binary watchdog's stack dumps)"
    apt_install gdb || echo "warning: no gdb; a hung test binary is killed without its stacks" >&2
fi
if ! command -v python3 >/dev/null; then
    note "installing python3"
    apt_install python3 python3-venv
fi

needs_grpc=0
for area in "${CONFORMANCE_AREAS[@]}"; do
    if grep -lq '"grpc"' "$SHARED/conformance/cases/$area"/*.json 2>/dev/null; then needs_grpc=1; fi
done
setup_venv() {
    if "$VENV/bin/python" -c 'import aetcd, grpc, google.protobuf' 2>/dev/null; then return 0; fi
    note "creating $VENV for the conformance gRPC cases"
    if ! python3 -m venv "$VENV" 2>/dev/null; then
        rm -rf "$VENV"
        apt_install python3-venv && python3 -m venv "$VENV"
    fi
    "$VENV/bin/pip" install -q aetcd grpcio 'protobuf>=5.27.2'
}
if [ "$run_conformance" -eq 1 ]; then
    [ -f "$SHARED/conformance/run.py" ] || { echo "no conformance suite at $SHARED (set KEEL_SHARED_DIR)" >&2; exit 1; }
    if ! setup_venv; then
        if [ "$needs_grpc" -eq 1 ]; then
            echo "could not set up $VENV, which the selected conformance areas need" >&2
            exit 1
        fi
        echo "warning: could not set up $VENV; no selected area has gRPC steps, continuing" >&2
    fi
fi

cd "$REPO"
TARGET_DIR="$(cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
KEEL_BIN="${KEEL_BIN:-$TARGET_DIR/release/keel}"

keel_pid=""
watchdog_pid=""
workdir="$(mktemp -d "${TMPDIR:-/tmp}/keel-test.XXXXXX")"
cleanup() {
    if [ -n "$keel_pid" ] && kill -0 "$keel_pid" 2>/dev/null; then kill -KILL "$keel_pid" || true; fi
    if [ -n "$watchdog_pid" ]; then kill "$watchdog_pid" 2>/dev/null || true; fi
    rm -rf "$workdir"
}
trap cleanup EXIT

# ---- test-binary watchdog ---------------------------------------------------------------------
# A hung test binary (a deadlock) must fail its target, not eat CI's whole time limit: any
# process running a test executable ($TARGET_DIR/release/deps/...) for longer than
# TEST_BINARY_LIMIT_S gets its threads' stacks printed (gdb, when installed) and is killed
# with its descendants (the keel members it started); `cargo test --no-fail-fast` then goes
# on with the next target and reports this one failed. The slowest binary takes about 4 min.
TEST_BINARY_LIMIT_S="${KEEL_TEST_BINARY_LIMIT_S:-900}"
descendants() { # descendants <pid>: prints every descendant's PID, deepest last
    local child
    for child in $(pgrep -P "$1" || true); do
        echo "$child"
        descendants "$child"
    done
}
watchdog() {
    local pid age
    while sleep 10; do
        for pid in $(pgrep -f "^$TARGET_DIR/release/deps/" || true); do
            age="$(ps -o etimes= -p "$pid" 2>/dev/null | tr -d ' ')"
            [ -n "$age" ] && [ "$age" -gt "$TEST_BINARY_LIMIT_S" ] || continue
            {
                echo "==> WATCHDOG: test binary $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) (PID $pid) ran ${age} s > ${TEST_BINARY_LIMIT_S} s; its threads:"
                if command -v gdb >/dev/null; then
                    timeout 120 gdb -p "$pid" -batch -ex "thread apply all bt 40" 2>&1 | grep -E '^(Thread|#)' || true
                else
                    for t in /proc/"$pid"/task/*; do echo "$(cat "$t/comm" 2>/dev/null) in $(cat "$t/wchan" 2>/dev/null)"; done
                fi
                echo "==> WATCHDOG: killing PID $pid and its descendants"
            } >&2
            echo "$pid $age" >>"$workdir/watchdog-killed"
            # shellcheck disable=SC2046
            kill -KILL "$pid" $(descendants "$pid") 2>/dev/null || true
        done
    done
}
if [ "$run_cargo" -eq 1 ]; then
    watchdog &
    watchdog_pid=$!
fi

# ---------------------------------------------------------------------------------------------
# 2. + 3. build once in release, then run every cargo test

# ---- layering (docs/architecture.md) ---------------------------------------------------------
# No module of server/src may use a module above it; the script lists any reference that does.
if [ "$run_cargo" -eq 1 ]; then
    phase "layers: scripts/layers.sh"
    if layers_out="$(bash "$REPO/scripts/layers.sh")" && [ -z "$layers_out" ]; then
        record ok "scripts/layers.sh: every dependency points down"
    else
        echo "$layers_out"
        record FAIL "scripts/layers.sh: upward imports (listed above)"
    fi
    # The write-path timeline joiner (docs/benchmarks.md, issue 20 part 1) on synthetic logs.
    if python3 "$REPO/scripts/put-trace.py" --self-test; then
        record ok "scripts/put-trace.py --self-test"
    else
        record FAIL "scripts/put-trace.py --self-test"
    fi
    # bench-vs-etcd.sh's charts (issue 20 part 8) from a synthetic results.tsv; matplotlib comes
    # from a venv the chart script makes (~/.cache/keel-bench/venv-chart). Exit status 3: pip
    # could not install matplotlib, a skip with its warning above, not a failure.
    chart_rc=0
    timeout 900 python3 "$REPO/scripts/bench-chart.py" --self-test || chart_rc=$?
    case "$chart_rc" in
        0) record ok "scripts/bench-chart.py --self-test" ;;
        3) record skip "scripts/bench-chart.py --self-test (matplotlib could not be installed)" ;;
        *) record FAIL "scripts/bench-chart.py --self-test" ;;
    esac
fi

# ---- failpoints (docs/failpoints.md) --------------------------------------------------------
# Building or testing keel-server with `--features failpoints` writes a failpoint `keel` to
# $TARGET_DIR/release/keel, so this runs BEFORE the normal build below, which writes the
# normal binary there again. The failpoint binary is kept as release/keel-failpoints for the
# chaos tests (KEEL_FAILPOINTS_BIN).
export KEEL_FAILPOINTS_BIN="$TARGET_DIR/release/keel-failpoints"
if [ "$run_cargo" -eq 1 ]; then
    phase "failpoints: cargo test --release -p keel-server --features failpoints --test failpoints"
    # One build: the test build's own `keel` (CARGO_BIN_EXE_keel) is the failpoint binary. A
    # separate `cargo build --bin keel` is a different keel-server unit (the test build also
    # unifies dev-dependency features) and would compile keel-server a second time.
    if cargo test --release -p keel-server --features failpoints --test failpoints --no-run &&
        cp "$TARGET_DIR/release/keel" "$KEEL_FAILPOINTS_BIN"; then
        if cargo test --release -p keel-server --features failpoints --test failpoints; then
            record ok "cargo test --release -p keel-server --features failpoints --test failpoints"
        else
            record FAIL "cargo test --release -p keel-server --features failpoints --test failpoints"
        fi
    else
        record FAIL "build of keel-server --features failpoints (cargo test --no-run)"
    fi
fi
# ---- end of failpoints ----------------------------------------------------------------------

if [ "$run_cargo" -eq 1 ] || [ ! -x "$KEEL_BIN" ]; then
    # --all-targets also builds the criterion micro-benchmarks (issue 6; they only need to
    # build here, and `cargo test` alone skips bench targets) in the SAME feature resolution
    # as the tests: a separate `cargo build --benches` resolves keel-server's features without
    # the dev-dependencies and compiled it a second time (3-5 min).
    phase "build: cargo test --release --workspace --all-targets --no-run"
    if ! cargo test --release --workspace --all-targets --no-run; then
        echo "RESULT: FAILED (the release build of the workspace failed)"
        exit 1
    fi
    record ok "release build of every target (criterion benches included)"
    # failpoints: the normal build must have put the normal binary back in place.
    if [ -e "$KEEL_FAILPOINTS_BIN" ] && cmp -s "$KEEL_BIN" "$KEEL_FAILPOINTS_BIN"; then
        echo "RESULT: FAILED ($KEEL_BIN is still the failpoint build)"
        exit 1
    fi
fi
if [ "$run_cargo" -eq 1 ]; then
    phase "cargo test --release --workspace"
    # --no-fail-fast: a failing unit test binary must not hide the end-to-end results.
    if cargo test --release --workspace --no-fail-fast 2>&1 | tee "$workdir/cargo-test.log"; then
        record ok "cargo test --release --workspace"
    else
        # cargo names each failing test target as `-p <crate> --lib|--test <name>|...`.
        targets="$(grep -oE '`-p [^`]+`' "$workdir/cargo-test.log" | sort -u | tr '\n' ' ')"
        record FAIL "cargo test --release --workspace; failing targets: ${targets:-see the log above}"
    fi
fi

# Upgrade compatibility (docs/upgrades.md): a 3-member 0.1.0 cluster rolled to this build and,
# after Maintenance.Downgrade ENABLE 0.1, back to 0.1.0, under
# the chaos workload. The 0.1.0 binary comes from ~/.cache/keel/0.1.0/keel, built once by
# scripts/build-release.sh (a cold build of 0fddff7 at opt-level 1; the run itself ~2 min). KEEL_SKIP_UPGRADE=1 skips the phase.
if [ "$run_cargo" -eq 1 ] && [ "${KEEL_SKIP_UPGRADE:-0}" != 1 ]; then
    phase "upgrade: keel-chaos upgrade --from 0.1.0 --to this build"
    if old_bin="$("$REPO/scripts/build-release.sh" 0fddff7 0.1.0)"; then
        # --hold-down with a low snapshot count: rolled members install snapshots from a
        # leader of the other version (--expect-snapshot checks both directions happened).
        if "$TARGET_DIR/release/keel-chaos" --faults none --duration 60s --clients 4 \
            --keel-arg=--snapshot-count=20 --keel-arg=--experimental-snapshot-catchup-entries=5 \
            upgrade --from "$old_bin" --to "$KEEL_BIN" --downgrade-to 0.1 \
            --hold-down 4s --expect-snapshot 2>&1 | tee "$workdir/upgrade.log"; then
            record ok "upgrade 0.1.0 -> this build -> 0.1.0: $(grep -c "rolled" "$workdir/upgrade.log") rolls, $(grep -c "installed a snapshot from" "$workdir/upgrade.log") snapshot installs, $(grep -o 'every member [0-9.]*s after the last roll' "$workdir/upgrade.log")"
        else
            record FAIL "upgrade 0.1.0 -> this build (keel-chaos upgrade; report above)"
        fi
        # A learner on this build joins a 0.1.0 cluster from a snapshot (about 30 s).
        if bash "$REPO/scripts/learner-upgrade.sh" "$old_bin" "$KEEL_BIN"; then
            record ok "learner on this build joined a 0.1.0 cluster (snapshot, promote, equal HashKV and key spaces, keelcluster 0.1.0)"
        else
            record FAIL "scripts/learner-upgrade.sh (a learner on this build joining 0.1.0)"
        fi
    else
        record FAIL "scripts/build-release.sh 0fddff7 (the 0.1.0 binary)"
    fi
fi

# ---------------------------------------------------------------------------------------------
# 4. + 5. conformance against a release keel

free_ports() { # prints two free 127.0.0.1 ports below the kernel's ephemeral range
    # (32768-60999), so no outgoing connection takes one between this check and keel's bind.
    python3 -c 'import random, socket
ports = []
while len(ports) < 2:
    p = random.randrange(20000, 32000)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
        ports.append(p)
    except OSError:
        pass
    finally:
        s.close()
print(" ".join(map(str, ports)))'
}

start_keel() { # a port taken between the check and the bind: up to 3 tries with new ports
    local try
    for try in 1 2 3; do
        if start_keel_once; then return 0; fi
        grep -q "Address already in use" "$workdir/keel.log" || return 1
        note "a port was taken before keel bound it (try $try of 3); picking new ports"
        rm -rf "$workdir/data"
    done
    return 1
}

start_keel_once() {
    local client peer
    read -r client peer < <(free_ports)
    endpoint="127.0.0.1:$client"
    "$KEEL_BIN" --name default --data-dir "$workdir/data" \
        --listen-client-urls "http://$endpoint" --advertise-client-urls "http://$endpoint" \
        --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
        --initial-cluster "default=http://127.0.0.1:$peer" --initial-cluster-state new \
        >"$workdir/keel.log" 2>&1 &
    keel_pid=$!
    local deadline=$(($(date +%s) + READY_TIMEOUT_S))
    while [ "$(date +%s)" -lt "$deadline" ]; do
        if ! kill -0 "$keel_pid" 2>/dev/null; then
            echo "keel exited during start-up; its log:" >&2
            tail -n 40 "$workdir/keel.log" >&2
            return 1
        fi
        if ETCDCTL_API=3 etcdctl --endpoints="$endpoint" --dial-timeout=1s --command-timeout=2s \
            endpoint health >/dev/null 2>&1; then
            return 0
        fi
        sleep 0.2
    done
    echo "keel was not healthy within ${READY_TIMEOUT_S}s; its log:" >&2
    tail -n 40 "$workdir/keel.log" >&2
    return 1
}

stop_keel() { # SIGTERM, bounded wait; returns keel's exit code (137 if it had to be killed)
    kill -TERM "$keel_pid"
    local deadline=$(($(date +%s) + STOP_TIMEOUT_S))
    while kill -0 "$keel_pid" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.1; done
    if kill -0 "$keel_pid" 2>/dev/null; then
        echo "keel did not exit within ${STOP_TIMEOUT_S}s of SIGTERM; killing it" >&2
        kill -KILL "$keel_pid" || true
    fi
    local rc=0
    wait "$keel_pid" || rc=$?
    keel_pid=""
    return "$rc"
}

if [ "$run_conformance" -eq 1 ]; then
    phase "conformance (${CONFORMANCE_AREAS[*]}) against $KEEL_BIN"
    if start_keel; then
        for area in "${CONFORMANCE_AREAS[@]}"; do
            note "conformance area $area"
            out="$workdir/conformance-$area.txt"
            # "/$area/" matches that directory only (a bare "kv" would also pick grpc-kv).
            if python3 "$SHARED/conformance/run.py" --endpoints "$endpoint" \
                --grpc-python "$VENV/bin/python" --filter "/$area/" 2>&1 | tee "$out"; then
                record ok "conformance $area: $(tail -n 1 "$out")"
            else
                record FAIL "conformance $area: $(tail -n 1 "$out")"
            fi
        done
        # ---- keel-bench smoke (issue 6): a few seconds of puts against this member -------------
        # Benchmarks are not part of `cargo test`; this only checks that keel-bench runs and
        # gets answers. The binary comes from the build step (its CLI test makes cargo build it).
        KEEL_BENCH_BIN="${KEEL_BENCH_BIN:-$TARGET_DIR/release/keel-bench}"
        if [ -x "$KEEL_BENCH_BIN" ]; then
            note "keel-bench smoke: put, 2000 requests, 16 clients"
            if timeout 60 "$KEEL_BENCH_BIN" --endpoints "$endpoint" --clients 16 --conns 4 \
                --total 2000 --key-size 16 --val-size 256 --key-space-size 1000 --json put \
                >"$workdir/keel-bench.json" 2>&1 &&
                ok_requests=$(python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))
print(r["ok"] if r["ok"] > 0 and not r["errors"] else 0)' "$workdir/keel-bench.json") &&
                [ "$ok_requests" -gt 0 ]; then
                record ok "keel-bench smoke: $ok_requests puts ok"
            else
                cat "$workdir/keel-bench.json"
                record FAIL "keel-bench smoke (put against $endpoint)"
            fi
        elif [ "$run_cargo" -eq 1 ]; then
            record FAIL "keel-bench smoke: $KEEL_BENCH_BIN not built"
        else
            note "keel-bench smoke skipped: no $KEEL_BENCH_BIN (--skip-cargo builds nothing)"
        fi
        # ---- end of keel-bench smoke --------------------------------------------------------
        # ---- etcd3gw (issue 14): openstack's grpc-gateway client against this member ---------
        # A venv with etcd3gw from PyPI ($KEEL_ETCD3GW_VENV, default ~/.venv-etcd3gw).
        GW_VENV="${KEEL_ETCD3GW_VENV:-$HOME/.venv-etcd3gw}"
        if ! "$GW_VENV/bin/python" -c 'import etcd3gw' 2>/dev/null; then
            note "creating $GW_VENV with etcd3gw"
            rm -rf "$GW_VENV"
            python3 -m venv "$GW_VENV" && "$GW_VENV/bin/pip" install -q etcd3gw || true
        fi
        if timeout 120 "$GW_VENV/bin/python" "$REPO/tests/etcd3gw_check.py" \
            "${endpoint%:*}" "${endpoint##*:}"; then
            record ok "etcd3gw: put, get, prefix, create, lease, watch, lock, delete"
        else
            record FAIL "etcd3gw against $endpoint (tests/etcd3gw_check.py)"
        fi
        # ---- end of etcd3gw -------------------------------------------------------------------
        if stop_keel; then
            record ok "keel exited 0 on SIGTERM"
        else
            rc=$?
            record FAIL "keel exit code $rc on SIGTERM (want 0); its log tail is printed above"
            tail -n 20 "$workdir/keel.log"
        fi
    else
        record FAIL "conformance: keel did not start"
    fi
fi

# ---------------------------------------------------------------------------------------------
phase "summary"
if [ -s "$workdir/watchdog-killed" ]; then
    record FAIL "watchdog killed $(wc -l <"$workdir/watchdog-killed") hung test binary(ies) after ${TEST_BINARY_LIMIT_S} s (stacks above)"
fi
echo
echo "==================== summary ($(($(date +%s) - started)) s) ===================="
for line in "${timings[@]}"; do echo "time $line"; done
for line in "${summary[@]}"; do echo "$line"; done
# CI shows only the tail of this output: each failing test's panic message, briefly, here.
if [ -s "$workdir/cargo-test.log" ] && grep -q '^---- .* stdout ----$' "$workdir/cargo-test.log"; then
    echo "---- failing tests: each panic and the last lines of its output (all of it is above) ----"
    # Per test: its panic line and the 3 after it (the message), then the last 10 lines of
    # its output (the member's log tail, which the test kit prints on a panic).
    awk 'function flush(   i, from) {
             if (name == "") return
             print name
             for (i = 1; i <= n; i++) if (lines[i] ~ /panicked at/) { from = i; break }
             for (i = from; from && i <= n && i < from + 4; i++) print "    " lines[i]
             for (i = (n > 10 ? n - 9 : 1); i <= n; i++) if (!from || i >= from + 4) print "    " lines[i]
             name = ""; n = 0
         }
         /^---- .* stdout ----$/ { flush(); name = $0; next }
         /^failures:$/ { flush(); next }
         name != "" { lines[++n] = $0 }
         END { flush() }' "$workdir/cargo-test.log" | head -n 90
fi
if [ "$failed" -ne 0 ]; then
    echo "RESULT: FAILED"
    exit 1
fi
echo "RESULT: all passed"
