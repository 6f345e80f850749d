"""`elasticgpu plan` predicts the controller (issue 36, item 1).

For random nodes, cards, classes (provisioner, policy, gpuModel, nodeSelector, isolation,
topology, binding mode, default or not), a quota and claims, the real controller binds the claims
one after the other against the API server, and `plan` is given what `kubectl get pgpu,egpuclass,
egpuquota,egpuc -o yaml` would have shown before the first claim: each claim's phase and reason
must be the same. `plan` once said Bound for `nvidia.com/gpu: 2` under the default gpushare class
while the controller said InvalidRequest; this test found that kind of gap by construction.

The claims are created one at a time, each after the controller settled the one before, because
`plan` binds in file order: with all of them at once, the controller's order would decide which
of two contending claims wins, and the test would compare orders instead of decisions.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client

from elasticgpu import plan
from elasticgpu.api import GPU, ElasticGPUClaim, ElasticGPUClass, ElasticGPUQuota, names
from elasticgpu.controller.edge.kube import KubeApi
from tests.binding import objects as o
from tests.binding.conftest import Cluster, new_controller, settle
from tests.quota import quotas

CORE, MEMORY, CARDS = names.RESOURCE_CORE, names.RESOURCE_MEMORY, names.RESOURCE_NVIDIA_GPU
CARD_MODELS = {"A100": ("NVIDIA A100-SXM4-80GB", 81920), "T4": ("Tesla T4", 15360)}
OTHER_PROVISIONER = "example.com/someone-else"


@dataclass(frozen=True)
class ClassSpec:
    provisioner: str
    policy: str | None
    gpu_model: str | None
    zone: str | None
    isolation: str
    topology: str
    default: bool
    wait_for_consumer: bool


@dataclass(frozen=True)
class ClaimSpec:
    requests: dict[str, Any]
    class_ref: int | None
    """Index into the scenario's classes; None: no class named; -1: a class that does not exist."""


@dataclass(frozen=True)
class Scenario:
    nodes: list[tuple[str, int, str]]
    """(card model key, number of cards, zone label) per node."""
    classes: list[ClassSpec]
    quota: dict[str, Any] | None
    claims: list[ClaimSpec]


_classes = st.builds(
    ClassSpec,
    provisioner=st.sampled_from([names.PROVISIONER_GPUSHARE, names.PROVISIONER_GPUSHARE, names.PROVISIONER_PHYSICAL,
                                 OTHER_PROVISIONER]),
    policy=st.sampled_from([None, "binpack", "spread", "fragmentation"]),
    gpu_model=st.sampled_from([None, None, "*A100*", "*T4*", "*H100*"]),
    zone=st.sampled_from([None, None, "a"]),
    isolation=st.sampled_from(["None", "None", "MPS"]),
    topology=st.sampled_from(["Any", "Any", "NVLink"]),
    default=st.booleans(),
    wait_for_consumer=st.sampled_from([False, False, False, True]),
)
_requests = st.one_of(
    st.builds(lambda c, m: {CORE: c, **({MEMORY: m} if m else {})},
              st.sampled_from([10, 30, 50, 70, 100]), st.sampled_from([None, "8Gi", "20Gi", "96Gi"])),
    st.builds(lambda m: {MEMORY: m}, st.sampled_from(["4Gi", "40Gi"])),
    st.builds(lambda n: {CARDS: n}, st.integers(1, 3)),
    st.just({CORE: 200}),
)


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    nodes = draw(st.lists(st.tuples(st.sampled_from(sorted(CARD_MODELS)), st.integers(1, 3), st.sampled_from("ab")),
                          min_size=1, max_size=2))
    classes = draw(st.lists(_classes, max_size=3))
    refs = st.sampled_from([None, -1, *range(len(classes)), *range(len(classes))])
    claims = draw(st.lists(st.builds(ClaimSpec, requests=_requests, class_ref=refs), min_size=1, max_size=4))
    quota = draw(st.sampled_from([None, None, {CORE: 60}, {CARDS: 1}, {CORE: 150, CARDS: 2}]))
    return Scenario(nodes=nodes, classes=classes, quota=quota, claims=claims)


@contextlib.contextmanager
def _namespace(api_client: client.ApiClient) -> Iterator[str]:
    """A namespace of one example (the `namespace` fixture is per test, hypothesis runs many per test)."""
    core = client.CoreV1Api(api_client)
    name = f"plan-{uuid.uuid4().hex[:10]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={"elasticgpu-test": "1"})))
    try:
        yield name
    finally:
        with contextlib.suppress(client.ApiException):
            core.delete_namespace(name)


def _class_body(prefix: str, number: int, spec: ClassSpec) -> dict[str, Any]:
    parameters = {key: value for key, value in (("policy", spec.policy), ("gpuModel", spec.gpu_model),
                                                ("nodeSelector", f"zone-{prefix}={spec.zone}" if spec.zone else None))
                  if value}
    body = o.klass(f"{prefix}-c{number}", provisioner=spec.provisioner, default=spec.default, parameters=parameters,
                   mode="WaitForFirstConsumer" if spec.wait_for_consumer else None)
    body["isolation"], body["topology"] = spec.isolation, spec.topology
    return body


def _claim_body(prefix: str, number: int, spec: ClaimSpec) -> dict[str, Any]:
    body = o.claim(f"claim-{number}", cores=None, memory=None)
    body["spec"]["resources"]["requests"] = dict(spec.requests)
    if spec.class_ref == -1:
        body["spec"]["elasticGPUClassName"] = f"{prefix}-missing"
    elif spec.class_ref is not None:
        body["spec"]["elasticGPUClassName"] = f"{prefix}-c{spec.class_ref}"
    return body


def _verdict(status: dict[str, Any]) -> tuple[str, str]:
    """A claim's (phase, reason) as the controller left it; a claim it leaves alone has neither."""
    return status.get("phase") or "Pending", status.get("reason") or ""


@pytest.mark.timeout(600)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(scenario=scenarios())
def test_plan_s_phase_and_reason_are_the_controller_s(scenario: Scenario, kube: KubeApi,
                                                      api_client: client.ApiClient) -> None:
    core = client.CoreV1Api(api_client)
    with _namespace(api_client) as namespace:
        cluster = Cluster(kube, namespace)
        prefix = namespace
        made_nodes: list[str] = []
        try:
            for index, (model_key, count, zone) in enumerate(scenario.nodes):
                node = f"{prefix}-n{index}"
                labels = {f"zone-{prefix}": zone}
                core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=node, labels=labels)))
                made_nodes.append(node)
                model, memory = CARD_MODELS[model_key]
                for card in range(count):
                    cluster.gpu(o.gpu(f"gpu-{node}-{card}", node=node, memory=memory, model=model, index=card))
            for number, spec in enumerate(scenario.classes):
                cluster.klass(_class_body(prefix, number, spec))
            if scenario.quota is not None:
                quotas.create(api_client, namespace, quotas.quota("team", scenario.quota))
            controller = new_controller(kube, namespace)
            settle(controller)
            # What plan reads: the cluster as it is before the first claim (its GPUs hold nothing yet).
            found = plan.PlanInput(
                gpus=[GPU.model_validate(b) for b in kube.list_gpus()], node_list=[],
                classes=[ElasticGPUClass.model_validate(b) for b in kube.list_classes()],
                claims=[], node_labels={(n["metadata"]["name"]): n["metadata"].get("labels") or {}
                                        for n in kube.list_nodes()},
                quotas=[ElasticGPUQuota.model_validate(b) for b in kube.list_quotas(namespace)])
            for number, spec in enumerate(scenario.claims):
                found.claims.append(ElasticGPUClaim.model_validate(cluster.claim(_claim_body(prefix, number, spec))))
                settle(controller)
            controller_says = {}
            for claim in found.claims:
                status = cluster.get_claim(claim.metadata.name or "").get("status") or {}
                controller_says[claim.metadata.name] = (*_verdict(status), status.get("message") or "")
            plan_says = {r.claim.metadata.name: ("Bound" if r.placement else "Pending", r.reason, r.message)
                         for r in plan.plan(found)}
            assert {k: v[:2] for k, v in plan_says.items()} == {k: v[:2] for k, v in controller_says.items()}, (
                f"plan: {plan_says}\ncontroller: {controller_says}")
        finally:
            cluster.cleanup()
            for node in made_nodes:
                with contextlib.suppress(client.ApiException):
                    core.delete_node(node)
