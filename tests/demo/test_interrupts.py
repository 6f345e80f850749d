"""Ctrl-C on `elasticgpu demo`, as a terminal sends it (issue 36, item 5): SIGINT to the demo's
whole foreground process group, twice in a row, at start-up and in the middle of the run. However
often it is interrupted, the demo exits non-zero with one line saying so, no traceback, and leaves
no `egdemo-*` folder behind (it once printed a traceback and left 123 MB of containerd state).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from elasticgpu.testbed import local_cluster

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    local_cluster.find_binaries(build_if_missing=False) is None,
    reason="no cached test API server: run `bash testserver/build.sh` (a few minutes)",
)


def _interrupted_run(
    *, after_line: str | None, delay_s: float, env: dict[str, str] | None = None
) -> tuple[int, str, list[str]]:
    """Start the demo in a process group of its own (as a shell starts a foreground job), wait for
    `after_line` in its output (or `delay_s` after its start when None), then send the group SIGINT
    twice, 0.2 s apart, as two quick Ctrl-Cs do. Returns its exit code, its output, and what it
    left in its temp folder: a TMPDIR of its own, so that other demos running on this machine
    meanwhile are not counted (short: the demo's unix sockets live there)."""
    tmp = Path(tempfile.mkdtemp(prefix="egint-", dir="/tmp"))
    try:
        code, output = _run_and_interrupt(tmp, after_line=after_line, delay_s=delay_s, env=env)
        return code, output, sorted(p.name for p in tmp.iterdir())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run_and_interrupt(
    tmp: Path, *, after_line: str | None, delay_s: float, env: dict[str, str] | None = None
) -> tuple[int, str]:
    # SIGINT as a terminal's foreground job has it: a shell's background job (`pytest ... &`) starts with
    # SIGINT ignored, which Python then keeps, and the demo would never see the Ctrl-Cs.
    # SIGUSR1 dumps every thread's stack into the output: what a run that does not end was doing.
    command = [sys.executable, "-c", "import faulthandler, runpy, signal, sys;"
               " faulthandler.register(signal.SIGUSR1, all_threads=True);"
               " signal.signal(signal.SIGINT, signal.default_int_handler); sys.argv = ['elasticgpu', 'demo'];"
               " runpy.run_module('elasticgpu', run_name='__main__')"]
    proc = subprocess.Popen(command, cwd=ROOT, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "COLUMNS": "200", "TMPDIR": str(tmp), **(env or {})})
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if after_line is not None and after_line in line:
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if after_line is None:
            time.sleep(delay_s)
        else:
            assert seen.wait(120), f"the demo never printed {after_line!r}:\n{''.join(lines)}"
        for _ in range(2):
            os.killpg(proc.pid, signal.SIGINT)
            time.sleep(0.2)
        try:
            code = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGUSR1)
            time.sleep(2)
            output = "".join(lines)
            raise AssertionError(f"the demo ran on 120 s after two Ctrl-Cs; its output and stacks:\n{output}") from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    reader.join(timeout=10)
    return code, "".join(lines)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("after_line", "delay_s"), [(None, 0.3), (None, 1.5), ("2/4", 0.0), ("4/4", 0.0)],
                         ids=["importing", "starting-the-server", "starting-components", "running-containers"])
def test_ctrl_c_twice_exits_with_one_line_and_leaves_nothing(after_line: str | None, delay_s: float) -> None:
    code, output, left = _interrupted_run(after_line=after_line, delay_s=delay_s)
    assert code != 0, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    said = [line for line in output.splitlines() if "interrupted" in line]
    assert len(said) == 1, output
    assert not left, f"left behind: {left}\n{output}"


@pytest.mark.timeout(300)
def test_the_watchdog_ends_a_run_whose_cleanup_overruns_and_leaves_nothing() -> None:
    """The watchdog's way out, on a real run: its deadline (0.5 s) is shorter than any real cleanup,
    so it fires in the middle of one, with containerd, its shims and their mounts up. The run still
    ends with one line, and leaves no folder, no mount and no process of its own behind."""
    before = _own_processes()
    code, output, left = _interrupted_run(
        after_line="4/4", delay_s=0.0, env={"ELASTICGPU_DEMO_CLEANUP_DEADLINE_S": "0.5"}
    )
    assert code == 130, output
    said = [line for line in output.splitlines() if "interrupted" in line]
    assert len(said) == 1 and "cleanup hung" in said[0], output
    assert not left, f"left behind: {left}\n{output}"
    deadline = time.monotonic() + 30  # SIGKILLed processes are reaped by init: give it a moment
    while (after := _own_processes() - before) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not after, f"processes of the run still alive: {sorted(after)}"
    with open("/proc/self/mounts") as mounts:
        stale = [line.split()[1] for line in mounts if "/egint-" in line.split()[1]]
    assert not stale, f"mounts left behind: {stale}"


def _own_processes() -> set[str]:
    """Command lines of live processes that run from this machine's test builds or a demo folder."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "/egint-" in command or "egdemo-" in command:
            found.add(f"{entry.name} {command[:120]}")
    return found
