"""The DRA driver against Kubernetes' own kube-apiserver (1.36.3, resource.k8s.io/v1 with consumable
capacity on): the ResourceSlice the agent publishes is what the API server accepts and keeps, and
kubelet's plugin API over real unix sockets prepares ResourceClaims allocated on the node's DRA
cards, idempotently and across an agent restart.

GPU objects are handed to the publisher and the preparer as the plain dicts the API returns (their
owner fields are the controller side's; here the test states them)."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes import client

from elasticgpu.agent import errors
from elasticgpu.agent import kube as agent_api
from elasticgpu.agent.dra import checkpoint, claim_cdi, plugin_serving, preparing, protocol, slice_content
from elasticgpu.agent.dra.slice_publishing import SlicePublisher
from elasticgpu.api import dra_names
from tests.agent.dra.test_slice_content import gpu
from tests.kube_cluster import kube_request

pytestmark = pytest.mark.realcluster

CALL_TIMEOUT_S = 30.0
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"


@pytest.fixture
def node() -> str:
    return f"dra-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def admin_kube(api_client: client.ApiClient, node: str) -> Iterator[agent_api.AgentKube]:
    kube = agent_api.AgentKube(api_client, node_name=node, field_manager="elasticgpu-agent")
    try:
        yield kube
    finally:
        with contextlib.suppress(errors.KubeNotFound):
            kube.delete_resource_slice(slice_content.slice_name(node))


def test_the_slice_is_accepted_bumps_its_generation_and_goes_with_the_last_dra_card(
    admin_kube: agent_api.AgentKube, node: str
) -> None:
    publisher = SlicePublisher(admin_kube)
    assert publisher.publish([gpu(0), gpu(1, desired="ElasticGPU", effective="ElasticGPU")])
    stored = admin_kube.read_resource_slice(slice_content.slice_name(node))
    assert stored["spec"]["driver"] == "gpu.elasticgpu.io"
    assert stored["spec"]["nodeName"] == node
    assert stored["spec"]["pool"] == {"name": node, "generation": 1, "resourceSliceCount": 1}
    [device] = stored["spec"]["devices"]
    assert device["name"] == "gpu-0"
    assert device["allowMultipleAllocations"] is True  # the API server kept consumable capacity (beta, on)
    assert device["capacity"]["memory"]["requestPolicy"]["default"] == "80Gi"
    assert not publisher.publish([gpu(0), gpu(1, desired="ElasticGPU", effective="ElasticGPU")])  # no change, no write
    # A fresh agent (no memory of what it wrote) compares with the server and writes nothing either.
    assert not SlicePublisher(admin_kube).publish([gpu(0)])
    assert publisher.publish([gpu(0), gpu(1)])
    stored = admin_kube.read_resource_slice(slice_content.slice_name(node))
    assert stored["spec"]["pool"]["generation"] == 2
    assert [d["name"] for d in stored["spec"]["devices"]] == ["gpu-0", "gpu-1"]
    # The platform team takes both back: the slice goes.
    assert publisher.publish([gpu(0, desired="ElasticGPU"), gpu(1, desired="ElasticGPU")])
    with pytest.raises(errors.KubeNotFound):
        admin_kube.read_resource_slice(slice_content.slice_name(node))


# Kubelet's side of the plugin API -----------------------------------------------------------------------------


class Kubelet:
    """What kubelet does with a DRA plugin: GetInfo on the registration socket, then the DRA service."""

    def __init__(self, kubelet_dir: Path) -> None:
        self.registration_path = plugin_serving.registration_socket(kubelet_dir)
        self._channels: list[grpc.Channel] = []

    def _channel(self, path: str) -> grpc.Channel:
        channel = grpc.insecure_channel(f"unix://{path}")
        self._channels.append(channel)
        return channel

    def info(self) -> Any:
        stub = protocol.registration_services.RegistrationStub(self._channel(str(self.registration_path)))
        answer = stub.GetInfo(protocol.registration_pb.InfoRequest(), timeout=CALL_TIMEOUT_S)
        stub.NotifyRegistrationStatus(protocol.registration_pb.RegistrationStatus(plugin_registered=True),
                                      timeout=CALL_TIMEOUT_S)  # fmt: skip
        return answer

    def prepare(self, *claims: dict[str, Any], v1beta1: bool = False) -> Any:
        pb, services = ((protocol.dra_v1beta1_pb, protocol.dra_v1beta1_services) if v1beta1
                        else (protocol.dra_v1_pb, protocol.dra_v1_services))  # fmt: skip
        stub = services.DRAPluginStub(self._channel(self.info().endpoint))
        return stub.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=[_claim(pb, c) for c in claims]),
                                         timeout=CALL_TIMEOUT_S)  # fmt: skip

    def unprepare(self, *claims: dict[str, Any]) -> Any:
        stub = protocol.dra_v1_services.DRAPluginStub(self._channel(self.info().endpoint))
        pb = protocol.dra_v1_pb
        request = pb.NodeUnprepareResourcesRequest(claims=[_claim(pb, c) for c in claims])
        return stub.NodeUnprepareResources(request, timeout=CALL_TIMEOUT_S)

    def close(self) -> None:
        for channel in self._channels:
            channel.close()


def _claim(pb: Any, claim: dict[str, Any]) -> Any:
    meta = claim["metadata"]
    return pb.Claim(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


def allocated_claim(api: client.ApiClient, namespace: str, node: str, device: str,
                    consumed: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """A ResourceClaim allocated (as the scheduler writes it) on `device` of `node`'s pool."""
    name = f"c-{uuid.uuid4().hex[:8]}"
    created = kube_request(api, "POST", CLAIMS.format(namespace=namespace), body={
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.elasticgpu.io"}}]}},
    })  # fmt: skip
    assert created.status == 201, created.body
    claim = created.json()
    result: dict[str, Any] = {"request": "gpu", "driver": dra_names.DRIVER_NAME, "pool": node, "device": device}
    if consumed is not None:
        result["consumedCapacity"] = consumed
        result["shareID"] = str(uuid.uuid4())
    claim["status"] = {"allocation": {"devices": {"results": [result]}, "nodeSelector": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}  # fmt: skip
    answer = kube_request(api, "PUT", f"{CLAIMS.format(namespace=namespace)}/{name}/status", body=claim)
    assert answer.status == 200, answer.body
    return dict(answer.json())


@pytest.fixture
def plugin_dirs(tmp_path: Path) -> dict[str, Path]:
    # A unix socket path has 107 bytes at most: pytest's tmp_path can be longer.
    short = Path(f"/tmp/egdra-{uuid.uuid4().hex[:8]}")
    short.mkdir()
    yield {"kubelet": short, "cdi": tmp_path / "cdi", "checkpoint": tmp_path / "state" / "dra.json"}
    import shutil

    shutil.rmtree(short, ignore_errors=True)


@contextlib.contextmanager
def running_plugin(kube: agent_api.AgentKube, dirs: dict[str, Path], gpus: list[dict[str, Any]]) -> Iterator[Kubelet]:
    preparer = preparing.Preparer(node=kube.node_name, read_claim=kube.read_resource_claim, list_gpus=lambda: gpus,
                                  store=checkpoint.Checkpoint(dirs["checkpoint"]), cdi_dir=dirs["cdi"])  # fmt: skip
    plugin = plugin_serving.KubeletPlugin(preparer, kubelet_dir=dirs["kubelet"])
    plugin.start()
    kubelet = Kubelet(dirs["kubelet"])
    try:
        yield kubelet
    finally:
        kubelet.close()
        plugin.stop()


def test_registration_names_the_driver_its_socket_and_the_dra_services(
    admin_kube: agent_api.AgentKube, plugin_dirs: dict[str, Path]
) -> None:
    with running_plugin(admin_kube, plugin_dirs, []) as kubelet:
        info = kubelet.info()
        assert (info.type, info.name) == ("DRAPlugin", "gpu.elasticgpu.io")
        assert info.endpoint == str(plugin_dirs["kubelet"] / "plugins" / "gpu.elasticgpu.io" / "dra.sock")
        # kubelet's labels (drapbv1.DRAPluginService), as test_dra_kubelet shows kubelet 1.36 accepts them.
        assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
        assert oct(kubelet.registration_path.stat().st_mode & 0o777) == "0o600"
    assert not kubelet.registration_path.exists()  # a stopped plugin withdraws its registration


def test_prepare_returns_the_cards_cdi_ids_idempotently_and_survives_a_restart(
    api_client: client.ApiClient, admin_kube: agent_api.AgentKube, node: str, namespace: str,
    plugin_dirs: dict[str, Path],
) -> None:
    gpus = [gpu(0), gpu(1)]
    whole = allocated_claim(api_client, namespace, node, "gpu-1")
    uid = whole["metadata"]["uid"]
    with running_plugin(admin_kube, plugin_dirs, gpus) as kubelet:
        answer = kubelet.prepare(whole).claims[uid]
        assert answer.error == ""
        [device] = answer.devices
        assert (device.pool_name, device.device_name, list(device.request_names)) == (node, "gpu-1", ["gpu"])
        assert list(device.cdi_device_ids) == ["elasticgpu.io/gpu=GPU-0001", f"elasticgpu.io/claim={uid}"]
        spec = json.loads((plugin_dirs["cdi"] / claim_cdi.spec_file(uid)).read_text())
        assert spec["devices"][0]["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=GPU-0001"]  # whole: no limits
        assert kubelet.prepare(whole).claims[uid] == answer  # again: the same answer
        # A reboot empties a tmpfs spec folder while kubelet keeps the claim prepared: prepare writes it again.
        (plugin_dirs["cdi"] / claim_cdi.spec_file(uid)).unlink()
        assert kubelet.prepare(whole).claims[uid] == answer
        assert json.loads((plugin_dirs["cdi"] / claim_cdi.spec_file(uid)).read_text()) == spec
    # kill -9 between prepare and unprepare: nothing in memory survives; the checkpoint answers.
    with running_plugin(admin_kube, plugin_dirs, gpus) as kubelet:
        again = kubelet.prepare(whole, v1beta1=True).claims[uid]
        assert again.devices[0].cdi_device_ids == answer.devices[0].cdi_device_ids
        assert kubelet.unprepare(whole).claims[uid].error == ""
        assert not (plugin_dirs["cdi"] / claim_cdi.spec_file(uid)).exists()
        assert checkpoint.Checkpoint(plugin_dirs["checkpoint"]).entries() == {}
        assert kubelet.unprepare(whole).claims[uid].error == ""  # an unknown claim is done already


def test_a_slice_gets_its_consumed_capacity_as_limits_and_a_card_dra_does_not_own_is_refused(
    api_client: client.ApiClient, admin_kube: agent_api.AgentKube, node: str, namespace: str,
    plugin_dirs: dict[str, Path],
) -> None:
    gpus = [gpu(0), gpu(1, desired="ElasticGPU", effective="ElasticGPU")]
    share = allocated_claim(api_client, namespace, node, "gpu-0", consumed={"cores": "30", "memory": "10Gi"})
    ours = allocated_claim(api_client, namespace, node, "gpu-1")
    elsewhere = allocated_claim(api_client, namespace, "another-node", "gpu-0")
    with running_plugin(admin_kube, plugin_dirs, gpus) as kubelet:
        answers = kubelet.prepare(share, ours, elsewhere).claims
        shared = answers[share["metadata"]["uid"]]
        assert shared.error == "", shared.error
        assert shared.devices[0].share_id == share["status"]["allocation"]["devices"]["results"][0]["shareID"]
        env = json.loads((plugin_dirs["cdi"] / claim_cdi.spec_file(share["metadata"]["uid"])).read_text())
        assert set(env["devices"][0]["containerEdits"]["env"]) >= {
            "NVIDIA_VISIBLE_DEVICES=GPU-0000", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30",
            "CUDA_DEVICE_SM_LIMIT=30", "CUDA_DEVICE_MEMORY_LIMIT_0=10240m"}  # fmt: skip
        refused = answers[ours["metadata"]["uid"]]
        assert refused.devices == [] or len(refused.devices) == 0
        assert "belongs to ElasticGPU" in refused.error and "spec.owner to DRA" in refused.error, refused.error
        assert "the pool is not this node's" in answers[elsewhere["metadata"]["uid"]].error
        assert set(checkpoint.Checkpoint(plugin_dirs["checkpoint"]).entries()) == {share["metadata"]["uid"]}
