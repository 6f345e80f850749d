"""`elasticgpu sandbox up --install chart`: the chart demo's box, kept to try things in.

The box (Kubernetes' own control plane, kubelet, containerd with NRI, kube-proxy, a pod network, in a
network namespace of its own) with deploy/chart installed by helm, as `elasticgpu demo --cluster real
--install chart` makes it, but without the demo's scenario and kept until `sandbox down`: pods really
run there, on a node of simulated cards. `down` removes the box whole (nothing of it outlives it), so
no `helm uninstall` is run first.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elasticgpu.api import names
from elasticgpu.demo import chart
from elasticgpu.demo.run_frame import OWNER_FILE, TMP_PREFIX
from elasticgpu.testbed import kube, processes
from elasticgpu.testbed.processes import DemoError

NAMESPACE = "default"
"""Where the user's `kubectl apply` lands and where the webhook is probed."""


class ChartSandbox:
    """One kept box with the chart installed: `start` brings it up and says what it holds, `cleanup` removes it."""

    def __init__(self, args: argparse.Namespace, say: Callable[..., None]) -> None:
        self.say = say
        self.directory = Path(tempfile.mkdtemp(prefix=TMP_PREFIX))
        (self.directory / OWNER_FILE).write_text(str(os.getpid()))  # a later run sweeps it if this one is killed
        chart_args = argparse.Namespace(timeout_s=args.timeout_s, keep=False)
        self.demo = chart.ChartDemo(chart_args, say, self.directory)

    def start(self) -> dict[str, Any]:
        """Box, image and release up, the webhook gating pods; the fields of the sandbox's state."""
        self.say("1/3 the box: Kubernetes' own control plane, kubelet, containerd (NRI), kube-proxy, a pod network")
        self.demo.start_box()
        self.say("2/3 the product image into the node's containerd; helm install of deploy/chart (simulated cards)")
        self.demo.install()
        self.say("3/3 the chart's webhook gating pods in namespace default")
        box = self.demo.box
        k = self.demo.kube
        if box is None or k is None:
            raise DemoError("the box did not come up")
        image = box.runtime.image
        probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": "sandbox-webhook-probe", "annotations": {names.inline_request_annotation("main"): "gpu-core=10"}},
            "spec": {"containers": [{"name": "main", "image": image, "imagePullPolicy": "Never"}]}}  # fmt: skip

        def gates() -> bool:
            try:
                made = k.create(f"/api/v1/namespaces/{NAMESPACE}/pods", probe, dry_run=True)
            except (DemoError, kube.NotFound):  # the namespace's ServiceAccount, the webhook's endpoints: not yet
                return False
            return any(g.get("name") == names.SCHEDULING_GATE for g in made["spec"].get("schedulingGates") or [])

        processes.wait_until(gates, "the chart's webhook to gate pods that use claims",
                             timeout_s=self.demo.args.timeout_s, interval_s=0.5)  # fmt: skip
        return {
            "cluster": "the box: Kubernetes' own control plane, kubelet and containerd, with deploy/chart installed by"
            " helm", "kubeconfig_from": str(box.kubeconfig), "directory": str(self.directory), "nodes": [box.node],
            "pods_note": f"  pods: they run (real kubelet and containerd). The node pulls nothing: use image {image}"
            " with\n  imagePullPolicy: Never (the examples' CUDA image is not there). The chart's pods: namespace"
            f" {chart.SYSTEM}.",
            "serves": "or any claim, pod, Deployment, Job of yours (image: see above)",
        }

    def cleanup(self) -> None:
        """The box goes whole, with the release in it: no uninstall first."""
        self.demo.installed = False
        self.demo.cleanup()
        shutil.rmtree(self.directory, ignore_errors=True)
