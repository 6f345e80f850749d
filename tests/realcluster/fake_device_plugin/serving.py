"""The fake device plugin's process: serve DevicePlugin on `<dir>/nvidia-gpu.sock` (NVIDIA's own socket name),
register `nvidia.com/gpu` at `<dir>/kubelet.sock`, stream the cards as healthy, answer Allocate with
`NVIDIA_VISIBLE_DEVICES=<ids>` (what NVIDIA's plugin does in its envvar strategy). Each Allocate is printed as one
line `allocated <ids> at <epoch>` for the test to read. On TERM it stops and removes its socket, as the plugin's
pod does when the GPU Operator takes it off the node."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from tests.realcluster.fake_device_plugin.api import API_VERSION, pb, services

RESOURCE = "nvidia.com/gpu"
SOCKET = "nvidia-gpu.sock"
KUBELET_SOCKET = "kubelet.sock"
REGISTER_WITHIN_S = 120.0


class FakeNvidiaPlugin(services.DevicePluginServicer):  # type: ignore[misc]
    """Every card healthy, handed out by its id."""

    def __init__(self, ids: list[str], stop: threading.Event) -> None:
        self._ids = ids
        self._stop = stop

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return pb.DevicePluginOptions(get_preferred_allocation_available=True)

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:
        yield pb.ListAndWatchResponse(devices=[pb.Device(ID=i, health="Healthy") for i in self._ids])
        while context.is_active() and not self._stop.wait(1.0):
            pass

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        answers = []
        for asked in request.container_requests:
            must = list(asked.must_include_deviceIDs)
            rest = [i for i in asked.available_deviceIDs if i not in must]
            answers.append(pb.ContainerPreferredAllocationResponse(deviceIDs=(must + rest)[: asked.allocation_size]))
        return pb.PreferredAllocationResponse(container_responses=answers)

    def Allocate(self, request: Any, context: Any) -> Any:
        answers = []
        for asked in request.container_requests:
            ids = ",".join(asked.devices_ids)
            print(f"allocated {ids} at {time.time():.3f}", flush=True)
            answers.append(pb.ContainerAllocateResponse(envs={"NVIDIA_VISIBLE_DEVICES": ids}))
        return pb.AllocateResponse(container_responses=answers)

    def PreStartContainer(self, request: Any, context: Any) -> Any:
        return pb.PreStartContainerResponse()


def register(folder: Path, stop: threading.Event) -> None:
    """Register with kubelet, retrying until its socket answers (it may be starting)."""
    deadline = time.monotonic() + REGISTER_WITHIN_S
    while True:
        try:
            with grpc.insecure_channel(f"unix://{folder / KUBELET_SOCKET}") as channel:
                services.RegistrationStub(channel).Register(pb.RegisterRequest(
                    version=API_VERSION, endpoint=SOCKET, resource_name=RESOURCE,
                    options=pb.DevicePluginOptions(get_preferred_allocation_available=True)), timeout=10)  # fmt: skip
            print(f"registered {RESOURCE} with kubelet", flush=True)
            return
        except grpc.RpcError as e:
            if time.monotonic() > deadline or stop.is_set():
                raise SystemExit(f"kubelet did not take the registration: {e}") from e
            time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fake_device_plugin")
    parser.add_argument("--dir", required=True, type=Path, help="kubelet's device-plugin folder")
    parser.add_argument("--ids", required=True, help="the cards' ids, comma-separated")
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    path = args.dir / SOCKET
    path.unlink(missing_ok=True)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    services.add_DevicePluginServicer_to_server(FakeNvidiaPlugin(args.ids.split(","), stop), server)
    server.add_insecure_port(f"unix://{path}")
    server.start()
    try:
        register(args.dir, stop)
        stop.wait()
    finally:
        server.stop(grace=1).wait(5)
        path.unlink(missing_ok=True)
        print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
