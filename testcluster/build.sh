#!/usr/bin/env bash
# Build (or find in the cache) elasticgpu-k8s: Kubernetes' own kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet and kube-proxy in one binary (main.go),
# built from the k8s.io/kubernetes module as a library through the Go module
# proxy (go.mod pins k8s.io/kubernetes and replaces each k8s.io/* staging module
# with its published version of the same release; go.sum pins every checksum).
#
# Result: ${ELASTICGPU_CACHE:-$HOME/.cache/elasticgpu}/testcluster/<key>/
#   elasticgpu-k8s, versions.txt
# where <key> hashes main.go, go.mod, go.sum, this script, scripts/cached-build.sh and
# `go version`.
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
#
# The cache key, lock, fallback, current.env and logging are shared with testserver/ and
# testruntime/: scripts/cached-build.sh.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN_NAME=elasticgpu-k8s
NAME=testcluster WHAT=build MARKER=$BIN_NAME STRICT_VAR=ELASTICGPU_TESTCLUSTER_STRICT
# shellcheck source=scripts/cached-build.sh
. "$HERE/../scripts/cached-build.sh"
GO=${GO:-go}

build_complete() { [ -x "$1/$BIN_NAME" ]; }

env_lines() { # $1 = build dir
  echo "ELASTICGPU_K8S_BIN=$1/$BIN_NAME"
  echo "ELASTICGPU_K8S_VERSIONS=$1/versions.txt"
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

lock_cache
fallback_if_offline ELASTICGPU_TESTCLUSTER_OFFLINE "not building"
require_tools "$GO" sha256sum flock nice

gover=$("$GO" env GOVERSION)
kver=$(awk '$1=="k8s.io/kubernetes" && $2 ~ /^v1\./ {print $2; exit}' "$HERE/go.mod")
[ -n "$kver" ] || fallback "go.mod requires no k8s.io/kubernetes v1.X.Y"
key=$(cache_key "$HERE/main.go" "$HERE/go.mod" "$HERE/go.sum" "$HERE/build.sh" - <<<"$gover")
exit_if_up_to_date "$key"

go_start "$key"
log "building $BIN_NAME $key (Kubernetes $kver, $gover; cold: tens of minutes on 2 shared cores)"
start=$(date +%s)
go_download
downloaded=$(date +%s)
minor=$(echo "$kver" | cut -d. -f2)
vpkg=k8s.io/component-base/version
ldflags="-s -w -X $vpkg.gitVersion=$kver -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor -X $vpkg.gitTreeState=clean"
ldflags="$ldflags -X $vpkg.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
go_run "go build failed (compiler output above)" build -trimpath -o "$work/$BIN_NAME" -ldflags "$ldflags" .
for c in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy; do
  "$work/$BIN_NAME" "$c" --version >/dev/null 2>&1 || { rm -rf "$work"; fallback "$BIN_NAME $c --version does not run"; }
done
{
  echo "# elasticgpu-k8s build $key ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
  echo "# go=$gover kubernetes=$kver download_s=$((downloaded - start)) build_s=$(($(date +%s) - downloaded))"
  (cd "$HERE" && "$GO" list -m all 2>/dev/null | grep '^k8s.io/') || true
} >"$work/versions.txt"
go_finish "$key" "$BIN_NAME" versions.txt
finish_build "$key" "$start" 2 # keeps the two newest builds (each is ~200 MB)
