#!/usr/bin/env bash
# A learner of the new release joining a cluster of the old one (issue 16, docs/upgrades.md):
#
#   scripts/learner-upgrade.sh OLD_BIN NEW_BIN
#
# Starts 3 members on OLD_BIN (0.1.0) with a low --snapshot-count, writes enough keys that the
# leader purges its log, adds a 4th member as a learner (`etcdctl member add --learner`) and
# starts it on NEW_BIN, so it must catch up from a snapshot of an old leader; writes more while
# it follows, promotes it, and checks: it logged `installed a snapshot`, every key is on it,
# HashKV is equal on all 4 and every member holds the same key space at the same revision (serializable reads), its /version `keelcluster` stays 0.1 (the
# old members hold the cluster version down) and a 0.2-only request (`user add`) is refused
# there with the reason. Servers on 127.0.0.1 only; everything is stopped on exit.
set -euo pipefail
old="${1:?usage: learner-upgrade.sh OLD_BIN NEW_BIN}"
new="${2:?usage: learner-upgrade.sh OLD_BIN NEW_BIN}"
dir="$(mktemp -d "${TMPDIR:-/tmp}/keel-learner.XXXXXX")"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [ "${keep:-0}" = 1 ]; then echo "logs kept in $dir" >&2; else rm -rf "$dir"; fi
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; keep=1; exit 1; }

read -r -a ports < <(python3 -c 'import socket
s = [socket.socket() for _ in range(8)]
for x in s: x.bind(("127.0.0.1", 0))
print(" ".join(str(x.getsockname()[1]) for x in s))')
client() { echo "http://127.0.0.1:${ports[$((2 * $1))]}"; }
peer() { echo "http://127.0.0.1:${ports[$((2 * $1 + 1))]}"; }
cluster3="m0=$(peer 0),m1=$(peer 1),m2=$(peer 2)"
ctl() { ETCDCTL_API=3 etcdctl --dial-timeout=2s --command-timeout=10s "$@"; }
all3="$(client 0),$(client 1),$(client 2)"

start() { # start <index> <binary> <initial-cluster> <state>
    "$2" --name "m$1" --data-dir "$dir/m$1" \
        --listen-client-urls "$(client "$1")" --advertise-client-urls "$(client "$1")" \
        --listen-peer-urls "$(peer "$1")" --initial-advertise-peer-urls "$(peer "$1")" \
        --initial-cluster "$3" --initial-cluster-state "$4" --initial-cluster-token learner \
        --snapshot-count 100 --experimental-snapshot-catchup-entries 20 \
        >>"$dir/m$1.log" 2>&1 &
    pids+=($!)
}
wait_healthy() { # wait_healthy <endpoint>
    for _ in $(seq 1 150); do
        if ctl --endpoints "$1" endpoint health >/dev/null 2>&1; then return 0; fi
        sleep 0.2
    done
    fail "$1 not healthy within 30 s"
}

for i in 0 1 2; do start "$i" "$old" "$cluster3" new; done
for i in 0 1 2; do wait_healthy "$(client "$i")"; done
echo "3 members on $old"
for k in $(seq 1 600); do ctl --endpoints "$all3" put "k$k" "v$k" >/dev/null; done
echo "600 keys written"

ctl --endpoints "$all3" member add m3 --learner --peer-urls "$(peer 3)" >/dev/null
start 3 "$new" "$cluster3,m3=$(peer 3)" existing
for k in $(seq 601 800); do ctl --endpoints "$all3" put "k$k" "v$k" >/dev/null; done
echo "learner m3 on $new started; 200 more keys written"

id="$(ctl --endpoints "$all3" member list | awk -F', ' '$3 == "m3" {print $1}')"
promoted=0
for _ in $(seq 1 100); do
    if ctl --endpoints "$all3" member promote "$id" >/dev/null 2>&1; then promoted=1; break; fi
    sleep 0.3 # refused until the learner caught up with the leader
done
[ "$promoted" = 1 ] || fail "member promote $id refused for 30 s"
echo "m3 promoted"
wait_healthy "$(client 3)"
grep -q "installed a snapshot" "$dir/m3.log" || fail "m3 logged no snapshot install"
echo "m3 installed a snapshot from the 0.1.0 leader"

ctl --endpoints "$all3" put last done >/dev/null
for _ in $(seq 1 50); do
    [ "$(ctl --endpoints "$(client 3)" get last --print-value-only)" = done ] && break
    sleep 0.2
done
n="$(ctl --endpoints "$(client 3)" get k --prefix --keys-only | grep -c '^k')"
[ "$n" = 800 ] || fail "m3 serves $n of the 800 keys"
# HashKV on all 4 (endpoints without the scheme: etcdctl 3.4's `endpoint hashkv` with
# `http://` endpoints sends `:authority http://127.0.0.1:port`, which Keel's HTTP/2 server
# refuses with PROTOCOL_ERROR; docs/upgrades.md) ...
bare="127.0.0.1:${ports[0]},127.0.0.1:${ports[2]},127.0.0.1:${ports[4]},127.0.0.1:${ports[6]}"
hashes="$(ctl --endpoints "$bare" endpoint hashkv -w json |
    python3 -c 'import json, sys; print(" ".join(str(e["HashKV"]["hash"]) for e in json.load(sys.stdin)))')"
[ "$(wc -w <<<"$hashes")" = 4 ] || fail "HashKV answered by fewer than 4 members: $hashes"
[ "$(tr ' ' '\n' <<<"$hashes" | sort -u | wc -l)" = 1 ] || fail "HashKV differs: $hashes"
echo "HashKV equal on the 4 members: $hashes"
# ... and every member's own copy (serializable reads) of the whole key space, with
# create/mod revisions and versions.
dump() { ctl --endpoints "$1" get "" --from-key --consistency=s -w json |
    python3 -c 'import json, sys; r = json.load(sys.stdin)
print(r["header"]["revision"], [(k["key"], k["create_revision"], k["mod_revision"], k["version"], k["value"]) for k in r["kvs"]])' | md5sum; }
sums="$(for i in 0 1 2 3; do dump "$(client "$i")"; done | sort -u)"
[ "$(wc -l <<<"$sums")" = 1 ] || fail "the members' key spaces differ: $sums"
echo "key space (revision, every key with its revisions) equal on the 4 members"

cv="$(curl -s "$(client 3)/version")"
python3 -c 'import json, sys; v = json.loads(sys.argv[1]); sys.exit(v.get("keelcluster") != "0.1.0")' "$cv" ||
    fail "m3 /version is $cv, want keelcluster 0.1.0"
echo "m3 /version: $cv"
if out="$(ctl --endpoints "$(client 3)" user add chaos --new-user-password x 2>&1)"; then
    fail "user add on m3 was accepted with 0.1.0 members: $out"
fi
grep -q "too low for" <<<"$out" || fail "user add on m3 answered $out, want the cluster-version refusal"
echo "user add on m3 refused: $out"
echo "OK"
