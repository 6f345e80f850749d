"""The whole manifests of examples/workloads/ (issue 50), applied to the local API server with the
product running: the admission webhook as a process (HTTPS through the API server), a controller
with its watches, GPU objects of a node. Each claim must bind, each pod be gated by the webhook and
released by the controller onto the claims' node.

The local API server serves core/v1 but not apps/v1 or batch/v1, so a Deployment or a Job is
applied as the pods its controller would create from its template (`generateName`, the template's
metadata and spec): the part elasticgpu sees. Each workload object itself is checked by plan
(the webhook's checks on its template) in `test_plan_reads_every_workload_example`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from elasticgpu import cli
from elasticgpu.api import names
from elasticgpu.controller.decisions import pod_gate
from tests.binding import objects as o
from tests.pods.claim_world import World, controller_for, kube, wait_for, world

__all__ = ["kube", "world"]  # fixtures

ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = ROOT / "examples" / "workloads"
EXAMPLES = sorted(WORKLOADS.glob("*.yaml"))
WITHIN_S = 90.0  # a loaded 2-core machine: the controller's first sync and the webhook's certificate
TEMPLATE_KINDS = {"Deployment": ("replicas", 1), "Job": ("parallelism", 1)}


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def test_the_examples_cover_a_pod_a_deployment_and_a_training_job_with_a_group() -> None:
    kinds = {path.stem: {doc["kind"] for doc in _documents(path)} for path in EXAMPLES}
    assert kinds == {
        "claim-and-pod": {"ElasticGPUClaim", "Pod"},
        "deployment-inline": {"Deployment"},
        "training-job-group": {"ElasticGPUClaim", "Job"},
    }
    group = [d for d in _documents(WORKLOADS / "training-job-group.yaml") if d["kind"] == "ElasticGPUClaim"]
    assert {d["metadata"]["labels"][names.LABEL_GROUP] for d in group} == {"resnet-train"}
    for path in EXAMPLES:  # the first question of a device-plugin user, answered by the manifests themselves
        text = path.read_text()
        assert "nvidia.com/gpu" not in yaml.safe_dump(_documents(path)), path.name
        assert "No nvidia.com/gpu" in text or "NOT ask for nvidia.com/gpu" in text, path.name


def test_plan_reads_every_workload_example(capsys: pytest.CaptureFixture[str]) -> None:
    """plan gives each pod template the webhook's checks and binds every claim, inline ones included."""
    sample = ROOT / "examples" / "plan"
    code = cli.main(["plan", "--strict", "-f", str(sample / "nodes.yaml"), "-f", str(sample / "classes.yaml"),
                     "-f", str(WORKLOADS)])
    out = capsys.readouterr().out
    assert code == 0, out
    bound = {line.split()[1] for line in out.splitlines()[1:] if " Bound " in line}
    assert bound == {"notebook-gpu", "resnet-train-0", "resnet-train-1", "inference-0-server",
                     "inference-1-server"}, out


@pytest.fixture
def running(world: World, webhook_factory: Any) -> Iterator[World]:
    """The webhook and a controller over `world`, with one node of two 80Gi cards and a default class."""
    webhook_factory(world.namespace)
    node = world.node(f"{world.prefix}-gpu")
    for index in range(2):
        world.gpu(o.gpu(f"gpu-{world.prefix}-{index}", node=node, index=index))
    world.klass(o.klass(f"{world.prefix}-default", default=True))
    controller = controller_for(world)
    stop = threading.Event()
    threads = controller.informer.start(stop, timeout_s=30, listed=controller.rebuild())
    worker = threading.Thread(target=controller.run_worker, args=(stop,), daemon=True)
    worker.start()
    try:
        yield world
    finally:
        stop.set()
        for thread in [*threads, worker]:
            thread.join(timeout=40)
        controller.close()


def _apply(world: World, doc: dict[str, Any]) -> list[str]:
    """Create `doc` in the world's namespace; returns the names of the pods it made."""
    api = world.core.api_client
    if doc["kind"] == names.KIND_CLAIM:
        world.claim(doc)
        return []
    if doc["kind"] == "Pod":
        pod = [api.sanitize_for_serialization(world.core.create_namespaced_pod(world.namespace, doc))]
    else:
        field, default = TEMPLATE_KINDS[doc["kind"]]
        template = doc["spec"]["template"]
        body = {"apiVersion": "v1", "kind": "Pod", "spec": template["spec"],
                "metadata": {**template.get("metadata", {}), "generateName": f"{doc['metadata']['name']}-"}}
        pod = [api.sanitize_for_serialization(world.core.create_namespaced_pod(world.namespace, body))
               for _ in range(doc["spec"].get(field, default))]
    for created in pod:
        assert pod_gate.is_gated(created), f"the webhook did not gate {created['metadata']['name']}"
    return [created["metadata"]["name"] for created in pod]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_a_workload_example_binds_its_claims_and_releases_its_pods(running: World, path: Path) -> None:
    pods = [name for doc in _documents(path) for name in _apply(running, doc)]
    assert pods, f"{path.name} made no pod"
    for name in pods:
        lifted = wait_for(lambda name=name: (p := running.get_pod(name)) and not pod_gate.is_gated(p) and p,
                          f"the controller to release pod {name} of {path.name}", timeout=WITHIN_S)
        assert pod_gate.pinned_node(lifted) == f"{running.prefix}-gpu"
    claims = {c["metadata"]["name"]: c for c in running.kube.list_claims(running.namespace)}
    assert claims and all(c["status"]["phase"] == "Bound" for c in claims.values()), {
        n: c.get("status") for n, c in claims.items()}
    if path.stem == "deployment-inline":
        assert len(claims) == 2  # one claim per replica, made for its pod
