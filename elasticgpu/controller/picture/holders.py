"""The GPU ledger's index of reservations (`Holders`): which keys each GPU holds, and the GPUs holding
each key. A leaf: it calls nothing of the picture."""

from __future__ import annotations

from collections.abc import Collection


class Holders:
    """The ledger's index of reservations: the keys each GPU holds an allocation for and, the
    other way, the GPUs holding each key, kept in step so that a watch event of one GPU costs
    O(its allocations), not a scan of every GPU. Nearly every key is held by one GPU: that one
    is kept bare, a set only from two on (an empty set is 216 bytes; 50,000 one-member sets
    were ~11 MiB)."""

    def __init__(self) -> None:
        self._keys_on: dict[str, set[str]] = {}
        self._gpus_of: dict[str, str | set[str]] = {}

    def __contains__(self, key: object) -> bool:
        """True when some GPU holds an allocation for `key`."""
        return key in self._gpus_of

    def keys_on(self, gpu_name: str) -> set[str]:
        """The keys GPU `gpu_name` holds (empty when none); the live set: do not change it."""
        return self._keys_on.get(gpu_name, set())

    def gpus_holding(self, key: str) -> Collection[str]:
        """The GPUs holding `key` (empty when none); a live set when several: do not keep it."""
        held = self._gpus_of.get(key)
        if held is None:
            return ()
        return held if isinstance(held, set) else (held,)

    def set_keys_on(self, gpu_name: str, after: set[str]) -> set[str]:
        """GPU `gpu_name` holds exactly the keys `after` now; returns those it held before."""
        before = self._keys_on.get(gpu_name, set())
        for key in before - after:
            self._discard(key, gpu_name)
        for key in after - before:
            self._add(key, gpu_name)
        if after:
            self._keys_on[gpu_name] = after
        else:
            self._keys_on.pop(gpu_name, None)
        return before

    def _add(self, key: str, gpu_name: str) -> None:
        held = self._gpus_of.get(key)
        if held is None:
            self._gpus_of[key] = gpu_name
        elif isinstance(held, set):
            held.add(gpu_name)
        elif held != gpu_name:
            self._gpus_of[key] = {held, gpu_name}

    def _discard(self, key: str, gpu_name: str) -> None:
        held = self._gpus_of.get(key)
        if held is None:
            return
        if isinstance(held, set):
            held.discard(gpu_name)
            if len(held) == 1:
                self._gpus_of[key] = next(iter(held))
            elif not held:
                del self._gpus_of[key]
        elif held == gpu_name:
            del self._gpus_of[key]


__all__ = ["Holders"]
