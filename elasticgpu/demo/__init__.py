"""`elasticgpu demo`: the whole product in one command, on a throwaway local cluster.

Modules, one responsibility each:
- `commands`: the flags (the rest is imported when the demo runs);
- `processes`: child processes that die with the demo (no `preexec_fn`), their logs, deadlines;
- `local_cluster`: etcd and the project's test API server from the cache of `testserver/build.sh`,
  with a generated CA and kubeconfig;
- `local_runtime`: the test containerd from the cache of `testruntime/build.sh` (root only);
- `components`: the controller, the webhook and the simulated node agents as child processes;
- `scenario`: the objects the demo applies and what each container must see;
- `containers`: each claim's container, run through the agent's CRI proxy as kubelet would,
  or (without a runtime) the agent's injection decision for it;
- `showing`: `kubectl get`-style tables;
- `running`: the phases in order, their deadlines and timings, the exit code;
- `sandbox`: `elasticgpu sandbox up | status | down`, the demo's cluster kept in the background.

`--cluster real --install chart` (`chart`) runs the product as the chart's pods instead, on
- `box`: a one-node Kubernetes in a network namespace of its own (`real_cluster`'s control plane,
  `containerd`: the node's containerd with NRI, `kubelet`, kube-proxy, a pod network);
- `helm`: the real helm of `testhelm/build.sh`; `product_image`: the image of `image/build.sh`.
The tests start the same box, kubelet and containerd (tests/ re-exports these modules; never the reverse).

Nothing outside one temporary directory is touched; everything started is stopped.
"""

from __future__ import annotations

from elasticgpu.demo.commands import add_arguments, add_sandbox_arguments, run, run_sandbox

__all__ = ["add_arguments", "add_sandbox_arguments", "run", "run_sandbox"]
