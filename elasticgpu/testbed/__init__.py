"""A throwaway Kubernetes on this machine, and the product's processes on it: what `elasticgpu demo`,
the tests and the benches start, stop for sure, and leave nothing of.

Modules, one responsibility each (bottom up):
- `processes`: child processes that die with their parent (no `preexec_fn`), their logs, deadlines;
- `local_cluster`: etcd and the project's test API server from the cache of `testserver/build.sh`,
  with a generated CA and kubeconfig;
- `local_runtime`: the test containerd from the cache of `testruntime/build.sh` (root only);
- `real_cluster`: Kubernetes' own control plane (`testcluster/build.sh`'s elasticgpu-k8s) on etcd;
- `containerd`: one node's containerd with NRI (1.7 or 2.x); `kubelet`: Kubernetes' own kubelet;
- `box`: a one-node Kubernetes in a network namespace of its own (the control plane, `containerd`,
  `kubelet`, kube-proxy, a pod network);
- `helm`: the real helm of `testhelm/build.sh`; `product_image`: the image of `image/build.sh`;
- `components`: the product's controller, webhook and simulated node agents as child processes;
- `kube`: plain JSON calls to the API server of one kubeconfig.

Below the demo: nothing here imports `elasticgpu.demo` (an import contract in pyproject.toml), so
the tests and benches start the same machinery without the demo's scenario. The tests re-export
these modules; never the reverse.
"""
