#!/usr/bin/env bash
# Lists every reference, in non-test code of server/src, from one top-level module to a module
# above it (docs/architecture.md, "Dependencies point down"). Prints nothing and exits 0 when
# every dependency points down; exits 1 otherwise.
#
#   scripts/layers.sh [REPO_DIR]
#
# Ranks follow the module diagram of docs/architecture.md (higher = above); error.rs and
# failpoint.rs are leaves every layer may use. Test files (`tests*`, `*_test.rs`, `*_test/`,
# `test_support.rs`) and a file's trailing `#[cfg(test)] mod tests { ... }` block are skipped:
# tests may wire components from above the module they test.
set -euo pipefail
cd "${1:-$(dirname "$0")/..}/server/src"
declare -A rank=([main]=99 [lib]=99 [api]=90 [fence]=85 [node]=80 [config]=75 [cluster]=60
  [backup]=57 [apply]=55 [qos]=54 [auth]=52 [membership]=50 [alarm]=48 [version]=46 [lease]=45 [watch]=40 [raft]=35 [cindex]=30 [mvcc]=25
  [etcd_db]=27 [backend]=20 [wal]=15 [tls]=10 [metrics]=5 [logging]=95 [error]=1 [failpoint]=1)
found=0
while IFS= read -r f; do
  case "$f" in *tests*|*_test.rs|*_test/*|*test_support.rs) continue ;; esac
  from=$(echo "$f" | cut -d/ -f2 | sed 's/\.rs$//')
  # `super::x` names a top-level module in `a.rs` and `a/mod.rs`, `super::super::x` in `a/b.rs`.
  depth=$(echo "$f" | tr -cd / | wc -c)
  case "$f" in */mod.rs) depth=$((depth - 1)) ;; esac
  up=$(printf 'super::%.0s' $(seq "$depth"))
  while IFS=: read -r line to; do
    [ -z "$to" ] || [ "$to" = "$from" ] && continue
    if [ "${rank[$to]:-0}" -gt "${rank[$from]:-0}" ]; then
      echo "server/src/${f#./}:$line: $from uses $to"
      found=1
    fi
  done < <(awk '/^#\[cfg\(test\)\]/ { getline n; if (n ~ /^mod tests \{/) exit; print; print n; next } { print }' "$f" |
    grep -n -o -E "(crate::|(^|[^:a-z_])${up})[a-z_]+" | sed -E "s/^([0-9]+):.*(crate::|${up})/\1:/" || true)
done < <(find . -name '*.rs' | sort)
exit "$found"
