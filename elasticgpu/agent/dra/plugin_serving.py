"""The kubelet plugin of the DRA driver: two gRPC servers on unix sockets, as kubelet expects them.

    <kubelet dir>/plugins_registry/gpu.elasticgpu.io-reg.sock   Registration (pluginregistration v1):
        kubelet's plugin watcher finds the socket, calls GetInfo (type DRAPlugin, the driver's name,
        the service socket, the DRA services served) and NotifyRegistrationStatus
    <kubelet dir>/plugins/gpu.elasticgpu.io/dra.sock           DRAPlugin (dra v1 and v1beta1):
        NodePrepareResources / NodeUnprepareResources, answered by preparing.Preparer

The servicers translate messages and nothing else. Each claim of a request is answered on its own:
a claim that fails carries its error, the others their devices (kubelet retries the failed ones).
Both sockets are owner-only (private_socket): only root's kubelet may call.
"""

from __future__ import annotations

import contextlib
import logging
import stat
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from elasticgpu.agent import private_socket
from elasticgpu.agent.dra import checkpoint, preparing, protocol
from elasticgpu.api import dra_names

log = logging.getLogger(__name__)


def registration_socket(kubelet_dir: Path) -> Path:
    """Where kubelet's plugin watcher looks for the driver's registration socket."""
    return kubelet_dir / "plugins_registry" / f"{dra_names.DRIVER_NAME}-reg.sock"


def service_socket(kubelet_dir: Path) -> Path:
    """The socket of the DRA service (named to kubelet in GetInfo)."""
    return kubelet_dir / "plugins" / dra_names.DRIVER_NAME / "dra.sock"


class _Registration:
    """pluginregistration.Registration."""

    def __init__(self, endpoint: Path, state: PluginState) -> None:
        self._endpoint = endpoint
        self._state = state

    def GetInfo(self, request: Any, context: Any) -> Any:
        return protocol.registration_pb.PluginInfo(
            type=protocol.DRA_PLUGIN_TYPE, name=dra_names.DRIVER_NAME, endpoint=str(self._endpoint),
            supported_versions=list(protocol.SUPPORTED_SERVICES),
        )  # fmt: skip

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self._state.registered(bool(request.plugin_registered), str(request.error))
        return protocol.registration_pb.RegistrationStatusResponse()


class PluginState:
    """What kubelet said of the registration (for readiness and the node's conditions)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.is_registered = False
        self.error = ""
        self.changed = threading.Event()

    def registered(self, ok: bool, error: str) -> None:
        with self._lock:
            if ok != self.is_registered or error != self.error:
                if ok:
                    log.info("kubelet registered DRA driver %s", dra_names.DRIVER_NAME)
                else:
                    log.warning("kubelet refused DRA driver %s: %s", dra_names.DRIVER_NAME, error)
            self.is_registered, self.error = ok, error
        self.changed.set()


class _DraService:
    """DRAPlugin of one protocol version (`pb`: its messages); v1 and v1beta1 differ only in share_id."""

    def __init__(self, pb: Any, preparer: preparing.Preparer, *, with_share_id: bool) -> None:
        self._pb = pb
        self._preparer = preparer
        self._with_share_id = with_share_id

    def _device(self, device: checkpoint.PreparedDevice) -> Any:
        fields: dict[str, Any] = {"request_names": list(device.requests), "pool_name": device.pool,
                                  "device_name": device.device, "cdi_device_ids": list(device.cdi_ids)}  # fmt: skip
        if self._with_share_id and device.share_id:
            fields["share_id"] = device.share_id
        return self._pb.Device(**fields)

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        answer = self._pb.NodePrepareResourcesResponse()
        for claim in request.claims:
            ref = preparing.ClaimRef(namespace=claim.namespace, name=claim.name, uid=claim.uid)
            try:
                entry = self._preparer.prepare(ref)
            except (preparing.PrepareFailed, checkpoint.CheckpointCorrupt, OSError, ValueError) as e:
                log.warning("DRA prepare of %s failed: %s", ref, e)
                answer.claims[claim.uid].CopyFrom(self._pb.NodePrepareResourceResponse(error=str(e)))
                continue
            answer.claims[claim.uid].CopyFrom(
                self._pb.NodePrepareResourceResponse(devices=[self._device(d) for d in entry.devices])
            )
        return answer

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        answer = self._pb.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            ref = preparing.ClaimRef(namespace=claim.namespace, name=claim.name, uid=claim.uid)
            try:
                self._preparer.unprepare(ref)
            except (checkpoint.CheckpointCorrupt, OSError) as e:
                log.warning("DRA unprepare of %s failed: %s", ref, e)
                answer.claims[claim.uid].CopyFrom(self._pb.NodeUnprepareResourceResponse(error=str(e)))
                continue
            answer.claims[claim.uid].CopyFrom(self._pb.NodeUnprepareResourceResponse())
        return answer


def _listen(server: grpc.Server, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise FileExistsError(f"{path} exists and is not a socket; remove it or choose another --dra-kubelet-dir")
        path.unlink()  # left by an earlier run
    with private_socket.binding(path) as staged:
        if not server.add_insecure_port(f"unix://{staged}"):
            raise OSError(f"cannot listen on {path}")


class KubeletPlugin:
    """Both servers; `start` serves the DRA service first, then offers the registration (kubelet
    connects to the service as soon as it reads GetInfo), `stop` withdraws the registration first."""

    def __init__(self, preparer: preparing.Preparer, *, kubelet_dir: Path, workers: int = 4) -> None:
        self.kubelet_dir = kubelet_dir
        self.state = PluginState()
        self._service_path = service_socket(kubelet_dir)
        self._registration_path = registration_socket(kubelet_dir)
        self._service = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dra"))
        protocol.dra_v1_services.add_DRAPluginServicer_to_server(
            _DraService(protocol.dra_v1_pb, preparer, with_share_id=True), self._service)
        protocol.dra_v1beta1_services.add_DRAPluginServicer_to_server(
            _DraService(protocol.dra_v1beta1_pb, preparer, with_share_id=False), self._service)
        self._registration = grpc.server(futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="dra-reg"))
        protocol.registration_services.add_RegistrationServicer_to_server(
            _Registration(self._service_path, self.state), self._registration)

    def start(self) -> None:
        """Listen on both sockets; on failure nothing is left behind."""
        try:
            _listen(self._service, self._service_path)
            self._service.start()
            _listen(self._registration, self._registration_path)
            self._registration.start()
        except BaseException:
            self.stop()
            raise
        log.info("DRA driver %s serving on %s", dra_names.DRIVER_NAME, self._service_path)

    def stop(self) -> None:
        """Stop serving and remove the sockets (kubelet's watcher sees the registration go)."""
        for server, path in ((self._registration, self._registration_path), (self._service, self._service_path)):
            server.stop(None)
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISSOCK(path.lstat().st_mode):
                    path.unlink()
