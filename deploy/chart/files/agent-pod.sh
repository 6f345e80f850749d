#!/bin/sh
# Starts the elasticgpu node agent in its DaemonSet pod (agent.nodeHook=nri, deploy/agent-daemonset.yaml):
# checks the node, finds the NVIDIA driver's NVML library, then becomes the agent (exec). It runs at every
# start of the container, so a node fixed meanwhile (NRI switched on, the driver installed by the GPU
# Operator after the agent's pod started) is seen at the next restart; what it refuses it says in one line,
# in the container's log (`kubectl -n elasticgpu-system logs ds/elasticgpu-agent`), with the fix.
#
#   1. No agent of the proxy mode on this node: a host service elasticgpu-agent (its unit under
#      /etc/systemd/system) would publish the same GPU objects and hold the same ledger; the node is
#      moved first (docs/admin-guide.md, "Moving a node between the proxy and NRI").
#   2. The runtime's NRI socket exists: with NRI off (containerd 1.7's default) the runtime would create
#      every container untouched, claims included, and no agent would ever be asked.
#   3. libnvidia-ml.so.1 under the driver root on the node (seen at $HOST_ROOT): linked alone into a
#      folder of the pod's own, which goes first in LD_LIBRARY_PATH. Not the driver's whole library folder:
#      the node's libc and libssl would then replace the image's. Not found is no refusal: the agent says
#      what it does without NVML.
#
# Tests run it against a scratch directory: every path and the agent's command are settings.
set -eu

HOST_ROOT=${ELASTICGPU_AGENT_HOST_ROOT:-/host}              # the node's / (hostPath, read-only)
NRI_SOCKET=${ELASTICGPU_AGENT_NRI_SOCKET:-/var/run/nri/nri.sock}   # mounted at its node path
DRIVER_ROOT=${ELASTICGPU_AGENT_DRIVER_ROOT:-/}              # a node path
NVML_DIR=${ELASTICGPU_NVML_DIR:-/run/elasticgpu-nvml}       # the pod's own (emptyDir)
AGENT=${ELASTICGPU_AGENT_COMMAND:-elasticgpu agent run}     # tests: a stand-in
NODE_NAME=${ELASTICGPU_AGENT_NODE_NAME:?the node name (downward API spec.nodeName) is missing}
GUIDE='docs/admin-guide.md'

say() { echo "elasticgpu-agent[$NODE_NAME]: $*" >&2; }

# 1. The proxy mode's host service (the agent's unit, or its MPS daemons' unit left behind: that one
#    would serve the same socket and card folders as the DaemonSet elasticgpu-mps).
for unit in /etc/systemd/system/elasticgpu-agent.service /etc/systemd/system/elasticgpu-mps.service; do
  if [ -e "$HOST_ROOT$unit" ]; then
    say "this node runs the agent as a host service ($unit, agent.nodeHook=cri-proxy); two agents would" \
        "write the same GPU objects and ledger, two MPS services the same daemons. Move the node to NRI first" \
        "($GUIDE, \"Moving a node between the proxy and NRI\"), or keep this node off the DaemonSet" \
        "(agent.daemonset.nodeSelector)"
    exit 3
  fi
done

# 2. NRI on in the runtime.
if [ ! -S "$NRI_SOCKET" ]; then
  say "no NRI socket at $NRI_SOCKET: this node's container runtime has NRI off, so it would create every" \
      "container untouched. containerd 1.7: [plugins.\"io.containerd.nri.v1.nri\"] disable = false in its" \
      "config.toml, then restart containerd; containerd 2.x: NRI is on unless that says disable = true;" \
      "CRI-O: enable_nri = true under [crio.nri]; elsewhere the socket path is agent.nriSocket. Or run this" \
      "node with the CRI proxy (agent.nodeHook=cri-proxy; $GUIDE, \"Managed clusters\")"
  exit 4
fi

# 3. NVML.
root=$HOST_ROOT/${DRIVER_ROOT#/}
found=""
for dir in usr/lib/x86_64-linux-gnu usr/lib/aarch64-linux-gnu usr/lib64 lib64 usr/lib lib; do
  if [ -e "${root%/}/$dir/libnvidia-ml.so.1" ]; then
    found=${root%/}/$dir/libnvidia-ml.so.1
    break
  fi
done
mkdir -p "$NVML_DIR"
if [ -n "$found" ]; then
  ln -sfn "$found" "$NVML_DIR/libnvidia-ml.so.1"
  say "NVML: ${found#"$HOST_ROOT"} (driver root $DRIVER_ROOT)"
else
  rm -f "$NVML_DIR/libnvidia-ml.so.1"
  say "no libnvidia-ml.so.1 under the driver root $DRIVER_ROOT on this node (agent.daemonset.driverRoot:" \
      "/run/nvidia/driver with the GPU Operator's driver container, /home/kubernetes/bin/nvidia on GKE)"
fi
LD_LIBRARY_PATH=$NVML_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH

# shellcheck disable=SC2086 # AGENT is a command line: a program and its arguments.
exec $AGENT "$@"
