#!/usr/bin/env bash
# Writes the data-dir fixture of a previous release (docs/upgrades.md "Fixtures"):
#
#   scripts/make-fixtures.sh <commit> <version>      e.g. scripts/make-fixtures.sh 0fddff7 0.1.0
#
# Builds (or reuses) that release's `keel` (scripts/build-release.sh), runs one member on a
# fresh data dir with `--snapshot-count 20`, writes keys with etcdctl (puts, a delete, a lease
# with a key, a compaction, enough entries for a snapshot file), stops it with SIGTERM and
# packs the data dir as server/tests/fixtures/v<version>.tar.gz. The contents are pinned by
# server/tests/fixtures.rs: change both together.
set -euo pipefail
commit="${1:?usage: make-fixtures.sh <commit> <version>}"
version="${2:?usage: make-fixtures.sh <commit> <version>}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
bin="$("$repo/scripts/build-release.sh" "$commit" "$version")"
work="$(mktemp -d "${TMPDIR:-/tmp}/keel-fixture.XXXXXX")"
pid=""
cleanup() { [[ -n "$pid" ]] && kill -9 "$pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
cport=23971 pport=23981
ep="http://127.0.0.1:$cport"
"$bin" --name fixture --data-dir "$work/data" --snapshot-count 20 \
  --listen-client-urls "$ep" --advertise-client-urls "$ep" \
  --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
  --initial-cluster "fixture=http://127.0.0.1:$pport" --initial-cluster-token fixture \
  --initial-cluster-state new >"$work/keel.log" 2>&1 &
pid=$!
ctl() { ETCDCTL_API=3 etcdctl --endpoints="$ep" --command-timeout=5s "$@"; }
for _ in $(seq 100); do ctl endpoint health >/dev/null 2>&1 && break; sleep 0.1; done
# Revisions 2..31: k01..k30 = v01..v30.
for i in $(seq -w 1 30); do ctl put "k$i" "v$i" >/dev/null; done
ctl put multi one >/dev/null    # rev 32
ctl put multi two >/dev/null    # rev 33
ctl del k01 >/dev/null          # rev 34
lease=$(ctl lease grant 100000 | awk '{print $2}')
ctl put leased yes --lease="$lease" >/dev/null   # rev 35
ctl compact 10 >/dev/null
for i in $(seq -w 1 10); do ctl put "late$i" "x$i" >/dev/null; done   # revs 36..45
ctl get "" --prefix -w json >"$work/range.json"
kill -TERM "$pid"; wait "$pid" || true; pid=""
ls "$work/data/member/snap" | grep -q . || { echo "no snapshot file was written" >&2; exit 1; }
echo "lease $lease" >"$work/data/FIXTURE"
tar -C "$work" -czf "$repo/server/tests/fixtures/v$version.tar.gz" data
echo "wrote server/tests/fixtures/v$version.tar.gz (lease $lease)"
head -c 300 "$work/range.json"; echo
