"""The daemon side of an MPS slice's limits: the most one client of a card may use (see mps_daemons' `ceiling`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Ceiling:
    """The most one MPS client of a card may use: percent of its compute (100: no ceiling) and MiB of its memory
    (0: no ceiling)."""

    cores: int = 100
    memory_mib: int = 0

    @classmethod
    def of(cls, cores: int, memory_mib: int) -> Ceiling:
        """The ceiling of one slice: a memory-only slice (0 cores) has no compute ceiling, a slice without memory
        (0 MiB) no memory ceiling."""
        return cls(cores if 0 < cores < 100 else 100, max(memory_mib, 0))

    def covering(self, other: Ceiling) -> Ceiling:
        """The ceiling that lets through what either does (a dimension without a ceiling in either has none)."""
        return Ceiling(max(self.cores, other.cores),
                       0 if 0 in (self.memory_mib, other.memory_mib) else max(self.memory_mib, other.memory_mib))

    def commands(self, servers: Iterable[int] = ()) -> list[str]:
        """The control commands that put this ceiling on the daemon: its defaults for servers spawned later, and
        each running server's own (MPS v2 interface; device 0: the daemon sees only its card)."""
        found = []
        if self.cores < 100:
            found.append(f"set_default_active_thread_percentage {self.cores}")
        if self.memory_mib > 0:
            found.append(f"set_default_device_pinned_mem_limit 0 {self.memory_mib}M")
        for server in servers:
            if self.cores < 100:
                found.append(f"set_active_thread_percentage {server} {self.cores}")
            if self.memory_mib > 0:
                found.append(f"set_device_pinned_mem_limit {server} 0 {self.memory_mib}M")
        return found
