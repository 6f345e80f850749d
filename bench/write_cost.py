"""kube-apiserver CPU per write, by the kind of write a claim pod makes: where each write's cost lies.

Starts the real control plane (elasticgpu/testbed/real_cluster.py), installs the CRDs, and makes, one
at a time from one thread, N writes of each kind the controller makes for one inline claim, with
the bodies it makes (as bench/writes_per_pod.py --dump shows them): the claim's create, its bind
patch (finalizer and spec.elasticGPUName), its Bound status patch, the ElasticGPU's create and its
status patch, and a core/v1 Event. The API server's CPU (/proc/<pid>/stat) over each series, less
its idle rate measured just before, divided by N, is that write's cost. Then the same claim status
writes with the claim and ElasticGPU CRDs' CEL rules taken out (what CEL costs each write), and a
claim status written as a merge patch and as a PUT of the object, alternating.

    python bench/write_cost.py --writes 300
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from elasticgpu.api import names

NS = "write-cost"
REQUESTS = {names.RESOURCE_CORE: 10, names.RESOURCE_MEMORY: "1Gi"}


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:13]) / os.sysconf("SC_CLK_TCK")


def claim_body(i: int, pod_uid: str) -> dict[str, Any]:
    return {"apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM,
            "metadata": {"name": f"p{i:05d}-main", "namespace": NS,
                         "annotations": {names.inline_request_annotation("main"): "gpu-core=10,gpu-memory=1Gi,class=c"},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "owner", "uid": pod_uid,
                                              "controller": True, "blockOwnerDeletion": True}]},
            "spec": {"resources": {"requests": REQUESTS}, "elasticGPUClassName": "c"}}  # fmt: skip


def bound_status(i: int, uid: str, pod_uid: str) -> dict[str, Any]:
    message = f"bound to ElasticGPU egpu-{uid} on bench-node-0004 (GPU-BENCH-0004-0)"
    return {"phase": "Bound", "reason": None, "message": message, "capacity": REQUESTS, "allocatedResources": REQUESTS,
            "nodeName": "bench-node-0004", "gpus": ["GPU-BENCH-0004-0"],
            "conditions": [{"type": "Bound", "status": "True", "reason": "Bound", "message": message,
                            "lastTransitionTime": "2026-12-05T20:02:41Z"}],
            "isolation": "None", "policing": {"overLimitAction": "Warn", "overLimitGraceSeconds": 60},
            "users": [{"name": f"p{i:05d}", "uid": pod_uid}]}  # fmt: skip


def egpu_body(claim: dict[str, Any]) -> dict[str, Any]:
    meta = claim["metadata"]
    return {"apiVersion": names.API_VERSION, "kind": names.KIND_ELASTIC_GPU,
            "metadata": {"name": f"egpu-{meta['uid']}", "finalizers": [names.FINALIZER_EGPU_PROTECTION],
                         "labels": {"elasticgpu.io/claim-name": meta["name"], "elasticgpu.io/claim-namespace": NS,
                                    "elasticgpu.io/class": "c", "elasticgpu.io/node": "bench-node-0004"}},
            "spec": {"capacity": REQUESTS, "elasticGPUClassName": "c", "gpuShare": {"gpuName": "gpu-bench-0004-0"},
                     "nodeName": "bench-node-0004", "reclaimPolicy": "Delete",
                     "claimRef": {"apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM, "name": meta["name"],
                                  "namespace": NS, "uid": meta["uid"]},
                     "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchFields": [
                         {"key": "metadata.name", "operator": "In", "values": ["bench-node-0004"]}]}]}}}}  # fmt: skip


def egpu_status(claim: dict[str, Any]) -> dict[str, Any]:
    return {"phase": "Bound", "reason": None, "message": f"provisioned for claim {NS}/{claim['metadata']['name']}",
            "capacity": REQUESTS, "nodeName": "bench-node-0004", "gpus": ["GPU-BENCH-0004-0"],
            "gpuList": "GPU-BENCH-0004-0", "claim": f"{NS}/{claim['metadata']['name']}",
            "accounting": {"cardSeconds": 0, "coreSeconds": 0, "memoryMibSeconds": 0,
                           "since": "2026-12-05T20:02:41Z"}}  # fmt: skip


def strip_rules(schema: Any) -> Any:
    """The schema without its CEL rules."""
    if isinstance(schema, dict):
        return {k: strip_rules(v) for k, v in schema.items() if k != "x-kubernetes-validations"}
    if isinstance(schema, list):
        return [strip_rules(v) for v in schema]
    return schema


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writes", type=int, default=300, help="writes of each kind")
    args = parser.parse_args(argv)
    n = args.writes

    import yaml
    from kubernetes import client, config

    from elasticgpu.api import crd
    from elasticgpu.crd_installer import FIELD_MANAGER, KINDS, apply_crds
    from elasticgpu.testbed import real_cluster

    results: list[tuple[str, float, float]] = []
    with real_cluster.running_control_plane(verbosity="0") as plane:
        for _ in apply_crds(kubeconfig=str(plane.kubeconfig)):
            pass
        api = config.new_client_from_config(config_file=str(plane.kubeconfig))
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        extensions = client.ApiextensionsV1Api(api)
        core.create_namespace({"metadata": {"name": NS}})
        pids = {c.name: c.process.pid for c in plane.children.started}
        apiserver, etcd = pids["kube-apiserver"], pids["etcd"]
        # The claims' owner exists (else the garbage collector deletes them under the series).
        owner_uid = core.create_namespaced_pod(NS, {"metadata": {"name": "owner"}, "spec": {"containers": [
            {"name": "main", "image": "registry.k8s.io/pause:3.10"}]}}).metadata.uid
        time.sleep(5.0)  # the API server's start-up work settles

        def measure(label: str, each: Callable[[int], None]) -> None:
            idle_from, idle_a, idle_e = time.monotonic(), _cpu_s(apiserver), _cpu_s(etcd)
            time.sleep(3.0)
            idle_s = time.monotonic() - idle_from
            rate_a, rate_e = (_cpu_s(apiserver) - idle_a) / idle_s, (_cpu_s(etcd) - idle_e) / idle_s
            began, cpu_a, cpu_e = time.monotonic(), _cpu_s(apiserver), _cpu_s(etcd)
            for i in range(n):
                each(i)
            wall = time.monotonic() - began
            per_a = (_cpu_s(apiserver) - cpu_a - rate_a * wall) / n * 1000
            per_e = (_cpu_s(etcd) - cpu_e - rate_e * wall) / n * 1000
            results.append((label, per_a, per_e))
            print(f"  {label:58s} kube-apiserver {per_a:5.2f} ms  etcd {per_e:5.2f} ms"
                  f"  ({1000 * wall / n:.1f} ms each)", flush=True)  # fmt: skip

        def series(prefix: str, offset: int) -> None:
            """The writes of one inline claim, each kind as its own series (claims offset..offset+n)."""
            claims: dict[int, dict[str, Any]] = {}
            pod_uid = owner_uid

            def create(i: int) -> None:
                claims[i] = custom.create_namespaced_custom_object(names.GROUP, names.VERSION, NS, names.PLURAL_CLAIM,
                                                                   claim_body(offset + i, pod_uid))  # fmt: skip

            def bind(i: int) -> None:
                meta = claims[i]["metadata"]
                claims[i] = custom.patch_namespaced_custom_object(names.GROUP, names.VERSION, NS, names.PLURAL_CLAIM,
                    meta["name"], {"metadata": {"finalizers": [names.FINALIZER_CLAIM_PROTECTION],
                                                "resourceVersion": meta["resourceVersion"]},
                                   "spec": {"elasticGPUName": f"egpu-{meta['uid']}"}})  # fmt: skip

            def status(i: int) -> None:
                meta = claims[i]["metadata"]
                patch = {"metadata": {"resourceVersion": meta["resourceVersion"]},
                         "status": bound_status(offset + i, meta["uid"], pod_uid)}
                claims[i] = custom.patch_namespaced_custom_object_status(names.GROUP, names.VERSION, NS,
                                                                         names.PLURAL_CLAIM, meta["name"], patch)

            measure(f"{prefix}claim POST", create)
            measure(f"{prefix}claim PATCH (finalizer, spec.elasticGPUName)", bind)
            measure(f"{prefix}claim/status PATCH (Bound)", status)

            egpus: dict[int, dict[str, Any]] = {}

            def egpu_create(i: int) -> None:
                egpus[i] = custom.create_cluster_custom_object(names.GROUP, names.VERSION, names.PLURAL_ELASTIC_GPU,
                                                               egpu_body(claims[i]))  # fmt: skip

            def egpu_status_patch(i: int) -> None:
                meta = egpus[i]["metadata"]
                egpus[i] = custom.patch_cluster_custom_object_status(names.GROUP, names.VERSION,
                    names.PLURAL_ELASTIC_GPU, meta["name"], {"metadata": {"resourceVersion": meta["resourceVersion"]},
                                                             "status": egpu_status(claims[i])})  # fmt: skip

            def event(i: int) -> None:
                meta = claims[i]["metadata"]
                core.create_namespaced_event(NS, {
                    "metadata": {"name": f"{meta['name']}.{i:016x}", "namespace": NS},
                    "involvedObject": {"apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM, "name": meta["name"],
                                       "namespace": NS, "uid": meta["uid"], "resourceVersion": meta["resourceVersion"]},
                    "reason": "Bound", "message": bound_status(i, meta["uid"], pod_uid)["message"], "type": "Normal",
                    "source": {"component": "elasticgpu-controller"}, "firstTimestamp": "2026-12-05T20:02:41Z",
                    "lastTimestamp": "2026-12-05T20:02:41Z", "count": 1, "reportingComponent": "elasticgpu-controller",
                    "reportingInstance": "bench"})  # fmt: skip

            measure(f"{prefix}ElasticGPU POST", egpu_create)
            measure(f"{prefix}ElasticGPU/status PATCH (Bound)", egpu_status_patch)
            if prefix:
                return
            measure("core/v1 Event POST", event)

            # The same status change written two ways, alternating (each round changes the message:
            # a write that changes nothing is not stored): a merge patch, or a PUT of the whole
            # object (both with the resourceVersion as precondition).
            for round_ in range(2):
                for how in ("PATCH", "PUT"):

                    def rewrite(i: int, how: str = how, tag: str = f"{round_}{how}") -> None:
                        meta = claims[i]["metadata"]
                        status = bound_status(i, meta["uid"], pod_uid)
                        status["message"] += f" {tag}"
                        status["conditions"][0]["message"] = status["message"]
                        if how == "PATCH":
                            patch = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": status}
                            claims[i] = custom.patch_namespaced_custom_object_status(
                                names.GROUP, names.VERSION, NS, names.PLURAL_CLAIM, meta["name"], patch)
                        else:
                            status = {k: v for k, v in status.items() if v is not None}
                            claims[i] = custom.replace_namespaced_custom_object_status(
                                names.GROUP, names.VERSION, NS, names.PLURAL_CLAIM, meta["name"],
                                {**claims[i], "status": status})

                    measure(f"claim/status {how} (message changed), round {round_ + 1}", rewrite)

        print(f"kube-apiserver CPU per write ({n} writes of each kind, one at a time):", flush=True)
        series("", 0)
        # The claim and ElasticGPU CRDs without their CEL rules: what they cost each write.
        for plural in (names.PLURAL_CLAIM, names.PLURAL_ELASTIC_GPU):
            info = next(i for i in KINDS if i.crd_name.startswith(plural + "."))
            body = yaml.safe_load(crd.crd_yaml(info))
            body["spec"]["versions"] = [{**v, "schema": strip_rules(v["schema"])} for v in body["spec"]["versions"]]
            extensions.patch_custom_resource_definition(name=info.crd_name, body=body, field_manager=FIELD_MANAGER,
                                                        force=True,
                                                        _content_type="application/apply-patch+yaml")
        # The CRD's handler is rebuilt; a probe object must be created, read and patched through it.
        time.sleep(10.0)
        probe = custom.create_namespaced_custom_object(names.GROUP, names.VERSION, NS, names.PLURAL_CLAIM,
                                                       claim_body(999_999, owner_uid))  # fmt: skip
        for _ in range(100):
            try:
                custom.patch_namespaced_custom_object(names.GROUP, names.VERSION, NS, names.PLURAL_CLAIM,
                                                      probe["metadata"]["name"], {"metadata": {"labels": {"p": "1"}}})
                break
            except client.ApiException:
                time.sleep(0.2)
        series("no CEL: ", 100_000)
        api.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
