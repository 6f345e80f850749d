"""Translation's cost at admission (issue 45 item 3): a pod asking `nvidia.com/gpu: 1` in a namespace that opted
in, against the same pod written with the annotation `elasticgpu.io/request.main: gpu=1`, in one run.

Starts the local test server with the CRDs (bench/crd_server.py), 8 simulated GPU objects on 4 nodes, a class,
and one real `elasticgpu webhook --translate` process (HTTPS, called by the API server). Two namespaces, both
labelled `elasticgpu.io/translate-resources: "true"` (so the annotated pod pays the same namespace selection):
`annotated` pods carry the inline request themselves; `translated` pods carry only `nvidia.com/gpu: 1`. The
phases alternate in rounds (annotated, translated, annotated, ...) so that the machine's load falls on both.

Per phase: admission latency (the create call, which holds the webhook's answer; p50 / p99 / mean, ms), the API
writes per pod and the webhook's API reads per pod (the server's own apiserver_request_total, successful, before
and after the phase: the webhook is the only reader meanwhile). Both end as the same stored pod (request
annotation, gate, label), so what follows admission (the controller's claim, bind, gate lift) is the same
object path; bench/pods.py measures that part.

    python bench/translation.py                       # 4 rounds of 50 pods per phase
    python bench/translation.py --namespace-cache-s 0 # the namespace read for every translated pod
    python bench/translation.py --rounds 2 --pods 20  # smoke run
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from crd_server import test_server_with_crds  # noqa: E402

from elasticgpu.api import names  # noqa: E402

_READS = ("GET", "LIST")
_WRITES = ("POST", "PUT", "PATCH", "DELETE", "APPLY")


def _requests(api: Any) -> dict[str, float]:
    """Successful requests so far by verb class ('write', 'read'), from the server's /metrics."""
    response = api.call_api("GET", api.configuration.host + "/metrics", header_params={"Accept": "text/plain"})
    totals = {"write": 0.0, "read": 0.0}
    for line in response.read().decode().splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels_text, value = line[len("apiserver_request_total{"):].rsplit("} ", 1)
        labels = {k: v.strip('"') for k, v in (p.split("=", 1) for p in labels_text.split(",") if "=" in p)}
        if not labels.get("code", "").startswith("2"):
            continue
        verb = labels.get("verb", "")
        if verb in _WRITES:
            totals["write"] += float(value)
        elif verb in _READS and labels.get("resource") not in ("", None):
            totals["read"] += float(value)
    return totals


def _pod(name: str, *, translated: bool) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "busybox:1.36"}
    metadata: dict[str, Any] = {"name": name}
    if translated:
        container["resources"] = {"limits": {names.RESOURCE_NVIDIA_GPU: "1"}}
    else:
        metadata["annotations"] = {names.inline_request_annotation("main"): "gpu=1"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": {"containers": [container]}}


def _setup(api: Any) -> None:
    from kubernetes import client

    custom = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)
    for n in range(4):
        node = f"bench-node-{n}"
        core.create_node({"metadata": {"name": node}})
        for i in range(2):
            name = f"gpu-bench-{n}-{i}"
            custom.create_cluster_custom_object(names.GROUP, names.VERSION, names.PLURAL_GPU, {
                "apiVersion": names.API_VERSION, "kind": names.KIND_GPU, "metadata": {"name": name},
                "spec": {"index": i, "uuid": name.upper(), "model": "A100-SXM4-80GB", "memory": 81920,
                         "nodeName": node}})
    custom.create_cluster_custom_object(names.GROUP, names.VERSION, names.PLURAL_CLASS, {
        "apiVersion": names.API_VERSION, "kind": names.KIND_CLASS,
        "metadata": {"name": "bench", "annotations": {names.ANNOTATION_DEFAULT_CLASS: "true"}},
        "provisioner": names.PROVISIONER_PHYSICAL})
    for namespace in ("annotated", "translated"):
        core.create_namespace({"metadata": {"name": namespace, "labels": {names.LABEL_TRANSLATE_RESOURCES: "true"}}})


def _wait_translating(api: Any, timeout_s: float = 60.0) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    core = client.CoreV1Api(api)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            answer = core.create_namespaced_pod("translated", _pod("probe", translated=True), dry_run="All")
            if (answer.metadata.annotations or {}).get(names.ANNOTATION_TRANSLATED):
                return
        except ApiException:
            pass
        time.sleep(0.2)
    raise SystemExit(f"the webhook did not translate within {timeout_s:.0f}s")


def _phase(api: Any, *, translated: bool, pods: int, round_: int) -> tuple[list[float], dict[str, float]]:
    from kubernetes import client

    core = client.CoreV1Api(api)
    namespace = "translated" if translated else "annotated"
    before = _requests(api)
    latencies = []
    for index in range(pods):
        body = _pod(f"p{round_}-{index}", translated=translated)
        start = time.perf_counter()
        created = core.create_namespaced_pod(namespace, body)
        latencies.append((time.perf_counter() - start) * 1000)
        annotations = created.metadata.annotations or {}
        assert annotations.get(names.inline_request_annotation("main")), annotations  # both end with the request
    after = _requests(api)
    # The bench's two /metrics reads are GETs of a non-resource path: not counted.
    return latencies, {k: (after[k] - before[k]) / pods for k in after}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--pods", type=int, default=50, help="pods per phase and round")
    parser.add_argument("--cache-s", type=float, default=10.0, help="the webhook's --translation-cache-s")
    parser.add_argument("--namespace-cache-s", type=float, default=2.0,
                        help="the webhook's --translation-namespace-cache-s (0: the namespace read for every pod)")
    args = parser.parse_args()

    from tests.pods.conftest import free_port, start_webhook

    results: dict[str, tuple[list[float], list[dict[str, float]]]] = {"annotated": ([], []), "translated": ([], [])}
    with test_server_with_crds() as (cluster, api), tempfile.TemporaryDirectory() as logs:
        _setup(api)
        webhook = start_webhook(cluster, api, namespace="default", log_dir=Path(logs),
                                configuration_name=f"bench-{uuid.uuid4().hex[:6]}",
                                extra_args=("--translate", "--translation-cache-s", str(args.cache_s),
                                            "--translation-namespace-cache-s", str(args.namespace_cache_s),
                                            "--metrics-bind-address", f"127.0.0.1:{free_port()}"))
        try:
            _wait_translating(api)
            for round_ in range(args.rounds):
                for kind in ("annotated", "translated"):
                    latencies, per_pod = _phase(api, translated=kind == "translated", pods=args.pods, round_=round_)
                    results[kind][0].extend(latencies)
                    results[kind][1].append(per_pod)
        finally:
            webhook.stop()
    print(f"{args.rounds} rounds x {args.pods} pods per phase, alternating; the webhook's caches: cluster"
          f" {args.cache_s:g} s, namespace {args.namespace_cache_s:g} s")
    print("| pod as written | admission p50 ms | p99 ms | mean ms | API writes per pod | webhook reads per pod |")
    print("|---|---|---|---|---|---|")
    for kind, (latencies, counts) in results.items():
        ordered = sorted(latencies)
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        writes = statistics.mean(c["write"] for c in counts)
        reads = statistics.mean(c["read"] for c in counts)
        label = "annotation elasticgpu.io/request.main" if kind == "annotated" else "nvidia.com/gpu: 1 (translated)"
        print(f"| {label} | {statistics.median(ordered):.1f} | {p99:.1f} | {statistics.mean(ordered):.1f} |"
              f" {writes:.2f} | {reads:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
