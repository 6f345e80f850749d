"""CreateContainer latency with no hook, with the NRI hook and with the CRI proxy, on one containerd.

    python bench/nri_hook.py                    # 5 rounds of 40 creates per path
    python bench/nri_hook.py --rounds 20 --creates 10    # smaller blocks: load that comes and goes hits all
    python bench/nri_hook.py --nri-baseline /tmp/base     # + nri-base: the NRI side of another checkout

Starts the test containerd 1.7 with NRI switched on (tests/containerd_runtime.py), the agent's
CRI proxy as its own process (tests/agent/cri/agent_process.py: claim hooks, SQLite ledger) and,
for the NRI rounds, the agent's NRI side as its own process (tests/agent/nri/agent_process.py:
the NRI front on the same claim hooks, its Go plugin a child). Every create is the same
kubelet request for a container whose pod names a 30% slice claim; each container is removed
(untimed) before the next. The paths, in blocks that rotate every round (the NRI plugin cannot
be registered for one call and not the next), so that drift hits all alike:

    none    the request straight to containerd, no plugin registered: no injection at all
    nri     the request straight to containerd, the agent's plugin registered: containerd asks
            it (ttrpc), it asks the agent (a JSON line on a unix socket), the adjustment comes back
    proxy   the request to the CRI proxy, which decides, rewrites it and forwards it
    nri-noop  as nri, but the plugin's agent answers every event with nothing to change
            (bench/nri_noop_agent.py): containerd's NRI round trip and the plugin's relay alone

The first create after an agent (re)start is made untimed, in every registered block alike.

Prints p50/p99 per path and what each hook adds over none. Goal (issue 34): the NRI hook adds no
more than the proxy does.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import grpc  # noqa: E402
from percentiles import percentile  # noqa: E402

from elasticgpu.agent.cri import api  # noqa: E402
from tests import spawning  # noqa: E402
from tests.agent.cri.node import View, publish_cards, slice_claim  # noqa: E402
from tests.agent.nri.conftest import plugin_binary  # noqa: E402
from tests.containerd_runtime import container_config, running_containerd, sandbox_config  # noqa: E402

pb = api.pb


def start(argv: list[str], ready: str, tree: Path = REPO) -> subprocess.Popen[str]:
    """`argv`: a module and its arguments, or a script (a path ending in .py) and its arguments; `tree`: the
    checkout whose code it runs."""
    command = [sys.executable, *argv] if argv[0].endswith(".py") else [sys.executable, "-m", *argv]
    proc = spawning.spawn(command, cwd=tree, stdout=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONPATH": str(tree)})  # fmt: skip
    assert proc.stdout is not None and select.select([proc.stdout], [], [], 30)[0], f"{argv[0]} did not start"
    assert proc.stdout.readline().strip() == ready
    return proc


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    proc.wait(20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of blocks, one block per path each")
    parser.add_argument("--creates", type=int, default=40, help="CreateContainer calls per block")
    parser.add_argument("--nri-baseline", type=Path, help="another checkout (e.g. `git worktree add /tmp/base "
                        "main`): adds the path nri-base, its agent's NRI side, for before/after in one run")
    args = parser.parse_args()
    plugin = plugin_binary()
    with contextlib.ExitStack() as stack:
        runtime = stack.enter_context(running_containerd(nri=True))
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="egbench-", dir="/tmp")))
        assert runtime.nri_socket is not None
        publish_cards(runtime.cdi_dir, runtime.directory / "dev")
        view = View()
        view.add(slice_claim("bench", "slice", user="gpu"))
        (tmp / "view.json").write_text(view.to_json())
        listen = tmp / "proxy.sock"
        proxy_agent = start(["tests.agent.cri.agent_process", str(listen), str(runtime.socket),
                             f"sqlite:///{tmp}/proxy-ledger.db", f"{tmp}/view.json"], "reconciled")
        stack.callback(stop, proxy_agent)
        direct = api.services.RuntimeServiceStub(stack.enter_context(grpc.insecure_channel(runtime.endpoint)))
        proxy = api.services.RuntimeServiceStub(stack.enter_context(grpc.insecure_channel(f"unix://{listen}")))
        print(f"containerd {direct.Version(pb.VersionRequest()).runtime_version} with NRI, {os.cpu_count()} CPUs, "
              f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}; times in ms")  # fmt: skip
        pod = sandbox_config(name="gpu", namespace="bench", uid="uid-gpu",
                             annotations={"egpuc.elasticgpu.io/main": "slice"})
        pod_id = direct.RunPodSandbox(pb.RunPodSandboxRequest(config=pod)).pod_sandbox_id
        request = pb.CreateContainerRequest(pod_sandbox_id=pod_id, sandbox_config=pod,
                                            config=container_config(name="main", image=runtime.image, sandbox=pod))

        def block(stub: Any, n: int) -> list[float]:
            times = []
            for _ in range(n):
                began = time.perf_counter_ns()
                answer = stub.CreateContainer(request, timeout=30)
                times.append((time.perf_counter_ns() - began) / 1e6)
                # Removed through the same path, which keeps its ledger in step (untimed).
                stub.RemoveContainer(pb.RemoveContainerRequest(container_id=answer.container_id), timeout=30)
            return times

        def registered_block(argv: list[str], n: int, tree: Path = REPO) -> list[float]:
            agent = start(argv, "synchronized", tree)
            try:
                block(direct, 1)  # untimed: the first create after a start pays the agent's warm-up
                return block(direct, n)
            finally:
                stop(agent)
                time.sleep(0.3)  # the plugin exits with its parent: unregistered before the next block

        def nri_block(n: int, tree: Path = REPO) -> list[float]:
            return registered_block(["tests.agent.nri.agent_process", str(runtime.nri_socket),
                                     str(tmp / "nri-agent.sock"), plugin, f"sqlite:///{tmp}/nri-ledger-{tree.name}.db",
                                     f"{tmp}/view.json", str(runtime.cdi_dir)], n, tree)  # fmt: skip

        def noop_block(n: int) -> list[float]:
            return registered_block([str(REPO / "bench" / "nri_noop_agent.py"), str(runtime.nri_socket),
                                     str(tmp / "noop-agent.sock"), plugin], n)  # fmt: skip

        paths = {"none": lambda n: block(direct, n), "nri": nri_block, "proxy": lambda n: block(proxy, n),
                 "nri-noop": noop_block}
        if args.nri_baseline is not None:
            baseline = args.nri_baseline.resolve()
            paths["nri-base"] = lambda n: nri_block(n, baseline)
        times: dict[str, list[float]] = {name: [] for name in paths}
        names = list(paths)
        for r in range(args.rounds):
            for j in range(len(names)):
                name = names[(r + j) % len(names)]
                times[name].extend(paths[name](args.creates))
        base50, base99 = percentile(times["none"], 0.5), percentile(times["none"], 0.99)
        for name in names:
            p50, p99 = percentile(times[name], 0.5), percentile(times[name], 0.99)
            added = "" if name == "none" else f" | added p50 {p50 - base50:+7.3f} p99 {p99 - base99:+7.3f}"
            print(f"CreateContainer, {name:<8} {len(times[name]):>5}  p50 {p50:7.3f} p99 {p99:7.3f}{added}")
        verdicts = []
        for label, q, base in (("p50", 0.5, base50), ("p99", 0.99, base99)):
            nri_added = percentile(times["nri"], q) - base
            proxy_added = percentile(times["proxy"], q) - base
            verdicts.append(f"{label} {'met' if nri_added <= proxy_added else 'MISSED'} ({nri_added:+.3f} vs "
                            f"{proxy_added:+.3f} ms)")
        print(f"goal, NRI adds no more than the proxy: {'; '.join(verdicts)}; load after "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")  # fmt: skip

if __name__ == "__main__":
    main()
