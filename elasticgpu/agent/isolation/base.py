"""The seam between the CRI hook and the isolation modes: what a mode adds to a claim's container.

Each mode (none.py, mps.py, hami_core.py) is a room of its own behind `Room`; the CRI hook asks the
claim's room (rooms.py picks it from the claim's `status.isolation`) and never branches on a mode:

    problem()                  None when the node can provide the mode now, else why not (names the
                               setting or file to fix); the inventory publishes the modes without one
    prepare(slice_)            the node-side work before the container is created (MPS: its card's
                               daemon runs, with its ceiling); raises `Unavailable` when it cannot be
                               done now; returns a warning for the pod (a Warning Event), or None
    contribute(slice_)         pure: the env, mounts and annotations the container gets
    sync(containers)           the runtime's containers (after every removal and reconcile): undo what
                               no container needs any more (MPS: stop a card's daemon; HAMi-core:
                               remove a gone container's cache folder)
    close()                    the agent stops (daemons keep running: containers use them)

Only slices go through a room: whole cards are nobody else's, so no mechanism is needed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

MODE_NONE = "None"
MODE_MPS = "MPS"
MODE_HAMI_CORE = "HAMiCore"
MODE_WHOLE_CARD = "WholeCard"  # a claim's status.isolation for whole cards: served by no room

ANNOTATION_MODE = "elasticgpu.io/isolation"
"""Set on a claim container by the agent: the mode that enforces its size (read back by `sync`)."""
ANNOTATION_CARDS = "elasticgpu.io/isolation-cards"
"""Set on a claim container with a mode: the uuids of its cards, comma-separated (read back by `sync`)."""
ANNOTATION_MPS_USER = "elasticgpu.io/mps-user"
"""Set on an MPS container whose pod says its uid (runAsUser): read back by `sync` (MPS runs one server per uid)."""


class Unavailable(Exception):
    """The mode cannot serve the container now; the message says why and what to fix."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        """True when it may pass by itself (a daemon that did not start yet); False: an admin must act."""


@dataclass(frozen=True, kw_only=True)
class Slice:
    """A claim's container, as a mode needs it (plain values)."""

    claim: str  # namespace/name
    uuids: tuple[str, ...]  # the claim's cards, in the container's device order
    cores: int  # percent of each card's compute (0: a memory-only slice, no compute limit)
    memory_mib: int  # MiB of each card's memory (0: no memory limit)
    pod_uid: str
    container: str
    user: int | None = None  # the uid it runs as when the pod says (securityContext.runAsUser); None: the image's


@dataclass(frozen=True, kw_only=True)
class Mount:
    """A bind mount the runtime makes: a node path at a container path."""

    host_path: str
    container_path: str
    readonly: bool = True


@dataclass(frozen=True, kw_only=True)
class Contribution:
    """What a mode adds to one container."""

    envs: tuple[tuple[str, str], ...] = ()
    mounts: tuple[Mount, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class RunningContainer:
    """A container of the runtime, as `sync` reads it (from ListContainers)."""

    id: str
    pod_uid: str
    name: str
    annotations: Mapping[str, str]


class Room(Protocol):
    """One isolation mode (see the module docstring)."""

    mode: str

    def problem(self) -> str | None:
        """None when the node can provide the mode, else why not."""
        ...

    def prepare(self, slice_: Slice) -> str | None:
        """Node-side work before the container is created; raises `Unavailable`. Returns a warning for the pod
        (the container starts all the same), or None."""
        ...

    def contribute(self, slice_: Slice) -> Contribution:
        """The container's env, mounts and annotations (pure)."""
        ...

    def sync(self, containers: Sequence[RunningContainer]) -> None:
        """Undo what no container of `containers` needs any more."""
        ...

    def close(self) -> None:
        """The agent stops."""
        ...


def marked(mode: str, slice_: Slice) -> dict[str, str]:
    """The annotations every enforcing mode puts on its containers (for `sync`)."""
    return {ANNOTATION_MODE: mode, ANNOTATION_CARDS: ",".join(slice_.uuids)}


def cards_in_use(mode: str, containers: Sequence[RunningContainer]) -> set[str]:
    """Lowercased uuids of the cards that containers of `mode` use."""
    used: set[str] = set()
    for container in containers:
        if container.annotations.get(ANNOTATION_MODE) == mode:
            used.update(u.strip().lower() for u in container.annotations.get(ANNOTATION_CARDS, "").split(",")
                        if u.strip())
    return used
