"""The product's own processes, started as the operator would start them, but as children of the demo:

- `elasticgpu controller`, watching the demo's namespace only, leader election off (one replica);
- `elasticgpu webhook`, listening on 127.0.0.1 and registered with that URL (the API server runs
  on this host), its MutatingWebhookConfiguration named after the run;
- `elasticgpu agent run` per simulated node: the simulated backend from a YAML in the temp dir,
  its ledger, CDI folder, stand-in devices and sockets in the temp dir too, and its CRI proxy in
  front of the local containerd when there is one (else no proxy: inventory only).
Children are processes, not threads: each runs exactly the code a user runs (`python -m elasticgpu`).
"""

from __future__ import annotations

import ssl
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from elasticgpu.testbed import free_ports, processes
from elasticgpu.testbed.local_cluster import REPO_ROOT

START_TIMEOUT_S = 60.0
"""Seconds each component gets to come up."""


def _elasticgpu(*args: str) -> list[str]:
    return [sys.executable, "-m", "elasticgpu", *args]


@dataclass(frozen=True)
class AgentPaths:
    """Where one node's agent keeps everything (all inside the demo's temp dir)."""

    simulation: Path
    device_dir: Path
    ledger: Path
    cdi_dir: Path
    cri_socket: Path
    front_dir: Path
    inject_dir: Path
    """Where the simulated backend takes injected processes and XIDs from (`simulated.inject`)."""

    @classmethod
    def under(cls, directory: Path, node: str, cdi_dir: Path | None) -> AgentPaths:
        """Paths under `directory/<node>`; the CDI folder is the runtime's when it has one for the node."""
        home = directory / node
        home.mkdir(parents=True, exist_ok=True)
        return cls(
            simulation=home / "cards.yaml",
            device_dir=home / "dev",
            ledger=home / "ledger.db",
            cdi_dir=cdi_dir or home / "cdi",
            cri_socket=directory / f"{node[-1]}.sock",
            front_dir=home / "front",
            inject_dir=home / "inject",
        )


def start_controller(
    children: processes.Children, *, kubeconfig: Path, namespace: str | None, log_dir: Path, metrics_port: int = 0
) -> processes.Child:
    """The controller, for the demo's namespace (None: every namespace, the sandbox's), one replica
    without leader election; with `metrics_port`, its /metrics (and probes) on 127.0.0.1 there, else none."""
    return children.start(
        "controller",
        _elasticgpu(
            "controller",
            "--kubeconfig",
            str(kubeconfig),
            *(("--namespace", namespace) if namespace else ()),
            "--leader-elect=false",
            "--health-probe-bind-address",
            f"127.0.0.1:{metrics_port}" if metrics_port else "0",
        ),
        log=log_dir / "controller.log",
        cwd=REPO_ROOT,
        env={"ELASTICGPU_RESYNC_INTERVAL_S": "10"},
    )


def start_webhook(
    children: processes.Children, *, kubeconfig: Path, namespace: str, configuration: str, log_dir: Path,
    metrics_port: int = 0, choose_port: free_ports.ChoosePort = free_ports.any_free_port,
) -> tuple[processes.Child, int]:
    """The admission webhook on a free loopback port (`choose_port("webhook")`), once it listens
    there (its certificate made and published); again on a fresh port when the one chosen was taken
    meanwhile (free_ports). Returns it and the port. With `metrics_port`, its plain-HTTP /metrics
    on 127.0.0.1 there."""
    metrics = ["--metrics-bind-address", f"127.0.0.1:{metrics_port}"] if metrics_port else []

    def command() -> tuple[list[str], int]:
        port = choose_port("webhook")
        return _elasticgpu(
            "webhook", "--kubeconfig", str(kubeconfig), "--namespace", namespace,
            "--configuration-name", configuration, "--url", f"https://127.0.0.1:{port}",
            "--listen-host", "127.0.0.1", "--port", str(port), *metrics,
        ), port  # fmt: skip

    def listening(port: int) -> Callable[[], bool]:
        # It listens once its certificate is loaded. Its own /healthz, not a bare connection: whoever
        # took the port would accept that. The certificate is its own (no CA here to check it against).
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE

        def check() -> bool:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", timeout=2, context=context) as answer:
                return bool(answer.status == 200)

        return check

    return free_ports.start_on_free_ports(children, "webhook", command, log=log_dir / "webhook.log",
                                          ready=listening, timeout_s=START_TIMEOUT_S, cwd=REPO_ROOT)  # fmt: skip


def start_agent(
    children: processes.Children,
    *,
    node: str,
    kubeconfig: Path,
    paths: AgentPaths,
    events_namespace: str,
    runtime_socket: Path | None,
    log_dir: Path,
    metrics_port: int = 0,
    extra: tuple[str, ...] = (),
) -> processes.Child:
    """One node's agent with the simulated backend; its CRI proxy only when a runtime is given;
    with `metrics_port`, its /metrics on 127.0.0.1 there; `extra`: more flags (e.g. `--dra true`)."""
    cri = (
        [
            "--cri-proxy",
            "true",
            "--cri-listen",
            str(paths.cri_socket),
            "--cri-upstream",
            str(runtime_socket),
            "--cri-front",
            "none",
        ]
        if runtime_socket is not None
        else ["--cri-proxy", "false"]
    )
    return children.start(
        f"agent of {node}",
        _elasticgpu(
            "agent",
            "run",
            "--node-name",
            node,
            "--kubeconfig",
            str(kubeconfig),
            "--backend",
            "simulated",
            "--simulation",
            str(paths.simulation),
            "--device-dir",
            str(paths.device_dir),
            "--ledger-url",
            f"sqlite:///{paths.ledger}",
            "--metrics-bind-address",
            f"127.0.0.1:{metrics_port}" if metrics_port else "0",
            "--events-namespace",
            events_namespace,
            "--heartbeat-interval-s",
            "5",
            "--rediscover-interval-s",
            "2",
            "--inject-dir",
            str(paths.inject_dir),
            "--cdi-dir",
            str(paths.cdi_dir),
            "--cri-front-dir",
            str(paths.front_dir),
            *cri,
            *extra,
        ),
        log=log_dir / f"agent-{node}.log",
        cwd=REPO_ROOT,
    )
