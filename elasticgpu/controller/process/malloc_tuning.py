"""glibc malloc settings for a process that holds a large picture for days (issue 49 item 2).

The controller keeps ~100,000 small objects for the life of the process and, now and then,
parses a list of every kind at once: a fresh start, a watch that starts over after an API server
restart (one thread per kind, all at the same moment), the periodic relist. Two of glibc's
defaults turn those transient lists into RSS that never goes back:

- one malloc arena per thread, up to 8 per core. Each watch thread that starts over parses its
  list in an arena of its own; the arena grows to that list's peak and keeps it (a non-main
  arena only gives back the free top of its heap), so every kind's peak stays, side by side.
  `M_ARENA_MAX` 2 makes the threads share two arenas: the free space one list left is what
  the next list reuses. The threads hold the GIL while they allocate, so the contention an
  arena per thread avoids is small here.
- the dynamic mmap threshold: a freed mmapped block (a response body of several MiB) raises
  the threshold to its size, so later bodies up to 32 MiB come from the heap, between the
  picture's long-lived blocks, and fragment it. A fixed `M_MMAP_THRESHOLD` (which also fixes
  the trim threshold) keeps large bodies in mmaps of their own, unmapped when freed.

`tune` sets both with `mallopt` and must run before the process starts threads (an arena that
exists stays). A variable the operator set (`MALLOC_ARENA_MAX`, `MALLOC_MMAP_THRESHOLD_`, read by
glibc at its start) is left as set; `ELASTICGPU_MALLOC=off` leaves glibc's defaults altogether.
`trim` (`malloc_trim(0)`) gives the free pages inside every arena back to the system, which
glibc does not do by itself (it only shortens a heap from its top): `Trimming` calls it every
`TRIM_EVERY_S` on a thread of its own, so that what a large list left free goes back within a
minute of the list, wherever in the process it was read. Elsewhere than glibc (musl, macOS)
all of this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import logging
import os
import platform
import threading
from collections.abc import Mapping

logger = logging.getLogger(__name__)

SWITCH = "ELASTICGPU_MALLOC"
"""The environment variable that turns the settings off ("off")."""

ARENA_MAX = 2
"""Arenas the process's threads share (glibc's default: 8 per core, e.g. 128 on 16 cores)."""

MMAP_THRESHOLD = 128 * 1024
"""Bytes from which a block is an mmap of its own: glibc's starting value, kept fixed."""

TRIM_EVERY_S = 60.0
"""Seconds between two trims: a trim walks the free lists under each arena's lock (a few ms at
a heap of 1 GiB), and the lists that leave memory free come minutes apart."""

_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


@dataclasses.dataclass(frozen=True)
class Tuning:
    """What `tune` did: the values it set (None: left as they were) and why not, when not."""

    arena_max: int | None = None
    mmap_threshold: int | None = None
    skipped: str = ""


_libc: ctypes.CDLL | None = None
_loaded = False


def _glibc() -> ctypes.CDLL | None:
    """The process's C library when it is glibc (the only one whose mallopt takes these)."""
    global _libc, _loaded
    if not _loaded:
        _loaded = True
        if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
            try:
                _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            except OSError:
                _libc = None
    return _libc


def switched_off(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether `ELASTICGPU_MALLOC` says off; ValueError for a value that is neither on nor off."""
    value = environ.get(SWITCH, "").strip().lower()
    if value not in ("", "on", "off"):
        raise ValueError(f"environment variable {SWITCH}={environ[SWITCH]!r}: not 'on' or 'off'; set it to 'off' to"
                         " leave glibc's malloc settings as they are, or unset it")
    return value == "off"


def tune(environ: Mapping[str, str] = os.environ) -> Tuning:
    """Set the arena count and a fixed mmap threshold (see the module docstring); call it first
    thing in the process, before any thread starts."""
    if switched_off(environ):
        return Tuning(skipped=f"{SWITCH}=off")
    libc = _glibc()
    if libc is None:
        return Tuning(skipped="not glibc")
    arena_max = mmap_threshold = None
    if "MALLOC_ARENA_MAX" not in environ and libc.mallopt(_M_ARENA_MAX, ARENA_MAX) == 1:
        arena_max = ARENA_MAX
    if "MALLOC_MMAP_THRESHOLD_" not in environ and libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1:
        mmap_threshold = MMAP_THRESHOLD
    tuning = Tuning(arena_max=arena_max, mmap_threshold=mmap_threshold)
    logger.debug("malloc: %s", tuning)
    return tuning


def trim() -> bool:
    """Give the free pages of every malloc arena back to the system (`malloc_trim(0)`); True when
    some were. Costs a walk of the free lists: a few ms at a heap of 1 GiB."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.malloc_trim(0))


class Trimming:
    """`trim` every `every_s` seconds on a daemon thread until `stop` is set (see the module
    docstring); nothing where the C library is not glibc or `ELASTICGPU_MALLOC=off`."""

    def __init__(self, stop: threading.Event, *, every_s: float = TRIM_EVERY_S,
                 environ: Mapping[str, str] = os.environ) -> None:
        self._stop = stop
        self._every_s = every_s
        self._on = _glibc() is not None and not switched_off(environ)
        self.trims = 0
        """Trims done (for the tests)."""

    def start(self) -> None:
        if self._on:
            threading.Thread(target=self._run, name="malloc-trim", daemon=True).start()

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            trim()
            self.trims += 1


__all__ = ["ARENA_MAX", "MMAP_THRESHOLD", "SWITCH", "TRIM_EVERY_S", "Trimming", "Tuning", "switched_off", "trim",
           "tune"]
