"""Controller processes for the race and crash tests, and the invariants both check.

Every controller here is a real `python -m elasticgpu controller` process (watches, the
binder thread, the resync loop), started in its own session so that `kill -9` hits it alone, and
killed by `ControllerProcesses.close` whatever happens in the test. Every wait has a deadline.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from elasticgpu.api import names
from elasticgpu.controller.edge.kube import KubeApi
from tests import spawning
from tests.kube_cluster import REPO_ROOT

T = TypeVar("T")


@dataclass
class ControllerProcesses:
    """Started controller processes; `close` kills every one still alive."""

    kubeconfig: Path
    namespace: str | None
    """The namespace the controllers are limited to; None: cluster-wide (the default mode)."""
    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    flags: list[str] = field(default_factory=lambda: ["--no-leader-elect", "--health-port", "0"])
    """More command-line flags. Without leader election by default: these tests race controllers
    on purpose (the binding protocol, not a Lease, must keep cards from oversubscription)."""

    def start(self, *, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """One more controller process, logging into `log_dir/controller-<n>.log`; `env` adds to
        the environment of this one (e.g. `ELASTICGPU_WATCH=kopf`)."""
        log = self.log_dir / f"controller-{len(self.procs)}.log"
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **self.env, **(env or {})}
        with log.open("wb") as out:
            proc = spawning.spawn(
                [sys.executable, "-m", "elasticgpu", "controller", "--kubeconfig", str(self.kubeconfig),
                 *(["--namespace", self.namespace] if self.namespace else []), "--log-level", "warning",
                 *self.flags],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO_ROOT, env=env,
                start_new_session=True,
            )  # fmt: skip
        self.procs.append(proc)
        return proc

    @staticmethod
    def kill(proc: subprocess.Popen[bytes]) -> None:
        """kill -9, and reap it (bounded)."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=15)

    def close(self) -> None:
        for proc in self.procs:
            self.kill(proc)

    def logs(self, lines: int = 30) -> str:
        """The last lines of every controller's log, for a failure message."""
        parts = []
        for path in sorted(self.log_dir.glob("controller-*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)


def wait_quiescent(kube: KubeApi, namespace: str, *, quiet_s: float, deadline_s: float,
                   done: Any = None, procs: ControllerProcesses | None = None,
                   explain: Callable[[], str] | None = None, stall_s: float | None = None) -> list[dict[str, Any]]:
    """Poll the namespace's claims until none changed for `quiet_s` seconds (and `done(claims)`,
    when given, holds); returns them. Fails after `deadline_s` seconds, with what `explain()`
    says and the controllers' logs; with `stall_s`, also once no claim changed for `stall_s` seconds
    while `done` does not hold (a deadline from progress: a loaded machine that is slow but moving
    gets up to `deadline_s`, one that settled short of `done` fails without waiting for it)."""
    start = time.monotonic()
    last: tuple[Any, ...] | None = None
    since = start
    while True:
        claims = kube.list_claims(namespace)
        now = time.monotonic()
        signature = tuple(sorted((c["metadata"]["name"], c["metadata"]["resourceVersion"]) for c in claims))
        if signature != last:
            last, since = signature, now
        elif now - since >= quiet_s and (done is None or done(claims)):
            return claims
        if now - start > deadline_s or (stall_s is not None and now - since > stall_s):
            phases = Counter((c.get("status") or {}).get("phase") for c in claims)
            raise AssertionError(f"not quiescent after {now - start:.0f}s ({now - since:.0f}s since a claim last"
                                 f" changed): {dict(phases)}\n"
                                 + (explain() + "\n" if explain else "") + (procs.logs() if procs else ""))
        time.sleep(0.5)


def eventually(check: Callable[[], T], *, deadline_s: float, explain: Callable[[], str] | None = None) -> T:
    """`check()` once it stops failing (an AssertionError); the last failure, with what
    `explain()` says, after `deadline_s`. For what a controller repairs in the background after
    the claims are quiet: a deleted claim's ElasticGPU whose reclaim is retried with backoff."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return check()
        except AssertionError as failure:
            if time.monotonic() > deadline:
                raise AssertionError(f"{failure}\n{explain() if explain else ''}") from failure
        time.sleep(1.0)


def room_report(kube: KubeApi, namespace: str, gpu_names: list[str]) -> str:
    """Who holds the cards' room, for a failure message: the reasons of the Pending claims, and
    every reservation that does not serve a Bound claim (with its ElasticGPU's and claim's phase)."""
    claims = {c["metadata"]["name"]: c for c in kube.list_claims(namespace)}
    egpus = {e["metadata"]["name"]: e for e in kube.list_elastic_gpus()}
    serving = {c["spec"].get("elasticGPUName") for c in claims.values()
               if (c.get("status") or {}).get("phase") == "Bound"}
    reasons = Counter((c.get("status") or {}).get("reason") for c in claims.values()
                      if (c.get("status") or {}).get("phase") != "Bound")
    idle = []
    for gpu_name in gpu_names:
        for allocation in (kube.get_gpu(gpu_name).get("status") or {}).get("allocations") or []:
            key = allocation["elasticGPU"]
            if key in serving:
                continue
            egpu = egpus.get(key)
            ref = (egpu or {}).get("spec", {}).get("claimRef") or allocation.get("claimRef") or {}
            claim = claims.get(ref.get("name", ""))
            idle.append(f"{gpu_name}: {key} (ElasticGPU {((egpu or {}).get('status') or {}).get('phase', 'missing')}"
                        f", claim {ref.get('name')} {((claim or {}).get('status') or {}).get('phase', 'missing')})")
    return f"not Bound, by reason: {dict(reasons)}; reservations serving no Bound claim: {idle or 'none'}"


def check_invariants(kube: KubeApi, namespace: str, claims: list[dict[str, Any]], gpu_names: list[str]) -> Counter[str]:
    """What both promises mean, read from the server. Returns the claims' phases."""
    # No card oversubscribed: the reservations on each card fit its cores and memory.
    held_by: Counter[str] = Counter()
    for gpu_name in gpu_names:
        gpu = kube.get_gpu(gpu_name)
        allocations = (gpu.get("status") or {}).get("allocations") or []
        assert sum(a["cores"] for a in allocations) <= names.CORES_PER_CARD, (gpu_name, allocations)
        assert sum(a["memory"] for a in allocations) <= gpu["spec"]["memory"], (gpu_name, allocations)
        keys = [a["elasticGPU"] for a in allocations]
        assert len(keys) == len(set(keys)), (gpu_name, keys)
        held_by.update(keys)
    # Every claim is Bound, or Pending with a reason.
    phases: Counter[str] = Counter()
    for claim in claims:
        status = claim.get("status") or {}
        phase = status.get("phase")
        phases[str(phase)] += 1
        assert phase in ("Bound", "Pending"), (claim["metadata"]["name"], status)
        conditions = status.get("conditions") or []
        assert conditions and conditions[0].get("reason"), (claim["metadata"]["name"], status)
    # No two ElasticGPUs for one claim; every Bound claim's ElasticGPU exists and points back.
    egpus = {e["metadata"]["name"]: e for e in kube.list_elastic_gpus()
             if (e["spec"].get("claimRef") or {}).get("namespace") == namespace}
    per_uid = Counter(e["spec"]["claimRef"].get("uid") for e in egpus.values())
    assert max(per_uid.values(), default=1) == 1, [u for u, n in per_uid.items() if n > 1]
    uids = {c["metadata"]["uid"] for c in claims}
    strays = sorted(f"{name} ({(e.get('status') or {}).get('phase')}, claim {e['spec']['claimRef'].get('name')})"
                    for name, e in egpus.items() if e["spec"]["claimRef"].get("uid") not in uids)
    assert not strays, f"ElasticGPUs point to claims that do not exist: {strays[:10]}"
    bound_to: Counter[str] = Counter()
    for claim in claims:
        if claim["status"]["phase"] != "Bound":
            continue
        egpu_name = claim["spec"].get("elasticGPUName")
        bound_to[egpu_name] += 1
        egpu = egpus.get(egpu_name)
        assert egpu is not None, (claim["metadata"]["name"], egpu_name)
        assert egpu["spec"]["claimRef"]["uid"] == claim["metadata"]["uid"]
        assert egpu["spec"]["claimRef"]["name"] == claim["metadata"]["name"]
        assert (egpu.get("status") or {}).get("phase") == "Bound", egpu.get("status")
        assert held_by[egpu_name] >= 1, f"{egpu_name} holds no reservation"
    assert max(bound_to.values(), default=1) == 1
    # Every reservation belongs to an ElasticGPU of a Bound claim (no leaked capacity).
    assert set(held_by) <= set(bound_to), sorted(set(held_by) - set(bound_to))[:5]
    return phases


class CardSampler:
    """Reads one GPU's reservations every `every_s` on a thread of its own, keeping the sums:
    what a racing test checks was never over the card, at any moment it could see."""

    def __init__(self, kube: KubeApi, gpu: str, every_s: float = 0.02) -> None:
        self.kube = kube
        self.gpu = gpu
        self.every_s = every_s
        self.sums: list[tuple[int, int]] = []
        """(cores, memory MiB) reserved at each reading."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name=f"sample-{gpu}", daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.every_s):
            allocations = (self.kube.get_gpu(self.gpu).get("status") or {}).get("allocations") or []
            self.sums.append((sum(a["cores"] for a in allocations), sum(a["memory"] for a in allocations)))

    def start(self) -> None:
        """Start reading."""
        self._thread.start()

    def stop(self) -> None:
        """Stop reading (bounded wait)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def assert_never_over(self, memory_mib: int) -> None:
        """Every reading within 100 cores and `memory_mib`, and at least one reading made."""
        assert self.sums, f"no reading of {self.gpu} was made"
        assert max(c for c, _m in self.sums) <= 100, max(self.sums)
        assert max(m for _c, m in self.sums) <= memory_mib, max(self.sums, key=lambda s: s[1])
