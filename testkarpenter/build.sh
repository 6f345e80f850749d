#!/usr/bin/env bash
# Build (or find in the cache) Karpenter with its KWOK cloud provider (sigs.k8s.io/karpenter/kwok,
# the upstream main, unchanged) from the Go module proxy, for tests/realcluster/test_karpenter.py:
# a real node autoscaler against the real control plane of tests/realcluster. go.mod pins the
# release (tools.go keeps it required), go.sum every checksum; -mod=readonly.
#
# Result: ${ELASTICGPU_CACHE:-$HOME/.cache/elasticgpu}/testkarpenter/<key>/
#   karpenter-kwok, crds/ (karpenter.sh NodePool, NodeClaim, NodeOverlay; karpenter.kwok.sh
#   KWOKNodeClass, copied from the same module), versions.txt
# where <key> hashes go.mod, go.sum, this script, scripts/cached-build.sh and `go version`.
# The path is written to <cache>/testkarpenter/current.env and printed.
#
# If downloading or building fails and a binary was built before, a WARNING is printed and the
# newest cached build is used; with nothing cached it exits 1 (the Karpenter tests then skip,
# naming this script). A cold build is about an hour on 2 loaded cores (the Kubernetes client
# libraries, controller-runtime and Karpenter itself); every go command runs under `nice -n 19`.
#
# Environment:
#   ELASTICGPU_CACHE                  cache root (default ~/.cache/elasticgpu)
#   ELASTICGPU_KARPENTER_OFFLINE=1    do not touch the network; use the newest cache
#   ELASTICGPU_KARPENTER_STRICT=1     fail instead of falling back
#   GO                                the go command (default: go on PATH)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN_NAME=karpenter-kwok
MODULE=sigs.k8s.io/karpenter
NAME=testkarpenter WHAT=build MARKER=$BIN_NAME STRICT_VAR=ELASTICGPU_KARPENTER_STRICT
# shellcheck source=scripts/cached-build.sh
. "$HERE/../scripts/cached-build.sh"
GO=${GO:-go}

build_complete() { [ -x "$1/$BIN_NAME" ] && [ -d "$1/crds" ]; }

env_lines() { # $1 = build dir
  echo "ELASTICGPU_KARPENTER_BIN=$1/$BIN_NAME"
  echo "ELASTICGPU_KARPENTER_CRDS=$1/crds"
  echo "ELASTICGPU_KARPENTER_VERSIONS=$1/versions.txt"
}

lock_cache
fallback_if_offline ELASTICGPU_KARPENTER_OFFLINE "not building"
require_tools "$GO" sha256sum flock nice

gover=$("$GO" env GOVERSION)
key=$(cache_key "$HERE/go.mod" "$HERE/go.sum" "$HERE/tools.go" "$HERE/build.sh" - <<<"$gover")
exit_if_up_to_date "$key"

go_start "$key"
version=$(cd "$HERE" && "$GO" list -m -f '{{.Version}}' "$MODULE")
log "building $MODULE/kwok $version $key ($gover; cold: about an hour on 2 loaded cores)"
start=$(date +%s)
go_download
log "modules downloaded in $(($(date +%s) - start))s"
go_run "go build failed (output above)" build -trimpath -ldflags "-s -w" -o "$work/$BIN_NAME" "$MODULE/kwok"
moddir=$(cd "$HERE" && "$GO" list -m -f '{{.Dir}}' "$MODULE")
mkdir -p "$work/crds"
cp "$moddir"/pkg/apis/crds/*.yaml "$moddir"/kwok/apis/crds/*.yaml "$work/crds/"
chmod u+w "$work"/crds/*.yaml
{
  echo "# $BIN_NAME build $key ($(date -u +%Y-%m-%dT%H:%M:%SZ)) go=$gover build_s=$(($(date +%s) - start))"
  (cd "$HERE" && "$GO" list -m all 2>/dev/null | grep -E "^($MODULE|sigs.k8s.io/controller-runtime|k8s.io/client-go) ") || true
} >"$work/versions.txt"
go_finish "$key" "$BIN_NAME" crds versions.txt
finish_build "$key" "$start" 2
