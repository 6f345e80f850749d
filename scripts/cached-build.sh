# shellcheck shell=bash
# What testserver/build.sh, testcluster/build.sh and testruntime/build.sh share: sourced by each
# (never run on its own). It is part of every build's recipe, so cache_key hashes it into every
# cache key: a change here rebuilds all three once.
#
# The sourcing script sets, before sourcing it:
#   HERE        its own folder (build_step runs "$HERE/build.sh __build ...")
#   NAME        testserver, testcluster or testruntime: the cache folder <cache>/NAME and the log
#               prefix "NAME/build.sh: "
#   WHAT        what one build is called in the fallback's messages ("test server", "build", ...)
#   MARKER      a path that every build folder holds (its binary, or root/): builds are listed by
#               it, newest first, for the fallback and for pruning
#   STRICT_VAR  optional: the variable which, set to 1, makes the fallback fail instead
# and defines:
#   build_complete DIR  true when DIR holds a whole build
#   env_lines DIR       the lines of current.env that name the build in DIR
#
# It sets CACHE (<cache>/NAME) and, for the builds from Debian packages, APTDIR (<cache>/NAME/apt,
# the private apt configuration) and MIRROR. Environment: ELASTICGPU_CACHE (cache root, default
# ~/.cache/elasticgpu), ELASTICGPU_DEBIAN_MIRROR (default http://deb.debian.org/debian),
# ELASTICGPU_APT_TRUSTED=1 (skip apt's signature checks: [trusted=yes]).

CACHED_BUILD=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
CACHE=${ELASTICGPU_CACHE:-$HOME/.cache/elasticgpu}/$NAME
APTDIR=$CACHE/apt
MIRROR=${ELASTICGPU_DEBIAN_MIRROR:-http://deb.debian.org/debian}

log() { echo "$NAME/build.sh: $*" >&2; }

# --- the cache ---

lock_cache() { # one build at a time per cache folder; held until the script ends
  mkdir -p "$CACHE"
  exec 9>"$CACHE/.lock"
  flock 9
}

cache_key() { # $@ = the recipe's files (- = standard input), then this helper: 16 hex digits
  cat "$@" "$CACHED_BUILD" | sha256sum | cut -c1-16
}

write_env() { # $1 = build dir: current.env replaced whole (never half written), printed less *_VERSIONS
  local tmp
  tmp=$(mktemp "$CACHE/current.env.XXXXXX")
  env_lines "$1" >"$tmp"
  mv -f "$tmp" "$CACHE/current.env"
  grep -v '^[A-Z0-9_]*_VERSIONS=' "$CACHE/current.env"
}

newest_cached() { # the newest complete build folder; false when there is none
  local m d
  while IFS= read -r m; do
    d=$(dirname "$m")
    if build_complete "$d"; then
      echo "$d"
      return 0
    fi
  done < <(ls -1td "$CACHE"/*/"$MARKER" 2>/dev/null)
  return 1
}

exit_if_up_to_date() { # $1 = key: when that build is complete, name it in current.env and exit 0
  if build_complete "$CACHE/$1"; then
    log "up to date: $CACHE/$1"
    write_env "$CACHE/$1"
    exit 0
  fi
}

finish_build() { # $1 = key, $2 = start (date +%s), $3 = how many of the newest builds to keep
  log "built in $(($(date +%s) - $2))s: $CACHE/$1"
  write_env "$CACHE/$1"
  # shellcheck disable=SC2012 # the names are <key> folders
  ls -1td "$CACHE"/*/"$MARKER" 2>/dev/null | tail -n +$(($3 + 1)) | while read -r old; do rm -rf "$(dirname "$old")"; done
}

# --- when a build cannot be made ---

fallback() { # $1 = reason: name the newest complete build in current.env (exit 0), or fail (exit 1)
  local d
  if [ -n "${STRICT_VAR:-}" ] && [ "${!STRICT_VAR:-}" = 1 ]; then
    log "ERROR: $1 ($STRICT_VAR=1: no fallback)"
    exit 1
  fi
  if d=$(newest_cached); then
    log "WARNING: $1"
    log "WARNING: falling back to the newest cached $WHAT: $d"
    write_env "$d"
    exit 0
  fi
  log "ERROR: $1 (and no cached $WHAT to fall back to)"
  exit 1
}

fallback_if_offline() { # $1 = the OFFLINE variable, $2 = what it skips ("not fetching")
  if [ "${!1:-}" = 1 ]; then
    fallback "$1=1: $2"
  fi
}

require_tools() { # $@ = commands the build needs
  local t
  for t in "$@"; do
    command -v "$t" >/dev/null || fallback "required tool $t not found"
  done
}

build_step() { # $1 = key, $2 = versions file: "$HERE/build.sh __build" as its own process (so that
  # set -e holds in it), output to stderr; on failure its half-made folders are removed, false
  if bash "$HERE/build.sh" __build "$1" "$2" >&2; then
    return 0
  fi
  rm -rf "$CACHE/work-$1" "$CACHE/$1.tmp"
  return 1
}

# --- a private apt configuration (own sources list, state and cache dirs; nothing installed) ---

apt_opts() {
  echo -o "Dir::Etc::SourceList=$APTDIR/etc/sources.list" -o "Dir::Etc::SourceParts=$APTDIR/etc/sources.list.d" \
    -o "Dir::Etc::Preferences=$APTDIR/etc/preferences" -o "Dir::Etc::PreferencesParts=$APTDIR/etc/preferences.d" \
    -o "Dir::State=$APTDIR/state" -o "Dir::State::status=$APTDIR/state/status" \
    -o "Dir::Cache=$APTDIR/cache" -o Debug::NoLocking=1 -o "APT::Sandbox::User=$(id -un)" \
    -o APT::Architecture=amd64 -o APT::Architectures=amd64
}

apt_setup() { # the private configuration's folders
  mkdir -p "$CACHE" "$APTDIR/etc/sources.list.d" "$APTDIR/etc/preferences.d" "$APTDIR/state/lists/partial" "$APTDIR/cache/archives/partial"
  touch "$APTDIR/state/status"
}

apt_sources() { # $@ = suites: sources.list, verified with the system's debian-archive-keyring
  local opts s
  opts="[arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]"
  if [ "${ELASTICGPU_APT_TRUSTED:-}" = 1 ]; then
    opts="[arch=amd64 trusted=yes]"
  fi
  for s in "$@"; do
    echo "deb $opts $MIRROR $s main"
  done >"$APTDIR/etc/sources.list"
}

apt_update() { # $1 = the suites, as the fallback's message names them
  # shellcheck disable=SC2046
  if ! apt-get -q $(apt_opts) --error-on=any update >"$CACHE/apt-update.log" 2>&1; then
    fallback "private apt update of $1 failed (see $CACHE/apt-update.log)"
  fi
}

deb_of() { # $1 = package=version: its .deb in $APTDIR/debs (':' of an epoch is %3a in the name)
  local p=${1%%=*} v=${1#*=}
  # shellcheck disable=SC2012 # apt-get download's names: package_version_arch.deb
  ls "$APTDIR/debs/${p}_${v/:/%3a}"_*.deb | head -n1
}

unpack_debs() { # $1 = versions file (package=version lines), $2 = root: dpkg -x each, in order
  local pv
  while read -r pv; do
    dpkg -x "$(deb_of "$pv")" "$2"
  done <"$1"
}

prune_debs() { # $1 = versions file: drop the debs in $APTDIR/debs that it does not name
  local f b
  for f in "$APTDIR"/debs/*.deb; do
    b=$(basename "$f")
    grep -qxF "${b%%_*}=$(echo "$b" | cut -d_ -f2 | sed 's/%3a/:/')" "$1" || rm -f "$f"
  done
}
