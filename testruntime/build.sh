#!/usr/bin/env bash
# Build (or find in the cache) the elasticgpu test container runtime: a real containerd with
# runc and CDI, plus a small busybox OCI image, for the CRI tests (tests/agent/cri/).
#
# Everything comes from Debian packages, nothing is pulled from a registry:
#   containerd 1.7   from trixie   (bookworm's 1.6 has no CDI; Go, needs only libc >= 2.34)
#   runc             from bookworm (trixie's runc needs a newer glibc than bookworm's)
#   busybox-static   from bookworm (the image's only file)
#   nginx 1.22       from bookworm (the CRI front, elasticgpu/agent/cri/front.py: its http_v2 and
#                    grpc modules are built in; it needs only libc, libcrypt, libpcre2, libssl3, zlib)
# They are fetched with a *private* apt configuration (own sources list, state and cache
# directories; the system's apt state is untouched) and unpacked with `dpkg -x`; nothing is
# installed into the system.
#
# Result: ${ELASTICGPU_CACHE:-$HOME/.cache/elasticgpu}/testruntime/<key>/
#   root/        the unpacked packages (usr/bin/containerd, usr/bin/ctr, usr/sbin/runc, usr/sbin/nginx, ...)
#   image.tar    an OCI image archive named $IMAGE_NAME (busybox + applet links)
#   versions.txt the package versions this build used
# where <key> hashes this script, scripts/cached-build.sh and the exact package versions. The
# paths are written to <cache>/testruntime/current.env and printed.
#
# If fetching fails (no network, a mirror hiccup) and a runtime was built before, a WARNING is
# printed and the newest cached build is used (exit 0). With no cached build it exits 1 and the
# caller (scripts/test.sh) lets the runtime tests skip with that reason.
#
# Environment:
#   ELASTICGPU_CACHE                 cache root (default ~/.cache/elasticgpu)
#   ELASTICGPU_TESTRUNTIME_OFFLINE=1 do not touch the network; use the newest cached build
#   ELASTICGPU_DEBIAN_MIRROR         (default http://deb.debian.org/debian)
#   ELASTICGPU_APT_TRUSTED=1         skip signature checks ([trusted=yes])
#
# containerd 2.x (NRI on by default: issue 34), the same recipe with another package set:
#   ELASTICGPU_TESTRUNTIME_CONTAINERD=2 bash testruntime/build.sh
# takes containerd from sid (2.1 today; Go, it needs only libc >= 2.34, checked by running it),
# runc and busybox-static from bookworm as above, no nginx (the front's tests run on 1.7), and
# keeps its builds apart: <cache>/testruntime2/<key>/ and <cache>/testruntime2/current.env.
#
# The cache key, lock, fallback, current.env, logging and private apt configuration are shared
# with testserver/ and testcluster/: scripts/cached-build.sh.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VARIANT=${ELASTICGPU_TESTRUNTIME_CONTAINERD:-1.7}
case "$VARIANT" in
1.7)
  NAME=testruntime
  # package:suite, in the order they are unpacked
  PKGS="containerd:trixie runc:bookworm busybox-static:bookworm nginx:bookworm"
  SUITES="bookworm trixie"
  ;;
2)
  NAME=testruntime2
  PKGS="containerd:sid runc:bookworm busybox-static:bookworm"
  SUITES="bookworm sid"
  ;;
*) echo "testruntime/build.sh: ELASTICGPU_TESTRUNTIME_CONTAINERD must be 1.7 or 2, not $VARIANT" >&2 && exit 2 ;;
esac
WHAT="test runtime" MARKER=root STRICT_VAR= # no STRICT: it always falls back
# shellcheck source=scripts/cached-build.sh
. "$HERE/../scripts/cached-build.sh"
IMAGE_NAME=elasticgpu.local/busybox:test

build_complete() { # $1 = build dir: true when everything the fixture needs is there
  [ -x "$1/root/usr/bin/containerd" ] && [ -x "$1/root/usr/bin/ctr" ] && [ -x "$1/root/usr/sbin/runc" ] &&
    [ -x "$1/root/usr/bin/containerd-shim-runc-v2" ] && [ -s "$1/image.tar" ]
}

env_lines() { # $1 = build dir
  echo "ELASTICGPU_TESTRUNTIME_CONTAINERD=$VARIANT"
  echo "ELASTICGPU_TESTRUNTIME_ROOT=$1/root"
  echo "ELASTICGPU_TESTRUNTIME_IMAGE=$1/image.tar"
  echo "ELASTICGPU_TESTRUNTIME_IMAGE_NAME=$IMAGE_NAME"
  # A cached build from before the front has no nginx: the front's tests skip with that reason.
  if [ -x "$1/root/usr/sbin/nginx" ]; then echo "ELASTICGPU_TESTRUNTIME_NGINX=$1/root/usr/sbin/nginx"; fi
}

# Writes an OCI image archive (oci-layout, index.json, blobs/) of one layer: busybox and a
# link per applet. Reproducible: sorted entries, mtime 0, numeric owner 0, gzip without name/time.
build_image() { # $1 = unpacked root, $2 = output archive
  local root=$1 out=$2 img rootfs layer diff_id layer_digest layer_size config config_digest manifest manifest_digest
  img=$(mktemp -d "$CACHE/image.XXXXXX")
  rootfs=$img/rootfs
  mkdir -p "$rootfs/bin" "$rootfs/etc" "$rootfs/tmp" "$rootfs/proc" "$rootfs/sys" "$rootfs/dev" "$rootfs/root" "$img/oci/blobs/sha256"
  cp "$root/bin/busybox" "$rootfs/bin/busybox"
  for applet in $("$rootfs/bin/busybox" --list); do
    [ "$applet" = busybox ] || ln -s busybox "$rootfs/bin/$applet"
  done
  echo "root:x:0:0:root:/root:/bin/sh" >"$rootfs/etc/passwd"
  echo "root:x:0:" >"$rootfs/etc/group"
  chmod 1777 "$rootfs/tmp"
  layer=$img/layer.tar
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$rootfs" -cf "$layer" .
  diff_id=$(sha256sum <"$layer" | cut -d' ' -f1)
  gzip -n -9 "$layer"
  layer_digest=$(sha256sum <"$layer.gz" | cut -d' ' -f1)
  layer_size=$(stat -c %s "$layer.gz")
  mv "$layer.gz" "$img/oci/blobs/sha256/$layer_digest"
  # The default command keeps a sandbox ("pause") or a plain container alive and ends at once
  # on SIGTERM (PID 1 ignores signals it has no handler for).
  config='{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/bin"],"Cmd":["/bin/sh","-c","trap \"exit 0\" TERM; while :; do sleep 1; done"]},"rootfs":{"type":"layers","diff_ids":["sha256:'$diff_id'"]},"history":[{"created_by":"elasticgpu testruntime/build.sh"}]}'
  printf '%s' "$config" >"$img/config.json"
  config_digest=$(sha256sum <"$img/config.json" | cut -d' ' -f1)
  mv "$img/config.json" "$img/oci/blobs/sha256/$config_digest"
  manifest='{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:'$config_digest'","size":'$(stat -c %s "$img/oci/blobs/sha256/$config_digest")'},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:'$layer_digest'","size":'$layer_size'}]}'
  printf '%s' "$manifest" >"$img/manifest.json"
  manifest_digest=$(sha256sum <"$img/manifest.json" | cut -d' ' -f1)
  mv "$img/manifest.json" "$img/oci/blobs/sha256/$manifest_digest"
  printf '%s' '{"imageLayoutVersion":"1.0.0"}' >"$img/oci/oci-layout"
  printf '%s' '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:'$manifest_digest'","size":'$(stat -c %s "$img/oci/blobs/sha256/$manifest_digest")',"annotations":{"io.containerd.image.name":"'$IMAGE_NAME'","org.opencontainers.image.ref.name":"test"}}]}' >"$img/oci/index.json"
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$img/oci" -cf "$out" oci-layout index.json blobs
  rm -rf "$img"
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
  unpack_debs "$versions" "$out.tmp/root"
  prune_debs "$versions" # those of older builds
  "$out.tmp/root/usr/bin/containerd" --version >/dev/null
  "$out.tmp/root/usr/bin/containerd-shim-runc-v2" -v >/dev/null
  "$out.tmp/root/usr/sbin/runc" --version >/dev/null
  if [ -x "$out.tmp/root/usr/sbin/nginx" ]; then
    # Captured first: `nginx -V | grep -q` could end nginx with SIGPIPE, a failure under pipefail.
    nginx_built=$("$out.tmp/root/usr/sbin/nginx" -V 2>&1)
    case "$nginx_built" in
    *--with-http_v2_module*) ;;
    *) echo "nginx from Debian has no http_v2 module: $nginx_built" >&2 && exit 1 ;;
    esac
  fi
  build_image "$out.tmp/root" "$out.tmp/image.tar"
  {
    echo "# elasticgpu test runtime build $key ($(date -u +%Y-%m-%dT%H:%M:%SZ)) mirror=$MIRROR"
    cat "$versions"
  } >"$out.tmp/versions.txt"
  rm -rf "$out"
  mv "$out.tmp" "$out"
  exit 0
fi

# --- outer driver ---
apt_setup
lock_cache
fallback_if_offline ELASTICGPU_TESTRUNTIME_OFFLINE "not fetching"
require_tools apt-get apt-cache dpkg sha256sum flock tar gzip
# shellcheck disable=SC2086
apt_sources $SUITES

apt_update_daily "${SUITES// /+}"

versions=$(mktemp)
trap 'rm -f "$versions"' EXIT
# shellcheck disable=SC2086
pin_versions "$versions" $PKGS

key=$(cache_key "$HERE/build.sh" "$versions")
exit_if_up_to_date "$key"

log "building test runtime (containerd $VARIANT) $key from $(tr '\n' ' ' <"$versions")"
start=$(date +%s)
build_step "$key" "$versions" || fallback "building the test runtime failed"
finish_build "$key" "$start" 2 # keeps the two newest builds
