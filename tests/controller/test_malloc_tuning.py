"""The controller's glibc malloc settings (`process/malloc_tuning.py`, issue 49 item 2: RSS at rest).

Each case runs in a Python process of its own (malloc's settings are the process's), on the real
glibc of this machine: the arenas its threads get, and what a trim gives back.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")]

REPO = Path(__file__).resolve().parents[2]

ARENAS = textwrap.dedent("""
    import ctypes, json, os, sys, tempfile, threading
    from elasticgpu.controller.process import malloc_tuning
    tuning = malloc_tuning.tune()
    # 8 threads alive at once, each allocating blocks malloc serves (over pymalloc's 512 bytes):
    # a thread's first malloc takes an arena of its own while glibc's limit allows.
    barrier = threading.Barrier(9, timeout=30)
    held = []
    def work():
        held.append([bytes(2048) for _ in range(100)])
        barrier.wait()
        barrier.wait()
    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    barrier.wait()
    libc = ctypes.CDLL("libc.so.6")
    libc.fopen.restype = ctypes.c_void_p
    path = tempfile.mktemp()
    out = libc.fopen(path.encode(), b"w")
    libc.malloc_info(0, ctypes.c_void_p(out))
    libc.fclose(ctypes.c_void_p(out))
    barrier.wait()
    for t in threads:
        t.join(30)
    text = open(path).read()
    os.unlink(path)
    print(json.dumps({"tuning": str(tuning), "arenas": text.count("<heap nr=")}))
""")

TRIM = textwrap.dedent("""
    import json
    from elasticgpu.controller.process import malloc_tuning
    malloc_tuning.tune()
    def rss():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    # ~300 MiB of 2 KiB blocks from the heap, then all but every 64th freed: the free space lies
    # between blocks still held, where free() gives nothing back (only a heap's top is).
    blocks = [bytes(2048) for _ in range(150_000)]
    kept = blocks[::64]
    del blocks
    before = rss()
    trimmed = malloc_tuning.trim()
    print(json.dumps({"before": before, "after": rss(), "trimmed": trimmed}))
""")


def _run(script: str, **env: str) -> dict[str, object]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "ELASTICGPU_MALLOC"}
    answer = subprocess.run([sys.executable, "-c", script], env={**environ, "PYTHONPATH": str(REPO), **env},
                            capture_output=True, text=True, timeout=90, check=False)
    assert answer.returncode == 0, answer.stderr[-3000:]
    found: dict[str, object] = json.loads(answer.stdout.strip().splitlines()[-1])
    return found


def test_the_threads_share_two_arenas() -> None:
    tuned = _run(ARENAS)
    assert tuned["arenas"] == 2, tuned
    # glibc's default here: an arena per thread (up to 8 per core), the main one besides.
    untouched = _run(ARENAS, ELASTICGPU_MALLOC="off")
    assert isinstance(untouched["arenas"], int) and untouched["arenas"] > 2, untouched


def test_what_the_operator_set_is_kept() -> None:
    found = _run(ARENAS, MALLOC_ARENA_MAX="4")
    assert found["arenas"] == 4, found
    assert "arena_max=None" in str(found["tuning"]) and "mmap_threshold=131072" in str(found["tuning"]), found
    off = _run(ARENAS, ELASTICGPU_MALLOC="off")
    assert "skipped='ELASTICGPU_MALLOC=off'" in str(off["tuning"]), off


def test_a_switch_neither_on_nor_off_is_refused_with_its_fix() -> None:
    from elasticgpu.controller.process import malloc_tuning

    with pytest.raises(ValueError, match=r"ELASTICGPU_MALLOC='of'.*'off' to leave glibc's"):
        malloc_tuning.tune({"ELASTICGPU_MALLOC": "of"})


def test_a_trim_gives_back_the_free_space_between_held_blocks() -> None:
    found = _run(TRIM)
    before, after = found["before"], found["after"]
    assert isinstance(before, int) and isinstance(after, int)
    assert found["trimmed"] is True, found
    assert after < before - 150, f"RSS {before} -> {after} MiB after the trim"


def test_the_trimming_thread_trims_until_stopped() -> None:
    import threading
    import time

    from elasticgpu.controller.process import malloc_tuning

    stop = threading.Event()
    trimming = malloc_tuning.Trimming(stop, every_s=0.05, environ={})
    trimming.start()
    deadline = time.monotonic() + 10
    while trimming.trims < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    assert trimming.trims >= 2
    done = trimming.trims
    time.sleep(0.2)
    assert trimming.trims <= done + 1, "the thread went on after stop"
