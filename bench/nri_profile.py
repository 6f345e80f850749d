"""Where the NRI path's time goes: the NRI front served in this process, each step timed.

    python bench/nri_profile.py                      # 5 rounds of 25 creates per path
    python bench/nri_profile.py --rounds 3 --creates 10 --cprofile

One containerd 1.7 with NRI switched on, the agent's Go plugin registered in blocks that rotate:

    none     no plugin registered
    noop     the plugin, answered `{}` at once (containerd's NRI round trip and the relay)
    fixed    the plugin, answered at once with the adjustment the real front gave first (the same
             device nodes, env and annotation): what containerd pays to apply it
    nri      the real NRI front on the claim hooks and a SQLite ledger

Prints p50/p99 per path, then p50 of each step inside the front (the handler, prepare_create,
cdi.resolve, the adjustment, the JSON in and out); --cprofile adds cProfile of the handler thread.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import pstats
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import grpc  # noqa: E402
from percentiles import percentile  # noqa: E402

from elasticgpu.agent.cri import api  # noqa: E402
from elasticgpu.agent.injecting import cdi, claim_hooks  # noqa: E402
from elasticgpu.agent.ledger import store  # noqa: E402
from elasticgpu.agent.nri import FrontServer, NriFront, PluginProcess, PluginSettings, serving, translating  # noqa: E402
from tests.agent.cri.node import View, publish_cards, slice_claim  # noqa: E402
from tests.agent.nri.conftest import plugin_binary  # noqa: E402
from tests.containerd_runtime import container_config, running_containerd, sandbox_config  # noqa: E402

pb = api.pb
steps: dict[str, list[float]] = {}


def timed(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter_ns()
        try:
            return f(*args, **kwargs)
        finally:
            steps.setdefault(name, []).append((time.perf_counter_ns() - began) / 1e6)

    return call


class Canned:
    """A front answering at once: `{}`, or (fixed) the first adjustment the real front gave."""

    def __init__(self, answer: Callable[[], dict[str, Any]]) -> None:
        self.synchronized = threading.Event()
        self._answer = answer

    def handle(self, message: Mapping[str, Any]) -> dict[str, Any]:
        if message.get("op") == "synchronize":
            self.synchronized.set()
        return self._answer() if message.get("op") == "create" else {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--creates", type=int, default=25)
    parser.add_argument("--cprofile", action="store_true")
    args = parser.parse_args()
    profile = cProfile.Profile()
    first: dict[str, Any] = {}
    handle = NriFront.handle

    def front_handle(self: NriFront, message: Mapping[str, Any]) -> dict[str, Any]:
        if message.get("op") != "create":
            return handle(self, message)
        if args.cprofile:
            profile.enable()
        try:
            answer = timed("handler (create)", handle)(self, message)
            first.setdefault("answer", answer)
            return answer
        finally:
            if args.cprofile:
                profile.disable()

    NriFront.handle = front_handle  # type: ignore[method-assign]
    serving.json = type("Json", (), {"loads": staticmethod(timed("json in", json.loads)),  # type: ignore[assignment]
                                     "dumps": staticmethod(timed("json out", json.dumps))})  # fmt: skip
    translating.adjustment = timed("adjustment (cdi.resolve in it)", translating.adjustment)  # type: ignore[assignment]
    cdi.resolve = timed("cdi.resolve", cdi.resolve)  # type: ignore[assignment]
    claim_hooks.ClaimHooks.prepare_create = timed(  # type: ignore[method-assign]
        "prepare_create", claim_hooks.ClaimHooks.prepare_create)
    with contextlib.ExitStack() as stack:
        runtime = stack.enter_context(running_containerd(nri=True))
        assert runtime.nri_socket is not None
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="egprof-", dir="/tmp")))
        publish_cards(runtime.cdi_dir, runtime.directory / "dev")
        view = View()
        view.add(slice_claim("bench", "slice", user="gpu"))
        ledger = store.LedgerStore.open(f"sqlite:///{tmp}/ledger.db")
        core = claim_hooks.ClaimHooks(view=view, ledger=ledger)
        stack.callback(ledger.close)
        stack.callback(core.close)
        direct = api.services.RuntimeServiceStub(stack.enter_context(grpc.insecure_channel(runtime.endpoint)))
        pod = sandbox_config(name="gpu", namespace="bench", uid="uid-gpu",
                             annotations={"egpuc.elasticgpu.io/main": "slice"})  # fmt: skip
        pod_id = direct.RunPodSandbox(pb.RunPodSandboxRequest(config=pod)).pod_sandbox_id
        request = pb.CreateContainerRequest(pod_sandbox_id=pod_id, sandbox_config=pod,
                                            config=container_config(name="main", image=runtime.image, sandbox=pod))

        def block(n: int) -> list[float]:
            times = []
            for _ in range(n):
                began = time.perf_counter_ns()
                answer = direct.CreateContainer(request, timeout=30)
                times.append((time.perf_counter_ns() - began) / 1e6)
                direct.RemoveContainer(pb.RemoveContainerRequest(container_id=answer.container_id), timeout=30)
            return times

        def registered(front: Any, n: int) -> list[float]:
            socket = tmp / "agent.sock"
            server = FrontServer(front, socket).start()
            stop = threading.Event()
            plugin = PluginProcess(PluginSettings(binary=plugin_binary(), nri_socket=runtime.nri_socket,
                                                  agent_socket=socket))  # fmt: skip
            thread = threading.Thread(target=plugin.run, args=(stop,), daemon=True)
            thread.start()
            try:
                assert front.synchronized.wait(30), "the plugin did not register"
                block(1)  # untimed warm-up
                return block(n)
            finally:
                stop.set()
                thread.join(10)
                server.close()
                time.sleep(0.3)

        paths: dict[str, Callable[[int], list[float]]] = {
            "none": block,
            "noop": lambda n: registered(Canned(dict), n),
            "nri": lambda n: registered(NriFront(hooks=core, view=view, cdi_dir=runtime.cdi_dir), n),
            "fixed": lambda n: registered(Canned(lambda: first["answer"]), n),
        }
        times: dict[str, list[float]] = {name: [] for name in paths}
        names = list(paths)
        for r in range(args.rounds):
            for j in range(len(names)):
                name = names[(r + j) % len(names)]  # round 0: nri before fixed, which replays nri's answer
                times[name].extend(paths[name](args.creates))
        base = percentile(times["none"], 0.5)
        for name in names:
            p50, p99 = percentile(times[name], 0.5), percentile(times[name], 0.99)
            print(f"CreateContainer, {name:<6} {len(times[name]):>5}  p50 {p50:7.3f} p99 {p99:7.3f}  "
                  f"(p50 {p50 - base:+.3f} over none)")  # fmt: skip
        for step, values in steps.items():
            print(f"  in the front: {step:<32} n={len(values):>5} p50 {percentile(values, 0.5):.3f}")
        if args.cprofile:
            out = io.StringIO()
            pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(30)
            print(out.getvalue())


if __name__ == "__main__":
    main()
