"""`elasticgpu sandbox up --cluster real --install chart` (issue 50 item 1): the chart demo's box, kept. Run as
a user runs it (processes with deadlines): up returns with the KUBECONFIG of a one-node Kubernetes where the
chart runs as pods; a claim and a pod of the user's reach Running with the claim's card; down removes the box
and leaves no process of it."""

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
from elasticgpu.testbed import box
from tests.realcluster import box as chart_box

ROOT = Path(__file__).resolve().parents[2]
UP_TIMEOUT_S = 660  # the sandbox's own wait is 600 s; the chart demo's box and install take ~35 s when idle
WITHIN_S = 180.0

pytestmark = [pytest.mark.realcluster, pytest.mark.timeout(UP_TIMEOUT_S + 3 * 200 + 2 * int(WITHIN_S))]


def _sandbox(where: Path, *args: str, timeout: float = 200) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "elasticgpu", "sandbox", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, "ELASTICGPU_SANDBOX_DIR": str(where)})


def _wait(check: Any, what: str) -> Any:
    deadline = time.monotonic() + WITHIN_S
    while not (result := check()):
        assert time.monotonic() < deadline, f"timed out after {WITHIN_S:.0f}s waiting for {what}"
        time.sleep(1)
    return result


@pytest.fixture
def where() -> Iterator[Path]:
    chart_box.skip_unless_the_chart_can_run()
    with tempfile.TemporaryDirectory(prefix="egsbc-") as directory:
        path = Path(directory) / "sandbox"
        try:
            yield path
        finally:
            _sandbox(path, "down", timeout=200)  # whatever the test did: nothing left running


def test_a_kept_box_with_the_chart_runs_the_user_s_pod_and_down_removes_it(where: Path) -> None:
    refused = _sandbox(where, "up", "--install", "chart", timeout=60)  # the box is Kubernetes' own: --cluster real
    assert refused.returncode != 0 and "--cluster real" in refused.stdout + refused.stderr, refused

    started = _sandbox(where, "up", "--cluster", "real", "--install", "chart", timeout=UP_TIMEOUT_S)
    assert started.returncode == 0, started.stdout + started.stderr
    assert "  | 2/3 the product image" in started.stdout and "imagePullPolicy: Never" in started.stdout
    state = yaml.safe_load((where / "sandbox.json").read_text())
    (node,) = state["nodes"]
    api = config.new_client_from_config(config_file=str(where / "kubeconfig"))  # type: ignore[no-untyped-call]
    try:
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        system = core.list_namespaced_pod("elasticgpu-system").items
        assert {p.status.phase for p in system} == {"Running"}, [(p.metadata.name, p.status.phase) for p in system]
        # The user's claim (the chart's default class) and a pod of the node's image.
        claim, pod = yaml.safe_load_all((ROOT / "examples" / "workloads" / "claim-and-pod.yaml").read_text())
        image = state["pods_note"].split("use image ", 1)[1].split()[0]
        (container,) = pod["spec"]["containers"]
        container.update(image=image, imagePullPolicy="Never", command=["/bin/sh", "-c",
                         "echo SEE=$NVIDIA_VISIBLE_DEVICES; trap 'exit 0' TERM; while :; do sleep 1; done"])
        container.pop("resources")
        custom.create_namespaced_custom_object(names.GROUP, names.VERSION, "default", names.PLURAL_CLAIM, claim)
        core.create_namespaced_pod("default", pod)
        _wait(lambda: core.read_namespaced_pod("notebook", "default").status.phase == "Running", "the pod Running")
        bound = custom.get_namespaced_custom_object(names.GROUP, names.VERSION, "default", names.PLURAL_CLAIM,
                                                    "notebook-gpu")  # fmt: skip
        assert (bound["status"]["phase"], bound["status"]["nodeName"]) == ("Bound", node), bound["status"]
        seen = _wait(lambda: [line for line in core.read_namespaced_pod_log("notebook", "default").splitlines()
                              if line.startswith("SEE=")], "the pod's log")  # fmt: skip
        assert seen == [f"SEE={','.join(bound['status']['gpus'])}"], seen
    finally:
        api.close()

    stopped = _sandbox(where, "down", timeout=200)
    assert stopped.returncode == 0 and "every process it started stopped" in stopped.stdout, stopped.stdout
    assert not where.exists()
    assert not (Path(state["directory"]).exists())
    if os.path.isdir("/run/netns"):  # the box's network namespace went with it
        assert not [n for n in os.listdir("/run/netns") if n.startswith(f"{box.NETNS_PREFIX}{state['pid']}-")]
