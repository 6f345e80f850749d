"""Long calls never starve short ones (issue 15, item 7): with 40 `ExecSync sleep 4` in flight
through the proxy (exec probes of a busy node), a `Version` is answered at once. Real containerd."""

from __future__ import annotations

import threading
import time

import grpc

from elasticgpu.agent.cri import api
from tests.agent.cri.kubelet import Kubelet

pb = api.pb
LONG_CALLS = 40  # more than the short pool's 32 threads
LONG_S = 4


def test_version_is_answered_while_forty_execs_run(kubelet: Kubelet) -> None:
    pod = kubelet.run_pod("starvation")
    container_id = kubelet.create_container(pod, "main")
    kubelet.start(container_id)
    finished: list[int] = []
    failures: list[BaseException] = []

    def long_call() -> None:
        try:
            answer = kubelet.runtime.ExecSync(
                pb.ExecSyncRequest(container_id=container_id, cmd=["sleep", str(LONG_S)], timeout=LONG_S + 20),
                timeout=LONG_S + 30,
            )
            finished.append(answer.exit_code)
        except grpc.RpcError as e:
            failures.append(e)

    threads = [threading.Thread(target=long_call, daemon=True) for _ in range(LONG_CALLS)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # the execs reach the proxy and hold their threads
    assert not finished, "an exec of sleep 4 ended within a second: the load is not there"
    began = time.monotonic()
    version = kubelet.runtime.Version(pb.VersionRequest(), timeout=LONG_S + 10)
    took = time.monotonic() - began
    assert version.runtime_name == "containerd"
    # Generous: about 2 ms here; a starved pool answers only when the first execs end (~3 s).
    assert took < 1.0, f"Version took {took:.2f} s behind {LONG_CALLS} ExecSync calls: short calls starve"
    for thread in threads:
        thread.join(timeout=LONG_S + 40)
    assert not failures, failures[:3]
    assert finished == [0] * LONG_CALLS
    assert time.monotonic() - started < LONG_S * 3, "the execs did not run side by side"
