#!/usr/bin/env bash
# Build a previous Keel release from git and cache its server binary (docs/upgrades.md).
#
#   scripts/build-release.sh <commit> [version]
#
# Extracts `git archive <commit>` into a temp dir, builds `keel-server` in release mode there
# (its own target dir, so the current tree's build is untouched) and copies the binary to
# ~/.cache/keel/<version>/keel. Prints the cached path. A cached binary is reused.
# Known releases: 0fddff7 = 0.1.0.
set -euo pipefail
commit="${1:?usage: build-release.sh <commit> [version]}"
version="${2:-}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
if [[ -z "$version" ]]; then
  version="$(git -C "$repo" show "$commit:Cargo.toml" | sed -n 's/^version = "\(.*\)"/\1/p' | head -1)"
fi
cache="${KEEL_RELEASE_CACHE:-$HOME/.cache/keel}/$version"
bin="$cache/keel"
if [[ -x "$bin" ]]; then
  echo "$bin"
  exit 0
fi
src="$(mktemp -d "${TMPDIR:-/tmp}/keel-release-$version.XXXXXX")"
trap 'rm -rf "$src"' EXIT
git -C "$repo" archive "$commit" | tar -x -C "$src"
# Its own target dir (KEEL_RELEASE_TARGET overrides), kept for the next release build.
target="${KEEL_RELEASE_TARGET:-${KEEL_RELEASE_CACHE:-$HOME/.cache/keel}/target}"
mkdir -p "$cache"
(
  cd "$src"
  # opt-level 1 and no debug info: the upgrade suite needs the old release's behaviour, not
  # its speed, and a cold CI run builds it (KEEL_RELEASE_OPT_LEVEL=3 for a faithful build).
  CARGO_TARGET_DIR="$target" CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}" \
    CARGO_PROFILE_RELEASE_OPT_LEVEL="${KEEL_RELEASE_OPT_LEVEL:-1}" CARGO_PROFILE_RELEASE_DEBUG=false \
    cargo build --release --locked -p keel-server >&2
)
# The server binary's name in that release (keel or keel-server).
for name in keel keel-server; do
  if [[ -x "$target/release/$name" ]]; then
    cp "$target/release/$name" "$bin.tmp"
    mv "$bin.tmp" "$bin"
    echo "$bin"
    exit 0
  fi
done
echo "build-release.sh: no server binary in $target/release" >&2
exit 1
