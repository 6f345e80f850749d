"""Settled keys: which objects the periodic resync may leave alone (issue 49 item 2).

The resync used to queue every claim, ElasticGPU and GPU every `ResyncSettings.interval_s`:
at 40,000 cards and 50,000 Bound claims that is ~3,300 syncs a second at rest, each finding
nothing to do. Here a key is *settled* once a sync of it succeeded, wrote nothing, and found
nothing pending (its sync said so: a Bound claim in sync, not a Pending one; see `Worker.sync`);
a settled key is requeued by the resync only when

  - something queued it since (any `WorkQueue.add` on the front lane: a watch event, a write's
    answer, another sync): it is unsettled again and its next sync decides;
  - a relist found its object or an input of it changed (`Picture.input_versions`), or a class
    changed (`unsettle_all`: its policing, resizability and recommendation follow the class);
  - the walk comes round to it: every resync looks again at the settled keys verified longest
    ago, a slice per pass so that each is seen about once per relist interval (at most
    `settled_walk_per_s` a second): what a bug elsewhere left wrong is still repaired, rarely.

A key whose state changes with time alone asks for its own later look (`WorkQueue.add` with a
delay: heartbeats, quota and group waits, recommendations); such a delayed add does not unsettle
it, so a timer costs one sync when due, not one per resync.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping

Key = tuple[str, ...]


class SettledKeys:
    """The settled keys, oldest verified first, and the keys the resync still looks at each pass."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._settled: dict[Key, None] = {}
        """Settled keys in the order they were last verified (a sync or the walk): the walk takes the front."""
        self._unsettled: set[Key] = set()
        """Keys queued and not settled since: each resync queues them again (the old behaviour)."""
        self._syncing: dict[Key, bool] = {}
        """Keys being synced -> nothing unsettled them meanwhile."""

    def begin(self, key: Key) -> None:
        """A sync of `key` starts: an unsettle before its `end` keeps it unsettled."""
        with self._lock:
            self._syncing[key] = True

    def end(self, key: Key, *, settled: bool) -> None:
        """A sync of `key` ended; `settled`: it succeeded, wrote nothing and left nothing pending."""
        with self._lock:
            clean = self._syncing.pop(key, False)
            if settled and clean:
                self._unsettled.discard(key)
                self._settled.pop(key, None)
                self._settled[key] = None  # to the back: verified now
            else:
                self._settled.pop(key, None)
                self._unsettled.add(key)

    def unsettle(self, key: Key) -> None:
        """Something queued `key` (its object or an input changed): the resync looks at it again."""
        with self._lock:
            if key in self._syncing:
                self._syncing[key] = False
            self._settled.pop(key, None)
            self._unsettled.add(key)

    def seen(self, key: Key) -> None:
        """`key` queued on the background lane (a start-up list, the resync): known, settled or not."""
        with self._lock:
            if key not in self._settled:
                self._unsettled.add(key)

    def unsettle_all(self) -> None:
        """Every key is looked at again by the next resync (a class changed: every claim of it may
        decide differently, and no key names what a class wakes among the Bound ones)."""
        with self._lock:
            self._unsettled.update(self._settled)
            self._settled.clear()
            for key in self._syncing:
                self._syncing[key] = False

    def relisted(self, before: Mapping[Key, object], after: Mapping[Key, object]) -> None:
        """A relist was merged: `before` and `after` are `Picture.input_versions` around it. Keys
        whose versions changed are unsettled; keys of objects gone are forgotten (their syncs
        came with the deletion); keys the picture has and this does not know are unsettled; a
        class changed, added or gone unsettles every key (`unsettle_all`)."""
        classes_before = {key: v for key, v in before.items() if key[0] == "class"}
        classes_after = {key: v for key, v in after.items() if key[0] == "class"}
        with self._lock:
            for key in list(self._settled):
                if key not in after:
                    del self._settled[key]
                elif before.get(key) != after[key]:
                    del self._settled[key]
                    self._unsettled.add(key)
            self._unsettled.intersection_update(after)
            self._unsettled.update(key for key in after if key not in self._settled and key[0] != "class")
        if classes_before != classes_after:
            self.unsettle_all()

    def to_look_at(self, *, walk: int) -> list[Key]:
        """What one resync queues: every unsettled key, then the `walk` settled keys verified
        longest ago (moved to the back: the next pass walks on)."""
        with self._lock:
            keys = list(self._unsettled)
            for key in list(itertools.islice(self._settled, max(0, walk))):
                del self._settled[key]
                self._settled[key] = None
                keys.append(key)
            return keys

    def walk_size(self, *, interval_s: float, relist_interval_s: float, per_s: float) -> int:
        """Settled keys one resync walks: all of them once per relist interval, at most `per_s` a second."""
        with self._lock:
            count = len(self._settled)
        if count == 0 or per_s <= 0 or relist_interval_s <= 0:
            return 0
        share = -(-count * interval_s // relist_interval_s)
        return int(min(share, max(1.0, per_s * interval_s)))

    def counts(self) -> tuple[int, int]:
        """(settled, unsettled) keys now."""
        with self._lock:
            return len(self._settled), len(self._unsettled)

    def is_settled(self, key: Key) -> bool:
        """Whether `key` is settled now."""
        with self._lock:
            return key in self._settled
