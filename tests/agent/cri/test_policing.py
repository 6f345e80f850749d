"""Over-limit policing end to end (issue 25), on the real containerd and the test API server: a
claim container started through the CRI proxy, its process reported by the simulated backend
over the claim's memory. Over for less than the grace: nothing. Longer: the runtime stops the
container (CRI state EXITED), a Warning Event `OverLimitStopped` on the claim and the pod names
the figures, the stop counter and its metric count one, and the container is not stopped twice.
A process on the card that no claim holds: told (Event, metric), never stopped. With Warn: the
OverLimit condition only."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from elasticgpu.agent import discovery, health, inventory, kube, metrics, policing, usage
from elasticgpu.agent.cri import api
from elasticgpu.agent.cri.proxy import CriProxy, ProxySettings
from elasticgpu.agent.discovery import simulated
from elasticgpu.agent.dra import checkpoint as dra_checkpoint
from elasticgpu.agent.dra import claim_cdi
from elasticgpu.agent.injecting import cdi, claim_hooks, limits_file
from elasticgpu.agent.injecting.injection import CardInfo
from elasticgpu.agent.ledger import store
from elasticgpu.agent.settings import InventorySettings, LedgerSettings, PolicingSettings, UsageSettings
from elasticgpu.api import names
from tests.agent.cri.kubelet import Kubelet
from tests.agent.cri.node import View, slice_claim, stand_ins
from tests.agent.objects import DESCRIPTION
from tests.containerd_runtime import TestRuntime
from tests.controller.relay import Relay
from tests.kube_cluster import kube_request

CLAIMS = f"/apis/{names.GROUP}/{names.VERSION}/namespaces/{{namespace}}/{names.PLURAL_CLAIM}"


@dataclass
class Node:
    """The agent's parts of one simulated node, with a clock the test turns."""

    loop: usage.UsageLoop
    enforcer: policing.Enforcer
    sources: metrics.Sources
    ledger: store.LedgerStore
    inject: Path
    uuids: list[str]
    clock: list[float]
    proxies: list[CriProxy]
    """The CRI proxy once `running` started it: the runtime channel policing stops containers through."""

    def sample_at(self, at: float) -> None:
        self.clock[0] = at
        self.loop.sample_once()


@pytest.fixture
def node(api_client: client.ApiClient, crds_installed: list[str], node_name: str, namespace: str,
         containerd: TestRuntime, tmp_path: Path) -> Iterator[Node]:  # fmt: skip
    simulation = tmp_path / "sim.yaml"
    simulation.write_text(yaml.safe_dump(DESCRIPTION))
    backend = discovery.open_backend("simulated", node_name=node_name, simulation_file=simulation,
                                     device_dir=tmp_path / "devices", inject_dir=tmp_path / "inject")  # fmt: skip
    ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    agent_kube = kube.AgentKube(api_client, node_name=node_name, field_manager="elasticgpu-agent")
    tracker = health.HealthTracker(recovery_quiet_s=300)
    cards = inventory.Inventory(kube=agent_kube, backend=backend, health=tracker,
                                settings=InventorySettings(events_namespace=namespace))  # fmt: skip
    cards.snapshot = backend.snapshot()
    clock = [1000.0]
    loop = usage.UsageLoop(backend=backend, ledger=ledger, kube=agent_kube, inventory=cards, settings=UsageSettings(),
                           ledger_settings=LedgerSettings(), clock=lambda: clock[0])  # fmt: skip
    proxies: list[CriProxy] = []
    enforcer = policing.Enforcer(kube=agent_kube, runtime=lambda: proxies[0] if proxies else None,
                                 settings=PolicingSettings(over_limit_stop_timeout_s=5),
                                 clock=lambda: clock[0])  # fmt: skip
    loop.policing = enforcer
    uuids = [simulated.simulated_uuid(node_name, i) for i in range(2)]
    yield Node(loop=loop, enforcer=enforcer, ledger=ledger, inject=tmp_path / "inject", uuids=uuids, clock=clock,
               proxies=proxies,
               sources=metrics.Sources(inventory=cards, usage=loop, health=tracker, ledger=ledger, kube=agent_kube))
    ledger.close()
    backend.close()


@pytest.fixture
def running(node: Node, node_name: str, namespace: str, containerd: TestRuntime,
            proxy_socket: Path) -> Iterator[Kubelet]:  # fmt: skip
    """The CRI proxy with the claim hooks (the policing's runtime channel) and a kubelet before it."""
    cards, control = stand_ins(containerd.directory / "dev")
    cdi.write_spec(containerd.cdi_dir, [replace(c, uuid=u) for c, u in zip(cards, node.uuids, strict=True)], control)
    view = View(node_name=node_name, cards={u.lower(): CardInfo(uuid=u, index=i, memory_mib=81920)
                                            for i, u in enumerate(node.uuids)})  # fmt: skip
    view.add(slice_claim(namespace, "train", user="trainer", node_name=node_name, gpus=(node.uuids[0],)))
    hooks = claim_hooks.ClaimHooks(view=view, ledger=node.ledger)
    settings = ProxySettings(listen=proxy_socket, upstream=str(containerd.socket))
    with CriProxy(settings, container_hooks=hooks) as proxy, Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
        assert proxy.reconciled.wait(10)
        node.proxies.append(proxy)
        yield k
    hooks.close()


def make_claim(api_client: client.ApiClient, namespace: str, node_name: str, gpu: str,
               policy: dict[str, Any] | None) -> dict[str, Any]:  # fmt: skip
    """The claim as the controller leaves it after the bind: Bound on this node, with the class's policy."""
    path = CLAIMS.format(namespace=namespace)
    body = {"apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM, "metadata": {"name": "train"},
            "spec": {"resources": {"requests": {names.RESOURCE_CORE: 30, names.RESOURCE_MEMORY: "10Gi"}}}}
    created = kube_request(api_client, "POST", path, body=body)
    assert created.status == 201, created.body
    status: dict[str, Any] = {"phase": "Bound", "nodeName": node_name, "gpus": [gpu]}
    if policy is not None:
        status["policing"] = policy
    answer = kube_request(api_client, "PATCH", f"{path}/train/status", body={"status": status},
                          headers={"Content-Type": "application/merge-patch+json"})  # fmt: skip
    assert answer.status == 200, answer.body
    return dict(answer.json())


def state(kubelet: Kubelet, container_id: str) -> str:
    answer = kubelet.runtime.ContainerStatus(api.pb.ContainerStatusRequest(container_id=container_id), timeout=10)
    return str(api.pb.ContainerState.Name(answer.status.state))


def pid_of(proxy: CriProxy, container_id: str) -> int:
    pid = int(proxy.container_info(container_id)["pid"])
    assert usage.ContainerFinder().container_of(pid) == container_id, "the container's process is not in its cgroup"
    return pid


def events(api_client: client.ApiClient, namespace: str, reason: str) -> list[Any]:
    return [e for e in client.CoreV1Api(api_client).list_namespaced_event(namespace).items if e.reason == reason]


def scrape(node: Node) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The agent's metrics as /metrics serves them: (name, sorted labels) -> value."""
    text = generate_latest(metrics.registry(node.sources)).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def stops_metric(node: Node, namespace: str) -> float | None:
    return scrape(node).get(("elasticgpu_agent_over_limit_stops_total",
                             (("claim", "train"), ("namespace", namespace))))  # fmt: skip


def test_a_claim_over_its_memory_for_the_grace_has_its_container_stopped(
    api_client: client.ApiClient, node: Node, running: Kubelet, namespace: str, node_name: str,
) -> None:
    proxy = node.proxies[0]
    make_claim(api_client, namespace, node_name, node.uuids[0],
               {"overLimitAction": "StopContainer", "overLimitGraceSeconds": 30})
    trainer = running.run_pod("trainer", namespace, annotations={"egpuc.elasticgpu.io/main": "train"})
    main = running.create_container(trainer, "main")
    running.start(main)
    # A pod without a claim whose process reached card 0 anyway (a privileged container, another plugin's).
    stray_pod = running.run_pod("stray", namespace)
    stray = running.create_container(stray_pod, "main")
    running.start(stray)
    main_pid, stray_pid = pid_of(proxy, main), pid_of(proxy, stray)
    # The driver reports 12 GiB for the claim's 10 GiB, and 1 GiB for the stray process.
    simulated.inject(node.inject, {"process": {"card": 0, "pid": main_pid, "memory": "12Gi", "sm": 30}})
    simulated.inject(node.inject, {"process": {"card": 0, "pid": stray_pid, "memory": "1Gi"}})

    # Over for less than the grace (30 s), sample after sample: nothing is stopped.
    for at in (1000.0, 1010.0, 1020.0, 1029.0):
        node.sample_at(at)
    assert state(running, main) == "CONTAINER_RUNNING"
    assert events(api_client, namespace, policing.REASON_STOPPED) == []
    assert [e.reason for e in events(api_client, namespace, "OverLimit")] == ["OverLimit"]  # the warning, once
    # The stray process is told about, with its figures in the metrics, and never stopped.
    assert set(node.loop.unattributed) == {stray_pid}
    assert len(events(api_client, namespace, "UnattributedGPUProcess")) == 1
    card = (("gpu", node.uuids[0]), ("node", node_name))
    scraped = scrape(node)
    assert scraped[("elasticgpu_agent_gpu_unattributed_processes", card)] == 1
    assert scraped[("elasticgpu_agent_gpu_unattributed_memory_bytes", card)] == 1024 * 1024 * 1024

    # 30 s over, every sample of them: the runtime stops the claim's container, not the stray one.
    node.sample_at(1030.0)
    assert state(running, main) == "CONTAINER_EXITED"
    assert state(running, stray) == "CONTAINER_RUNNING"
    told = events(api_client, namespace, policing.REASON_STOPPED)
    assert sorted(e.involved_object.kind for e in told) == ["ElasticGPUClaim", "Pod"]
    for event in told:
        assert event.type == "Warning"
        assert f"claim {namespace}/train used 12288 MiB" in event.message, event.message
        assert "more than the 10240 MiB it reserved, for 30 s" in event.message, event.message
        assert f"container main ({main[:13]}) of pod {namespace}/trainer" in event.message, event.message
    assert node.enforcer.stops == {(namespace, "train"): 1}
    assert stops_metric(node, namespace) == 1.0

    # The driver still lists the dead process for a while: never stopped twice, nothing else stopped.
    node.sample_at(1040.0)
    node.sample_at(1080.0)
    assert node.enforcer.stops == {(namespace, "train"): 1}
    assert len(events(api_client, namespace, policing.REASON_STOPPED)) == 2
    assert state(running, stray) == "CONTAINER_RUNNING"


def test_one_sample_under_the_limit_restarts_the_grace(
    api_client: client.ApiClient, node: Node, running: Kubelet, namespace: str, node_name: str,
) -> None:
    proxy = node.proxies[0]
    make_claim(api_client, namespace, node_name, node.uuids[0],
               {"overLimitAction": "StopContainer", "overLimitGraceSeconds": 30})
    pod = running.run_pod("trainer", namespace, annotations={"egpuc.elasticgpu.io/main": "train"})
    main = running.create_container(pod, "main")
    running.start(main)
    pid = pid_of(proxy, main)

    def uses(memory: str) -> None:
        simulated.inject(node.inject, {"process": {"card": 0, "pid": pid, "memory": memory}})

    for at, memory in ((1000.0, "12Gi"), (1020.0, "12Gi"), (1025.0, "8Gi"), (1030.0, "12Gi"), (1059.0, "12Gi")):
        uses(memory)
        node.sample_at(at)
    assert state(running, main) == "CONTAINER_RUNNING"  # 59 s over in all, but only 29 s in a row
    node.sample_at(1060.0)
    assert state(running, main) == "CONTAINER_EXITED"


def _allocation(node: Node, namespace: str, *, cores: int, memory_mib: int) -> dict[str, dict[str, Any]]:
    """The node's GPU objects as the agent's watch delivers them, card 0 holding the claim's ElasticGPU at this size
    (what the controller writes into status.allocations; an in-place resize changes it)."""
    allocation = {"elasticGPU": "egpu-train", "namespace": namespace, "name": "train", "cores": cores,
                  "memory": memory_mib}
    return {names.gpu_object_name(uuid): {"spec": {"uuid": uuid},
                                          "status": {"allocations": [allocation] if i == 0 else []}}
            for i, uuid in enumerate(node.uuids)}


@pytest.mark.parametrize("with_limits_files", [True, False], ids=["limits-files", "no-limits-dir"])
def test_a_claim_grown_in_place_is_judged_by_its_new_size(
    api_client: client.ApiClient, node: Node, running: Kubelet, namespace: str, node_name: str, tmp_path: Path,
    with_limits_files: bool,
) -> None:
    """Issue 33.5: a claim grown from 10 to 20 GiB whose container uses 15 GiB is within its size: no OverLimit,
    no stop, and the metrics say 20 GiB. The size is the allocation the controller wrote on the card, which the
    running-claims pass records in the ledger (with or without the limits files)."""
    proxy = node.proxies[0]
    make_claim(api_client, namespace, node_name, node.uuids[0],
               {"overLimitAction": "StopContainer", "overLimitGraceSeconds": 30})
    pod = running.run_pod("trainer", namespace, annotations={"egpuc.elasticgpu.io/main": "train"})
    main = running.create_container(pod, "main")  # created at 10 GiB (the ledger row's memory_mib)
    running.start(main)
    files = limits_file.LimitsFiles(tmp_path / "limits") if with_limits_files else None
    # The controller grew the reservation in place; the agent's pass over its GPU objects sees it.
    limits_file.sync(files, node.ledger, _allocation(node, namespace, cores=30, memory_mib=20480))
    simulated.inject(node.inject, {"process": {"card": 0, "pid": pid_of(proxy, main), "memory": "15Gi"}})
    for at in (1000.0, 1030.0, 1060.0):
        node.sample_at(at)
    assert state(running, main) == "CONTAINER_RUNNING"
    assert events(api_client, namespace, policing.REASON_STOPPED) == []
    assert events(api_client, namespace, "OverLimit") == []
    usage_now = node.loop.claims[(namespace, "train")]
    assert (usage_now.reserved_mib, usage_now.reserved_cores, usage_now.over_limit) == (20480, 30, False)
    labels = (("claim", "train"), ("namespace", namespace))
    assert scrape(node)[("elasticgpu_agent_claim_memory_limit_bytes", labels)] == 20480 * 2**20

    # Shrunk back to 10 GiB (a `limit` while the controller waits for it to apply): 15 GiB is over again.
    limits_file.sync(files, node.ledger, _allocation(node, namespace, cores=30, memory_mib=10240))
    for at in (1100.0, 1130.0):
        node.sample_at(at)
    assert state(running, main) == "CONTAINER_EXITED"


def test_warn_only_warns(api_client: client.ApiClient, node: Node, running: Kubelet, namespace: str,
                         node_name: str) -> None:  # fmt: skip
    proxy = node.proxies[0]
    make_claim(api_client, namespace, node_name, node.uuids[0], {"overLimitAction": "Warn", "overLimitGraceSeconds": 0})
    pod = running.run_pod("trainer", namespace, annotations={"egpuc.elasticgpu.io/main": "train"})
    main = running.create_container(pod, "main")
    running.start(main)
    simulated.inject(node.inject, {"process": {"card": 0, "pid": pid_of(proxy, main), "memory": "40Gi"}})
    for at in (1000.0, 1100.0, 5000.0):
        node.sample_at(at)
    assert state(running, main) == "CONTAINER_RUNNING"
    assert events(api_client, namespace, policing.REASON_STOPPED) == []
    assert [e.reason for e in events(api_client, namespace, "OverLimit")] == ["OverLimit"]
    assert stops_metric(node, namespace) is None


def test_runtime_and_api_failures_are_retried_and_nothing_is_stopped_twice(
    api_client: client.ApiClient, node: Node, running: Kubelet, namespace: str, node_name: str,
    containerd: TestRuntime, relayed_kubeconfig: tuple[Path, Relay],
) -> None:
    kubeconfig, relay = relayed_kubeconfig
    # Policing's own API client goes through a relay the test breaks; its runtime first through a
    # proxy whose runtime socket does not exist (every call: UNAVAILABLE), then through the real one.
    broken = CriProxy(ProxySettings(listen=containerd.directory / f"broken-{uuid.uuid4().hex[:8]}.sock",
                                    upstream=str(containerd.directory / "no-such-runtime.sock")))  # fmt: skip
    runtime: list[CriProxy] = [broken]
    relayed = kube.AgentKube(kube.load_api_client(str(kubeconfig), None), node_name=node_name,
                             field_manager="elasticgpu-agent", timeout_s=2)  # fmt: skip
    enforcer = policing.Enforcer(kube=relayed, runtime=lambda: runtime[0], clock=lambda: node.clock[0],
                                 settings=PolicingSettings(over_limit_stop_timeout_s=5))  # fmt: skip
    node.loop.policing = enforcer
    make_claim(api_client, namespace, node_name, node.uuids[0],
               {"overLimitAction": "StopContainer", "overLimitGraceSeconds": 10})
    pod = running.run_pod("trainer", namespace, annotations={"egpuc.elasticgpu.io/main": "train"})
    main = running.create_container(pod, "main")
    running.start(main)
    simulated.inject(node.inject, {"process": {"card": 0, "pid": pid_of(node.proxies[0], main), "memory": "12Gi"}})
    relay.refuse()
    with broken:
        node.sample_at(1000.0)
        node.sample_at(1010.0)  # due: the runtime cannot be reached, so nothing is stopped (and no error escapes)
        node.sample_at(1015.0)  # the next passes try again
        assert state(running, main) == "CONTAINER_RUNNING"
        assert enforcer.stops == {}
    runtime[0] = node.proxies[0]
    node.sample_at(1020.0)  # the runtime answers: stopped; the API server does not: the Events are owed
    assert state(running, main) == "CONTAINER_EXITED"
    assert enforcer.stops == {(namespace, "train"): 1}
    assert events(api_client, namespace, policing.REASON_STOPPED) == []
    relay.accept_again()
    node.sample_at(1025.0)  # the Events are written now, once each; the container is not stopped again
    node.sample_at(1030.0)
    assert sorted(e.involved_object.kind for e in events(api_client, namespace, policing.REASON_STOPPED)) == [
        "ElasticGPUClaim", "Pod"]
    assert enforcer.stops == {(namespace, "train"): 1}


# Issue 48: a ResourceClaim's container (DRA), policed by the policy its DeviceClass's config gave at prepare.
DRA_UID = "4f0c9b1e-dra0-4a8e-9d1c-00000000002a"
DRA_POD_UID = "pod-dra-policed"


@dataclass
class DraNode:
    kubelet: Kubelet
    hooks: claim_hooks.ClaimHooks
    checkpoint: dra_checkpoint.Checkpoint
    proxy: CriProxy


@pytest.fixture
def dra_running(node: Node, node_name: str, namespace: str, containerd: TestRuntime, proxy_socket: Path,
                tmp_path: Path) -> Iterator[DraNode]:  # fmt: skip
    """The CRI proxy with the claim hooks reading the DRA driver's real checkpoint, and a kubelet before it."""
    cards, control = stand_ins(containerd.directory / "dev")
    cdi.write_spec(containerd.cdi_dir, [replace(c, uuid=u) for c, u in zip(cards, node.uuids, strict=True)], control)
    view = View(node_name=node_name, cards={u.lower(): CardInfo(uuid=u, index=i, memory_mib=81920)
                                            for i, u in enumerate(node.uuids)})  # fmt: skip
    cp = dra_checkpoint.Checkpoint(tmp_path / "dra-checkpoint.json")
    hooks = claim_hooks.ClaimHooks(view=view, ledger=node.ledger, dra_claims=cp.claims_of_pod)
    settings = ProxySettings(listen=proxy_socket, upstream=str(containerd.socket))
    with CriProxy(settings, container_hooks=hooks) as proxy, Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
        assert proxy.reconciled.wait(10)
        node.proxies.append(proxy)
        yield DraNode(kubelet=k, hooks=hooks, checkpoint=cp, proxy=proxy)
    hooks.close()


def prepare_dra(dra: DraNode, containerd: TestRuntime, namespace: str, card: str, *, action: str, grace_s: int) -> None:
    """ResourceClaim <namespace>/rc, a 30% / 10 GiB slice of `card`, as the driver leaves it after prepare: its
    checkpoint entry (with its DeviceClass's policy) and its CDI spec."""
    device = dra_checkpoint.PreparedDevice(requests=("gpu",), pool="node-a", device="gpu-0", uuid=card,
                                           cdi_ids=(claim_cdi.card_id(card), claim_cdi.device_id(DRA_UID)),
                                           cores=30, memory_mib=10240)  # fmt: skip
    env = claim_cdi.env([device], card_memory_mib={card: 81920}, isolation="None")
    dra.checkpoint.put(dra_checkpoint.ClaimEntry(
        uid=DRA_UID, namespace=namespace, name="rc", state=dra_checkpoint.COMPLETED, devices=(device,),
        pods=(DRA_POD_UID,), env=tuple(env), over_limit_action=action, over_limit_grace_s=grace_s))  # fmt: skip
    claim_cdi.write(containerd.cdi_dir, DRA_UID, env)


@pytest.mark.parametrize("action", ["StopContainer", "Warn", "not-prepared-here"])
def test_a_resource_claim_is_policed_by_its_device_class_s_policy(
    api_client: client.ApiClient, node: Node, dra_running: DraNode, namespace: str, containerd: TestRuntime,
    action: str,
) -> None:
    """The enforcer reads the policy the driver kept at prepare (by the claim's uid): StopContainer stops the
    container after the grace, with Events on the ResourceClaim and the pod; Warn, or a claim whose entry is
    not in the checkpoint (the policy cannot be known), never stops it."""
    enforcer = node.enforcer
    enforcer.dra_policy = dra_running.checkpoint.policy_of  # as the agent wires it when it is a DRA driver
    prepare_dra(dra_running, containerd, namespace, node.uuids[0], grace_s=30,
                action="Warn" if action == "Warn" else "StopContainer")
    k = dra_running.kubelet
    pod = k.run_pod("trainer", namespace, uid=DRA_POD_UID)
    main = k.create_container(pod, "main", cdi_devices=[claim_cdi.card_id(node.uuids[0]),
                                                         claim_cdi.device_id(DRA_UID)])
    k.start(main)
    dra_running.hooks.flush()
    row = node.ledger.allocation_for_container(main)
    assert row is not None and row.claim_key == (namespace, "resourceclaim/rc")
    if action == "not-prepared-here":
        # The container runs (prepared), then the entry goes (a checkpoint moved aside): nothing says StopContainer.
        dra_running.checkpoint.remove(DRA_UID)
    simulated.inject(node.inject, {"process": {"card": 0, "pid": pid_of(dra_running.proxy, main), "memory": "12Gi"}})
    for at in (1000.0, 1010.0, 1029.0):
        node.sample_at(at)
    assert state(k, main) == "CONTAINER_RUNNING"
    assert node.loop.claims[(namespace, "resourceclaim/rc")].over_limit
    node.sample_at(1030.0)
    if action != "StopContainer":
        node.sample_at(5000.0)
        assert state(k, main) == "CONTAINER_RUNNING"
        assert enforcer.stops == {}
        assert events(api_client, namespace, policing.REASON_STOPPED) == []
        return
    assert state(k, main) == "CONTAINER_EXITED"
    assert enforcer.stops == {(namespace, "resourceclaim/rc"): 1}
    told = events(api_client, namespace, policing.REASON_STOPPED)
    assert sorted((e.involved_object.kind, e.involved_object.name) for e in told) == [
        ("Pod", "trainer"), ("ResourceClaim", "rc")]
    claim_event = next(e for e in told if e.involved_object.kind == "ResourceClaim")
    involved = claim_event.involved_object
    assert (involved.api_version, involved.uid) == ("resource.k8s.io/v1", DRA_UID)
    for event in told:
        assert f"ResourceClaim {namespace}/rc used 12288 MiB" in event.message, event.message
        assert "(the DeviceClass allows 30 s: overLimitAction StopContainer)" in event.message, event.message
        assert "Request more memory capacity in the ResourceClaim" in event.message, event.message
    node.sample_at(1040.0)
    assert enforcer.stops == {(namespace, "resourceclaim/rc"): 1}  # never stopped twice
