"""The controller runs without automatic full garbage collections and freezes what survives
(`operator.take_over_full_collections`, `collect_and_freeze`). That is only safe while binding
leaves no reference cycles behind: a cycle never collected is a leak. This test binds claims
against the API server with the collector off and counts the cyclic garbage left over.

The binding runs in a process of its own: in the test process, threads left by earlier tests
(watches winding down, clients of other fixtures) make garbage of their own while the collector
is off, and a large combined run counted theirs as ours."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from elasticgpu.controller.edge.kube import KubeApi
from tests.binding import objects as o
from tests.binding.conftest import Cluster

REPO = Path(__file__).resolve().parents[2]
CLAIMS = 30

BIND_WITH_THE_COLLECTOR_OFF = """
import gc, json, sys
from collections import Counter
from elasticgpu.controller.edge.kube import KubeApi
from tests.binding import objects as o
from tests.binding.conftest import new_controller, settle, stop_watches

kubeconfig, namespace, class_name, claims = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
kube = KubeApi.from_kubeconfig(kubeconfig)
controller = new_controller(kube, namespace)
settle(controller)  # warm up: imports, connections, caches
for index in range(claims):
    body = o.claim(f"c{index}", cores=10, memory="1Gi", class_name=class_name)
    body["metadata"]["namespace"] = namespace
    body["metadata"].pop("uid", None)
    kube.create_claim(body)
gc.collect()
gc.disable()
settle(controller)  # binds them all (workers, Events, watch events)
controller.close()
gc.set_debug(gc.DEBUG_SAVEALL)
found = gc.collect()
kinds = Counter(type(obj).__name__ for obj in gc.garbage).most_common(8)
print(json.dumps({"found": found, "kinds": kinds}), flush=True)
stop_watches()
"""


def test_binding_leaves_no_cyclic_garbage(cluster: Cluster, kube: KubeApi, kube_cluster: Any) -> None:
    model = f"T{cluster.prefix}"
    for index in range(4):
        cluster.gpu(o.gpu(f"gpu-{cluster.prefix}-{index}", node=f"{cluster.prefix}-node", index=index, model=model))
    class_name = f"{cluster.prefix}-class"
    cluster.klass(o.klass(class_name, parameters={"gpuModel": model}))

    run = subprocess.run([sys.executable, "-c", BIND_WITH_THE_COLLECTOR_OFF, str(kube_cluster.kubeconfig),
                          cluster.namespace, class_name, str(CLAIMS)],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert all(cluster.get_claim(f"c{index}")["status"]["phase"] == "Bound" for index in range(CLAIMS))
    assert result["found"] == 0, f"binding left {result['found']} objects in reference cycles: {result['kinds']}"
