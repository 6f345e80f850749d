"""What the demo applies: two simulated nodes, two classes, claims and the pods that use them.

- `slice`: 30% of a card's compute and 10 GiB of its memory (class `<prefix>gpushare`, provisioner gpushare);
- `whole`: one whole card (class `<prefix>whole`, physical);
- `too-big`: 96 GiB on cards of 80 GiB, which can never fit: it stays Pending and says why;
- pod `trainer` uses `slice` in container `main` (annotation `egpuc.elasticgpu.io/main`);
- pod `renderer` uses `whole` in container `main`;
- pod `notebook` asks inline (`elasticgpu.io/request.main`) for 20% and 8 GiB: the controller
  makes the claim `notebook-main`, owned by the pod.
Nothing here talks to the API server; `running` applies these bodies and checks the outcome.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from elasticgpu.api import names, pod_claims

CARD_MODEL = "NVIDIA A100-SXM4-80GB"
CARDS_PER_NODE = 2
CARD_MEMORY = "80Gi"
DEMO_LABEL = "elasticgpu.io/demo"
"""Label (value: the run's id) on every cluster-scoped object the demo makes, and the key of the
NoSchedule taint on its simulated nodes, so nothing else lands there on a real cluster."""
CONTAINER = "main"


@dataclass(frozen=True)
class PodUse:
    """A pod of the scenario, the claim its container uses, and how it asks for it."""

    pod: str
    claim: str
    how: str  # "claim" (annotation naming a claim) or "inline" (request annotation)


@dataclass(frozen=True)
class Scenario:
    """The objects of one run. `prefix` makes cluster-scoped names unique on a shared cluster."""

    namespace: str
    run_id: str
    prefix: str
    shared_cluster: bool = False

    @property
    def nodes(self) -> list[str]:
        """The simulated nodes."""
        return [f"{self.prefix}node-a", f"{self.prefix}node-b"]

    @property
    def model(self) -> str:
        """The cards' model: the real name locally; on a shared cluster marked with the run, so the
        classes' gpuModel matches the demo's simulated cards only, never a real one."""
        return CARD_MODEL if not self.shared_cluster else f"{CARD_MODEL} sim-{self.run_id}"

    @property
    def shared_class(self) -> str:
        """Class of slices."""
        return f"{self.prefix}gpushare"

    @property
    def whole_class(self) -> str:
        """Class of whole cards."""
        return f"{self.prefix}whole"

    @property
    def uses(self) -> list[PodUse]:
        """The pods and the claims that must reach their containers."""
        return [
            PodUse("trainer", "slice", "claim"),
            PodUse("renderer", "whole", "claim"),
            PodUse("notebook", pod_claims.inline_claim_name("notebook", CONTAINER), "inline"),
        ]

    unfit_claim = "too-big"

    def simulation(self) -> str:
        """The simulated backend's YAML of one node (both nodes have the same cards)."""
        return yaml.safe_dump(
            {
                "driver": {"version": "550.54.15", "cuda": "12.4"},
                "cards": [{"model": self.model, "memory": CARD_MEMORY, "numa": 0, "count": CARDS_PER_NODE}],
            }
        )

    def namespace_body(self) -> dict[str, Any]:
        """The demo's namespace."""
        return {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": self.namespace, "labels": {DEMO_LABEL: self.run_id}},
        }

    def node_body(self, name: str) -> dict[str, Any]:
        """A Node for a simulated node; tainted so that only the demo's pods tolerate it."""
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, DEMO_LABEL: self.run_id}},
            "spec": {"taints": [{"key": DEMO_LABEL, "value": self.run_id, "effect": "NoSchedule"}]},
        }

    @staticmethod
    def node_status() -> dict[str, Any]:
        """What kubelet would report: room for the pods."""
        room = {"cpu": "16", "memory": "64Gi", "pods": "110"}
        return {"allocatable": room, "capacity": room}

    def class_bodies(self) -> list[dict[str, Any]]:
        """A class of slices and one of whole cards, limited to the demo's card model; both opt in
        to per-claim series (the demo shows every panel and `kubectl egpu usage` per class)."""
        common = {
            "apiVersion": names.API_VERSION,
            "kind": names.KIND_CLASS,
            "reclaimPolicy": "Delete",
            "bindingMode": "Immediate",
        }
        opted = {names.ANNOTATION_PER_CLAIM_METRICS: "true"}
        return [
            {
                **common,
                "metadata": {"name": self.shared_class, "labels": {DEMO_LABEL: self.run_id}, "annotations": opted},
                "provisioner": names.PROVISIONER_GPUSHARE,
                "parameters": {"gpuModel": self.model, "policy": "binpack"},
            },
            {
                **common,
                "metadata": {"name": self.whole_class, "labels": {DEMO_LABEL: self.run_id}, "annotations": opted},
                "provisioner": names.PROVISIONER_PHYSICAL,
                "parameters": {"gpuModel": self.model},
            },
        ]

    def claim_bodies(self) -> list[dict[str, Any]]:
        """The claims made by hand (the inline one is made by the controller)."""

        def claim(name: str, klass: str, requests: dict[str, str]) -> dict[str, Any]:
            return {
                "apiVersion": names.API_VERSION,
                "kind": names.KIND_CLAIM,
                "metadata": {"name": name, "namespace": self.namespace},
                "spec": {"elasticGPUClassName": klass, "resources": {"requests": requests}},
            }

        return [
            claim("slice", self.shared_class, {names.RESOURCE_CORE: "30", names.RESOURCE_MEMORY: "10Gi"}),
            claim("whole", self.whole_class, {names.RESOURCE_NVIDIA_GPU: "1"}),
            claim(self.unfit_claim, self.shared_class, {names.RESOURCE_CORE: "50", names.RESOURCE_MEMORY: "96Gi"}),
        ]

    def pod_body(self, use: PodUse) -> dict[str, Any]:
        """A pod whose container `main` uses the claim (the webhook adds the gate and the label)."""
        if use.how == "inline":
            annotation = {
                names.inline_request_annotation(CONTAINER): f"gpu-core=20,gpu-memory=8Gi,class={self.shared_class}"
            }
        else:
            annotation = {names.claim_annotation(CONTAINER): use.claim}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": use.pod, "namespace": self.namespace, "annotations": annotation},
            "spec": {
                "containers": [
                    {
                        "name": CONTAINER,
                        "image": "busybox:1.36",
                        "command": ["sleep", "3600"],
                        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                    }
                ],
                "tolerations": [{"key": DEMO_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
                "terminationGracePeriodSeconds": 0,
            },
        }

    def probe_pod_body(self) -> dict[str, Any]:
        """A pod sent with dryRun to see whether the API server calls the webhook yet."""
        body = self.pod_body(self.uses[0])
        body["metadata"]["name"] = "webhook-probe"
        return body
