"""`elasticgpu sandbox up | status | down`: the demo's cluster, kept to try things in.

    up      starts, in the background, what the demo starts (the local API server, or with
            `--cluster real` Kubernetes' own control plane; the CRDs; two simulated nodes of two
            A100-80GB cards, their agents, the controller for every namespace, the webhook) plus the
            default class `gpushare` of examples/, and returns once the cards are published and the
            webhook gates pods; it prints the KUBECONFIG to export and what to try.
    status  whether one is up, and its KUBECONFIG.
    down    stops it and everything it started, and removes its files; nothing is left running.

The background process (`sandbox serve`, a session of its own, its log in the sandbox's folder) is
the demo's `running.Demo` that stops after its components phase and waits for SIGTERM, then cleans
up as the demo does. Its children die with it (`processes`: setpriv's death signal), so even a
SIGKILL of it leaves nothing running; `down` sends SIGTERM, waits, and kills the session if it must.

One sandbox per user: its folder is `$TMPDIR/egsandbox-<uid>` (`ELASTICGPU_SANDBOX_DIR` chooses
another), holding `sandbox.json` (the process and its cluster), `sandbox.log` and `kubeconfig`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elasticgpu import user_errors
from elasticgpu.api import names
from elasticgpu.demo import run_frame, sandbox_chart
from elasticgpu.testbed import kube
from elasticgpu.testbed.processes import DemoError

STATE = "sandbox.json"
LOG = "sandbox.log"
KUBECONFIG = "kubeconfig"
UP_TIMEOUT_S = 600.0
"""How long `up` waits for the background process to be ready (a cold control plane on 2 busy cores)."""
DOWN_TIMEOUT_S = 120.0
"""How long `down` waits for the background process to clean up before it kills its session."""
INTERRUPTED = 130
"""Exit code of `up` after Ctrl-C (128 + SIGINT, as a shell reports it)."""
REPO_ROOT = Path(__file__).resolve().parents[2]
CLASS_FILE = REPO_ROOT / "examples" / "class-gpushare.yaml"
"""The default class the sandbox applies, so that a claim naming no class binds, as on an installed cluster."""


class SandboxFailed(user_errors.UserError):
    """The sandbox did not come up; the message says why and where the log is."""


def folder() -> Path:
    """The sandbox's folder (short: the demo's unix sockets live under /tmp too)."""
    override = os.environ.get("ELASTICGPU_SANDBOX_DIR")
    return Path(override) if override else Path(tempfile.gettempdir()) / f"egsandbox-{os.getuid()}"


def read_state(where: Path) -> dict[str, Any] | None:
    """What the sandbox's process wrote of itself, or None when there is none (or half a file)."""
    try:
        loaded = json.loads((where / STATE).read_text())
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


def _write_state(where: Path, state: dict[str, Any]) -> None:
    partial = where / f"{STATE}.part"
    partial.write_text(json.dumps(state))
    partial.replace(where / STATE)  # atomic: `up` and `status` never read half a file


def alive(pid: int) -> bool:
    """True while process `pid` exists (and is not a zombie of ours)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


# up --------------------------------------------------------------------------------------------------


def up(args: argparse.Namespace) -> int:
    """Start the sandbox in the background and wait until it is ready; print how to use it."""
    where = folder()
    state = read_state(where)
    if state is not None and alive(int(state.get("pid", 0))) and state.get("ready"):
        print(f"sandbox: already up ({state.get('cluster')}); `elasticgpu sandbox down` first for a new one")
        _usage(state)
        return 0
    if state is not None and alive(int(state.get("pid", 0))):
        raise SandboxFailed(f"a sandbox is still starting (pid {state.get('pid')}, log {where / LOG});"
                            " wait, or `elasticgpu sandbox down`")
    shutil.rmtree(where, ignore_errors=True)  # one whose process is gone (killed, rebooted): its files only
    where.mkdir(parents=True, mode=0o700)
    command = [sys.executable, "-m", "elasticgpu", "sandbox", "serve", "--cluster", args.cluster,
               "--timeout-s", str(args.timeout_s)]
    if args.no_runtime:
        command.append("--no-runtime")
    if args.install == "chart":
        if args.cluster != "real" or os.geteuid() != 0:
            raise SandboxFailed("--install chart needs --cluster real and root (the box: a network namespace, kubelet,"
                                " containerd), as `elasticgpu demo --cluster real --install chart` does")
        command += ["--install", "chart"]
    print(f"sandbox: starting in the background (log: {where / LOG}) ...", flush=True)
    with (where / LOG).open("ab") as log:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True, cwd=REPO_ROOT)
    shown = 0
    deadline = time.monotonic() + UP_TIMEOUT_S
    try:
        while True:
            shown = _show_progress(where / LOG, shown)
            state = read_state(where)
            if state is not None and state.get("ready"):
                break
            if child.poll() is not None:
                failed = (state or {}).get("failed") or f"it exited ({child.returncode}); the end of its log:\n" + \
                    "\n".join((where / LOG).read_text(errors="replace").splitlines()[-15:])
                shutil.rmtree(where, ignore_errors=True)
                raise SandboxFailed(f"the sandbox did not come up: {failed}")
            if time.monotonic() > deadline:
                _stop(child.pid)
                raise SandboxFailed(f"the sandbox was not ready within {UP_TIMEOUT_S:.0f} s; its log: {where / LOG}")
            time.sleep(0.3)
    except KeyboardInterrupt:
        _stop(child.pid)
        shutil.rmtree(where, ignore_errors=True)
        print("sandbox: interrupted; stopped what it had started", file=sys.stderr)
        return INTERRUPTED
    _show_progress(where / LOG, shown)
    _usage(state)
    return 0


def _show_progress(log: Path, shown: int) -> int:
    """Print the log's lines after the first `shown` (the demo's phase lines), indented; returns the new count."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return shown
    for line in lines[shown:]:
        print(f"  | {line}", flush=True)
    return len(lines)


def _usage(state: dict[str, Any]) -> None:
    kubeconfig = state.get("kubeconfig")
    print(f"""
sandbox: up: {state.get('cluster')}; nodes {', '.join(state.get('nodes') or [])} with simulated cards;
  the controller (every namespace), the webhook, one agent per node; default class gpushare.
{state.get('pods_note', '')}
  export KUBECONFIG={kubeconfig}
  kubectl apply -f examples/workloads/claim-and-pod.yaml      # {state.get('serves', 'or any claim or pod of yours')}
  kubectl get egpuc,egpu,pgpu; kubectl egpu top; kubectl egpu why notebook-gpu
  elasticgpu sandbox down                                     # stops everything, removes its files""")


# status and down ----------------------------------------------------------------------------------------


def status(_args: argparse.Namespace) -> int:
    """Say whether a sandbox is up; exit 0 when it is, 1 when not."""
    where = folder()
    state = read_state(where)
    if state is None or not alive(int(state.get("pid", 0))):
        print("sandbox: none is up (`elasticgpu sandbox up` starts one)")
        return 1
    if not state.get("ready"):
        print(f"sandbox: starting (pid {state.get('pid')}, log {where / LOG})")
        return 0
    print(f"sandbox: up since {state.get('since')}: {state.get('cluster')} (pid {state.get('pid')});"
          f" export KUBECONFIG={state.get('kubeconfig')}")
    return 0


def down(_args: argparse.Namespace) -> int:
    """Stop the sandbox's process (which stops its children and removes its files); remove the folder."""
    where = folder()
    state = read_state(where)
    if state is None or not alive(int(state.get("pid", 0))):
        existed = where.exists()
        shutil.rmtree(where, ignore_errors=True)
        print("sandbox: none is up" + (f" (removed the files of one that was gone: {where})" if existed else ""))
        return 0
    pid = int(state["pid"])
    print(f"sandbox: stopping (pid {pid}) ...", flush=True)
    began = time.monotonic()
    how = _stop(pid)
    shutil.rmtree(where, ignore_errors=True)
    print(f"sandbox: down in {time.monotonic() - began:.0f} s ({how}); removed {where}")
    return 0


def _stop(pid: int) -> str:
    """SIGTERM to the sandbox's process, a wait for its cleanup, then SIGKILL to its session if it must."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + DOWN_TIMEOUT_S
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # our own child (`up` stopping it): reap it
    if not alive(pid):
        return "every process it started stopped"
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)  # its session: it was started with one of its own
    return f"it did not stop within {DOWN_TIMEOUT_S:.0f} s: killed; its children die with it"


# serve: the background process ---------------------------------------------------------------------------


def serve(args: argparse.Namespace) -> int:
    """Run the demo's cluster and components until SIGTERM (or SIGINT), then clean up as the demo does."""
    from elasticgpu.demo import running

    where = folder()
    stop = threading.Event()

    def asked_to_stop(signum: int, _frame: object) -> None:
        stop.set()
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, asked_to_stop)
    signal.signal(signal.SIGINT, asked_to_stop)
    _write_state(where, {"pid": os.getpid(), "ready": False})
    demo_args = argparse.Namespace(kubeconfig=None, context=None, cluster=args.cluster, install="processes",
                                   timeout_s=args.timeout_s, no_runtime=args.no_runtime, no_agent=False,
                                   keep=False, metrics=False, sandbox=True)

    def say(text: str, _style: str | None = None) -> None:
        print(text, flush=True)

    demo: running.Demo | sandbox_chart.ChartSandbox | None = None
    code = 0
    try:
        run_frame.sweep_stale_dirs()
        if args.install == "chart":
            demo = sandbox_chart.ChartSandbox(args, say)
            kept = demo.start()
        else:
            demo = running.Demo(demo_args, say)
            kept = _start_processes(demo, say)
        shutil.copy(kept.pop("kubeconfig_from"), where / KUBECONFIG)
        (where / KUBECONFIG).chmod(0o600)
        _write_state(where, {"pid": os.getpid(), "ready": True, "kubeconfig": str(where / KUBECONFIG),
                             "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **kept})
        say("ready")
        stop.wait()
    except KeyboardInterrupt:
        pass
    except (DemoError, user_errors.UserError) as error:
        _write_state(where, {"pid": os.getpid(), "ready": False, "failed": " ".join(str(error).split())})
        code = 1
    finally:
        # From here on a signal only counts: the cleanup runs to its end (the demo's rule, issue 36).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if demo is not None:
            say("stopping: every process the sandbox started, and its files")
            demo.cleanup()
    return code


def _start_processes(demo: Any, say: Callable[[str], None]) -> dict[str, Any]:
    """The demo's cluster and components up, the defaults applied; the fields of the sandbox's state (with
    `kubeconfig_from`, the cluster's kubeconfig to copy)."""
    where_from = "Kubernetes' own control plane" if demo.real else "the local API server"
    say(f"1/3 API server and CRDs ({where_from})")
    demo.start_cluster()
    say("2/3 node agents (simulated cards), controller, webhook")
    demo.start_components()
    say("3/3 the default class gpushare (examples/class-gpushare.yaml) and the namespace default")
    _apply_defaults(demo)
    return {
        "cluster": "Kubernetes' own control plane (kube-apiserver, controller manager, scheduler)" if demo.real
        else "the local API server (apiextensions-apiserver and etcd)",
        "kubeconfig_from": str(demo.kubeconfig), "directory": str(demo.directory), "nodes": demo.scenario.nodes,
        "pods_note": _pods_note(demo),
        # The local API server serves core/v1 and the CRDs, not apps/v1 or batch/v1.
        "serves": "or any claim, pod, Deployment, Job of yours" if demo.real
        else "or any claim or pod of yours (Deployments, Jobs: sandbox up --cluster real)",
    }


def _apply_defaults(demo: Any) -> None:
    """The examples' default class, and the namespace `default` where the server lacks it (the local
    API server runs no namespace controller), so that `kubectl apply -f examples/...` works as written."""
    import yaml

    k: kube.DemoKube = demo.kube
    body = yaml.safe_load(CLASS_FILE.read_text())
    wanted = [(f"{kube.CUSTOM}/{names.PLURAL_CLASS}", body),
              ("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}})]
    for collection, manifest in wanted:
        try:
            k.get(f"{collection}/{manifest['metadata']['name']}")
        except kube.NotFound:
            k.create(collection, manifest)


def _pods_note(demo: Any) -> str:
    """What happens to a pod here, said before the user wonders why theirs is not Running."""
    if demo.real:
        return ("  pods: the webhook gates them, the controller binds their claims and lifts the gate, the scheduler"
                " places them;\n  no kubelet runs them (the demo's nodes are simulated): Running pods need"
                " `elasticgpu demo --cluster real --install chart`.")
    return ("  pods: the webhook gates them, the controller binds their claims, lifts the gate and pins them to the"
            " claims' node;\n  this server has no scheduler and no kubelet, so they stay Pending there: the claims, the"
            " ElasticGPUs and the cards are the point.")
