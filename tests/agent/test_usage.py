"""Measured usage: cgroup path forms, and real processes in real cgroups attributed to claims end to end."""

from __future__ import annotations

import os
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from elasticgpu.agent import usage
from elasticgpu.agent.discovery import simulated
from elasticgpu.agent.ledger.store import LedgerStore
from elasticgpu.api import names
from tests.agent.conftest import RunningAgent, free_port, scrape, wait_for
from tests.kube_cluster import kube_request

CID = "0123456789abcdef" * 4
POD = "7c4f6a52-8a63-4a1e-9a55-3d1f0e7b9c11"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # cgroup v2, systemd driver, containerd / CRI-O / docker
        (f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{POD}.slice/cri-containerd-{CID}.scope",
         CID),
        (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD}.slice/crio-{CID}.scope", CID),
        (f"0::/system.slice/docker-{CID}.scope", CID),
        # cgroup v2, cgroupfs driver; containerd outside kubelet
        (f"0::/kubepods/besteffort/pod{POD}/{CID}", CID),
        (f"0::/k8s.io/{CID}", CID),
        # cgroup v1 on a hybrid host: the container only in the v1 lines, `/` in the v2 one
        (f"12:pids:/kubepods/burstable/pod{POD}/{CID}\n4:memory:/kubepods/burstable/pod{POD}/{CID}\n0::/", CID),
        (f"9:name=systemd:/kubepods.slice/kubepods-pod{POD}.slice/cri-containerd-{CID}.scope\n0::/", CID),
        # a sub-cgroup inside the container's (systemd in a container)
        (f"0::/kubepods/pod{POD}/{CID}/init.scope", CID),
        # not containers: the host, a pod's cgroup without a container, CRI-O's monitor
        ("0::/user.slice/user-0.slice/session-1.scope", None),
        (f"0::/kubepods/besteffort/pod{POD}", None),
        (f"0::/kubepods.slice/crio-conmon-{CID}.scope", None),
        ("", None),
    ],
)
def test_container_id_from_cgroup(text: str, expected: str | None) -> None:
    assert usage.container_id_from_cgroup(text) == expected


def test_finder_notices_pid_reuse(tmp_path: Path) -> None:
    process = tmp_path / "4242"
    process.mkdir()

    def becomes(start_time: int, cgroup: str) -> None:
        # /proc/<pid>/stat: the command may hold spaces and parentheses; start time is field 22.
        (process / "stat").write_text(f"4242 (my (odd) cmd) S 1 {' '.join(['0'] * 17)} {start_time} 0 0\n")
        (process / "cgroup").write_text(cgroup)

    finder = usage.ContainerFinder(tmp_path)
    becomes(1000, f"0::/kubepods/pod{POD}/{CID}\n")
    assert finder.container_of(4242) == CID
    (process / "cgroup").write_text("0::/\n")
    assert finder.container_of(4242) == CID  # same process: cached, procfs not read again
    becomes(2000, "0::/user.slice\n")  # the pid was reused by a host process
    assert finder.container_of(4242) is None
    assert finder.container_of(4243) is None  # no such process


def test_finder_on_this_process() -> None:
    # This test runs outside any container here; on a containerised CI the id is 64 hex digits.
    found = usage.ContainerFinder().container_of(os.getpid())
    assert found is None or re.fullmatch(r"[0-9a-f]{64}", found)


# Real processes in real cgroups -------------------------------------------------------------------------------


class Cgroups:
    """cgroups this test makes (v2 and v1 hierarchies), with processes in them; all removed at the end."""

    def __init__(self) -> None:
        self.made: list[Path] = []
        self.processes: list[subprocess.Popen[bytes]] = []

    def make(self, path: Path) -> Path:
        missing = [p for p in (path, *path.parents) if not p.exists()]
        path.mkdir(parents=True)
        self.made.extend(missing)  # every folder made, so that all of them are removed
        return path

    def start_in(self, cgroup: Path | None) -> int:
        process = subprocess.Popen(["sleep", "600"])
        self.processes.append(process)
        if cgroup is not None:
            (cgroup / "cgroup.procs").write_text(str(process.pid))
        return process.pid

    def close(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait(timeout=10)
        for path in sorted(self.made, key=lambda p: len(p.parts), reverse=True):
            for _ in range(50):  # a killed process leaves its cgroup a moment later
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


V2_ROOT = Path("/sys/fs/cgroup/unified")
V1_ROOT = Path("/sys/fs/cgroup/pids")


@pytest.fixture
def cgroups() -> Iterator[Cgroups]:
    made = Cgroups()
    probe = f"egpu-probe-{uuid.uuid4().hex[:8]}"
    for root in (V2_ROOT, V1_ROOT):
        try:
            (root / probe).mkdir()
            (root / probe).rmdir()
        except OSError as e:
            pytest.skip(f"cannot create cgroups under {root} ({e.strerror}): this test needs root and a writable"
                        " cgroup v2 hierarchy at /sys/fs/cgroup/unified and v1 pids at /sys/fs/cgroup/pids")
    try:
        yield made
    finally:
        made.close()


def make_claim(api: client.ApiClient, namespace: str, name: str, memory: str) -> None:
    body = {
        "apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM, "metadata": {"name": name, "namespace": namespace},
        "spec": {"resources": {"requests": {names.RESOURCE_CORE: 30, names.RESOURCE_MEMORY: memory}}},
    }
    path = f"/apis/{names.GROUP}/{names.VERSION}/namespaces/{namespace}/{names.PLURAL_CLAIM}"
    answer = kube_request(api, "POST", path, body=body)
    assert answer.status == 201, answer.body


def read_claim(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    path = f"/apis/{names.GROUP}/{names.VERSION}/namespaces/{namespace}/{names.PLURAL_CLAIM}/{name}"
    answer = kube_request(api, "GET", path)
    assert answer.status == 200, answer.body
    return dict(answer.json())


def over_limit(claim: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in (claim.get("status") or {}).get("conditions") or [] if c["type"] == "OverLimit"), None)


def test_real_processes_in_real_cgroups_reach_the_claims(
    api_client: client.ApiClient, namespace: str, node_name: str, cgroups: Cgroups,
    start_agent: Callable[..., RunningAgent],
) -> None:
    tag = uuid.uuid4().hex[:8]
    id_a, id_b = uuid.uuid4().hex * 2, uuid.uuid4().hex * 2
    pod_a, pod_b = str(uuid.uuid4()), str(uuid.uuid4())
    # Claim A's container in cgroup v2 with the systemd driver's names; claim B's in v1 (cgroupfs driver).
    group_a = cgroups.make(V2_ROOT / f"egpu-test-{tag}" / "kubepods.slice" / "kubepods-burstable.slice"
                           / f"kubepods-burstable-pod{pod_a.replace('-', '_')}.slice" / f"cri-containerd-{id_a}.scope")
    group_b = cgroups.make(V1_ROOT / f"egpu-test-{tag}" / "kubepods" / "burstable" / f"pod{pod_b}" / id_b)
    pid_a, pid_b, pid_host = cgroups.start_in(group_a), cgroups.start_in(group_b), cgroups.start_in(None)
    assert usage.ContainerFinder().container_of(pid_a) == id_a
    assert usage.ContainerFinder().container_of(pid_b) == id_b

    make_claim(api_client, namespace, "claim-a", "1Gi")
    make_claim(api_client, namespace, "claim-b", "2Gi")
    description = {"cards": [{"model": "NVIDIA A100-SXM4-80GB", "memory": "80Gi", "count": 2}]}
    port = free_port()
    agent = start_agent(node_name, description, "--sample-interval-s", "0.3", "--usage-write-interval-s", "2",
                        "--usage-change-mib", "256", "--metrics-port", str(port), "--metrics-address", "127.0.0.1",
                        "--usage-verify-s", "2")
    card0, card1 = (simulated.simulated_uuid(node_name, i) for i in range(2))
    # What the CRI hook records when it creates the containers.
    ledger = LedgerStore.open(agent.ledger_url)
    for pod, container, claim, memory, cards in (
        (pod_a, id_a, "claim-a", 1024, [card0]), (pod_b, id_b, "claim-b", 2048, [card1]),
    ):
        row = ledger.record_started(pod_uid=pod, pod_namespace=namespace, pod_name=f"pod-{claim}",
                                    container_name="main", claim_namespace=namespace, claim_name=claim,
                                    elastic_gpu=f"egpu-{claim}", gpu_uuids=cards, cores=30, memory_mib=memory)
        ledger.mark_created(row, container)
    # The driver reports the three processes: A within its reservation, B above it, one of the host.
    simulated.inject(agent.inject_dir, {"process": {"card": 0, "pid": pid_a, "memory": 512, "sm": 20}})
    simulated.inject(agent.inject_dir, {"process": {"card": 1, "pid": pid_b, "memory": "3Gi", "sm": 70}})
    simulated.inject(agent.inject_dir, {"process": {"card": 0, "pid": pid_host, "memory": 100}})

    claim_a = wait_for("claim-a usage", lambda: (c := read_claim(api_client, namespace, "claim-a"))
                       .get("status", {}).get("usage") and c, timeout=30)
    assert claim_a["status"]["usage"]["memoryUsed"] == 512 and claim_a["status"]["usage"]["coresUsed"] == 20
    assert over_limit(claim_a) is None
    claim_b = wait_for("claim-b OverLimit", lambda: over_limit(read_claim(api_client, namespace, "claim-b")),
                       timeout=20)
    assert claim_b["status"] == "True" and claim_b["reason"] == "MemoryOverLimit"
    assert "3072 MiB" in claim_b["message"] and "2048 MiB" in claim_b["message"]
    assert read_claim(api_client, namespace, "claim-b")["status"]["usage"]["memoryUsed"] == 3072
    events = wait_for("the OverLimit Warning Event", lambda: [
        e for e in client.CoreV1Api(api_client).list_namespaced_event(namespace).items
        if e.reason == "OverLimit" and e.involved_object.name == "claim-b"], timeout=30)
    assert events[0].type == "Warning" and "3072 MiB" in events[0].message

    # The cards' usage counts every process on them, the host's too.
    gpus = f"/apis/{names.GROUP}/{names.VERSION}/{names.PLURAL_GPU}"
    wait_for("card 0 usage", lambda: (kube_request(api_client, "GET", f"{gpus}/{names.gpu_object_name(card0)}")
                                      .json().get("status", {}).get("usage") or {}).get("memoryUsed") == 612,
             timeout=20)

    # The claims' metrics, in bytes and cards. Scraped once the agent has counted both Events: the
    # host's process may be first seen a pass after claim-b's OverLimit, and the card's usage (what
    # was waited for above) is written by another thread before this one has its Event's answer.
    events_written = ("elasticgpu_agent_api_writes_total", (("write", "event"),))
    metrics = wait_for("both Events counted", lambda: (m := scrape(port)).get(events_written, 0) >= 2 and m,
                       timeout=30)
    b_labels = (("claim", "claim-b"), ("namespace", namespace))
    assert metrics[("elasticgpu_agent_claim_memory_used_bytes", b_labels)] == 3072 * 1024 * 1024
    assert metrics[("elasticgpu_agent_claim_memory_limit_bytes", b_labels)] == 2048 * 1024 * 1024
    assert metrics[("elasticgpu_agent_claim_sm_utilization_ratio", b_labels)] == 0.7
    assert metrics[("elasticgpu_agent_claim_cores_limit_ratio", b_labels)] == 0.3
    assert metrics[("elasticgpu_agent_claim_over_limit", b_labels)] == 1.0
    assert metrics[("elasticgpu_agent_api_writes_total", (("write", "claim_status"),))] >= 2
    # Two Events: claim-b's OverLimit, and UnattributedGPUProcess for the host's process on card 0.
    assert metrics[events_written] == 2

    # Steady usage: no more claim writes (values unchanged), whatever the passes.
    version = read_claim(api_client, namespace, "claim-a")["metadata"]["resourceVersion"]
    time.sleep(3)
    assert read_claim(api_client, namespace, "claim-a")["metadata"]["resourceVersion"] == version

    # Another writer replaces A's status without the usage: the agent reads it back and writes it again.
    claim_a = read_claim(api_client, namespace, "claim-a")
    del claim_a["status"]["usage"]
    path = f"/apis/{names.GROUP}/{names.VERSION}/namespaces/{namespace}/{names.PLURAL_CLAIM}/claim-a/status"
    assert kube_request(api_client, "PUT", path, body=claim_a).status == 200
    wait_for("claim-a usage written again", lambda: (read_claim(api_client, namespace, "claim-a").get("status", {})
                                                     .get("usage") or {}).get("memoryUsed") == 512, timeout=30)

    # B drops below its reservation: OverLimit turns False at once (a flip is urgent).
    simulated.inject(agent.inject_dir, {"process": {"card": 1, "pid": pid_b, "memory": 1024, "sm": 10}})
    within = wait_for("claim-b back within its limit", lambda: (c := over_limit(
        read_claim(api_client, namespace, "claim-b"))) and c["status"] == "False" and c, timeout=30)
    assert within["reason"] == "WithinLimit"

    # The samples are in the ledger, attributed.
    samples = ledger.usage_samples()
    assert {(s.pid, s.claim_name) for s in samples} >= {(pid_a, "claim-a"), (pid_b, "claim-b"), (pid_host, None)}
    ledger.close()
    assert agent.process.poll() is None, agent.log()
    assert "Traceback" not in agent.log()
