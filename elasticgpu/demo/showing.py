"""What the demo prints: the server's own tables (what `kubectl get` shows) and what each container sees.

Tables come from the API server as `meta.k8s.io/v1 Table` (the CRDs' printer columns), so they are
exactly the columns kubectl prints; `rich` draws them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from elasticgpu.api import format_memory, names
from elasticgpu.demo.containers import Sight
from elasticgpu.demo.scenario import Scenario
from elasticgpu.testbed import kube

_HAMI_MIB = re.compile(r"^(\d+)m$")


def memory_limit(value: str | None) -> str:
    """A container's memory limit as people read memory (`10Gi`): HAMi-core's variable holds MiB
    with its own suffix (`10240m`), which would read as milli-units. Anything else as it is."""
    found = _HAMI_MIB.match(value or "")
    return format_memory(int(found.group(1))) if found else (value or "-")


NEVER_WRAP = 1 << 16
"""The console's width: wider than any row, so that a row is one line however long its names are,
as kubectl prints (a pipe, a file, a test or a terminal; the terminal wraps for the eye). At a
fixed 200, longer rows were folded inside names (issue 36)."""


def console() -> Console:
    """A console on stdout that never wraps: lines stay whole for `grep`, `less -S` and tests."""
    return Console(highlight=False, soft_wrap=True, width=NEVER_WRAP)


def server_table(title: str, table: dict[str, Any], *, wide: bool = False) -> Table:
    """A server Table as a rich Table: the default columns (priority 0), or all with `wide`."""
    columns = [(i, c) for i, c in enumerate(table.get("columnDefinitions") or []) if wide or not c.get("priority")]
    shown = Table(title=title, title_justify="left", show_edge=False, box=None, header_style="bold")
    for _, column in columns:
        shown.add_column(str(column["name"]).upper(), no_wrap=True)
    for row in table.get("rows") or []:
        cells = row.get("cells") or []
        shown.add_row(*(Text("" if i >= len(cells) or cells[i] is None else str(cells[i])) for i, _ in columns))
    if not table.get("rows"):
        shown.add_row(*(["(none)"] + [""] * (len(columns) - 1)))
    return shown


ENFORCED_BY = {"None": "nothing: advisory", "WholeCard": "whole card, not shared", "MPS": "MPS",
               "HAMiCore": "HAMi-core"}
"""What holds a container to its SM and memory limits, by its claim's `status.isolation`."""
SIMULATED_NOTE = (
    "The cards are simulated (the agents' simulated backend): no GPU, driver, NVML, MPS or HAMi-core runs here,"
    " and {devices}."
    " SM LIMIT and MEMORY LIMIT are what the container is told; under isolation None (the demo's classes) they are"
    " advisory, nothing holds a process to them; MPS or HAMi-core on a real card enforce them (docs/isolation.md)."
)
"""Said under the table, where the numbers are: what the demo shows is not what a GPU enforced."""


def sights_table(sights: Sequence[Sight], isolation: Mapping[str, str] | None = None) -> Table:
    """One row per container: its claim, node, the cards it sees, its limits and what enforces
    them (`isolation`: each claim's `status.isolation`, by claim name), with a note that the cards
    are simulated and the limits advisory."""
    decided = any(s.source == "decision" for s in sights)
    title = (
        "What each container would get (no container runtime here: the agent's injection decision; simulated cards)"
        if decided
        else "What each container sees (read inside the running container; simulated cards)"
    )
    devices = ("CDI DEVICES are the names a runtime would resolve" if decided
               else "/dev/nvidiaN are stand-in device nodes that the agent's CDI spec names")
    shown = Table(title=title, title_justify="left", show_edge=False, box=None, header_style="bold",
                  caption=SIMULATED_NOTE.format(devices=devices), caption_justify="left")
    for name in (
        "POD/CONTAINER",
        "CLAIM",
        "NODE",
        "NVIDIA_VISIBLE_DEVICES",
        "SM LIMIT",
        "MEMORY LIMIT",
        "CDI DEVICES" if decided else "/dev",
        "ENFORCED BY",
    ):
        shown.add_column(name, no_wrap=True)
    modes = isolation or {}
    for s in sights:
        mode = modes.get(s.claim, "")
        shown.add_row(
            *map(
                Text,
                (
                    f"{s.pod}/{s.container}",
                    s.claim,
                    s.node,
                    s.env.get("NVIDIA_VISIBLE_DEVICES", "-"),
                    s.env.get("CUDA_DEVICE_SM_LIMIT", "-"),
                    memory_limit(s.env.get("CUDA_DEVICE_MEMORY_LIMIT_0")),
                    " ".join(s.devices) or "-",
                    ENFORCED_BY.get(mode, mode or "-"),
                ),
            )
        )
    return shown


def timings_table(phases: Sequence[tuple[str, float]], total: float) -> Table:
    """Seconds per phase and in all."""
    shown = Table(title="Elapsed", title_justify="left", show_edge=False, box=None, header_style="bold")
    shown.add_column("PHASE")
    shown.add_column("SECONDS", justify="right")
    for name, seconds in phases:
        shown.add_row(name, f"{seconds:.1f}")
    shown.add_row("total", f"{total:.1f}")
    return shown


def show_run(k: kube.DemoKube, s: Scenario, sights: Sequence[Sight], say: Callable[[str], None]) -> None:
    """A run's tables as `kubectl get` prints them (claims, ElasticGPUs, GPUs), what each container saw,
    and one line per claim naming its cards."""
    out = console()
    out.print()
    out.print(
        server_table(
            f"$ kubectl get egpuc -n {s.namespace}",
            k.table(f"{kube.CUSTOM}/namespaces/{s.namespace}/{names.PLURAL_CLAIM}"),
        )
    )
    out.print()
    selector = f"{names.LABEL_CLAIM_NAMESPACE}={s.namespace}"
    out.print(
        server_table(
            f"$ kubectl get egpu -l {selector}",
            k.request(
                "GET",
                f"{kube.CUSTOM}/{names.PLURAL_ELASTIC_GPU}",
                query={"labelSelector": selector},
                accept=kube.TABLE,
            ),
        )
    )
    out.print()
    gpu_selector = f"{names.LABEL_NODE} in ({','.join(s.nodes)})"
    out.print(
        server_table(
            f"$ kubectl get pgpu -l '{gpu_selector}'",
            k.request(
                "GET", f"{kube.CUSTOM}/{names.PLURAL_GPU}", query={"labelSelector": gpu_selector}, accept=kube.TABLE
            ),
        )
    )
    out.print()
    claims = k.get(f"{kube.CUSTOM}/namespaces/{s.namespace}/{names.PLURAL_CLAIM}").get("items") or []
    isolation = {c["metadata"]["name"]: (c.get("status") or {}).get("isolation", "") for c in claims}
    out.print(sights_table(sights, isolation))
    out.print()
    for sight in sights:
        where = "inside the container" if sight.source == "container" else "in the agent's decision (nothing ran)"
        say(
            f"ok claim {sight.claim} -> {sight.env.get('NVIDIA_VISIBLE_DEVICES')} on {sight.node}, "
            f"seen by {sight.pod}/{sight.container} {where}"
        )
