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
- `running`: the phases in order, their deadlines and timings, the exit code.

Nothing outside one temporary directory is touched; everything started is stopped.
"""

from __future__ import annotations

from elasticgpu.demo.commands import add_arguments, run

__all__ = ["add_arguments", "run"]
