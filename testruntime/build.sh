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
# where <key> hashes this script and the exact package versions. The paths are written to
# <cache>/testruntime/current.env and printed.
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
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${ELASTICGPU_CACHE:-$HOME/.cache/elasticgpu}/testruntime
APTDIR=$CACHE/apt
MIRROR=${ELASTICGPU_DEBIAN_MIRROR:-http://deb.debian.org/debian}
IMAGE_NAME=elasticgpu.local/busybox:test
# package:suite, in the order they are unpacked
PKGS="containerd:trixie runc:bookworm busybox-static:bookworm nginx:bookworm"

log() { echo "testruntime/build.sh: $*" >&2; }

complete() { # $1 = build dir: true when everything the fixture needs is there
  [ -x "$1/root/usr/bin/containerd" ] && [ -x "$1/root/usr/bin/ctr" ] && [ -x "$1/root/usr/sbin/runc" ] &&
    [ -x "$1/root/usr/bin/containerd-shim-runc-v2" ] && [ -s "$1/image.tar" ]
}

write_env() { # $1 = build dir
  local d=$1 tmp
  tmp=$(mktemp "$CACHE/current.env.XXXXXX")
  {
    echo "ELASTICGPU_TESTRUNTIME_ROOT=$d/root"
    echo "ELASTICGPU_TESTRUNTIME_IMAGE=$d/image.tar"
    echo "ELASTICGPU_TESTRUNTIME_IMAGE_NAME=$IMAGE_NAME"
    # A cached build from before the front has no nginx: the front's tests skip with that reason.
    if [ -x "$d/root/usr/sbin/nginx" ]; then echo "ELASTICGPU_TESTRUNTIME_NGINX=$d/root/usr/sbin/nginx"; fi
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
    log "WARNING: falling back to the newest cached test runtime: $d"
    write_env "$d"
    exit 0
  fi
  log "ERROR: $1 (and no cached test runtime to fall back to)"
  exit 1
}

apt_opts() {
  echo -o "Dir::Etc::SourceList=$APTDIR/etc/sources.list" -o "Dir::Etc::SourceParts=$APTDIR/etc/sources.list.d" \
    -o "Dir::Etc::Preferences=$APTDIR/etc/preferences" -o "Dir::Etc::PreferencesParts=$APTDIR/etc/preferences.d" \
    -o "Dir::State=$APTDIR/state" -o "Dir::State::status=$APTDIR/state/status" \
    -o "Dir::Cache=$APTDIR/cache" -o Debug::NoLocking=1 -o "APT::Sandbox::User=$(id -un)" \
    -o APT::Architecture=amd64 -o APT::Architectures=amd64
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
  while read -r pv; do
    p=${pv%%=*}
    v=${pv#*=}
    fv=${v/:/%3a}
    dpkg -x "$(ls "${p}_${fv}"_*.deb | head -n1)" "$out.tmp/root"
  done <"$versions"
  # Drop debs of older builds.
  for f in "$APTDIR"/debs/*.deb; do
    b=$(basename "$f")
    grep -qxF "${b%%_*}=$(echo "$b" | cut -d_ -f2 | sed 's/%3a/:/')" "$versions" || rm -f "$f"
  done
  "$out.tmp/root/usr/bin/containerd" --version >/dev/null
  "$out.tmp/root/usr/sbin/runc" --version >/dev/null
  # Captured first: `nginx -V | grep -q` could end nginx with SIGPIPE, a failure under pipefail.
  nginx_built=$("$out.tmp/root/usr/sbin/nginx" -V 2>&1)
  case "$nginx_built" in
  *--with-http_v2_module*) ;;
  *) echo "nginx from Debian has no http_v2 module: $nginx_built" >&2 && exit 1 ;;
  esac
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
mkdir -p "$CACHE" "$APTDIR/etc/sources.list.d" "$APTDIR/etc/preferences.d" "$APTDIR/state/lists/partial" "$APTDIR/cache/archives/partial"
touch "$APTDIR/state/status"
exec 9>"$CACHE/.lock"
flock 9

if [ "${ELASTICGPU_TESTRUNTIME_OFFLINE:-}" = 1 ]; then
  fallback "ELASTICGPU_TESTRUNTIME_OFFLINE=1: not fetching"
fi
for t in apt-get apt-cache dpkg sha256sum flock tar gzip; do
  command -v "$t" >/dev/null || fallback "required tool $t not found"
done

opts="[arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]"
[ "${ELASTICGPU_APT_TRUSTED:-}" = 1 ] && opts="[arch=amd64 trusted=yes]"
{
  echo "deb $opts $MIRROR bookworm main"
  echo "deb $opts $MIRROR trixie main"
} >"$APTDIR/etc/sources.list"

# A fresh index costs a few seconds; one younger than a day is good enough for the cache check
# (the build key changes only when Debian publishes a new version of one of the packages).
lists=$(ls -1t "$APTDIR"/state/lists/*_Packages* 2>/dev/null | head -n1 || true)
if [ -z "$lists" ] || [ -n "$(find "$lists" -mmin +1440)" ]; then
  # shellcheck disable=SC2046
  if ! apt-get -q $(apt_opts) --error-on=any update >"$CACHE/apt-update.log" 2>&1; then
    fallback "private apt update of bookworm+trixie failed (see $CACHE/apt-update.log)"
  fi
fi

versions=$(mktemp)
trap 'rm -f "$versions"' EXIT
# One apt-cache call for all the packages (each call reads the whole index: ~1.5 s).
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

log "building test runtime $key from $(tr '\n' ' ' <"$versions")"
start=$(date +%s)
if ! bash "$HERE/build.sh" __build "$key" "$versions" >&2; then
  rm -rf "$CACHE/$key.tmp"
  fallback "building the test runtime failed"
fi
log "built in $(($(date +%s) - start))s: $CACHE/$key"
write_env "$CACHE/$key"
# Keep the two newest builds.
ls -1td "$CACHE"/*/root 2>/dev/null | tail -n +3 | while read -r old; do rm -rf "$(dirname "$old")"; done
