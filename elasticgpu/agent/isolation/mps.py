"""Mode MPS: NVIDIA's Multi-Process Service with per-client limits, from the claim's own size.

The card's MPS control daemon (mps_daemons.py) runs while a container of an MPS claim uses the card.
Each container gets the card's pipe folder mounted at /run/nvidia-mps (CUDA_MPS_PIPE_DIRECTORY), the
card's shared-memory tmpfs at /dev/shm (replacing the container's own: the MPS server and its clients
share POSIX shared memory; the daemon has the same tmpfs as its /dev/shm), and its own limits:
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (the claim's cores) and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (`0=<MiB>M`:
device 0 of the container, its one card). The MPS server enforces them for every process of the
container, children included: they are the driver's limits, not the container's goodwill. They are
read when a process starts: after a resize, new processes get the new size (from limits.env,
docs/resize-node.md); running ones keep theirs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from elasticgpu.agent.isolation import base, mps_daemons, none
from elasticgpu.agent.isolation.mps_daemons import MpsDaemons

CONTAINER_PIPE_DIR = "/run/nvidia-mps"
"""Where a container sees its card's MPS pipe folder (not /tmp/nvidia-mps, which the CDI spec may mount)."""
ENV_PIPE_DIR = "CUDA_MPS_PIPE_DIRECTORY"
CONTAINER_SHM_DIR = "/dev/shm"
"""Where a container sees its card's shared memory with the MPS server (the daemon's /dev/shm too)."""


class MpsRoom:
    """base.Room of mode MPS (see the module docstring)."""

    mode = base.MODE_MPS

    def __init__(self, daemons: MpsDaemons, *, control: Callable[[], str | None], control_setting: str) -> None:
        """`control`: the control binary found under the driver root now (None: the node cannot run MPS);
        `control_setting`: where it was looked for, for the message that says so."""
        self.daemons = daemons
        self._control = control
        self._control_setting = control_setting

    def problem(self) -> str | None:
        """Why the node cannot run MPS, or None."""
        if self._control() is None:
            return f"the driver's nvidia-cuda-mps-control is not installed ({self._control_setting})"
        return self.daemons.problem()

    def prepare(self, slice_: base.Slice) -> None:
        """The daemon of the claim's card runs; `Unavailable` (retryable) when it cannot start."""
        if (problem := self.problem()) is not None:
            raise base.Unavailable(problem)
        for uuid in slice_.uuids:
            try:
                self.daemons.ensure(uuid)
            except RuntimeError as e:  # NeedsAdmin: it will not pass by itself
                raise base.Unavailable(f"the MPS control daemon of card {uuid} does not start: {e}",
                                       retryable=not isinstance(e, mps_daemons.NeedsAdmin)) from e

    def contribute(self, slice_: base.Slice) -> base.Contribution:
        """The pipe folder and shared memory of the card, and the claim's per-client limits."""
        uuid = slice_.uuids[0]  # a slice is of one card
        return base.Contribution(
            envs=((ENV_PIPE_DIR, CONTAINER_PIPE_DIR), *none.mps_env(slice_)),
            mounts=(base.Mount(host_path=str(self.daemons.pipe_dir(uuid)), container_path=CONTAINER_PIPE_DIR,
                               readonly=False),  # clients write to the pipes
                    base.Mount(host_path=str(self.daemons.shm_dir(uuid)), container_path=CONTAINER_SHM_DIR,
                               readonly=False)),  # and create shared memory with the server
            annotations=base.marked(self.mode, slice_),
        )

    def sync(self, containers: Sequence[base.RunningContainer]) -> None:
        """Stop the daemons of cards no MPS container uses."""
        self.daemons.release_except(base.cards_in_use(self.mode, containers))

    def close(self) -> None:
        """Stop supervising; the daemons keep serving their containers."""
        self.daemons.close()
