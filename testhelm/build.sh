#!/usr/bin/env bash
# Build (or find in the cache) helm itself: helm.sh/helm/v4's own cmd/helm, pinned by go.mod/go.sum
# (the `tool` line names it; the version is the one go.mod requires), for the tests that run the
# real helm against deploy/chart (tests/deploy/test_helm_chart.py; tests/helm_binary.py finds it).
# No code of ours: helm is built as its Makefile builds a release (CGO_ENABLED=0, -trimpath, the
# version stamped, so `helm version` prints the module's version rather than its source's "v4.3").
#
# Result: ${ELASTICGPU_CACHE:-$HOME/.cache/elasticgpu}/testhelm/<key>/
#   helm, versions.txt
# where <key> hashes go.mod, go.sum, this script, scripts/cached-build.sh and `go version`.
# The path is written to <cache>/testhelm/current.env and printed (ELASTICGPU_HELM_BIN=...).
#
# If downloading or building fails and a binary was built before, a WARNING is printed and the
# newest cached build is used; with none it fails, and scripts/test.sh lets the helm tests skip,
# naming this script. Every go command runs under `nice -n 19`: the machines are small and shared.
# Its own GOCACHE (<cache>/testhelm/gocache): a build here never evicts testcluster's.
#
# Environment:
#   ELASTICGPU_CACHE             cache root (default ~/.cache/elasticgpu)
#   ELASTICGPU_HELM_OFFLINE=1    do not touch the network; use the newest cache
#   ELASTICGPU_HELM_STRICT=1     fail instead of falling back (when changing go.mod)
#   GO                           the go command (default: go on PATH)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN_NAME=helm
MODULE=helm.sh/helm/v4
NAME=testhelm WHAT=helm MARKER=$BIN_NAME STRICT_VAR=ELASTICGPU_HELM_STRICT
# shellcheck source=scripts/cached-build.sh
. "$HERE/../scripts/cached-build.sh"
GO=${GO:-go}

build_complete() { [ -x "$1/$BIN_NAME" ]; }

env_lines() { # $1 = build dir
  echo "ELASTICGPU_HELM_BIN=$1/$BIN_NAME"
}

lock_cache
fallback_if_offline ELASTICGPU_HELM_OFFLINE "not building"
require_tools "$GO" sha256sum flock nice

gover=$("$GO" env GOVERSION)
key=$(cache_key "$HERE/go.mod" "$HERE/go.sum" "$HERE/build.sh" - <<<"$gover")
exit_if_up_to_date "$key"

go_start "$key"
# The version go.mod pins: one source, stamped into the binary below.
version=$(cd "$HERE" && "$GO" list -m -f '{{.Version}}' "$MODULE")
log "building $MODULE $version $key ($gover)"
start=$(date +%s)
go_download
log "modules downloaded in $(($(date +%s) - start))s"
# As helm's Makefile for a tagged release: version set, metadata empty (no "+unreleased").
ldflags="-s -w -X $MODULE/internal/version.version=$version -X $MODULE/internal/version.metadata="
go_run "go build failed (output above)" build -trimpath -ldflags "$ldflags" -o "$work/$BIN_NAME" "$MODULE/cmd/helm"
# The binary must say what go.mod pinned: a wrong stamp fails here, not in a test.
said=$("$work/$BIN_NAME" version --template '{{.Version}}')
if [ "$said" != "$version" ]; then
  rm -rf "$work"
  fallback "the built helm says $said, go.mod pins $version"
fi
{
  echo "# $BIN_NAME build $key ($(date -u +%Y-%m-%dT%H:%M:%SZ)) go=$gover"
  "$work/$BIN_NAME" version
  (cd "$HERE" && "$GO" list -m all 2>/dev/null | grep -E "^($MODULE|k8s.io/client-go) ") || true
} >"$work/versions.txt"
go_finish "$key" "$BIN_NAME" versions.txt
finish_build "$key" "$start" 2
