#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: installs the Python package with its test
# extra into .venv, builds (or reuses from cache) the local Kubernetes API server, checks lint
# and layering, then runs pytest. Extra arguments go to pytest (e.g. `-k binding -x`).
# Set ELASTICGPU_TEST_KUBECONFIG to run the same tests against a real cluster instead.
# It also builds (or reuses) Kubernetes' own components for the tests/realcluster tier (testcluster/).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n== %s ==\n' "$*"; }

if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  python3 -m venv .venv
fi
log "installing elasticgpu[test]"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test,bench]'

if [ -z "${ELASTICGPU_TEST_KUBECONFIG:-}" ]; then
  log "building the local API server (cached)"
  bash testserver/build.sh
fi
if [ -z "${ELASTICGPU_TEST_KUBECONFIG:-}" ] && [ "${ELASTICGPU_SKIP_TESTCLUSTER:-}" != 1 ]; then
  # Kubernetes' own components for the tests/realcluster tier: a cold build is about 16 minutes on
  # 2 cores (testcluster/README.md), then cached. A failed build with nothing cached only skips
  # that tier, naming this script; ELASTICGPU_SKIP_TESTCLUSTER=1 skips the build for a quick run.
  log "building Kubernetes' own control plane and kubelet (cached; the first build takes ~16 min)"
  if ! bash testcluster/build.sh; then
    echo "WARNING: testcluster/build.sh failed with nothing cached; the tests/realcluster tier will be SKIPPED" >&2
  fi
fi
log "building the test container runtime (cached)"
if ! bash testruntime/build.sh; then
  # Only a failed fetch with nothing cached gets here: the CRI tests skip, naming this reason.
  export ELASTICGPU_TESTRUNTIME_UNAVAILABLE="testruntime/build.sh could not fetch containerd/runc from Debian"
  echo "WARNING: $ELASTICGPU_TESTRUNTIME_UNAVAILABLE; the tests on a real containerd will be SKIPPED" >&2
fi
log "fetching containerd 2.x for the NRI tests (cached)"
if ! ELASTICGPU_TESTRUNTIME_CONTAINERD=2 bash testruntime/build.sh; then
  # As above, for the containerd 2.x half of the NRI (and CRI smoke) tests: they skip with this reason.
  export ELASTICGPU_TESTRUNTIME2_UNAVAILABLE="testruntime/build.sh (ELASTICGPU_TESTRUNTIME_CONTAINERD=2) could not fetch containerd 2.x from Debian sid"
  echo "WARNING: $ELASTICGPU_TESTRUNTIME2_UNAVAILABLE; the tests on containerd 2.x will be SKIPPED" >&2
fi

log "fetching the box's pod network: CNI plugins and nft from Debian (cached)"
if ! bash testnetwork/build.sh; then
  # A failed fetch with nothing cached: the tests on the box (a pod network inside a network
  # namespace, tests/realcluster/box.py) skip, naming this reason.
  export ELASTICGPU_TESTNETWORK_UNAVAILABLE="testnetwork/build.sh could not fetch Debian's containernetworking-plugins and nftables"
  echo "WARNING: $ELASTICGPU_TESTNETWORK_UNAVAILABLE; the tests on the box (pod network, kube-proxy) will be SKIPPED" >&2
fi

log "fetching Prometheus and promtool from Debian (cached)"
if prom_env=$(bash testprometheus/build.sh); then
  # The observability tests (tests/observability) read the binaries from these.
  eval "export $(echo "$prom_env" | grep '^ELASTICGPU_PROM' | tr '\n' ' ')"
else
  # Only a failed fetch with nothing cached gets here: those tests skip, naming this reason.
  export ELASTICGPU_TESTPROMETHEUS_UNAVAILABLE="testprometheus/build.sh could not fetch Debian's prometheus (promtool)"
  echo "WARNING: $ELASTICGPU_TESTPROMETHEUS_UNAVAILABLE; the Prometheus tests will be SKIPPED" >&2
fi

log "building the agent's NRI plugin (cached)"
if ! bash nri-plugin/build.sh; then
  # A failed build with nothing cached: the NRI tests skip, naming this reason.
  export ELASTICGPU_NRI_PLUGIN_UNAVAILABLE="nri-plugin/build.sh could not build the NRI plugin (Go or the Go module proxy)"
  echo "WARNING: $ELASTICGPU_NRI_PLUGIN_UNAVAILABLE; the tests of the NRI hook will be SKIPPED" >&2
fi

log "building the product image without a registry (cached)"
if image_env=$(bash image/build.sh); then
  # This checkout's build, for tests/product_image.py: the cache's current.env may name another's by then.
  echo "$image_env"
  eval "export $(echo "$image_env" | grep '^ELASTICGPU_IMAGE_[A-Z]*=' | tr '\n' ' ')"
else
  # A failed build with nothing cached: the tests of the image (tests/deploy/test_image.py) skip, naming this reason.
  export ELASTICGPU_IMAGE_UNAVAILABLE="image/build.sh could not build the product image (Debian's mirror or PyPI unreachable)"
  echo "WARNING: $ELASTICGPU_IMAGE_UNAVAILABLE; the tests of the product image will be SKIPPED" >&2
fi

log "building helm from the Go module proxy (cached)"
if helm_env=$(bash testhelm/build.sh); then
  # The real helm for tests/deploy/test_helm_chart.py (and the helm install tier): tests/helm_binary.py reads it.
  export "$(echo "$helm_env" | grep '^ELASTICGPU_HELM_BIN=')"
else
  # A failed build with nothing cached: the helm tests skip, naming this reason.
  export ELASTICGPU_HELM_UNAVAILABLE="testhelm/build.sh could not build helm (Go or the Go module proxy)"
  echo "WARNING: $ELASTICGPU_HELM_UNAVAILABLE; the tests that run the real helm will be SKIPPED" >&2
fi

# Only for the opt-in Karpenter tests (ELASTICGPU_KARPENTER_TESTS=1): a cold build takes about an hour on a
# loaded 2-core box, too much for every run's budget until it is cached.
if [ -z "${ELASTICGPU_TEST_KUBECONFIG:-}" ] && [ "${ELASTICGPU_SKIP_TESTCLUSTER:-}" != 1 ] \
    && [ "${ELASTICGPU_KARPENTER_TESTS:-}" = 1 ]; then
  log "building Karpenter with its KWOK provider from the Go module proxy (cached; the first build takes ~1 h)"
  if ! bash testkarpenter/build.sh; then
    # A failed build with nothing cached: tests/realcluster/test_karpenter.py skips, naming this reason.
    export ELASTICGPU_KARPENTER_UNAVAILABLE="testkarpenter/build.sh could not build Karpenter (Go or the Go module proxy)"
    echo "WARNING: $ELASTICGPU_KARPENTER_UNAVAILABLE; the tests with a real node autoscaler will be SKIPPED" >&2
  fi
fi

log "ruff"
.venv/bin/ruff check elasticgpu tests bench
log "import layering"
.venv/bin/lint-imports
log "mypy --strict"
.venv/bin/mypy --strict elasticgpu

log "pytest"
exec .venv/bin/python -m pytest "$@"
