"""`elasticgpu sandbox up | status | down` as a user runs it (issue 50): subprocesses with deadlines.

`up` must return with the demo's cluster running in the background; the user's own manifests
(examples/workloads/claim-and-pod.yaml, as the README says) then go through the real webhook and
controller there, and `kubectl egpu` answers against it; `down` must leave no process of it running
and none of its files. The local API server only: the plain sandbox (`--cluster real` needs the
testcluster build; its processes are the same `Demo`'s).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from elasticgpu.api import names
from elasticgpu.controller.decisions import pod_gate
from elasticgpu.testbed import local_cluster

ROOT = Path(__file__).resolve().parents[2]
UP_TIMEOUT_S = 400  # the sandbox's own wait is 600 s at most; the demo takes ~25 s on two busy cores
WITHIN_S = 120.0

pytestmark = pytest.mark.skipif(
    local_cluster.find_binaries(build_if_missing=False) is None,
    reason="no cached test API server: run `bash testserver/build.sh` (a few minutes)",
)


def _sandbox(where: Path, *args: str, timeout: float = 200) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "elasticgpu", "sandbox", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, "ELASTICGPU_SANDBOX_DIR": str(where)})


def _descendants(pid: int) -> set[int]:
    """Every process below `pid`, from /proc (children by their parent pid)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait(check: Any, what: str, timeout: float = WITHIN_S) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.5)


@pytest.fixture
def where() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="egsb-") as directory:
        path = Path(directory) / "sandbox"
        try:
            yield path
        finally:
            _sandbox(path, "down", timeout=200)  # whatever the test did: nothing left running


def test_sandbox_up_keeps_the_cluster_for_the_user_s_manifests_and_down_leaves_nothing(where: Path) -> None:
    assert _sandbox(where, "status").returncode == 1  # none yet

    started = _sandbox(where, "up", timeout=UP_TIMEOUT_S)
    assert started.returncode == 0, started.stdout + started.stderr
    kubeconfig = where / "kubeconfig"
    assert f"export KUBECONFIG={kubeconfig}" in started.stdout
    assert "elasticgpu sandbox down" in started.stdout and "  | 2/3 node agents" in started.stdout  # progress shown
    state = yaml.safe_load((where / "sandbox.json").read_text())
    pid, demo_dir = int(state["pid"]), Path(state["directory"])
    below = _descendants(pid)
    assert _running(pid) and len(below) >= 4, below  # the API server, etcd, the controller, the webhook, agents...
    status = _sandbox(where, "status")
    assert status.returncode == 0 and f"export KUBECONFIG={kubeconfig}" in status.stdout

    # The README's next steps, on the sandbox: the example's claim and pod through the webhook and controller.
    api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
    try:
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        claim, pod = yaml.safe_load_all((ROOT / "examples" / "workloads" / "claim-and-pod.yaml").read_text())
        custom.create_namespaced_custom_object(names.GROUP, names.VERSION, "default", names.PLURAL_CLAIM, claim)
        created = api.sanitize_for_serialization(core.create_namespaced_pod("default", pod))
        assert pod_gate.is_gated(created)  # the sandbox's webhook serves the user's namespace
        bound = _wait(lambda: (c := custom.get_namespaced_custom_object(
            names.GROUP, names.VERSION, "default", names.PLURAL_CLAIM, "notebook-gpu")).get("status", {}).get(
            "phase") == "Bound" and c, "the example's claim Bound (class gpushare, the sandbox's default)")
        assert bound["status"]["nodeName"] in state["nodes"]
        _wait(lambda: not pod_gate.is_gated(api.sanitize_for_serialization(core.read_namespaced_pod(
            "notebook", "default"))), "the controller to lift the pod's gate")
    finally:
        api.close()
    top = subprocess.run([sys.executable, "-m", "elasticgpu.kubectl_plugin", "top", "--kubeconfig", str(kubeconfig)],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert top.returncode == 0 and "notebook-gpu" in top.stdout, top.stdout + top.stderr

    stopped = _sandbox(where, "down", timeout=200)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "every process it started stopped" in stopped.stdout, stopped.stdout
    assert not [p for p in {pid, *below} if _running(p)], "down left processes of the sandbox running"
    assert not where.exists() and not demo_dir.exists()
    assert _sandbox(where, "status").returncode == 1
    again = _sandbox(where, "down")
    assert again.returncode == 0 and "none is up" in again.stdout
