#!/bin/sh
# Installs or updates the elasticgpu node agent as a host service, then sleeps: the program of the
# agent installer DaemonSet (deploy/agent-installer.yaml), run in a privileged pod that sees the
# node's / at $HOST_ROOT and the node's systemd through PID 1 (hostPID).
#
# Why a host service: kubelet reaches the container runtime through the agent's CRI proxy, so the
# agent must not be a container kubelet has to start. This pod only puts the files in place and
# asks the host's systemd to (re)start the unit; the agent keeps running when this pod goes.
#
# What it writes on the node:
#   /opt/elasticgpu/releases/ID/root   this image's /usr (Python 3.11, the agent, every library),
#                                      ID = image tag + a hash of the installed package's RECORD
#   /opt/elasticgpu/current            -> releases/ID (switched atomically; the previous one is kept)
#   /opt/elasticgpu/bin/python         that Python, started with the image's own loader and libraries,
#                                      so the node needs no Python of its own
#   /etc/systemd/system/elasticgpu-agent.service, /etc/elasticgpu/agent.env
#   /etc/systemd/system/elasticgpu-mps.service   the node's MPS control daemons in a unit of their own,
#                                      so that an agent restart leaves them and their clients alone
# It restarts elasticgpu-mps and elasticgpu-agent only when one of them changed (a restart of
# elasticgpu-mps leaves its daemons running: KillMode=process), starts them once /etc/elasticgpu/kubeconfig
# exists (deploy/agent-kubeconfig.sh NODE writes it), and never touches kubelet: pointing kubelet
# at the agent's socket (--container-runtime-endpoint unix:///var/run/elasticgpu/cri.sock) and
# restarting kubelet is the administrator's step, once, per node (docs/admin-guide.md, "The node agent").
#
# Tests run it against a scratch directory: every path and the systemctl command are settings.
set -eu

HOST_ROOT=${ELASTICGPU_HOST_ROOT:-/host}             # the node's / (hostPath)
IMAGE_ROOT=${ELASTICGPU_IMAGE_ROOT:-}                # this image's / ("" is /)
FILES=${ELASTICGPU_INSTALLER_FILES:-/installer}      # the ConfigMap: the unit and agent.env
TAG=${ELASTICGPU_IMAGE_TAG:-unknown}
NODE_NAME=${ELASTICGPU_NODE_NAME:?the node name (downward API spec.nodeName) is missing}
SYSTEMCTL=${ELASTICGPU_SYSTEMCTL:-nsenter --target 1 --mount --uts --ipc --net --pid -- systemctl}
POLL_S=${ELASTICGPU_INSTALLER_POLL_S:-30}            # how often the sleeping installer looks for the kubeconfig
ONCE=${ELASTICGPU_INSTALLER_ONCE:-}                  # tests: exit after installing instead of sleeping
UNIT=elasticgpu-agent.service
MPS_UNIT=elasticgpu-mps.service                     # the agent's unit Wants= it (its own cgroup)

log() { echo "elasticgpu-agent-installer[$NODE_NAME]: $*"; }
systemctl_host() { $SYSTEMCTL "$@"; }

opt=$HOST_ROOT/opt/elasticgpu
changed=""

# Writes stdin to $1 when its content differs (atomically: a half-written unit is never read).
put() {
  target=$1
  mkdir -p "$(dirname "$target")"
  cat >"$target.new"
  if [ -f "$target" ] && cmp -s "$target.new" "$target"; then
    rm -f "$target.new"
  else
    mv -f "$target.new" "$target"
    changed="$changed ${target#"$HOST_ROOT"}"
  fi
}

# 1. This image's files, once per release.
record=$(ls "$IMAGE_ROOT"/usr/local/lib/python3*/site-packages/elasticgpu-*.dist-info/RECORD 2>/dev/null | head -n 1)
[ -n "$record" ] || { log "no elasticgpu installed under $IMAGE_ROOT/usr/local: is this the elasticgpu image?"; exit 2; }
release=$TAG-$(sha256sum "$record" | cut -c1-12)
if [ ! -e "$opt/releases/$release/.complete" ]; then
  log "copying release $release to /opt/elasticgpu/releases/$release"
  rm -rf "$opt/releases/$release.partial"
  mkdir -p "$opt/releases/$release.partial/root"
  # usrmerge: /lib, /lib64 and /bin are links into /usr; copy them as links.
  for entry in usr lib lib64 bin etc/ssl; do
    if [ -e "$IMAGE_ROOT/$entry" ] || [ -L "$IMAGE_ROOT/$entry" ]; then
      mkdir -p "$(dirname "$opt/releases/$release.partial/root/$entry")"
      cp -a "$IMAGE_ROOT/$entry" "$opt/releases/$release.partial/root/$entry"
    fi
  done
  touch "$opt/releases/$release.partial/.complete"
  rm -rf "${opt:?}/releases/$release"
  mv "$opt/releases/$release.partial" "$opt/releases/$release"
fi
if [ "$(readlink "$opt/current" 2>/dev/null || true)" != "releases/$release" ]; then
  previous=$(readlink "$opt/current" 2>/dev/null || true)
  ln -sfn "releases/$release" "$opt/current.new" && mv -T "$opt/current.new" "$opt/current"
  changed="$changed /opt/elasticgpu/current"
  # Keep the release just replaced (to go back by hand), drop older ones.
  for old in "$opt"/releases/*; do
    case "$old" in */"$release"|*/"${previous#releases/}") ;; *) rm -rf "$old" ;; esac
  done
fi

# 2. The interpreter: the image's Python through the image's dynamic loader and libraries.
loader=""
for candidate in lib64/ld-linux-x86-64.so.2 lib/ld-linux-aarch64.so.1; do
  if [ -e "$IMAGE_ROOT/$candidate" ]; then loader=$candidate; break; fi
done
[ -n "$loader" ] || { log "no dynamic loader in this image (lib64/ld-linux-x86-64.so.2, lib/ld-linux-aarch64.so.1)"; exit 2; }
libdir=$(cd "$IMAGE_ROOT/usr/lib" && ls -d ./*-linux-gnu | head -n 1)
libdir=usr/lib/${libdir#./}  # Debian's multiarch folder, e.g. usr/lib/x86_64-linux-gnu
put "$opt/bin/python" <<PYTHON
#!/bin/sh
# elasticgpu's Python, from its image (written by the agent installer DaemonSet; edits are overwritten).
root=/opt/elasticgpu/current/root
export PYTHONHOME=\$root/usr/local
exec "\$root/$loader" --library-path "\$root/usr/local/lib:\$root/$libdir" "\$root/usr/local/bin/python3" "\$@"
PYTHON
chmod 0755 "$opt/bin/python"

# 3. The unit and the settings.
put "$HOST_ROOT/etc/systemd/system/$MPS_UNIT" <"$FILES/$MPS_UNIT"
put "$HOST_ROOT/etc/systemd/system/$UNIT" <"$FILES/$UNIT"
# (put reads a here-document, not a pipe: a pipe would run it in a subshell and lose $changed.)
put "$HOST_ROOT/etc/elasticgpu/agent.env" <<ENV
# Written by the elasticgpu agent installer DaemonSet (chart value agent.env); edits are overwritten.
ELASTICGPU_AGENT_NODE_NAME=$NODE_NAME
$(cat "$FILES/agent.env")
ENV

# 4. systemd: reload and restart only for a change; never kubelet.
case "$changed" in *"/$UNIT"*|*"/$MPS_UNIT"*) systemctl_host daemon-reload ;; esac
systemctl_host enable "$MPS_UNIT" "$UNIT" >/dev/null
start_when_configured() {
  if [ ! -e "$HOST_ROOT/etc/elasticgpu/kubeconfig" ]; then
    log "waiting for /etc/elasticgpu/kubeconfig (deploy/agent-kubeconfig.sh $NODE_NAME); the agent is installed, not started"
    return 1
  fi
  # The MPS service first: the agent asks it for MPS daemons as soon as it serves.
  if [ -n "$changed" ]; then
    log "restarting $MPS_UNIT and $UNIT (changed:$changed)"
    systemctl_host restart "$MPS_UNIT"
    systemctl_host restart "$UNIT"
  else
    systemctl_host start "$MPS_UNIT"  # no-op when it runs
    systemctl_host start "$UNIT"
  fi
  log "$MPS_UNIT and $UNIT are installed (release $release)"
}
started=""
if start_when_configured; then started=yes; fi
[ -z "$ONCE" ] || exit 0

# 5. Sleep; start the agent once its kubeconfig appears. TERM (pod deleted) ends the sleep only.
trap 'exit 0' TERM INT
while :; do
  sleep "$POLL_S" &
  wait $! || true
  if [ -z "$started" ] && start_when_configured; then started=yes; fi
done
