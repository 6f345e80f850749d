"""`elasticgpu demo`: the whole product in one command, on a throwaway local cluster.

Modules, one responsibility each:
- `commands`: the flags (the rest is imported when the demo runs);
- `scenario`: the objects the demo applies and what each container must see;
- `containers`: each claim's container, run through the agent's CRI proxy as kubelet would,
  or (without a runtime) the agent's injection decision for it;
- `showing`: `kubectl get`-style tables;
- `running`: the phases in order, their deadlines and timings, the exit code;
- `sandbox`: `elasticgpu sandbox up | status | down`, the demo's cluster kept in the background.
- `chart`: `--cluster real --install chart`, the product as the chart's pods instead, on the box.

The clusters, containerd, kubelet, the box, helm, the product image and the product's processes
it starts are `elasticgpu.testbed`'s, shared with the tests and the benches (the testbed never
imports the demo).

Nothing outside one temporary directory is touched; everything started is stopped.
"""

from __future__ import annotations

from elasticgpu.demo.commands import add_arguments, add_sandbox_arguments, run, run_sandbox

__all__ = ["add_arguments", "add_sandbox_arguments", "run", "run_sandbox"]
