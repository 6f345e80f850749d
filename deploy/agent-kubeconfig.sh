#!/usr/bin/env bash
# The kubeconfig of one node's agent: a token of the ServiceAccount elasticgpu-system/elasticgpu-agent
# bound to that node's Node object (deploy/agent.yaml, deploy/policies/agent-node-scope.yaml).
#
#   deploy/agent-kubeconfig.sh NODE [FILE]
#
# Run it where kubectl reaches the cluster as an admin (kubectl 1.31+, Kubernetes 1.31+: Node-bound
# tokens). Writes FILE (mode 0600), or stdout, e.g. straight onto the node:
#   deploy/agent-kubeconfig.sh gpu-node-1 | ssh gpu-node-1 'sudo install -D -m 0600 /dev/stdin /etc/elasticgpu/kubeconfig'
#
# The API server puts the node's name into every request made with the token
# (authentication.kubernetes.io/node-name), and the policies let that agent write only its own
# node's objects. The token dies with the Node object (a node that registers again needs a new
# one) and at the end of its lifetime: ELASTICGPU_AGENT_TOKEN_DURATION (default 8760h; the API
# server may cap it, --service-account-max-token-expiration). Run this again before then and
# restart the agent (it reads its kubeconfig at start).
set -euo pipefail

node=${1:?usage: deploy/agent-kubeconfig.sh NODE [FILE]}
out=${2:-}
namespace=elasticgpu-system
account=elasticgpu-agent
duration=${ELASTICGPU_AGENT_TOKEN_DURATION:-8760h}
kubectl=${KUBECTL:-kubectl}

# The token is bound to the Node: it must exist (kubelet registers it) and the name must be the
# one the agent runs with (--node-name, the host name by default).
"$kubectl" get node "$node" -o name >/dev/null
token=$("$kubectl" create token "$account" --namespace "$namespace" \
  --bound-object-kind Node --bound-object-name "$node" --duration "$duration")
# Server and CA of the current context (--flatten inlines a CA given as a file).
server=$("$kubectl" config view --minify --flatten -o jsonpath='{.clusters[0].cluster.server}')
ca=$("$kubectl" config view --minify --flatten -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')

kubeconfig() {
  cat <<CONFIG
apiVersion: v1
kind: Config
clusters:
  - name: cluster
    cluster:
      server: ${server}
$( [ -n "$ca" ] && echo "      certificate-authority-data: ${ca}" )
users:
  - name: ${account}-${node}
    user:
      token: ${token}
contexts:
  - name: ${account}
    context: {cluster: cluster, user: ${account}-${node}}
current-context: ${account}
CONFIG
}

if [ -n "$out" ]; then
  (umask 077 && kubeconfig >"$out.tmp" && mv -f "$out.tmp" "$out")
  echo "wrote $out: the agent of node $node (token bound to Node $node, lifetime $duration)" >&2
else
  kubeconfig
fi
