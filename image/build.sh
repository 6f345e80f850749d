#!/usr/bin/env bash
# Build (or find in the cache) the elasticgpu product image without a registry: the image that
# deploy/Containerfile builds where a registry is reachable, made here from packages alone, as an
# OCI image archive that `ctr -n k8s.io images import` (containerd 1.7 and 2.x) or `podman load`
# takes. Its name is what the chart runs by default, so `helm install` with the chart's defaults
# (image.pullPolicy IfNotPresent) runs it on a node whose containerd imported it.
#
#   base     Python 3.11 and the shell tools the chart's scripts use (dash, coreutils, diffutils,
#            util-linux's nsenter), from Debian bookworm's packages (bookworm-security first),
#            fetched with a private apt configuration and unpacked with `dpkg -x`: nothing is
#            installed into this machine, no maintainer script runs
#   on top   this project's wheel (`pip wheel --no-deps`) and its dependencies from PyPI, as
#            binary wheels for CPython 3.11 on manylinux x86_64 up to the base's glibc; the
#            agent's NRI plugin (nri-plugin/build.sh's static Go binary, cached) as
#            /usr/local/bin/elasticgpu-nri-plugin, which the agent's DaemonSet pod runs
#   config   User 65532:65532, Entrypoint ["elasticgpu"], Cmd ["--help"] (as deploy/Containerfile;
#            tests/deploy/test_image.py checks that they agree)
#
# Layout, kept compatible with the python:3.11-slim image the Containerfile starts from, since the
# agent installer (deploy/chart/files/install-agent.sh) copies the image's /usr to the node and runs
# its Python there with PYTHONHOME=<root>/usr/local: the standard library and the packages live
# in /usr/local/lib/python3.11 (/usr/lib/python3.11 links to it), the packages in its dist-packages
# (Debian's Python reads it from both prefixes; site-packages links to it), python3 and python in
# /usr/local/bin, and /bin, /lib, /lib64, /sbin link into /usr (merged /usr, as Debian installs it).
#
# Result: ${ELASTICGPU_CACHE:-$HOME/.cache/elasticgpu}/image/<key>/
#   image.tar     the OCI image archive (oci-layout, index.json, blobs/), one gzip layer
#   versions.txt  the Debian package versions and the Python distributions it holds
# where <key> hashes this script, scripts/cached-build.sh, the image's name, the exact Debian
# package versions and the project's packaged files (pyproject.toml, README.md, elasticgpu/,
# migrations/). The PyPI dependencies are resolved at build time within pyproject.toml's ranges
# (a newer release on PyPI is taken at the next change of the key, not before). The archive's
# path and the image's name go to <cache>/image/current.env (ELASTICGPU_IMAGE_ARCHIVE,
# ELASTICGPU_IMAGE_NAME) and are printed.
#
# If fetching fails (no network, a mirror hiccup) and an image was built before, a WARNING is
# printed and the newest cached build is used (exit 0); with none it exits 1 and the caller
# (scripts/test.sh) lets the tests of the image skip with that reason.
#
# Environment:
#   ELASTICGPU_CACHE               cache root (default ~/.cache/elasticgpu)
#   ELASTICGPU_IMAGE_OFFLINE=1     do not touch the network; use the newest cached build
#   ELASTICGPU_IMAGE_STRICT=1      fail instead of falling back (a release build)
#   ELASTICGPU_IMAGE_PYTHON        the Python whose pip builds and fetches the wheels (default
#                                  the checkout's .venv/bin/python, else python3)
#   ELASTICGPU_DEBIAN_MIRROR       (default http://deb.debian.org/debian)
#   ELASTICGPU_DEBIAN_SECURITY_MIRROR (default the mirror's host, /debian-security)
#   ELASTICGPU_APT_TRUSTED=1       skip signature checks ([trusted=yes])
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
NAME=image WHAT="product image" MARKER=image.tar STRICT_VAR=ELASTICGPU_IMAGE_STRICT
# shellcheck source=scripts/cached-build.sh
. "$REPO/scripts/cached-build.sh"
SECURITY_MIRROR=${ELASTICGPU_DEBIAN_SECURITY_MIRROR:-${MIRROR%/debian}/debian-security}
# What the image holds from Debian: apt resolves their dependencies (Depends, Pre-Depends).
# libstdc++6: manylinux wheels may link it (numpy does; the policy lets them expect it on the system).
ROOTS="python3.11-minimal libpython3.11-stdlib libstdc++6 ca-certificates dash coreutils diffutils util-linux"
# Pulled in only for maintainer scripts, which never run in an image: left out.
LEFT_OUT="debconf dpkg tar"
PYVER=3.11
USER_ID=65532

# The chart's default image: values.yaml's image.repository, tagged with Chart.yaml's appVersion.
image_name() {
  local repo tag
  repo=$(awk '/^image:/ {in_image=1; next} /^[^ #]/ {in_image=0} in_image && $1 == "repository:" {print $2; exit}' "$REPO/deploy/chart/values.yaml")
  tag=$(awk -F'"' '/^appVersion:/ {print $2; exit}' "$REPO/deploy/chart/Chart.yaml")
  [ -n "$repo" ] && [ -n "$tag" ] || { log "ERROR: no image.repository in deploy/chart/values.yaml or appVersion in deploy/chart/Chart.yaml"; exit 1; }
  echo "$repo:$tag"
}
IMAGE_NAME=$(image_name)

build_complete() { # $1 = build dir
  [ -s "$1/image.tar" ] && [ -s "$1/versions.txt" ] && [ -s "$1/image-name" ]
}

env_lines() { # $1 = build dir
  echo "ELASTICGPU_IMAGE_ARCHIVE=$1/image.tar"
  # The name the archive holds (a fallback's may be an older one than the chart's now).
  echo "ELASTICGPU_IMAGE_NAME=$(cat "$1/image-name")"
  echo "ELASTICGPU_IMAGE_KEY=$(basename "$1")"
}

packaged_files() { # what `pip wheel .` packages: their paths and contents, for the key
  (cd "$REPO" && find pyproject.toml README.md elasticgpu migrations \( -name __pycache__ -o -name '*.egg-info' \) -prune -o \
    \( -type f -o -type l \) -print | LC_ALL=C sort | while read -r f; do
    echo "$f"
    if [ -L "$f" ]; then readlink "$f"; else sha256sum <"$f"; fi
  done)
}

# --- inner build step (a separate process so that `set -e` is honoured) ---
if [ "${1:-}" = "__build" ]; then
  key=$2
  versions=$3
  nri_plugin=${ELASTICGPU_IMAGE_NRI_PLUGIN:?the outer driver names the NRI plugin}
  out=$CACHE/$key
  work=$CACHE/work-$key
  rm -rf "$out.tmp" "$work"
  mkdir -p "$out.tmp" "$work/root" "$APTDIR/debs"
  root=$work/root
  pybuild=${ELASTICGPU_IMAGE_PYTHON:-}
  if [ -z "$pybuild" ]; then
    if [ -x "$REPO/.venv/bin/python" ]; then pybuild=$REPO/.venv/bin/python; else pybuild=python3; fi
  fi

  # 1. Debian's packages, unpacked in order; then /usr merged as Debian installs it (bookworm's
  # packages still ship /lib/x86_64-linux-gnu/libc.so.6 and the like; the installer's Python finds
  # its libraries under usr/lib only).
  # shellcheck disable=SC2046
  (cd "$APTDIR/debs" && apt-get -q $(apt_opts) download $(cat "$versions") >/dev/null)
  unpack_debs "$versions" "$root"
  prune_debs "$versions"
  for d in bin sbin lib lib64; do
    if [ -d "$root/$d" ] && [ ! -L "$root/$d" ]; then
      mkdir -p "$root/usr/$d"
      cp -a "$root/$d/." "$root/usr/$d/"
      rm -rf "${root:?}/$d"
    fi
    ln -s "usr/$d" "$root/$d"
  done
  # Absolute links made relative (Debian's /lib64/ld-linux-x86-64.so.2 -> /lib/x86_64-linux-gnu/...):
  # the agent installer copies this /usr onto the node, where an absolute link would reach the
  # node's own loader and libraries instead of the image's.
  find "$root" -type l -lname '/*' -print | while read -r link; do
    ln -sfn "$(realpath -ms --relative-to="$(dirname "$link")" "$root$(readlink "$link")")" "$link"
  done
  # The loader and libraries the build runs the image's Python with (as the installer does).
  run_py() { "$root/usr/lib64/ld-linux-x86-64.so.2" --library-path "$root/usr/lib/x86_64-linux-gnu" "$root/usr/bin/python$PYVER" "$@"; }

  # 2. The standard library moves to /usr/local/lib/python3.11 (see the layout above).
  stdlib=$root/usr/local/lib/python$PYVER
  mkdir -p "$root/usr/local/lib" "$root/usr/local/bin"
  mv "$root/usr/lib/python$PYVER" "$stdlib"
  ln -s "../local/lib/python$PYVER" "$root/usr/lib/python$PYVER"
  mkdir -p "$stdlib/dist-packages"
  ln -s dist-packages "$stdlib/site-packages"
  ln -s "../../bin/python$PYVER" "$root/usr/local/bin/python3"
  ln -s python3 "$root/usr/local/bin/python"
  PYTHONHOME=$root/usr run_py -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version'

  # 3. This project's wheel, built from a copy of what the Containerfile copies (no build/ or
  # egg-info left in the checkout), and its dependencies as binary wheels for the image's Python.
  mkdir -p "$work/src" "$work/wheels"
  cp -a "$REPO/pyproject.toml" "$REPO/README.md" "$REPO/elasticgpu" "$REPO/migrations" "$work/src/"
  find "$work/src" -name __pycache__ -prune -exec rm -rf {} +
  "$pybuild" -m pip wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation --wheel-dir "$work/wheels" "$work/src"
  # Every manylinux up to the base's glibc: pip takes an explicit --platform literally (only
  # manylinux2014 implies the older 2010 and 1), so each manylinux_2_N from 2_17 is named.
  glibc_minor=$(grep '^libc6=' "$versions" | sed -E 's/^libc6=2\.([0-9]+).*/\1/')
  platforms="--platform manylinux2014_x86_64"
  for n in $(seq 17 "$glibc_minor"); do platforms="$platforms --platform manylinux_2_${n}_x86_64"; done
  # shellcheck disable=SC2086
  "$pybuild" -m pip install --quiet --disable-pip-version-check --no-compile \
    --target "$stdlib/dist-packages" $platforms --implementation cp \
    --python-version "$PYVER" --abi "cp${PYVER/./}" --only-binary=:all: "$work"/wheels/elasticgpu-*.whl
  rm -rf "$stdlib/dist-packages/bin" # scripts with the build's Python in their #!: written below
  # The console scripts, for the image's Python.
  for ep in $(awk '/^\[/ {s = ($0 == "[console_scripts]")} s && / = / {print $1 "=" $3}' "$stdlib"/dist-packages/elasticgpu-*.dist-info/entry_points.txt); do
    name=${ep%%=*} target=${ep#*=}
    printf '#!/usr/bin/python%s\nimport sys\nfrom %s import %s\nsys.exit(%s())\n' "$PYVER" "${target%%:*}" "${target#*:}" "${target#*:}" >"$root/usr/local/bin/$name"
    chmod 0755 "$root/usr/local/bin/$name"
  done
  # Bytecode now, by the image's own Python: the root is read-only at run time, so nothing could
  # be cached then, and every start would compile again. unchecked-hash: valid whatever the
  # files' times (the layer sets them all to 0).
  PYTHONHOME=$root/usr run_py -m compileall -q -j 2 --invalidation-mode unchecked-hash -s "$root" -p / "$stdlib" >/dev/null

  # The agent's NRI plugin (agent settings' nri_plugin, looked up in PATH): without it the
  # DaemonSet's agent (agent.nodeHook=nri) could not register with the runtime.
  install -m 0755 "$nri_plugin" "$root/usr/local/bin/elasticgpu-nri-plugin"

  # 4. What a container needs besides: users (65532 is the manifests' runAsUser), a /tmp, the CA
  # bundle (ca-certificates' postinst would make it) where OpenSSL looks.
  mkdir -p "$root/etc/ssl/certs" "$root/tmp" "$root/proc" "$root/sys" "$root/dev" "$root/root" "$root/home/nonroot" "$root/usr/lib/ssl"
  chmod 1777 "$root/tmp"
  printf 'root:x:0:0:root:/root:/bin/sh\nnonroot:x:%s:%s:nonroot:/home/nonroot:/usr/sbin/nologin\n' "$USER_ID" "$USER_ID" >"$root/etc/passwd"
  printf 'root:x:0:\nnonroot:x:%s:\n' "$USER_ID" >"$root/etc/group"
  find "$root/usr/share/ca-certificates" -name '*.crt' | LC_ALL=C sort | xargs cat >"$root/etc/ssl/certs/ca-certificates.crt"
  [ -e "$root/usr/lib/ssl/certs" ] || ln -s /etc/ssl/certs "$root/usr/lib/ssl/certs"
  [ -e "$root/usr/lib/ssl/cert.pem" ] || ln -s /etc/ssl/certs/ca-certificates.crt "$root/usr/lib/ssl/cert.pem"
  rm -rf "$root/usr/share/doc" "$root/usr/share/man" "$root/usr/share/info" "$root/usr/share/lintian"
  # Every program and library finds what it links inside the image: the loader run here would
  # otherwise fall back to this machine's own /usr/lib and hide a library the image lacks.
  # Only the files the loader links are listed: like ldd, ask `--verify` first, which answers 1
  # for a static executable (the NRI plugin's Go binary), where `--list` dies of SIGSEGV (and
  # bash prints "Segmentation fault" into the log of a build that is fine).
  missing=$(find "$root/usr" \( -name '*.so' -o -name '*.so.*' -o -path '*/bin/*' -o -path '*/sbin/*' \) -type f -print0 |
    while IFS= read -r -d '' f; do
      [ "$(head -c 4 "$f" | od -An -tx1 | tr -d ' \n')" = 7f454c46 ] || continue
      verified=0
      "$root/usr/lib64/ld-linux-x86-64.so.2" --verify "$f" >/dev/null 2>&1 || verified=$?
      [ "$verified" != 1 ] || continue # 1: not dynamically linked (0: dynamic; 2: static-pie, the loader itself)
      "$root/usr/lib64/ld-linux-x86-64.so.2" --library-path "$root/usr/lib/x86_64-linux-gnu" --list "$f" 2>/dev/null |
        awk -v f="${f#"$root"}" -v r="$root/" '$2 == "=>" && index($3, r) != 1 && $3 !~ /^\(/ {print f ": " $1 " => " $3 " " $4}' || true
    done)
  [ -z "$missing" ] || { echo "libraries not in the image (add their Debian package to ROOTS):" >&2; echo "$missing" | sort -u >&2; exit 1; }
  # The image's Python runs the project (its imports, the CRI proto compiled at import).
  PYTHONHOME=$root/usr PYTHONPATH=$stdlib/dist-packages run_py -c 'import elasticgpu.cli, elasticgpu.agent.cri.api, numpy, grpc, sqlalchemy, cryptography'

  # 5. The archive.
  "$pybuild" "$HERE/oci_archive.py" --root "$root" --name "$IMAGE_NAME" --user "$USER_ID:$USER_ID" --out "$out.tmp/image.tar"
  {
    echo "# elasticgpu product image $IMAGE_NAME, build $key ($(date -u +%Y-%m-%dT%H:%M:%SZ)) mirror=$MIRROR security=$SECURITY_MIRROR"
    cat "$versions"
    echo "# Python distributions (PyPI, cp311, manylinux up to glibc 2.$glibc_minor, x86_64)"
    (cd "$stdlib/dist-packages" && ls -d ./*.dist-info | sed -E 's|^\./||; s|\.dist-info$||; s|-([^-]+)$|==\1|' | LC_ALL=C sort)
  } >"$out.tmp/versions.txt"
  echo "$IMAGE_NAME" >"$out.tmp/image-name"
  rm -rf "$work" "$out"
  mv "$out.tmp" "$out"
  exit 0
fi

# --- outer driver ---
apt_setup
lock_cache
fallback_if_offline ELASTICGPU_IMAGE_OFFLINE "not fetching"
require_tools apt-get dpkg sha256sum flock tar gzip
apt_sources bookworm bookworm-updates
# Security updates first (bookworm's own python3.11 trails them): one more line in the private list.
if [ "${ELASTICGPU_APT_TRUSTED:-}" = 1 ]; then opts="[arch=amd64 trusted=yes]"; else opts="[arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]"; fi
echo "deb $opts $SECURITY_MIRROR bookworm-security main" >>"$APTDIR/etc/sources.list"

apt_update_daily "bookworm+bookworm-updates+bookworm-security"

versions=$(mktemp)
trap 'rm -f "$versions"' EXIT
# apt resolves the closure as if installing into an empty system (the private status is empty).
# shellcheck disable=SC2046,SC2086
if ! plan=$(apt-get $(apt_opts) -s install --no-install-recommends $ROOTS 2>&1); then
  fallback "apt cannot resolve $ROOTS in bookworm: $(echo "$plan" | tail -n 3)"
fi
echo "$plan" | awk -v skip=" $LEFT_OUT " '$1 == "Inst" && !index(skip, " " $2 " ") {gsub(/[()]/, "", $3); print $2 "=" $3}' >"$versions"
grep -q '^python3.11-minimal=' "$versions" || fallback "python3.11-minimal not in apt's plan: $(echo "$plan" | tail -n 3)"

# The NRI plugin, from its own cached build (a no-op when built).
if ! nri_env=$(bash "$REPO/nri-plugin/build.sh"); then
  fallback "nri-plugin/build.sh could not build the agent's NRI plugin"
fi
nri_plugin=$(echo "$nri_env" | sed -n 's/^ELASTICGPU_NRI_PLUGIN_BIN=//p')
[ -x "$nri_plugin" ] || fallback "nri-plugin/build.sh named no plugin binary: $nri_env"

key=$( (packaged_files; echo "$IMAGE_NAME"; cat "$HERE/oci_archive.py"; sha256sum <"$nri_plugin") | cache_key "$HERE/build.sh" "$versions" -)
exit_if_up_to_date "$key"

log "building the product image $IMAGE_NAME ($key) from $(wc -l <"$versions") Debian packages and PyPI"
start=$(date +%s)
ELASTICGPU_IMAGE_NRI_PLUGIN=$nri_plugin build_step "$key" "$versions" || fallback "building the product image failed"
finish_build "$key" "$start" 3 # keeps the three newest builds (each checkout builds its own)
