"""Mode MPS: NVIDIA's Multi-Process Service with per-client limits, from the claim's own size.

The card's MPS control daemon (mps_daemons.py) runs while a container of an MPS claim uses the card.
Each container gets the card's pipe folder mounted at /run/nvidia-mps (CUDA_MPS_PIPE_DIRECTORY), the
card's shared-memory tmpfs at /dev/shm (replacing the container's own: the MPS server and its clients
share POSIX shared memory; the daemon has the same tmpfs as its /dev/shm), and its own limits:
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (the claim's cores) and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (`0=<MiB>M`:
device 0 of the container, its one card). These are the client's own environment: MPS reads them when a
process starts, and a process can start a child with other values. So the agent also gives the card's
control daemon a ceiling (mps_daemons.Ceiling: the largest slice the daemon serves), which MPS obeys
whatever a client's environment says: with one MPS claim on a card its size holds even against a child
that rewrites its environment; with several, a client can reach the largest of them, not the whole card.
Anyone who can write to the pipe folder can talk to the control daemon, which is why MPS is for tenants
who trust each other (docs/isolation.md). After a resize, new processes get the new size (from
limits.env, docs/resize-node.md); running ones keep theirs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Protocol

from elasticgpu.agent.isolation import base, mps_shm, none
from elasticgpu.agent.isolation.mps_ceiling import Ceiling
from elasticgpu.agent.isolation.mps_client import MpsServiceRefused, MpsServiceUnreachable

log = logging.getLogger(__name__)

CONTAINER_PIPE_DIR = "/run/nvidia-mps"
"""Where a container sees its card's MPS pipe folder (not /tmp/nvidia-mps, which the CDI spec may mount)."""
ENV_PIPE_DIR = "CUDA_MPS_PIPE_DIRECTORY"
ANNOTATION_USER = base.ANNOTATION_MPS_USER
CONTAINER_SHM_DIR = "/dev/shm"
"""Where a container sees its card's shared memory with the MPS server (the daemon's /dev/shm too)."""


class Daemons(Protocol):
    """The node's MPS control daemons as the room uses them: run here (`mps_daemons.MpsDaemons`) or by the MPS
    daemon service, outside the agent's cgroup (`mps_client.MpsDaemonsClient`)."""

    def problem(self) -> str | None: ...
    def ensure(self, uuid: str, ceiling: Ceiling | None = None) -> None: ...
    def release_except(self, used: Iterable[str]) -> list[str]: ...
    def pipe_dir(self, uuid: str) -> Path: ...
    def shm_dir(self, uuid: str) -> Path: ...
    def close(self) -> None: ...


class MpsRoom:
    """base.Room of mode MPS (see the module docstring)."""

    mode = base.MODE_MPS

    def __init__(self, daemons: Daemons, *, control: Callable[[], str | None], control_setting: str) -> None:
        """`control`: the control binary found under the driver root now (None: the node cannot run MPS);
        `control_setting`: where it was looked for, for the message that says so."""
        self.daemons = daemons
        self._lock = threading.Lock()
        self._users: dict[str, dict[tuple[str, str], int]] = {}  # card -> (pod uid, container) -> uid it runs as
        self._control = control
        self._control_setting = control_setting
        self._unreachable = False  # the MPS daemon service did not answer the last sync (said once)

    def problem(self) -> str | None:
        """Why the node cannot run MPS, or None."""
        if self._control() is None:
            return f"the driver's nvidia-cuda-mps-control is not installed ({self._control_setting})"
        try:
            return self.daemons.problem()
        except (MpsServiceUnreachable, MpsServiceRefused) as e:
            return str(e)

    def prepare(self, slice_: base.Slice) -> str | None:
        """The daemon of the claim's card runs, with its ceiling; `Unavailable` (retryable) when it cannot start.
        Returns a warning when the container runs as another uid than the card's other MPS containers."""
        if self._control() is None:
            raise base.Unavailable(f"the driver's nvidia-cuda-mps-control is not installed ({self._control_setting})")
        try:
            problem = self.daemons.problem()
        except (MpsServiceUnreachable, MpsServiceRefused) as e:  # the service restarting: passes by itself
            raise base.Unavailable(str(e), retryable=True) from e
        if problem is not None:
            raise base.Unavailable(problem)
        for uuid in slice_.uuids:
            try:
                # The daemon's own ceiling (issue 33.7): what the client's environment says, a child can change.
                self.daemons.ensure(uuid, Ceiling.of(slice_.cores, slice_.memory_mib))
            except RuntimeError as e:  # NeedsAdmin: it will not pass by itself
                raise base.Unavailable(f"the MPS control daemon of card {uuid} does not start: {e}",
                                       retryable=not isinstance(e, mps_shm.NeedsAdmin)) from e
        return self._other_users(slice_)

    def _other_users(self, slice_: base.Slice) -> str | None:
        """MPS runs one server per uid on a card: a client of another uid waits until every client of the running
        server has finished (NVIDIA's MPS documentation), so pods of one card that run as different users take
        turns instead of sharing. Warned, not refused: a refusal would let whoever came first lock the card for
        its uid; a uid the pod does not set (the image's) cannot be known here and is not compared."""
        uuid = slice_.uuids[0].lower()
        me = (slice_.pod_uid, slice_.container)
        with self._lock:
            users = self._users.setdefault(uuid, {})
            if slice_.user is None:
                users.pop(me, None)
                return None
            users[me] = slice_.user
            others = sorted({user for key, user in users.items() if key != me and user != slice_.user})
        if not others:
            return None
        return (f"container {slice_.container!r} of ElasticGPUClaim {slice_.claim} runs as uid {slice_.user}, but"
                f" other MPS containers of card {slice_.uuids[0]} run as uid {', '.join(map(str, others))}: MPS"
                " serves one uid at a time per card, so these pods take turns on the card instead of sharing it (a"
                " client waits until the other uid's clients finish). Run the class's pods as one uid"
                " (securityContext.runAsUser), or use"
                " a class with isolation HAMiCore or partitioning MIG")

    def contribute(self, slice_: base.Slice) -> base.Contribution:
        """The pipe folder and shared memory of the card, and the claim's per-client limits."""
        uuid = slice_.uuids[0]  # a slice is of one card
        return base.Contribution(
            envs=((ENV_PIPE_DIR, CONTAINER_PIPE_DIR), *none.mps_env(slice_)),
            mounts=(base.Mount(host_path=str(self.daemons.pipe_dir(uuid)), container_path=CONTAINER_PIPE_DIR,
                               readonly=False),  # clients write to the pipes
                    base.Mount(host_path=str(self.daemons.shm_dir(uuid)), container_path=CONTAINER_SHM_DIR,
                               readonly=False)),  # and create shared memory with the server
            annotations={**base.marked(self.mode, slice_),
                         **({ANNOTATION_USER: str(slice_.user)} if slice_.user is not None else {})},
        )

    def sync(self, containers: Sequence[base.RunningContainer]) -> None:
        """Stop the daemons of cards no MPS container uses; keep the uids of those that run."""
        users: dict[str, dict[tuple[str, str], int]] = {}
        for container in containers:
            said = container.annotations
            if said.get(base.ANNOTATION_MODE) != self.mode or not said.get(ANNOTATION_USER, "").isdigit():
                continue
            for uuid in (u.strip().lower() for u in said.get(base.ANNOTATION_CARDS, "").split(",") if u.strip()):
                users.setdefault(uuid, {})[(container.pod_uid, container.name)] = int(said[ANNOTATION_USER])
        with self._lock:
            self._users = users
        try:
            self.daemons.release_except(base.cards_in_use(self.mode, containers))
        except MpsServiceUnreachable as e:
            if not self._unreachable:  # once per outage: the next sync tries again
                log.warning("MPS daemons not released: %s", e)
            self._unreachable = True
            return
        if self._unreachable:
            log.info("the MPS daemon service answers again")
        self._unreachable = False

    def close(self) -> None:
        """Stop supervising; the daemons keep serving their containers."""
        self.daemons.close()
