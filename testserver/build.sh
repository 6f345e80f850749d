#!/usr/bin/env bash
# Build (or find in the cache) the elasticgpu test API server and etcd.
#
# Everything comes from Debian packages: the Go sources of the Kubernetes API
# server libraries (golang-k8s-*-dev and their dependency closure), Go itself,
# openapi-gen (kube-openapi) and etcd (etcd-server). They exist only in Debian
# sid, so they are fetched with a *private* apt configuration (own sources list,
# state and cache directories) and unpacked with `dpkg -x` into a private root;
# nothing is installed into the system.
#
# Result: ${ELASTICGPU_CACHE:-$HOME/.cache/elasticgpu}/testserver/<key>/
#   elasticgpu-testserver, etcd, kubectl (if sid has it), versions.txt
# where <key> hashes main.go, go.mod, this script and the exact package versions.
# The paths are written to <cache>/testserver/current.env and printed.
#
# If fetching or building fails (sid changes daily, or no network) and a server
# was built before, a WARNING is printed and the newest cached build is used.
#
# Environment:
#   ELASTICGPU_CACHE               cache root (default ~/.cache/elasticgpu)
#   ELASTICGPU_TESTSERVER_OFFLINE=1  do not touch the network; use newest cache
#   ELASTICGPU_TESTSERVER_STRICT=1   fail instead of falling back (when editing main.go)
#   ELASTICGPU_DEBIAN_MIRROR       (default http://deb.debian.org/debian)
#   ELASTICGPU_DEBIAN_SUITE        (default sid)
#   ELASTICGPU_GO_PKG              Go toolchain package (default golang-1.26-go)
#   ELASTICGPU_APT_TRUSTED=1       skip signature checks ([trusted=yes]); by
#                                  default sid's InRelease is verified with the
#                                  system's debian-archive-keyring (bookworm's
#                                  keyring holds the trixie/forky-era keys that
#                                  sign sid today).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${ELASTICGPU_CACHE:-$HOME/.cache/elasticgpu}/testserver
APTDIR=$CACHE/apt
MIRROR=${ELASTICGPU_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=${ELASTICGPU_DEBIAN_SUITE:-sid}
GO_PKG=${ELASTICGPU_GO_PKG:-golang-1.26-go}
GO_VER=${GO_PKG#golang-}
GO_VER=${GO_VER%-go}
ROOT_PKGS="golang-k8s-apiextensions-apiserver-dev golang-k8s-kube-openapi-dev kube-openapi $GO_PKG golang-$GO_VER-src etcd-server"
OPTIONAL_PKGS="kubectl" # sid's kubectl (same Kubernetes version); the tests use it when present
BIN_NAME=elasticgpu-testserver

log() { echo "testserver/build.sh: $*" >&2; }

write_env() { # $1 = build dir
  local d=$1 tmp
  tmp=$(mktemp "$CACHE/current.env.XXXXXX")
  {
    echo "ELASTICGPU_TESTSERVER_BIN=$d/$BIN_NAME"
    echo "ELASTICGPU_ETCD_BIN=$d/etcd"
    echo "ELASTICGPU_TESTSERVER_VERSIONS=$d/versions.txt"
    [ ! -x "$d/kubectl" ] || echo "ELASTICGPU_KUBECTL_BIN=$d/kubectl"
  } >"$tmp"
  mv -f "$tmp" "$CACHE/current.env"
  grep -v VERSIONS "$CACHE/current.env"
}

newest_cached() {
  local f
  f=$(ls -1t "$CACHE"/*/"$BIN_NAME" 2>/dev/null | head -n1 || true)
  [ -n "$f" ] && [ -x "$(dirname "$f")/etcd" ] && dirname "$f"
}

fallback() { # $1 = reason
  local d
  if [ "${ELASTICGPU_TESTSERVER_STRICT:-}" = 1 ]; then
    log "ERROR: $1 (ELASTICGPU_TESTSERVER_STRICT=1: no fallback)"
    exit 1
  fi
  if d=$(newest_cached); then
    log "WARNING: $1"
    log "WARNING: falling back to the newest cached test server: $d"
    write_env "$d"
    exit 0
  fi
  log "ERROR: $1 (and no cached test server to fall back to)"
  exit 1
}

apt_opts() {
  echo -o "Dir::Etc::SourceList=$APTDIR/etc/sources.list" -o "Dir::Etc::SourceParts=$APTDIR/etc/sources.list.d" \
    -o "Dir::Etc::Preferences=$APTDIR/etc/preferences" -o "Dir::Etc::PreferencesParts=$APTDIR/etc/preferences.d" \
    -o "Dir::State=$APTDIR/state" -o "Dir::State::status=$APTDIR/state/status" \
    -o "Dir::Cache=$APTDIR/cache" -o Debug::NoLocking=1 -o "APT::Sandbox::User=$(id -un)" \
    -o APT::Architecture=amd64 -o APT::Architectures=amd64
}

# --- inner build step (run as a separate process so `set -e` is honoured) ---
if [ "${1:-}" = "__build" ]; then
  key=$2
  versions=$3
  out=$CACHE/$key
  work=$CACHE/work-$key
  # The unpacked packages are kept (keyed by the package versions) so that a change of
  # main.go only costs a go build; older unpacked roots are removed.
  vkey=$(sha256sum <"$versions" | cut -c1-16)
  R=$CACHE/root-$vkey
  rm -rf "$work"
  mkdir -p "$work" "$APTDIR/debs"
  if [ ! -e "$R/.complete" ]; then
    cd "$APTDIR/debs"
    missing=()
    while read -r pv; do
      p=${pv%%=*}
      v=${pv#*=}
      fv=${v/:/%3a}
      ls "${p}_${fv}"_*.deb >/dev/null 2>&1 || missing+=("$pv")
    done <"$versions"
    if [ ${#missing[@]} -gt 0 ]; then
      log "downloading ${#missing[@]} packages"
      # shellcheck disable=SC2046
      apt-get -q $(apt_opts) download "${missing[@]}" >/dev/null
    fi
    log "unpacking $(wc -l <"$versions") packages"
    rm -rf "$R.tmp"
    mkdir -p "$R.tmp"
    while read -r pv; do
      p=${pv%%=*}
      v=${pv#*=}
      fv=${v/:/%3a}
      dpkg -x "$(ls "${p}_${fv}"_*.deb | head -n1)" "$R.tmp"
    done <"$versions"
    touch "$R.tmp/.complete"
    mv "$R.tmp" "$R"
    # Drop debs no longer referenced by this package set.
    for f in "$APTDIR"/debs/*.deb; do
      b=$(basename "$f")
      grep -qxF "${b%%_*}=$(echo "$b" | cut -d_ -f2 | sed 's/%3a/:/')" "$versions" || rm -f "$f"
    done
  fi
  for old in "$CACHE"/root-*; do
    [ "$old" = "$R" ] || [ ! -d "$old" ] || (rm -rf "$old" &)
  done
  export GOROOT=$R/usr/lib/go-$GO_VER
  export PATH=$GOROOT/bin:$PATH
  export GOPATH=$work/gopath:$R/usr/share/gocode
  export GO111MODULE=off GOPROXY=off GOFLAGS= GOTOOLCHAIN=local CGO_ENABLED=0
  export GOCACHE=$CACHE/gocache
  pkgdir=$work/gopath/src/elasticgpu.local/testserver
  mkdir -p "$pkgdir/openapi"
  cp "$HERE/main.go" "$HERE/go.mod" "$pkgdir/"
  echo "// Code generated by openapi-gen. DO NOT EDIT." >"$work/boilerplate.txt"
  log "generating OpenAPI definitions for built-in kinds"
  (cd "$pkgdir" && "$R/usr/bin/openapi-gen" --go-header-file "$work/boilerplate.txt" \
    --output-dir openapi --output-pkg elasticgpu.local/testserver/openapi \
    --output-file zz_generated.openapi.go --report-filename "$work/openapi-violations.txt" \
    k8s.io/api/core/v1 k8s.io/api/coordination/v1 k8s.io/api/admissionregistration/v1 \
    k8s.io/api/events/v1 k8s.io/api/autoscaling/v1 k8s.io/apimachinery/pkg/apis/meta/v1 \
    k8s.io/apimachinery/pkg/runtime k8s.io/apimachinery/pkg/util/intstr \
    k8s.io/apimachinery/pkg/api/resource k8s.io/apimachinery/pkg/version)
  kver=$(awk -F= '$1=="golang-k8s-apiserver-dev"{print $2}' "$versions" | sed -E 's/^[0-9]+://; s/[-+~].*//')
  kminor=$(echo "$kver" | cut -d. -f2)
  gitver="v1.${kminor}.$(echo "$kver" | cut -d. -f3)"
  log "go build ($(go version | cut -d' ' -f3), k8s libraries $kver => $gitver)"
  vpkg=k8s.io/component-base/version
  (cd "$pkgdir" && go build -trimpath -o "$work/$BIN_NAME" \
    -ldflags "-s -w -X $vpkg.gitVersion=$gitver -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$kminor -X $vpkg.gitTreeState=clean -X $vpkg.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)" .)
  cp "$R/usr/bin/etcd" "$work/etcd"
  "$work/etcd" --version >/dev/null
  "$work/$BIN_NAME" --help >/dev/null 2>&1
  rm -rf "$out.tmp"
  mkdir -p "$out.tmp"
  mv "$work/$BIN_NAME" "$work/etcd" "$out.tmp/"
  if [ -x "$R/usr/bin/kubectl" ] && "$R/usr/bin/kubectl" version --client >/dev/null 2>&1; then
    cp "$R/usr/bin/kubectl" "$out.tmp/kubectl"
  fi
  {
    echo "# elasticgpu test server build $key ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
    echo "# suite=$SUITE mirror=$MIRROR go=$(go version | cut -d' ' -f3) gitVersion=$gitver"
    cat "$versions"
  } >"$out.tmp/versions.txt"
  rm -rf "$out"
  mv "$out.tmp" "$out"
  cd /
  rm -rf "$work"
  exit 0
fi

# --- outer driver ---
mkdir -p "$CACHE" "$APTDIR/etc/sources.list.d" "$APTDIR/etc/preferences.d" "$APTDIR/state/lists/partial" "$APTDIR/cache/archives/partial"
touch "$APTDIR/state/status"
exec 9>"$CACHE/.lock"
flock 9

if [ "${ELASTICGPU_TESTSERVER_OFFLINE:-}" = 1 ]; then
  fallback "ELASTICGPU_TESTSERVER_OFFLINE=1: not fetching"
fi
for t in apt-get apt-cache dpkg sha256sum flock; do
  command -v "$t" >/dev/null || fallback "required tool $t not found"
done

opts="[arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]"
[ "${ELASTICGPU_APT_TRUSTED:-}" = 1 ] && opts="[arch=amd64 trusted=yes]"
echo "deb $opts $MIRROR $SUITE main" >"$APTDIR/etc/sources.list"

# shellcheck disable=SC2046
if ! apt-get -q $(apt_opts) --error-on=any update >"$CACHE/apt-update.log" 2>&1; then
  fallback "private apt update of $SUITE failed (see $CACHE/apt-update.log)"
fi

versions=$(mktemp)
trap 'rm -f "$versions"' EXIT
# shellcheck disable=SC2046,SC2086
if ! pkgs=$(apt-cache $(apt_opts) depends --recurse --no-recommends --no-suggests --no-conflicts \
  --no-breaks --no-replaces --no-enhances $ROOT_PKGS 2>/dev/null | grep -v '^ ' | grep -v '^<' |
  grep -E '^golang-.*-dev$' | sort -u); then
  fallback "could not resolve the package closure"
fi
# shellcheck disable=SC2046,SC2086
apt-cache $(apt_opts) show --no-all-versions $pkgs $ROOT_PKGS $OPTIONAL_PKGS 2>/dev/null |
  awk '/^Package:/{p=$2} /^Version:/{print p"="$2}' | sort -u >"$versions" || true
for p in $ROOT_PKGS; do
  grep -q "^$p=" "$versions" || fallback "package $p not available in $SUITE"
done

key=$( (cat "$HERE/main.go" "$HERE/go.mod" "$HERE/build.sh" "$versions") | sha256sum | cut -c1-16)
if [ -x "$CACHE/$key/$BIN_NAME" ] && [ -x "$CACHE/$key/etcd" ]; then
  log "up to date: $CACHE/$key"
  write_env "$CACHE/$key"
  exit 0
fi

log "building test server $key from $(wc -l <"$versions") Debian $SUITE packages (a few minutes)"
start=$(date +%s)
if ! bash "$HERE/build.sh" __build "$key" "$versions" >&2; then
  rm -rf "$CACHE/work-$key" "$CACHE/$key.tmp"
  fallback "building the test server failed"
fi
log "built in $(($(date +%s) - start))s: $CACHE/$key"
write_env "$CACHE/$key"
# Keep the three newest builds.
ls -1td "$CACHE"/*/"$BIN_NAME" 2>/dev/null | tail -n +4 | while read -r old; do rm -rf "$(dirname "$old")"; done
