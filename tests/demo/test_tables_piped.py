"""The demo's tables piped (into a file, `grep`, a test): every row is one line with its names
whole, however long, as kubectl prints (issue 36, item 8: at a fixed width rows folded inside names)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

LONG = "gpu-" + "-".join(["0123456789abcdef"] * 16)  # 275 characters: wider than any terminal
PROGRAM = textwrap.dedent(f"""
    from elasticgpu.demo import containers, showing
    out = showing.console()
    table = {{"columnDefinitions": [{{"name": "Name"}}, {{"name": "Node"}}, {{"name": "Model"}}],
              "rows": [{{"cells": ["{LONG}", "node-with-a-long-name-" + "x" * 60, "NVIDIA A100-SXM4-80GB"]}}]}}
    out.print(showing.server_table("$ kubectl get pgpu", table))
    sight = containers.Sight(pod="p" * 80, container="main", claim="c" * 80, node="n" * 80,
                             env={{"NVIDIA_VISIBLE_DEVICES": "{LONG}"}}, devices=["/dev/nvidia0"])
    out.print(showing.sights_table([sight], {{"c" * 80: "None"}}))
""")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("columns", ["80", "200", None])
def test_piped_rows_are_one_line_with_whole_names(columns: str | None) -> None:
    env = {"PATH": "/usr/bin:/bin", **({"COLUMNS": columns} if columns else {})}
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    gpu_rows = [line for line in lines if LONG in line and "node-with-a-long-name-" in line]
    assert len(gpu_rows) == 1 and "NVIDIA A100-SXM4-80GB" in gpu_rows[0], done.stdout
    sight_rows = [line for line in lines if line.strip().startswith("p" * 80 + "/main")]
    assert len(sight_rows) == 1, done.stdout
    assert LONG in sight_rows[0] and "nothing: advisory" in sight_rows[0], done.stdout
