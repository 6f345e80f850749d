#!/usr/bin/env bash
# Fetch (or find in the cache) what the pod network of the tests/realcluster "box" needs: the CNI
# plugins (bridge, host-local, loopback, portmap, ...) and nft, which kube-proxy's nftables mode
# runs (tests/realcluster/box.py).
#
# All from Debian bookworm (the machines' own release, so its libraries match the host's libc):
#   containernetworking-plugins   the CNI plugins, Go (static): /usr/lib/cni/*
#   nftables, libnftables1,       nft and its libraries (kube-proxy's nftables mode execs `nft`;
#   libnftnl11, libjansson4,      the kernel has nf_tables built in, and there is no iptables
#   libmnl0, libxtables12,        binary on these machines: nftables mode needs nothing else; no
#   libedit2                      conntrack binary either: kube-proxy 1.36 clears conntrack
#                                 entries through netlink)
# fetched with a *private* apt configuration (own sources list, state and cache directories; the
# system's apt state is untouched) and unpacked with `dpkg -x`; nothing is installed into the
# system. The same approach as testruntime/ and testprometheus/, through the same sourced helper
# (scripts/cached-build.sh: the cache, its key, current.env, the fallback, private apt).
#
# Result: ${ELASTICGPU_CACHE:-$HOME/.cache/elasticgpu}/testnetwork/<key>/
#   root/        the unpacked packages (usr/lib/cni/bridge, usr/sbin/nft, usr/lib/x86_64-linux-gnu/...)
#   bin/nft      runs root/usr/sbin/nft with root's libraries (LD_LIBRARY_PATH for nft alone);
#                the box puts bin/ first on kube-proxy's PATH
#   versions.txt the package versions this build used
# where <key> hashes this script, scripts/cached-build.sh and the exact package versions. The
# paths are written to <cache>/testnetwork/current.env and printed.
#
# If fetching fails (no network, a mirror hiccup) and a build exists, a WARNING is printed and the
# newest cached build is used (exit 0). With no cached build it exits 1 and the caller
# (scripts/test.sh) lets the box's tests skip with that reason.
#
# Environment:
#   ELASTICGPU_CACHE                  cache root (default ~/.cache/elasticgpu)
#   ELASTICGPU_TESTNETWORK_OFFLINE=1  do not touch the network; use the newest cached build
#   ELASTICGPU_DEBIAN_MIRROR          (default http://deb.debian.org/debian)
#   ELASTICGPU_APT_TRUSTED=1          skip signature checks ([trusted=yes])
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NAME=testnetwork WHAT="pod network build" MARKER=root STRICT_VAR= # no STRICT: it always falls back
# shellcheck source=scripts/cached-build.sh
. "$HERE/../scripts/cached-build.sh"
# package:suite, in the order they are unpacked
PKGS="containernetworking-plugins:bookworm nftables:bookworm libnftables1:bookworm libnftnl11:bookworm"
PKGS="$PKGS libjansson4:bookworm libmnl0:bookworm libxtables12:bookworm libedit2:bookworm"
CNI_PLUGINS="bridge host-local loopback portmap"

build_complete() { # $1 = build dir: true when everything the box needs is there
  local p
  for p in $CNI_PLUGINS; do [ -x "$1/root/usr/lib/cni/$p" ] || return 1; done
  [ -x "$1/bin/nft" ]
}

env_lines() { # $1 = build dir
  echo "ELASTICGPU_TESTNETWORK_CNI_BIN=$1/root/usr/lib/cni"
  echo "ELASTICGPU_TESTNETWORK_BIN=$1/bin"
  echo "ELASTICGPU_TESTNETWORK_VERSIONS=$1/versions.txt"
}

if [ "${1:-}" = "__build" ]; then
  key=$2
  versions=$3
  out=$CACHE/$key
  rm -rf "$out.tmp"
  mkdir -p "$out.tmp/root" "$out.tmp/bin" "$APTDIR/debs"
  cd "$APTDIR/debs"
  # shellcheck disable=SC2046
  apt-get -q $(apt_opts) download $(cat "$versions") >/dev/null
  unpack_debs "$versions" "$out.tmp/root"
  prune_debs "$versions"
  # The wrapper finds root/ beside its own folder, so the build folder may be renamed (out.tmp -> out).
  cat >"$out.tmp/bin/nft" <<'WRAPPER'
#!/bin/sh
root=$(dirname "$(dirname "$(readlink -f "$0")")")/root
LD_LIBRARY_PATH=$root/usr/lib/x86_64-linux-gnu exec "$root/usr/sbin/nft" "$@"
WRAPPER
  chmod 755 "$out.tmp/bin/nft"
  "$out.tmp/bin/nft" --version >/dev/null
  for p in $CNI_PLUGINS; do
    # A CNI plugin run with CNI_COMMAND=VERSION prints the spec versions it supports, touching nothing.
    CNI_COMMAND=VERSION "$out.tmp/root/usr/lib/cni/$p" </dev/null >/dev/null
  done
  {
    echo "# elasticgpu test pod network build $key ($(date -u +%Y-%m-%dT%H:%M:%SZ)) mirror=$MIRROR"
    cat "$versions"
  } >"$out.tmp/versions.txt"
  rm -rf "$out"
  mv "$out.tmp" "$out"
  exit 0
fi

apt_setup
lock_cache
fallback_if_offline ELASTICGPU_TESTNETWORK_OFFLINE "not fetching"
require_tools apt-get apt-cache dpkg sha256sum flock
apt_sources bookworm

apt_update_daily bookworm

versions=$(mktemp)
trap 'rm -f "$versions"' EXIT
# shellcheck disable=SC2086
pin_versions "$versions" $PKGS

key=$(cache_key "$HERE/build.sh" "$versions")
exit_if_up_to_date "$key"

log "fetching the pod network's packages $key: $(tr '\n' ' ' <"$versions")"
start=$(date +%s)
build_step "$key" "$versions" || fallback "fetching the pod network's packages failed"
finish_build "$key" "$start" 2 # keeps the two newest builds
