# shellcheck shell=bash
# What the cached builds share (testserver/, testcluster/, testruntime/, testprometheus/,
# testnetwork/, testhelm/, nri-plugin/ and image/ build.sh): sourced by each (never run on its
# own). It is part of every build's recipe, so cache_key hashes it into every cache key: a change
# here rebuilds all of them once.
#
# The sourcing script sets, before sourcing it:
#   HERE        its own folder (build_step runs "$HERE/build.sh __build ...", the go steps run in it)
#   NAME        testserver, testcluster, ...: the cache folder <cache>/NAME and the log prefix
#               "NAME/build.sh: "
#   WHAT        what one build is called in the fallback's messages ("test server", "build", ...)
#   MARKER      a path that every build folder holds (its binary, or root/): builds are listed by
#               it, newest first, for the fallback and for pruning
#   STRICT_VAR  optional: the variable which, set to 1, makes the fallback fail instead
# and defines:
#   build_complete DIR  true when DIR holds a whole build
#   env_lines DIR       the lines of current.env that name the build in DIR
#
# It sets CACHE (<cache>/NAME), CHECKOUT (the checkout this file is in) and, for the builds from
# Debian packages, APTDIR (<cache>/NAME/apt, the private apt configuration) and MIRROR.
# Environment: ELASTICGPU_CACHE (cache root, default ~/.cache/elasticgpu), ELASTICGPU_DEBIAN_MIRROR
# (default http://deb.debian.org/debian), ELASTICGPU_APT_TRUSTED=1 (skip apt's signature checks:
# [trusted=yes]).
#
# Several checkouts share one cache (a clone and its worktrees, CI's jobs): current.env names the
# build the last of them asked for, and each checkout's own record, <cache>/NAME/checkouts/<id>.env,
# the build it asked for last. Pruning (finish_build) removes an old build only when neither
# current.env nor the record of a checkout that still exists names it, and no running process uses
# it (prune_builds says how that is told).

CACHED_BUILD=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
CHECKOUT=$(cd "$(dirname "$CACHED_BUILD")/.." && pwd)
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

write_env() { # $1 = build dir: current.env and this checkout's record replaced whole (never half
  # written); current.env printed less *_VERSIONS
  local tmp
  tmp=$(mktemp "$CACHE/current.env.XXXXXX")
  env_lines "$1" >"$tmp"
  mv -f "$tmp" "$CACHE/current.env"
  mkdir -p "$CACHE/checkouts"
  tmp=$(mktemp "$CACHE/checkouts/.record.XXXXXX")
  { echo "# checkout=$CHECKOUT"; env_lines "$1"; } >"$tmp"
  mv -f "$tmp" "$(checkout_record)"
  grep -v '^[A-Z0-9_]*_VERSIONS=' "$CACHE/current.env"
}

checkout_record() { # this checkout's record: <cache>/NAME/checkouts/<16 hex digits of its path>.env
  echo "$CACHE/checkouts/$(printf %s "$CHECKOUT" | sha256sum | cut -c1-16).env"
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
  prune_builds "$3"
}

# --- pruning: never a build that a checkout names or a process uses ---

prune_builds() { # $1 = how many of the newest builds to keep: each older one is removed unless
  # current.env or a checkout's record names it (named_builds) or a running process uses it
  # (build_user). Records are read rather than locks asked of every user: the users are many (the
  # tests' fixtures, the demo, a box started by hand, another checkout's older scripts) and a
  # process that forgot a lock would lose its build; what runs is read from /proc, which no user
  # has to remember.
  local named old d user
  named=$(named_builds)
  # shellcheck disable=SC2012 # the names are <key> folders
  ls -1td "$CACHE"/*/"$MARKER" 2>/dev/null | tail -n +$(($1 + 1)) | while read -r old; do
    d=$(dirname "$old")
    if grep -qxF -- "$(basename "$d")" <<<"$named"; then
      log "keeping $d: a checkout's current.env names it"
    elif user=$(build_user "$d"); then
      log "keeping $d: in use by $user"
    else
      rm -rf "$d"
    fi
  done
}

named_builds() { # the build folders (their names) that current.env or a live checkout's record names;
  # a record whose checkout is gone (its scripts/cached-build.sh with it) is removed
  local f checkout
  for f in "$CACHE/current.env" "$CACHE"/checkouts/*.env; do
    [ -f "$f" ] || continue
    if [ "$f" != "$CACHE/current.env" ]; then
      checkout=$(sed -n 's/^# checkout=//p' "$f" | head -n1)
      if [ -z "$checkout" ] || [ ! -f "$checkout/scripts/cached-build.sh" ]; then
        rm -f "$f"
        continue
      fi
    fi
    # KEY=<cache>/NAME/<build>/...: the <build>
    awk -v c="$CACHE/" '{v = substr($0, index($0, "=") + 1)} index(v, c) == 1 {split(substr(v, length(c) + 1), p, "/"); print p[1]}' "$f"
  done | sort -u
}

build_user() { # $1 = build dir: "pid N (command)" of a running process that uses it, else false.
  # Uses: runs a file of it (exe, maps: its binaries, its libraries), works or is rooted in it
  # (cwd, root), holds a file of it open (fd), or names it in its arguments or environment (a
  # test run that scripts/test.sh gave ELASTICGPU_IMAGE_ARCHIVE=... and that reads it later).
  # Processes this user may not read are not seen (their caches are their own).
  local d=$1 hit re
  hit=$(find /proc/[0-9]*/exe /proc/[0-9]*/cwd /proc/[0-9]*/root /proc/[0-9]*/fd -maxdepth 1 \
    \( -lname "$d" -o -lname "$d/*" \) -print -quit 2>/dev/null || true)
  [ -n "$hit" ] || hit=$(grep -lsF -- "$d/" /proc/[0-9]*/maps 2>/dev/null | head -n1 || true)
  if [ -z "$hit" ]; then
    re=$(printf '%s' "$d" | sed 's/[][\.*^$+?(){}|]/\\&/g')
    hit=$(grep -lsazE -- "(^|[=:])$re(/|:|\$)" /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | head -n1 || true)
  fi
  [ -n "$hit" ] || return 1
  hit=${hit#/proc/}
  hit=${hit%%/*}
  echo "pid $hit ($(tr '\0' ' ' <"/proc/$hit/cmdline" 2>/dev/null | cut -c1-100))"
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

apt_update_daily() { # $1 = as apt_update: an index younger than a day is good enough (a fresh one costs
  # seconds; the key changes only when Debian publishes a new version of a package)
  local lists
  # shellcheck disable=SC2012 # the names are apt's lists
  lists=$(ls -1t "$APTDIR"/state/lists/*_Packages* 2>/dev/null | head -n1 || true)
  if [ -z "$lists" ] || [ -n "$(find "$lists" -mmin +1440)" ]; then
    apt_update "$1"
  fi
}

pin_versions() { # $1 = versions file, the rest: package:suite pairs: the version each suite holds,
  # one package=version line each, in the order given (the order the debs are unpacked in);
  # fallback when a suite lacks one. One apt-cache call for them all (each reads the whole index).
  local out=$1 madison ps p suite v
  shift
  # shellcheck disable=SC2046
  madison=$(apt-cache $(apt_opts) madison $(for ps in "$@"; do echo "${ps%%:*}"; done) 2>/dev/null || true)
  for ps in "$@"; do
    p=${ps%%:*}
    suite=${ps#*:}
    v=$(echo "$madison" | awk -F'|' -v p="$p" -v s=" $suite/main " '{gsub(/ /, "", $1)} $1 == p && index($3, s) {gsub(/ /, "", $2); print $2; exit}')
    [ -n "$v" ] || fallback "package $p not found in $suite"
    echo "$p=$v" >>"$out"
  done
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

# --- a Go build from the module proxy (testcluster/, testhelm/, nri-plugin/): go.mod and go.sum in $HERE ---

go_start() { # $1 = key: the build's Go environment (its own GOCACHE, go.mod read-only, no cgo) and an
  # empty work folder, $work
  export GOCACHE=$CACHE/gocache GOFLAGS=-mod=readonly GOTOOLCHAIN=local CGO_ENABLED=0
  work=$CACHE/work-$1
  rm -rf "$work"
  mkdir -p "$work"
}

go_download() { # go mod download, its own step so that a refused module is named as such (go prints
  # the module and the proxy's answer), not lost among compiler output
  if ! (cd "$HERE" && nice -n 19 "$GO" mod download) >"$work/download.log" 2>&1; then
    cat "$work/download.log" >&2
    fallback "go mod download failed (see above: the module and the proxy's answer)"
  fi
}

go_run() { # $1 = what the fallback says when it fails, the rest: a go command, run in $HERE under
  # nice -n 19 (small shared machines), its output to stderr; on failure $work goes
  local failed=$1
  shift
  if ! (cd "$HERE" && nice -n 19 "$GO" "$@") >&2; then
    rm -rf "$work"
    fallback "$failed"
  fi
}

go_finish() { # $1 = key, the rest: files of $work: moved into the build folder <cache>/NAME/<key>
  local key=$1 f
  shift
  rm -rf "${CACHE:?}/${key:?}"
  mkdir -p "$CACHE/$key"
  for f in "$@"; do mv "$work/$f" "$CACHE/$key/"; done
  rm -rf "$work"
}
