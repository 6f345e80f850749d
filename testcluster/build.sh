#!/usr/bin/env bash
# Build (or find in the cache) elasticgpu-k8s: Kubernetes' own kube-apiserver,
# kube-controller-manager, kube-scheduler and kubelet in one binary (main.go),
# built from the k8s.io/kubernetes module as a library through the Go module
# proxy (go.mod pins k8s.io/kubernetes and replaces each k8s.io/* staging module
# with its published version of the same release; go.sum pins every checksum).
#
# Result: ${ELASTICGPU_CACHE:-$HOME/.cache/elasticgpu}/testcluster/<key>/
#   elasticgpu-k8s, versions.txt
# where <key> hashes main.go, go.mod, go.sum, this script and `go version`.
# The path is written to <cache>/testcluster/current.env and printed.
#
# If downloading or building fails (no network, a module refused) and a binary
# was built before, a WARNING is printed and the newest cached build is used.
#
# Every go command runs under `nice -n 19`: the machines are small and shared.
#
# Environment:
#   ELASTICGPU_CACHE                 cache root (default ~/.cache/elasticgpu)
#   ELASTICGPU_TESTCLUSTER_OFFLINE=1 do not touch the network; use the newest cache
#   ELASTICGPU_TESTCLUSTER_STRICT=1  fail instead of falling back (when editing main.go)
#   GO                               the go command (default: go on PATH)
#   GOPROXY, GOMODCACHE              as usual for go
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${ELASTICGPU_CACHE:-$HOME/.cache/elasticgpu}/testcluster
GO=${GO:-go}
BIN_NAME=elasticgpu-k8s

log() { echo "testcluster/build.sh: $*" >&2; }

write_env() { # $1 = build dir
  local d=$1 tmp
  tmp=$(mktemp "$CACHE/current.env.XXXXXX")
  {
    echo "ELASTICGPU_K8S_BIN=$d/$BIN_NAME"
    echo "ELASTICGPU_K8S_VERSIONS=$d/versions.txt"
  } >"$tmp"
  mv -f "$tmp" "$CACHE/current.env"
  grep -v VERSIONS "$CACHE/current.env"
}

newest_cached() {
  local f
  f=$(ls -1t "$CACHE"/*/"$BIN_NAME" 2>/dev/null | head -n1 || true)
  [ -n "$f" ] && dirname "$f"
}

fallback() { # $1 = reason
  local d
  if [ "${ELASTICGPU_TESTCLUSTER_STRICT:-}" = 1 ]; then
    log "ERROR: $1 (ELASTICGPU_TESTCLUSTER_STRICT=1: no fallback)"
    exit 1
  fi
  if d=$(newest_cached); then
    log "WARNING: $1"
    log "WARNING: falling back to the newest cached build: $d"
    write_env "$d"
    exit 0
  fi
  log "ERROR: $1 (and no cached build to fall back to)"
  exit 1
}

# --regen-gomod v1.X.Y: move to another Kubernetes release. Rewrites go.mod's replace lines from
# that release's own go.mod (each `k8s.io/foo => ./staging/src/k8s.io/foo` becomes
# `k8s.io/foo => k8s.io/foo v0.X.Y`) and lets `go mod tidy` pin the rest in go.mod and go.sum.
if [ "${1:-}" = "--regen-gomod" ]; then
  want=${2:?usage: build.sh --regen-gomod v1.X.Y}
  staging=v0.${want#v1.}
  modfile=$(nice -n 19 "$GO" mod download -json "k8s.io/kubernetes@$want" | awk -F'"' '$2=="GoMod"{print $4}')
  {
    sed -n '1,/^module /p' "$HERE/go.mod" | sed '$d'
    printf 'module elasticgpu.local/testcluster\n\ngo %s\n\n' "$(awk '$1=="go"{print $2; exit}' "$modfile")"
    grep '^godebug' "$modfile" && echo
    printf 'require k8s.io/kubernetes %s\n\nreplace (\n' "$want"
    awk -v v="$staging" '$2=="=>" && $3 ~ /^\.\/staging\// {print "\t"$1" => "$1" "v}' "$modfile"
    echo ")"
  } >"$HERE/go.mod.new"
  mv "$HERE/go.mod.new" "$HERE/go.mod"
  (cd "$HERE" && GOFLAGS=-mod=mod nice -n 19 "$GO" mod tidy)
  log "go.mod and go.sum now pin Kubernetes $want (staging modules $staging); build with: bash $0"
  exit 0
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9

if [ "${ELASTICGPU_TESTCLUSTER_OFFLINE:-}" = 1 ]; then
  fallback "ELASTICGPU_TESTCLUSTER_OFFLINE=1: not building"
fi
for t in "$GO" sha256sum flock nice; do
  command -v "$t" >/dev/null || fallback "required tool $t not found"
done

gover=$("$GO" env GOVERSION)
kver=$(awk '$1=="k8s.io/kubernetes" && $2 ~ /^v1\./ {print $2; exit}' "$HERE/go.mod")
[ -n "$kver" ] || fallback "go.mod requires no k8s.io/kubernetes v1.X.Y"
key=$( (cat "$HERE/main.go" "$HERE/go.mod" "$HERE/go.sum" "$HERE/build.sh"; echo "$gover") | sha256sum | cut -c1-16)
if [ -x "$CACHE/$key/$BIN_NAME" ]; then
  log "up to date: $CACHE/$key"
  write_env "$CACHE/$key"
  exit 0
fi

export GOCACHE=$CACHE/gocache GOFLAGS=-mod=readonly GOTOOLCHAIN=local CGO_ENABLED=0
work=$CACHE/work-$key
rm -rf "$work"
mkdir -p "$work"
log "building $BIN_NAME $key (Kubernetes $kver, $gover; cold: tens of minutes on 2 shared cores)"
start=$(date +%s)
# The download is its own step so that a refused module is named as such (go mod download
# prints the module and the proxy's answer), not lost among compiler output.
if ! (cd "$HERE" && nice -n 19 "$GO" mod download) >"$work/download.log" 2>&1; then
  cat "$work/download.log" >&2
  fallback "go mod download failed (see above: the module and the proxy's answer)"
fi
downloaded=$(date +%s)
minor=$(echo "$kver" | cut -d. -f2)
vpkg=k8s.io/component-base/version
ldflags="-s -w -X $vpkg.gitVersion=$kver -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor -X $vpkg.gitTreeState=clean"
ldflags="$ldflags -X $vpkg.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
if ! (cd "$HERE" && nice -n 19 "$GO" build -trimpath -o "$work/$BIN_NAME" -ldflags "$ldflags" .) >&2; then
  rm -rf "$work"
  fallback "go build failed (compiler output above)"
fi
for c in kube-apiserver kube-controller-manager kube-scheduler kubelet; do
  "$work/$BIN_NAME" "$c" --version >/dev/null 2>&1 || { rm -rf "$work"; fallback "$BIN_NAME $c --version does not run"; }
done
{
  echo "# elasticgpu-k8s build $key ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
  echo "# go=$gover kubernetes=$kver download_s=$((downloaded - start)) build_s=$(($(date +%s) - downloaded))"
  (cd "$HERE" && "$GO" list -m all 2>/dev/null | grep '^k8s.io/') || true
} >"$work/versions.txt"
rm -rf "$CACHE/$key"
mkdir -p "$CACHE/$key"
mv "$work/$BIN_NAME" "$work/versions.txt" "$CACHE/$key/"
rm -rf "$work"
log "built in $(($(date +%s) - start))s: $CACHE/$key"
write_env "$CACHE/$key"
# Keep the two newest builds (each is ~200 MB).
ls -1td "$CACHE"/*/"$BIN_NAME" 2>/dev/null | tail -n +3 | while read -r old; do rm -rf "$(dirname "$old")"; done
