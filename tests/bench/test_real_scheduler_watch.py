"""bench/real_scheduler.py's clock of scheduled pods survives a watch whose resourceVersion is gone
(issue 49 item 5): after 410 Gone it lists again instead of re-opening the same dead version until
the run times out. The 410 is real: the test's own API server is restarted after the clock's list,
so its watch cache begins past the version the watch starts from and answers "too old resource
version"."""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from kubernetes import client, config

from elasticgpu.testbed import local_cluster, processes
from tests import spawning
from tests.kube_cluster import find_binaries

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def real_scheduler() -> ModuleType:
    spec = importlib.util.spec_from_file_location("real_scheduler", REPO / "bench" / "real_scheduler.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["real_scheduler"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[tuple[client.ApiClient, Callable[[], None]]]:
    """etcd and the test server of this module alone (it restarts the server): a client, and the restart."""
    server_bin, etcd_bin = find_binaries()
    children = processes.Children(spawn=spawning.spawn)
    with tempfile.TemporaryDirectory(prefix="egk8s-410-") as tmp:
        try:
            local = local_cluster.start(Path(tmp), children, server_bin=server_bin, etcd_bin=etcd_bin)
            api = config.new_client_from_config(config_file=str(local.kubeconfig))
            command = [str(a) for a in local.apiserver.process.args]  # type: ignore[union-attr]

            def restart() -> None:
                local.apiserver.stop()
                children.start("API server", command, log=Path(tmp) / "apiserver-2.log")
                core = client.CoreV1Api(api)
                processes.wait_until(lambda: core.list_namespace(limit=1), "the restarted API server", timeout_s=120)

            try:
                yield api, restart
            finally:
                api.close()
        finally:
            children.stop_all()


def test_a_watch_whose_version_is_gone_lists_again_and_sees_what_happened(
    real_scheduler: ModuleType, own_cluster: tuple[client.ApiClient, Callable[[], None]]
) -> None:
    api, restart = own_cluster
    core = client.CoreV1Api(api)
    namespace = "watch-410"
    core.create_namespace({"metadata": {"name": namespace}})
    ready = {"ready": "yes"}
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "before"}, "data": ready})
    seen = real_scheduler.FirstSeen(core.list_namespaced_config_map, lambda o: (o.get("data") or {}) == ready,
                                    namespace=namespace)  # fmt: skip
    assert "before" in seen.seen  # the first list counts what already meets the condition
    # While the clock is not watching, objects change and the API server forgets the version it listed at.
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "not-yet"}, "data": {"ready": "no"}})
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "meanwhile"}, "data": ready})
    restart()
    seen.start()
    try:
        assert seen.wait(["meanwhile"], timeout_s=60), f"seen {sorted(seen.seen)}; relists {seen.relists}"
        assert seen.relists >= 1
        core.patch_namespaced_config_map("not-yet", namespace, {"data": ready})
        assert seen.wait(["not-yet"], timeout_s=60), f"the watch after the relist: seen {sorted(seen.seen)}"
    finally:
        seen.stop()
