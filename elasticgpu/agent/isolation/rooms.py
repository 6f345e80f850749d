"""The agent's isolation rooms, one per mode, and the one call the CRI hook makes for a container."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from elasticgpu.agent.isolation import base
from elasticgpu.agent.isolation.none import NoneRoom

log = logging.getLogger(__name__)


class IsolationRooms:
    """The modes this node knows, by name (`None` is always there)."""

    def __init__(self, rooms: Sequence[base.Room] = ()) -> None:
        self._rooms: dict[str, base.Room] = {base.MODE_NONE: NoneRoom()}
        for room in rooms:
            self._rooms[room.mode] = room

    @property
    def rooms(self) -> Mapping[str, base.Room]:
        """The rooms by mode."""
        return dict(self._rooms)

    def room(self, mode: str | None) -> base.Room:
        """The room of `mode` (None or empty: mode None); raises `Unavailable` for a mode this agent lacks."""
        if mode == base.MODE_WHOLE_CARD:
            mode = base.MODE_NONE  # whole cards are nobody else's: nothing to enforce
        room = self._rooms.get(mode or base.MODE_NONE)
        if room is None:
            raise base.Unavailable(f"this agent does not know isolation mode {mode!r}: upgrade the agent")
        return room

    def offered(self) -> list[str]:
        """The enforcing modes the node can provide now (published in each GPU's status.isolation)."""
        return [mode for mode, room in sorted(self._rooms.items()) if mode != base.MODE_NONE and room.problem() is None]

    def sync(self, containers: Sequence[base.RunningContainer]) -> None:
        """Every room undoes what no container needs any more (a failure is logged, the next sync retries)."""
        for room in self._rooms.values():
            try:
                room.sync(containers)
            except Exception:
                log.exception("isolation mode %s: syncing with the runtime's containers failed", room.mode)

    def close(self) -> None:
        """The agent stops."""
        for room in self._rooms.values():
            room.close()
