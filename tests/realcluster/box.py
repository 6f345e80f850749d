"""The box for the tier: elasticgpu/testbed/box.py (moved there so that `elasticgpu demo --cluster real
--install chart` can start it without importing tests/), re-exported under its old import path;
`running_box` starts every component with the tests' spawn (tests/spawning.py).

Manual use: ``python -m elasticgpu.testbed.box`` prints ``export KUBECONFIG=...`` and waits for Ctrl-C.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from elasticgpu.testbed import box as _box
from elasticgpu.testbed.box import (
    API_PORT,
    CLUSTER_CIDR,
    CNI_CACHE,
    NETNS_PREFIX,
    NODE_ADDRESS,
    NODE_NETWORK,
    NODE_PREFIX,
    POD_GATEWAY,
    POD_SUBNET,
    SERVICE_CIDR,
    SERVICE_IP,
    Box,
    BoxError,
    BoxUnavailable,
    Forwarder,
    NetworkNamespace,
    check_prerequisites,
    clashes,
    cni_config,
    find_network_build,
    host_networks,
    kube_proxy_config,
    reaches,
    sweep_stale_namespaces,
)
from tests import spawning

__all__ = [
    "API_PORT", "CLUSTER_CIDR", "CNI_CACHE", "NETNS_PREFIX", "NODE_ADDRESS", "NODE_NETWORK", "NODE_PREFIX",
    "POD_GATEWAY", "POD_SUBNET", "SERVICE_CIDR", "SERVICE_IP", "Box", "BoxError", "BoxUnavailable", "Forwarder",
    "NetworkNamespace", "check_prerequisites", "clashes", "cni_config", "find_network_build", "host_networks",
    "kube_proxy_config", "reaches", "running_box", "skip_unless_the_chart_can_run", "sweep_stale_namespaces",
]  # fmt: skip


@contextlib.contextmanager
def running_box(*, verbosity: str | None = None) -> Iterator[Box]:
    """elasticgpu.testbed.box.running_box, its components started with the tests' spawn."""
    with _box.running_box(verbosity=verbosity, spawn=spawning.spawn) as running:
        yield running


def skip_unless_the_chart_can_run() -> None:
    """Skip (naming what to build) unless the box, helm and this checkout's product image are there: what
    `elasticgpu demo` and `elasticgpu sandbox` need for `--install chart`. The image is built here if need
    be, so that the command's own call is then a cache hit."""
    import pytest

    from elasticgpu.testbed import helm, product_image, real_cluster

    try:
        check_prerequisites()
    except (BoxUnavailable, real_cluster.ControlPlaneUnavailable) as e:
        pytest.skip(str(e))
    if isinstance(found := helm.find_helm(), str):
        pytest.skip(f"no helm binary: {found}")
    try:
        product_image.this_checkouts_image()
    except product_image.ImageUnavailable as e:
        pytest.skip(f"no product image: {e}")
