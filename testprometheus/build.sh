#!/usr/bin/env bash
# Fetch (or find in the cache) a real Prometheus with promtool, for the tests that check the
# chart's dashboard and alert rules against what the components export (tests/observability/).
#
# Debian bookworm's `prometheus` package (2.42; Go, static: /usr/bin/prometheus and
# /usr/bin/promtool) is fetched with a *private* apt configuration (own sources list, state and
# cache directories; the system's apt state is untouched) and unpacked with `dpkg -x`; nothing is
# installed into the system. The same approach as testruntime/build.sh, through the same sourced
# helper (scripts/cached-build.sh: the cache, its key, current.env, the fallback, private apt).
#
# Result: ${ELASTICGPU_CACHE:-$HOME/.cache/elasticgpu}/testprometheus/<key>/
#   root/        the unpacked package (usr/bin/prometheus, usr/bin/promtool)
#   versions.txt the package version this build used
# where <key> hashes this script and the exact package version. The paths are written to
# <cache>/testprometheus/current.env and printed.
#
# If fetching fails (no network, a mirror hiccup) and a build exists, a WARNING is printed and the
# newest cached build is used (exit 0). With no cached build it exits 1 and the caller
# (scripts/test.sh, or the test fixture itself) lets the Prometheus tests skip with that reason.
#
# Environment:
#   ELASTICGPU_CACHE                    cache root (default ~/.cache/elasticgpu)
#   ELASTICGPU_TESTPROMETHEUS_OFFLINE=1 do not touch the network; use the newest cached build
#   ELASTICGPU_DEBIAN_MIRROR            (default http://deb.debian.org/debian)
#   ELASTICGPU_APT_TRUSTED=1            skip signature checks ([trusted=yes])
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NAME=testprometheus WHAT="Prometheus" MARKER=root STRICT_VAR= # no STRICT: it always falls back
. "$HERE/../scripts/cached-build.sh"
PKGS="prometheus:bookworm" # package:suite

build_complete() { # $1 = build dir: true when everything the fixture needs is there
  [ -x "$1/root/usr/bin/prometheus" ] && [ -x "$1/root/usr/bin/promtool" ]
}

env_lines() { # $1 = build dir
  echo "ELASTICGPU_PROMETHEUS=$1/root/usr/bin/prometheus"
  echo "ELASTICGPU_PROMTOOL=$1/root/usr/bin/promtool"
}

if [ "${1:-}" = "__build" ]; then
  key=$2
  versions=$3
  out=$CACHE/$key
  rm -rf "$out.tmp"
  mkdir -p "$out.tmp/root" "$APTDIR/debs"
  cd "$APTDIR/debs"
  # shellcheck disable=SC2046
  apt-get -q $(apt_opts) download $(cat "$versions") >/dev/null
  unpack_debs "$versions" "$out.tmp/root"
  prune_debs "$versions"
  "$out.tmp/root/usr/bin/prometheus" --version >/dev/null
  "$out.tmp/root/usr/bin/promtool" --version >/dev/null
  {
    echo "# elasticgpu test Prometheus build $key ($(date -u +%Y-%m-%dT%H:%M:%SZ)) mirror=$MIRROR"
    cat "$versions"
  } >"$out.tmp/versions.txt"
  rm -rf "$out"
  mv "$out.tmp" "$out"
  exit 0
fi

apt_setup
lock_cache
fallback_if_offline ELASTICGPU_TESTPROMETHEUS_OFFLINE "not fetching"
require_tools apt-get apt-cache dpkg sha256sum flock
apt_sources bookworm

apt_update_daily bookworm

versions=$(mktemp)
trap 'rm -f "$versions"' EXIT
# shellcheck disable=SC2086
pin_versions "$versions" $PKGS

key=$(cache_key "$HERE/build.sh" "$versions")
exit_if_up_to_date "$key"

log "fetching Prometheus $key from $(tr '\n' ' ' <"$versions")"
start=$(date +%s)
build_step "$key" "$versions" || fallback "fetching Prometheus failed"
finish_build "$key" "$start" 2 # keeps the two newest builds
