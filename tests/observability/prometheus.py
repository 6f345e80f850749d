"""A real Prometheus for the tests (issue 38): Debian bookworm's package, fetched and unpacked by
testprometheus/build.sh (cached under ~/.cache/elasticgpu/testprometheus), started on loopback
with a scrape configuration the test writes. Nothing here imitates Prometheus: rules are
evaluated and expressions answered by Prometheus itself, and `promtool` checks the rule files.

`binaries()` runs the build script once per session; when it fails with nothing cached, the
tests skip, naming the script and its last line (as the containerd tier does)."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import socket
import sqlite3
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "testprometheus" / "build.sh"
RULES = REPO / "deploy" / "chart" / "files" / "prometheus" / "rules.yaml"
DASHBOARD = REPO / "deploy" / "chart" / "files" / "grafana" / "elasticgpu.json"
METRIC = re.compile(r"\b(?:elasticgpu_[a-z0-9_]+|namespace_class:[a-z0-9_:]+)")
"""Names of series in an expression: the components' metrics and the recording rules' names."""


@dataclass(frozen=True)
class Binaries:
    prometheus: Path
    promtool: Path


@functools.cache
def binaries() -> Binaries | str:
    """The Prometheus and promtool binaries, or why there are none (the reason to skip)."""
    env = os.environ
    if env.get("ELASTICGPU_TESTPROMETHEUS_UNAVAILABLE"):  # scripts/test.sh tried already, and said why
        return env["ELASTICGPU_TESTPROMETHEUS_UNAVAILABLE"]
    if env.get("ELASTICGPU_PROMETHEUS") and env.get("ELASTICGPU_PROMTOOL"):
        return Binaries(Path(env["ELASTICGPU_PROMETHEUS"]), Path(env["ELASTICGPU_PROMTOOL"]))
    done = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"bash testprometheus/build.sh could not fetch Debian's prometheus and none is cached: {last}"
    found = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    return Binaries(Path(found["ELASTICGPU_PROMETHEUS"]), Path(found["ELASTICGPU_PROMTOOL"]))


def dashboard_expressions() -> list[tuple[str, str]]:
    """(panel title, expression) of every query of the dashboard, rows' panels included."""
    found = []
    board = json.loads(DASHBOARD.read_text())
    for panel in board["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []):
                found.append((inner["title"], target["expr"]))
    return found


def rules() -> list[dict[str, Any]]:
    """Every rule of the rules file (recording and alerting)."""
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def for_prometheus(expr: str, rate_interval: str = "1m") -> str:
    """A dashboard expression as Prometheus takes it: Grafana's `$__rate_interval` made concrete
    (1m by default: the demo's binds, a few seconds old, are in every window the test reads)."""
    return expr.replace("$__rate_interval", rate_interval)


class Prometheus:
    """One Prometheus process on a free loopback port, with its own data directory."""

    def __init__(self, binary: Path, directory: Path, *, targets: dict[str, list[str]], rule_files: list[Path],
                 port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": addresses}]}
                               for job, addresses in sorted(targets.items())],
        }
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = directory / "prometheus.log"
        self._log = self.log.open("wb")
        self.process = subprocess.Popen(
            [str(binary), f"--config.file={directory / 'prometheus.yml'}", f"--storage.tsdb.path={directory / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle"],
            stdout=self._log, stderr=subprocess.STDOUT)

    def api(self, path: str, **query: str) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(query)}"
        with urllib.request.urlopen(url, timeout=10) as answer:
            body = json.load(answer)
        if body.get("status") != "success":
            raise AssertionError(f"Prometheus {path} {query}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector of `expr` now (raises, naming the expression, on a PromQL error)."""
        try:
            return list(self.api("query", query=expr)["result"])
        except urllib.error.HTTPError as error:
            raise AssertionError(f"Prometheus refused {expr!r}: {error.read().decode()[:500]}") from None

    def query_range(self, expr: str, *, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """The range vector of `expr` from `start` to `end` (seconds since the epoch), every `step`."""
        return list(self.api("query_range", query=expr, start=str(start), end=str(end), step=str(step))["result"])

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"prometheus exited {self.process.returncode}: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2):
                    return
            except OSError:
                time.sleep(0.2)
        raise AssertionError(f"prometheus not ready in {timeout_s} s: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        self._log.close()


def exported_names(address: str) -> set[str]:
    """The series names a component's /metrics declares (its `# TYPE` lines, with the suffixes a
    histogram's and a counter's samples carry), whether or not a sample exists yet."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            names.add(name)
            if kind == "histogram":
                names |= {f"{name}_bucket", f"{name}_count", f"{name}_sum"}
            if kind == "counter" and not name.endswith("_total"):
                names.add(f"{name}_total")
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


@contextlib.contextmanager
def observed_demo(binaries: Binaries, directory: Path, *, settle_s: float = 20.0,
                  say: Callable[[str], None] = lambda _line: None) -> Iterator[tuple[Any, Prometheus]]:
    """The demo's scenario (`elasticgpu demo`'s own code: its API server, controller, webhook, two
    simulated agents, a real containerd where one is built, its claims and pods), each component
    with its /metrics on loopback, scraped every second by a real Prometheus that evaluates the
    chart's rules; yields (demo, prometheus) once every target is up, the scenario is applied and
    `settle_s` has passed (rates need a few samples). Everything is stopped after."""
    from elasticgpu.demo import running

    args = argparse.Namespace(kubeconfig=None, context=None, cluster="local", timeout_s=90.0, no_runtime=False,
                              no_agent=False, keep=False, metrics=True)
    demo = running.Demo(args, say)
    server: Prometheus | None = None
    try:
        demo.start_cluster()
        demo.start_components()
        server = Prometheus(binaries.prometheus, directory, targets=demo.metrics_targets, rule_files=[RULES],
                            port=_free_port())
        server.wait_ready()
        wanted = sum(len(addresses) for addresses in demo.metrics_targets.values())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            up = server.query("up == 1")
            if len(up) == wanted:
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"targets not all up after 60 s: {server.api('targets')}")
        # The scenario runs while Prometheus scrapes, as in a cluster: binds and gate lifts show
        # as increases of the histograms (ones made before the first scrape would not).
        bound = demo.apply_scenario()
        demo.see_containers(bound)
        busy = make_containers_busy(demo)
        say(f"  simulated GPU processes for the containers of: {', '.join(sorted(busy))}")
        time.sleep(settle_s)
        yield demo, server
    finally:
        if server is not None:
            server.stop()
        demo.cleanup()


SM_SHARE = 0.4
"""Of its reserved cores, the share of SM time a demo container's simulated process uses."""


def make_containers_busy(demo: Any) -> list[str]:
    """Give each running demo container a GPU process, as a CUDA program would have: the
    container's real process (found by its cgroup, as the agent finds it) is injected into its
    node's simulated backend on the claim's card, using `SM_SHARE` of the claim's cores and a
    quarter of its memory. The agent then measures it like any process: its usage pass maps the
    pid to the container and the claim, and the used counters grow. Returns the claims made busy."""
    from elasticgpu.agent import usage
    from elasticgpu.agent.discovery import simulated
    from elasticgpu.demo import scenario

    containers: dict[str, tuple[str, str, list[str], int, int]] = {}
    for node, paths in demo.agent_paths.items():
        with sqlite3.connect(paths.ledger) as db:
            for container, claim, gpus, cores, memory in db.execute(
                    "SELECT container_id, claim_name, gpu_uuids, cores, memory_mib FROM allocations"
                    " WHERE container_id IS NOT NULL AND state IN ('started', 'created')"):
                containers[str(container)] = (node, str(claim), list(json.loads(gpus)), int(cores), int(memory))
    busy = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            found = usage.container_id_from_cgroup((proc / "cgroup").read_text())
        except OSError:
            continue
        if found not in containers:
            continue
        node, claim, gpus, cores, memory = containers.pop(found)
        uuids = [simulated.simulated_uuid(node, i) for i in range(scenario.CARDS_PER_NODE)]
        for uuid in gpus:
            per_card_cores = cores // max(1, len(gpus)) if cores else 100
            simulated.inject(demo.agent_paths[node].inject_dir, {"process": {
                "card": uuids.index(uuid), "pid": int(proc.name), "memory": f"{max(1, memory // 4)}Mi",
                "sm": max(1, int(per_card_cores * SM_SHARE))}})
        busy.append(claim)
    return busy


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
