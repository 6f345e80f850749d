#!/usr/bin/env bash
# Build (or find in the cache) elasticgpu-nri-plugin: the agent's NRI front (main.go), a small main
# around github.com/containerd/nri's stub, pinned by go.mod/go.sum to NRI v0.8.0 (containerd 2.0's): the
# first stub that joins a Synchronize the runtime splits past ttrpc's 4 MiB (containerd/nri#111); the
# protocol is the same v1alpha1 that containerd 1.7 (NRI v0.6) and 2.x speak.
#
# Result: ${ELASTICGPU_CACHE:-$HOME/.cache/elasticgpu}/nriplugin/<key>/
#   elasticgpu-nri-plugin, versions.txt
# where <key> hashes main.go, go.mod, go.sum, this script, scripts/cached-build.sh and `go version`.
# The path is written to <cache>/nriplugin/current.env and printed (ELASTICGPU_NRI_PLUGIN_BIN=...).
#
# If downloading or building fails and a binary was built before, a WARNING is printed and the
# newest cached build is used; with none it fails, and scripts/test.sh lets the NRI tests skip,
# naming this script. Every go command runs under `nice -n 19`: the machines are small and shared.
#
# Environment:
#   ELASTICGPU_CACHE                 cache root (default ~/.cache/elasticgpu)
#   ELASTICGPU_NRIPLUGIN_OFFLINE=1   do not touch the network; use the newest cache
#   ELASTICGPU_NRIPLUGIN_STRICT=1    fail instead of falling back (when editing main.go)
#   GO                               the go command (default: go on PATH)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN_NAME=elasticgpu-nri-plugin
NAME=nriplugin WHAT=build MARKER=$BIN_NAME STRICT_VAR=ELASTICGPU_NRIPLUGIN_STRICT
# shellcheck source=scripts/cached-build.sh
. "$HERE/../scripts/cached-build.sh"
GO=${GO:-go}

build_complete() { [ -x "$1/$BIN_NAME" ]; }

env_lines() { # $1 = build dir
  echo "ELASTICGPU_NRI_PLUGIN_BIN=$1/$BIN_NAME"
}

lock_cache
fallback_if_offline ELASTICGPU_NRIPLUGIN_OFFLINE "not building"
require_tools "$GO" sha256sum flock nice

gover=$("$GO" env GOVERSION)
key=$(cache_key "$HERE/main.go" "$HERE/go.mod" "$HERE/go.sum" "$HERE/build.sh" - <<<"$gover")
exit_if_up_to_date "$key"

go_start "$key"
log "building $BIN_NAME $key ($gover)"
start=$(date +%s)
go_download
go_run "go vet failed (output above)" vet .
go_run "go build failed (output above)" build -trimpath -ldflags "-s -w" -o "$work/$BIN_NAME" .
{
  echo "# $BIN_NAME build $key ($(date -u +%Y-%m-%dT%H:%M:%SZ)) go=$gover"
  (cd "$HERE" && "$GO" list -m all 2>/dev/null | grep -E '^github.com/containerd/(nri|ttrpc) ') || true
} >"$work/versions.txt"
go_finish "$key" "$BIN_NAME" versions.txt
finish_build "$key" "$start" 2
