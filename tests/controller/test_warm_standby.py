"""A standby controller keeps its picture warm (issue 49): it lists and watches before it leads,
so after `kill -9` of the leader it binds as soon as it holds the Lease, without listing again.

Two real `elasticgpu controller` processes with leader election on (the default periods) against
the test API server; the server's own request counters (`apiserver_request_total`) say which
LISTs were made. On the old code the standby listed every kind only once it led: the LISTs
after the takeover below were 1 per kind, and the failover paid for them (seconds at fleet size).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from elasticgpu.api import names
from elasticgpu.controller.edge.leader import LeaderSettings
from tests.binding import objects as o
from tests.binding.processes import ControllerProcesses
from tests.controller.test_leader import _http, _leads, wait_for
from tests.kube_cluster import _free_port

WATCHED = (names.PLURAL_GPU, names.PLURAL_ELASTIC_GPU, names.PLURAL_CLAIM, names.PLURAL_CLASS)
BIND_AFTER_KILL_S = LeaderSettings().lease_duration_s + 5.0
"""kill -9 of the leader to the next claim Bound: the lease (10 s from the leader's last renewal,
which came before the kill) and one bind; 5 s covers a bind on a loaded 2-core machine. The
issue's goal is 15 s."""


def lists(kube: Any) -> dict[str, float]:
    """LIST requests the API server has answered so far, by resource (`WATCHED` only)."""
    _method, url, headers, _body, _post = kube._api.param_serialize(
        method="GET", resource_path="/metrics", header_params={"Accept": "text/plain"}, auth_settings=["BearerToken"])
    text = kube._api.call_api("GET", url, header_params=headers).read().decode()
    counts = dict.fromkeys(WATCHED, 0.0)
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(part.split("=", 1) for part in line[line.index("{") + 1:line.index("}")].split(","))
        resource = labels.get("resource", "").strip('"')
        if labels.get("verb", "").strip('"') == "LIST" and resource in counts:
            counts[resource] += float(line.rsplit(" ", 1)[1])
    return counts


def test_a_standby_with_a_warm_picture_binds_after_kill_9_without_listing(cluster: Any, kube: Any,
                                                                          kube_cluster: Any, tmp_path: Path) -> None:
    model = f"T{cluster.prefix}"
    for i in range(4):
        cluster.gpu(o.gpu(f"gpu-{cluster.prefix}-{i}", node=f"{cluster.prefix}-n", index=i, model=model))
    class_name = f"{cluster.prefix}-class"
    cluster.klass(o.klass(class_name, parameters={"gpuModel": model}))
    ports = [_free_port(), _free_port()]
    groups = []
    for name, port in zip("ab", ports, strict=True):
        (tmp_path / name).mkdir()
        groups.append(ControllerProcesses(Path(kube_cluster.kubeconfig), cluster.namespace, tmp_path / name,
                                          flags=["--health-port", str(port), "--log-level", "info"]))

    def logs() -> str:
        return "\n".join(group.logs(lines=40) for group in groups)

    def phase(name: str) -> str | None:
        return (cluster.get_claim(name).get("status") or {}).get("phase")

    def standby_log() -> str:
        return (groups[1].log_dir / "controller-0.log").read_text(errors="replace")

    try:
        leader = groups[0].start()
        wait_for(lambda: _leads(ports[0]), timeout_s=90, what="the first controller leads\n" + logs())
        cluster.claim(o.claim("first", cores=50, memory="1Gi", class_name=class_name))
        wait_for(lambda: phase("first") == "Bound", timeout_s=60, what="the leader binds\n" + logs())
        groups[1].start()
        wait_for(lambda: "standing by" in standby_log(), timeout_s=90, what="the standby waits\n" + logs())
        assert _http(ports[1], "/readyz")[0] == 200 and not _leads(ports[1])
        # While it stands by its picture follows the cluster (the watch delivers this one)...
        cluster.claim(o.claim("while-standing-by", cores=50, memory="1Gi", class_name=class_name))
        wait_for(lambda: phase("while-standing-by") == "Bound", timeout_s=60, what="the leader binds\n" + logs())
        # ...and it exports none of the picture's series (the leader does: no double count).
        standby_metrics = _http(ports[1], "/metrics")[1]
        assert "\nelasticgpu_claims{" not in standby_metrics, standby_metrics[-2000:]
        assert "\nelasticgpu_claims{" in _http(ports[0], "/metrics")[1]
        before = lists(kube)

        groups[0].kill(leader)
        killed = time.monotonic()
        cluster.claim(o.claim("after-kill", cores=50, memory="1Gi", class_name=class_name))
        wait_for(lambda: phase("after-kill") == "Bound", timeout_s=60, what="the new leader binds\n" + logs())
        took = time.monotonic() - killed
        print(f"kill -9 of the leader -> the standby's first bind: {took:.1f}s")
        assert _leads(ports[1]), logs()
        after = lists(kube)
        relisted = {resource: after[resource] - before[resource] for resource in WATCHED}
        assert not any(relisted.values()), (f"the new leader listed again after taking over: {relisted}\n"
                                            + logs())
        assert took <= BIND_AFTER_KILL_S, f"bound {took:.1f}s after the kill\n" + logs()
        assert "leading: Lease" in standby_log()
    finally:
        for group in groups:
            group.close()
