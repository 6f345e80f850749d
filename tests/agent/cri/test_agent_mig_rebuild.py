"""A lost ledger does not lose the MIG instances running containers hold (issue 26): the agent as a
real process, the simulated backend's MIG card, real containerd. Two MIG claims' containers run;
the agent is killed and its ledger corrupted; the restarted agent sets the file aside and rebuilds
from the runtime's containers, which carry `elasticgpu.io/mig-instance`: each instance gets its
`mig_instances` row again (created, its uuid and ElasticGPU) and the containers' rows name their
card and ElasticGPU. So removing one pod destroys its instance and keeps the other's, and removing
the last one destroys the last instance (before: the instances were left as an admin's, forgotten,
and never destroyed)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from elasticgpu.agent.injecting import mig_annotation
from elasticgpu.agent.ledger import store
from elasticgpu.api import pod_claims
from tests.agent.conftest import wait_for
from tests.agent.cri.kubelet import Kubelet
from tests.agent.cri.test_agent_mig import instances, partition, run_pod, two_mig_pods
from tests.agent.cri.test_agent_run import AgentProcess, agent_factory, serving, world_gpus
from tests.agent.cri.test_socket_first import _corrupt, _opened
from tests.containerd_runtime import TestRuntime
from tests.pods.claim_world import World, kube, world
from tests.pods.conftest import pod_update_policies

__all__ = ["agent_factory", "kube", "pod_update_policies", "world", "world_gpus"]  # fixtures


def test_a_rebuilt_ledger_records_the_mig_instances_running_containers_hold(
    world: World, world_gpus: list[str], containerd: TestRuntime, proxy_socket: Path, tmp_path: Path,
    agent_factory: Callable[..., AgentProcess],
) -> None:  # fmt: skip
    agent, uuid = two_mig_pods(world, world_gpus, proxy_socket, agent_factory)
    kept, gone = partition(world, "kept"), partition(world, "gone")
    egpus = {pod: world.get_claim(pod_claims.inline_claim_name(pod, "main"))["status"].get("elasticGPUName")
             or world.get_claim(pod_claims.inline_claim_name(pod, "main"))["spec"]["elasticGPUName"]
             for pod in ("kept", "gone")}

    with Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
        kept_pod, kept_main = run_pod(k, world, "kept")
        gone_pod, gone_main = run_pod(k, world, "gone")
        assert set(instances(containerd, uuid)) == {kept, gone}
        # The instance is named on the container, where a rebuild finds it.
        (listed,) = [c for c in k.runtime.ListContainers(k.pb.ListContainersRequest(), timeout=10).containers
                     if c.id == kept_main]
        named = mig_annotation.parse(listed.annotations[mig_annotation.MIG_ANNOTATION])
        assert named is not None
        assert (named.uuid, named.profile, named.start, named.card) == (instances(containerd, uuid)[kept], *kept,
                                                                        uuid)
        assert named.elastic_gpu == egpus["kept"]

    # The ledger is lost under the running containers: set aside, rebuilt from the runtime.
    agent.kill()
    ledger_file = tmp_path / "ledger.db"  # where agent_factory points --ledger-url
    _corrupt(ledger_file)
    agent.start()
    wait_for("the proxy serving again", lambda: agent.alive() and serving(proxy_socket), timeout=15)
    url = agent.command[agent.command.index("--ledger-url") + 1]
    wait_for("the corrupt file set aside", lambda: list(tmp_path.glob("ledger.db.corrupt-*")), timeout=30)
    ledger: store.LedgerStore = wait_for("the new ledger", lambda: _opened(url, agent), timeout=30)
    try:
        wait_for("both containers' rows rebuilt", lambda: len(ledger.open_allocations()) == 2, timeout=30)
        rebuilt = {row.container_id: row for row in ledger.open_allocations()}
        assert rebuilt[kept_main].elastic_gpu == egpus["kept"] and rebuilt[gone_main].elastic_gpu == egpus["gone"]
        assert rebuilt[kept_main].gpu_uuids == (uuid,), rebuilt[kept_main]
        records = wait_for("the MIG instances recorded again", lambda: ledger.mig_records() if len(
            ledger.mig_records()) == 2 else None, timeout=30)
        by_egpu = {r.elastic_gpu: r for r in records}
        assert set(by_egpu) == set(egpus.values()), records
        for pod, where in (("kept", kept), ("gone", gone)):
            record = by_egpu[egpus[pod]]
            assert (record.state, record.card_uuid, record.profile, record.start) == ("created", uuid, *where)
            assert record.mig_uuid == instances(containerd, uuid)[where]
    finally:
        ledger.close()
    assert set(instances(containerd, uuid)) == {kept, gone}  # the restart destroyed neither

    with Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
        k.remove_pod(gone_pod)
        wait_for("the removed pod's instance destroyed, the other kept",
                 lambda: set(instances(containerd, uuid)) == {kept}, timeout=15)
        assert k.env(kept_main)["NVIDIA_VISIBLE_DEVICES"] == instances(containerd, uuid)[kept]
        k.remove_pod(kept_pod)
        wait_for("the last instance destroyed", lambda: instances(containerd, uuid) == {}, timeout=15)
    assert agent.alive()
    assert "Traceback" not in agent.log()
