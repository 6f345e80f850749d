"""The suite cannot hang (issue 15): no `preexec_fn` anywhere, children die with the test process,
and every test runs under pytest-timeout."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import spawning

REPO = Path(__file__).resolve().parent.parent

PARENT = """
import sys, time
from tests import spawning
child = spawning.spawn(["sleep", "120"])
print(child.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (dead, not yet reaped by init) counts as gone
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_no_preexec_fn_in_tests_or_code() -> None:
    """A `preexec_fn=` runs Python in a forked child; with grpc loaded the fork can block forever."""
    found = []
    for folder in ("tests", "elasticgpu", "bench"):
        for path in (REPO / folder).rglob("*.py"):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r"preexec_fn\s*=", line) and path.name not in {"spawning.py", "test_spawning.py"}:
                    found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not found, "use tests/spawning.spawn instead of preexec_fn:\n" + "\n".join(found)


def test_a_spawned_child_dies_with_a_killed_parent() -> None:
    """kill -9 of the process that spawned it: the child gets SIGTERM from the kernel."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT], cwd=REPO, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert _alive(child)
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 10
        while _alive(child):
            assert time.monotonic() < deadline, f"child {child} outlived its killed parent by 10 s"
            time.sleep(0.05)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)


def test_spawn_refuses_preexec_fn() -> None:
    with pytest.raises(TypeError, match="preexec_fn"):
        spawning.spawn(["true"], preexec_fn=lambda: None)


def test_every_test_has_a_timeout_with_a_stack_dump(tmp_path: Path) -> None:
    """The project's pytest options bound every test: a test that hangs fails with the stacks."""
    options = (REPO / "pyproject.toml").read_text()
    timeout = re.search(r"^timeout = (\d+)$", options, re.M)
    method = re.search(r'^timeout_method = "(\w+)"$', options, re.M)
    assert timeout and method, "pyproject.toml's [tool.pytest.ini_options] has no timeout / timeout_method"
    assert 60 <= int(timeout.group(1)) <= 1800
    # The same method, with a short timeout, in a pytest of its own: the hang ends, with the stack.
    (tmp_path / "test_hang.py").write_text("import time\n\n\ndef test_hangs():\n    time.sleep(60)\n")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "timeout=2",
                           "-o", f"timeout_method={method.group(1)}", str(tmp_path / "test_hang.py")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert time.monotonic() - started < 30
    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert "Timeout" in output and "time.sleep(60)" in output, output


def test_spawn_uses_pdeathsig() -> None:
    prefix = spawning.death_prefix()
    assert prefix[1:] == ("--pdeathsig", signal.SIGTERM.name.removeprefix("SIG"), "--")
