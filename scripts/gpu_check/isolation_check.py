#!/usr/bin/env python3
"""GPU check of the isolation modes (issue 25, docs/isolation.md), for a machine with a real NVIDIA card.

Needs only the system's Python 3 and the NVIDIA driver (ctypes on libcuda.so.1 and libnvidia-ml.so.1;
no pip, no CUDA toolkit). It never changes the card's MIG or MPS settings: MPS runs as a control daemon
of its own (own pipe and log folders, in a temporary folder), quit at the end.

    python3 scripts/gpu_check/isolation_check.py discover              # NVML: driver, cards, MIG, memory
    python3 scripts/gpu_check/isolation_check.py run                   # every mode, a 10 GiB / 30% slice
    python3 scripts/gpu_check/isolation_check.py run --modes mps --memory-mib 4096 --cores 25 --json out.json
    python3 scripts/gpu_check/isolation_check.py run --hami-core-library /usr/local/vgpu/libvgpu.so

`run`, for each mode, starts a child process set up as the agent sets up a container of that mode,
which allocates device memory in chunks until the driver (or the limiter) refuses, and reports the
ceiling it reached against the slice:

    none      CUDA_VISIBLE_DEVICES=<card>; the limits are advice: expect about the card's free memory
    mps       the card's own MPS control daemon, CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
              "0=<MiB>M", CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: expect the slice. As root, run as the agent
              runs them: a 64 MiB tmpfs is the daemon's /dev/shm (own mount namespace) and the child's
              (own mount and IPC namespaces, as a container); so a pass also says the clients of a
              container reach the daemon. Not root: both share the host's /dev/shm (extra.shm says which)
    hami      LD_PRELOAD of the given libvgpu.so (as /etc/ld.so.preload would), CUDA_DEVICE_MEMORY_LIMIT_0,
              CUDA_DEVICE_SM_LIMIT, CUDA_DEVICE_MEMORY_SHARED_CACHE: expect the slice (skipped without it)

A mode is ENFORCED when the ceiling is at most the slice plus the tolerance (a chunk and 5%). Exit code
0 when every enforcing mode that ran was enforced, 1 otherwise, 2 when the driver cannot be loaded.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any

MODES = ("none", "mps", "hami")
SHM_MIB = 64  # the agent's default --mps-shm-size-mib
# The agent's wrapper (elasticgpu/agent/isolation/mps_daemons.py): the shared tmpfs at /dev/shm of a new
# mount namespace only, then exec.
BIND_AND_EXEC = 'shm=$1; shift; mount --bind "$shm" /dev/shm && exec "$@"'
ENFORCING = ("mps", "hami")
MIB = 1 << 20
MPS_CONTROL = "nvidia-cuda-mps-control"


# -- the driver through ctypes -------------------------------------------------------------------


class DriverMissing(Exception):
    """libcuda or libnvidia-ml cannot be loaded (no NVIDIA driver here)."""


def _load(name: str) -> Any:
    try:
        return ctypes.CDLL(name)
    except OSError as e:
        raise DriverMissing(f"{name}: {e}") from e


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def discover() -> dict[str, Any]:
    """The driver and every card as NVML reports them."""
    nvml = _load("libnvidia-ml.so.1")

    def check(code: int, what: str) -> None:
        if code != 0:
            raise RuntimeError(f"NVML {what} failed with {code}")

    check(nvml.nvmlInit_v2(), "nvmlInit_v2")
    try:
        text = ctypes.create_string_buffer(96)
        check(nvml.nvmlSystemGetDriverVersion(text, 96), "nvmlSystemGetDriverVersion")
        driver = text.value.decode()
        count = ctypes.c_uint()
        check(nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)), "nvmlDeviceGetCount_v2")
        cards = []
        for index in range(count.value):
            handle = ctypes.c_void_p()
            check(nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)), "nvmlDeviceGetHandleByIndex_v2")
            check(nvml.nvmlDeviceGetName(handle, text, 96), "nvmlDeviceGetName")
            name = text.value.decode()
            check(nvml.nvmlDeviceGetUUID(handle, text, 96), "nvmlDeviceGetUUID")
            uuid = text.value.decode()
            memory = _Memory()
            check(nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)), "nvmlDeviceGetMemoryInfo")
            current, pending = ctypes.c_uint(), ctypes.c_uint()
            mig = None if nvml.nvmlDeviceGetMigMode(handle, ctypes.byref(current), ctypes.byref(pending)) else bool(
                current.value)
            mode = ctypes.c_int()
            compute = None if nvml.nvmlDeviceGetComputeMode(handle, ctypes.byref(mode)) else mode.value
            cards.append({"index": index, "uuid": uuid, "name": name, "memory_mib": memory.total // MIB,
                          "free_mib": memory.free // MIB, "mig": mig, "compute_mode": compute})
    finally:
        nvml.nvmlShutdown()
    return {"driver": driver, "cards": cards}


def ceiling(chunk_mib: int, limit_mib: int) -> dict[str, Any]:
    """Allocate `chunk_mib` at a time on device 0 until refused (or `limit_mib` in all); what was reached."""
    cuda = _load("libcuda.so.1")
    result: dict[str, Any] = {"allocated_mib": 0, "stopped_by": "", "free_mib": None, "total_mib": None}
    code = cuda.cuInit(0)
    if code != 0:
        result["stopped_by"] = f"cuInit: {_error(cuda, code)}"
        return result
    device = ctypes.c_int()
    context = ctypes.c_void_p()
    if (code := cuda.cuDeviceGet(ctypes.byref(device), 0)) or (code := cuda.cuCtxCreate_v2(
            ctypes.byref(context), 0, device)):
        result["stopped_by"] = f"context: {_error(cuda, code)}"
        return result
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    if cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0:
        result["free_mib"], result["total_mib"] = free.value // MIB, total.value // MIB
    held = []
    try:
        while result["allocated_mib"] + chunk_mib <= limit_mib:
            pointer = ctypes.c_uint64()
            code = cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(chunk_mib * MIB))
            if code != 0:
                result["stopped_by"] = _error(cuda, code)
                break
            held.append(pointer)
            result["allocated_mib"] += chunk_mib
        else:
            result["stopped_by"] = f"the check's own limit ({limit_mib} MiB)"
    finally:
        for pointer in held:
            cuda.cuMemFree_v2(pointer)
        cuda.cuCtxDestroy_v2(context)
    return result


def _error(cuda: Any, code: int) -> str:
    name = ctypes.c_char_p()
    if cuda.cuGetErrorName(code, ctypes.byref(name)) == 0 and name.value:
        return f"{name.value.decode()} ({code})"
    return f"CUDA error {code}"


# -- the modes -----------------------------------------------------------------------------------


@dataclass
class Outcome:
    """One mode's result against the slice."""

    mode: str
    slice_mib: int
    ceiling_mib: int | None = None
    stopped_by: str = ""
    verdict: str = ""  # ENFORCED, NOT ENFORCED, ADVISORY, SKIPPED, FAILED
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def verdict(mode: str, slice_mib: int, ceiling_mib: int | None, chunk_mib: int) -> str:
    """ENFORCED when an enforcing mode stopped within the slice plus the tolerance; ADVISORY for none."""
    if ceiling_mib is None:
        return "FAILED"
    if mode not in ENFORCING:
        return "ADVISORY"
    tolerance = chunk_mib + slice_mib // 20
    return "ENFORCED" if ceiling_mib <= slice_mib + tolerance else "NOT ENFORCED"


def child_env(mode: str, *, uuid: str, memory_mib: int, cores: int, pipe_dir: str = "", library: str = "",
              cache: str = "") -> dict[str, str]:
    """The environment the agent gives a container of `mode` (elasticgpu/agent/isolation)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_MPS_", "CUDA_DEVICE_"))}
    env["CUDA_VISIBLE_DEVICES"] = uuid
    if mode == "mps":
        env.update(CUDA_MPS_PIPE_DIRECTORY=pipe_dir, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=f"0={memory_mib}M",
                   CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=str(cores))
    elif mode == "hami":
        env.update(LD_PRELOAD=library, CUDA_DEVICE_MEMORY_LIMIT_0=f"{memory_mib}m", CUDA_DEVICE_SM_LIMIT=str(cores),
                   CUDA_DEVICE_SM_LIMIT_0=str(cores), CUDA_DEVICE_MEMORY_SHARED_CACHE=cache)
    return env


def with_shm(argv: list[str], shm: str, *, container: bool = False) -> list[str]:
    """`argv` in a mount namespace of its own with `shm` at /dev/shm, as the agent runs an MPS daemon; with
    `container`, also an IPC namespace of its own, as a container of the card (needs root and util-linux)."""
    return ["unshare", "--mount", *(["--ipc"] if container else []), "--propagation", "private", "--", "sh", "-c",
            BIND_AND_EXEC, "isolation-check", shm, *argv]


def _measure(env: dict[str, str], args: argparse.Namespace, shm: str = "") -> dict[str, Any]:
    command = [sys.executable, os.path.abspath(__file__), "ceiling", "--chunk-mib", str(args.chunk_mib),
               "--limit-mib", str(args.limit_mib)]
    if shm:
        command = with_shm(command, shm, container=True)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the ceiling child exited with {done.returncode}: {done.stderr.strip()[-500:]}")
    return dict(json.loads(done.stdout))


def run_mode(mode: str, uuid: str, args: argparse.Namespace, work: str) -> Outcome:
    """One mode: set it up, measure in a child, tear down what was set up."""
    outcome = Outcome(mode=mode, slice_mib=args.memory_mib)
    daemon_env: dict[str, str] | None = None
    control = shutil.which(MPS_CONTROL) or ""
    shm = ""  # the daemon's and the child's /dev/shm when run as the agent runs them
    try:
        if mode == "mps":
            if not control:
                outcome.verdict, outcome.detail = "SKIPPED", f"{MPS_CONTROL} not found in PATH"
                return outcome
            pipe, logs = os.path.join(work, "mps-pipe"), os.path.join(work, "mps-log")
            os.makedirs(pipe, exist_ok=True)
            os.makedirs(logs, exist_ok=True)
            if os.geteuid() == 0 and shutil.which("unshare"):
                shm = os.path.join(work, "mps-shm")
                os.makedirs(shm, exist_ok=True)
                subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SHM_MIB}m,mode=1777,nosuid,nodev,noexec",
                                "isolation-check-shm", shm], check=True, timeout=30)
                outcome.extra["shm"] = f"a {SHM_MIB} MiB tmpfs shared by the daemon and the child (own namespaces)"
            else:
                outcome.extra["shm"] = "the host's /dev/shm (not root: daemon and child in one namespace)"
            daemon_env = {**os.environ, "CUDA_VISIBLE_DEVICES": uuid, "CUDA_MPS_PIPE_DIRECTORY": pipe,
                          "CUDA_MPS_LOG_DIRECTORY": logs}
            daemon = with_shm([control, "-d"], shm) if shm else [control, "-d"]
            subprocess.run(daemon, env=daemon_env, check=True, timeout=30, start_new_session=True,
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            env = child_env(mode, uuid=uuid, memory_mib=args.memory_mib, cores=args.cores, pipe_dir=pipe)
        elif mode == "hami":
            if not args.hami_core_library or not os.path.isfile(args.hami_core_library):
                outcome.verdict, outcome.detail = "SKIPPED", "no --hami-core-library file"
                return outcome
            cache = os.path.join(work, "vgpu.cache")
            env = child_env(mode, uuid=uuid, memory_mib=args.memory_mib, cores=args.cores,
                            library=args.hami_core_library, cache=cache)
        else:
            env = child_env(mode, uuid=uuid, memory_mib=args.memory_mib, cores=args.cores)
        measured = _measure(env, args, shm)
        outcome.ceiling_mib = int(measured["allocated_mib"])
        outcome.stopped_by = str(measured["stopped_by"])
        outcome.extra.update({k: measured.get(k) for k in ("free_mib", "total_mib")})
        outcome.verdict = verdict(mode, args.memory_mib, outcome.ceiling_mib, args.chunk_mib)
    except Exception as e:  # one mode failing must not hide the others' results
        outcome.verdict, outcome.detail = "FAILED", f"{type(e).__name__}: {e}"
    finally:
        if daemon_env is not None:
            subprocess.run(with_shm([control], shm) if shm else [control], input="quit\n", env=daemon_env,
                           text=True, timeout=30, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if shm:
            subprocess.run(["umount", "-l", shm], check=False, timeout=30)
    return outcome


def render(discovered: dict[str, Any], card: dict[str, Any], outcomes: list[Outcome], args: argparse.Namespace) -> str:
    """The human report."""
    lines = [f"driver {discovered.get('driver', '?')}, {len(discovered.get('cards', []))} card(s); checked card "
             f"{card.get('index')} {card.get('uuid')} {card.get('name')} ({card.get('memory_mib')} MiB, "
             f"MIG {card.get('mig')})",
             f"slice: {args.memory_mib} MiB, {args.cores}% cores; chunks of {args.chunk_mib} MiB",
             f"{'mode':<6} {'ceiling MiB':>12} {'slice MiB':>10}  verdict        stopped by / detail"]
    for o in outcomes:
        ceiling_text = "-" if o.ceiling_mib is None else str(o.ceiling_mib)
        lines.append(f"{o.mode:<6} {ceiling_text:>12} {o.slice_mib:>10}  {o.verdict:<14} {o.stopped_by or o.detail}")
    return "\n".join(lines)


def exit_code(outcomes: list[Outcome]) -> int:
    """0 when every enforcing mode that ran was enforced (and none failed), else 1."""
    bad = [o for o in outcomes if o.verdict in ("NOT ENFORCED", "FAILED")]
    return 1 if bad else 0


def parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    top = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = top.add_subparsers(dest="command", required=True)
    commands.add_parser("discover", help="NVML discovery of the cards, as JSON")
    run = commands.add_parser("run", help="every mode's memory ceiling against a slice")
    run.add_argument("--modes", default=",".join(MODES), help="comma-separated, of " + ", ".join(MODES))
    run.add_argument("--card", type=int, default=0, help="NVML index of the card to check")
    run.add_argument("--memory-mib", type=int, default=10240, help="the slice's memory (MiB)")
    run.add_argument("--cores", type=int, default=30, help="the slice's percent of compute")
    run.add_argument("--chunk-mib", type=int, default=256, help="allocation size (MiB)")
    run.add_argument("--limit-mib", type=int, default=1 << 20, help="stop allocating here in any case (MiB)")
    run.add_argument("--hami-core-library", default="", help="libvgpu.so the node's admin installed")
    run.add_argument("--timeout-s", type=float, default=300.0, help="seconds per mode")
    run.add_argument("--json", default="", help="also write the report as JSON to this file")
    ceiling_command = commands.add_parser("ceiling", help="(internal) allocate until refused, print JSON")
    ceiling_command.add_argument("--chunk-mib", type=int, default=256)
    ceiling_command.add_argument("--limit-mib", type=int, default=1 << 20)
    return top


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and check the command line (bad values exit 2 with the field named)."""
    top = parser()
    args = top.parse_args(argv)
    if args.command == "run":
        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        unknown = [m for m in modes if m not in MODES]
        if unknown or not modes:
            top.error(f"--modes: {', '.join(unknown) or 'empty'}: use any of {', '.join(MODES)}")
        args.modes = modes
        if not 1 <= args.cores <= 100:
            top.error("--cores: must be 1..100 (percent of the card)")
        for name in ("memory_mib", "chunk_mib", "limit_mib"):
            if getattr(args, name) < 1:
                top.error(f"--{name.replace('_', '-')}: must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        if args.command == "ceiling":
            print(json.dumps(ceiling(args.chunk_mib, args.limit_mib)))
            return 0
        discovered = discover()
    except DriverMissing as e:
        print(f"no NVIDIA driver here: {e}", file=sys.stderr)
        return 2
    if args.command == "discover":
        print(json.dumps(discovered, indent=2))
        return 0
    cards = discovered["cards"]
    if not 0 <= args.card < len(cards):
        print(f"--card {args.card}: the driver reports {len(cards)} card(s)", file=sys.stderr)
        return 2
    card = cards[args.card]
    with tempfile.TemporaryDirectory(prefix="egpu-gpu-check-") as work:
        outcomes = [run_mode(mode, card["uuid"], args, work) for mode in args.modes]
    print(render(discovered, card, outcomes, args))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"discovery": discovered, "card": card, "outcomes": [asdict(o) for o in outcomes]}, out, indent=2)
    return exit_code(outcomes)


if __name__ == "__main__":
    raise SystemExit(main())
