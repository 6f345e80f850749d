#!/usr/bin/env bash
# Fetch (or find in the cache) a real Prometheus with promtool, for the tests that check the
# chart's dashboard and alert rules against what the components export (tests/observability/).
#
# Debian bookworm's `prometheus` package (2.42; Go, static: /usr/bin/prometheus and
# /usr/bin/promtool) is fetched with a *private* apt configuration (own sources list, state and
# cache directories; the system's apt state is untouched) and unpacked with `dpkg -x`; nothing is
# installed into the system. The same approach, and the same helpers, as testruntime/build.sh.
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
CACHE=${ELASTICGPU_CACHE:-$HOME/.cache/elasticgpu}/testprometheus
APTDIR=$CACHE/apt
MIRROR=${ELASTICGPU_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# package:suite
PKGS="prometheus:bookworm"

log() { echo "testprometheus/build.sh: $*" >&2; }

complete() { # $1 = build dir: true when everything the fixture needs is there
  [ -x "$1/root/usr/bin/prometheus" ] && [ -x "$1/root/usr/bin/promtool" ]
}

write_env() { # $1 = build dir
  local d=$1 tmp
  tmp=$(mktemp "$CACHE/current.env.XXXXXX")
  {
    echo "ELASTICGPU_PROMETHEUS=$d/root/usr/bin/prometheus"
    echo "ELASTICGPU_PROMTOOL=$d/root/usr/bin/promtool"
  } >"$tmp"
  mv -f "$tmp" "$CACHE/current.env"
  cat "$CACHE/current.env"
}

newest_cached() {
  local d
  for d in $(ls -1td "$CACHE"/*/ 2>/dev/null); do
    d=${d%/}
    if complete "$d"; then
      echo "$d"
      return 0
    fi
  done
  return 1
}

fallback() { # $1 = reason
  local d
  if d=$(newest_cached); then
    log "WARNING: $1"
    log "WARNING: falling back to the newest cached Prometheus: $d"
    write_env "$d"
    exit 0
  fi
  log "ERROR: $1 (and no cached Prometheus to fall back to)"
  exit 1
}

apt_opts() {
  echo -o "Dir::Etc::SourceList=$APTDIR/etc/sources.list" -o "Dir::Etc::SourceParts=$APTDIR/etc/sources.list.d" \
    -o "Dir::Etc::Preferences=$APTDIR/etc/preferences" -o "Dir::Etc::PreferencesParts=$APTDIR/etc/preferences.d" \
    -o "Dir::State=$APTDIR/state" -o "Dir::State::status=$APTDIR/state/status" \
    -o "Dir::Cache=$APTDIR/cache" -o Debug::NoLocking=1 -o "APT::Sandbox::User=$(id -un)" \
    -o APT::Architecture=amd64 -o APT::Architectures=amd64
}

# --- inner build step (a separate process so that `set -e` is honoured) ---
if [ "${1:-}" = "__build" ]; then
  key=$2
  versions=$3
  out=$CACHE/$key
  rm -rf "$out.tmp"
  mkdir -p "$out.tmp/root" "$APTDIR/debs"
  cd "$APTDIR/debs"
  # shellcheck disable=SC2046
  apt-get -q $(apt_opts) download $(cat "$versions") >/dev/null
  while read -r pv; do
    p=${pv%%=*}
    v=${pv#*=}
    fv=${v/:/%3a}
    dpkg -x "$(ls "${p}_${fv}"_*.deb | head -n1)" "$out.tmp/root"
  done <"$versions"
  for f in "$APTDIR"/debs/*.deb; do
    b=$(basename "$f")
    grep -qxF "${b%%_*}=$(echo "$b" | cut -d_ -f2 | sed 's/%3a/:/')" "$versions" || rm -f "$f"
  done
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

# --- outer driver ---
mkdir -p "$CACHE" "$APTDIR/etc/sources.list.d" "$APTDIR/etc/preferences.d" "$APTDIR/state/lists/partial" "$APTDIR/cache/archives/partial"
touch "$APTDIR/state/status"
exec 9>"$CACHE/.lock"
flock 9

if [ "${ELASTICGPU_TESTPROMETHEUS_OFFLINE:-}" = 1 ]; then
  fallback "ELASTICGPU_TESTPROMETHEUS_OFFLINE=1: not fetching"
fi
for t in apt-get apt-cache dpkg sha256sum flock; do
  command -v "$t" >/dev/null || fallback "required tool $t not found"
done

opts="[arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]"
[ "${ELASTICGPU_APT_TRUSTED:-}" = 1 ] && opts="[arch=amd64 trusted=yes]"
echo "deb $opts $MIRROR bookworm main" >"$APTDIR/etc/sources.list"

# An index younger than a day is good enough (the key changes only when Debian publishes a new
# version of the package).
lists=$(ls -1t "$APTDIR"/state/lists/*_Packages* 2>/dev/null | head -n1 || true)
if [ -z "$lists" ] || [ -n "$(find "$lists" -mmin +1440)" ]; then
  # shellcheck disable=SC2046
  if ! apt-get -q $(apt_opts) --error-on=any update >"$CACHE/apt-update.log" 2>&1; then
    fallback "private apt update of bookworm failed (see $CACHE/apt-update.log)"
  fi
fi

versions=$(mktemp)
trap 'rm -f "$versions"' EXIT
# shellcheck disable=SC2046,SC2086
madison=$(apt-cache $(apt_opts) madison $(for ps in $PKGS; do echo "${ps%%:*}"; done) 2>/dev/null || true)
for ps in $PKGS; do
  p=${ps%%:*}
  suite=${ps#*:}
  v=$(echo "$madison" | awk -F'|' -v p="$p" -v s=" $suite/main " '{gsub(/ /, "", $1)} $1 == p && index($3, s) {gsub(/ /, "", $2); print $2; exit}')
  [ -n "$v" ] || fallback "package $p not found in $suite"
  echo "$p=$v" >>"$versions"
done

key=$( (cat "$HERE/build.sh" "$versions") | sha256sum | cut -c1-16)
if complete "$CACHE/$key"; then
  log "up to date: $CACHE/$key"
  write_env "$CACHE/$key"
  exit 0
fi

log "fetching Prometheus $key: $(tr '\n' ' ' <"$versions")"
start=$(date +%s)
if ! bash "$HERE/build.sh" __build "$key" "$versions" >&2; then
  rm -rf "$CACHE/$key.tmp"
  fallback "fetching Prometheus failed"
fi
log "unpacked in $(($(date +%s) - start))s: $CACHE/$key"
write_env "$CACHE/$key"
# Keep the two newest builds.
ls -1td "$CACHE"/*/root 2>/dev/null | tail -n +3 | while read -r old; do rm -rf "$(dirname "$old")"; done
