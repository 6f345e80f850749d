"""`elasticgpu agent mps-daemons`: the node's MPS control daemons in a process of their own (issue 44).

The chart runs it as the DaemonSet `elasticgpu-mps` beside the agent; the agent, given the same
`--mps-daemons-socket`, asks it for each card's daemon instead of running the daemons itself, so that an agent
restart (rollout, `helm upgrade`, kill -9) leaves the daemons and their clients alone (isolation/mps_service.py).
It reads the agent's settings (same flags, same ELASTICGPU_AGENT_* variables): the isolation folder, the MPS
settings, and the driver root under the host root where the control binary is found.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from elasticgpu.agent import isolation
from elasticgpu.agent.injecting import driver
from elasticgpu.agent.settings import AgentSettings

log = logging.getLogger(__name__)

DEFAULT_SOCKET_NAME = "mps-daemons.sock"
"""The service's socket under the isolation folder when --mps-daemons-socket is not given."""


def socket_path(settings: AgentSettings) -> Path:
    """Where the service listens: --mps-daemons-socket, else mps-daemons.sock in the isolation folder."""
    iso = settings.isolation
    return Path(iso.mps_daemons_socket or str(Path(iso.isolation_dir) / DEFAULT_SOCKET_NAME))


def control_finder(settings: AgentSettings, driver_root: Callable[[], str]) -> Callable[[], str | None]:
    """The driver's nvidia-cuda-mps-control as this process sees it now (None: not installed)."""

    def control() -> str | None:
        return driver.find_binary(isolation.mps_finding.CONTROL, driver_root=driver_root(),
                                  host_root=settings.cri.host_root)

    return control


def daemons_here(settings: AgentSettings, control: Callable[[], str | None]) -> isolation.MpsDaemons:
    """The MPS control daemons run by this process (the service, or an agent without --mps-daemons-socket)."""
    iso = settings.isolation
    return isolation.MpsDaemons(control=control, state_dir=Path(iso.isolation_dir) / "mps",
                                settings=isolation.DaemonSettings(
                                    stop_timeout_s=iso.mps_stop_timeout_s, check_interval_s=iso.mps_check_interval_s,
                                    idle_grace_s=iso.isolation_idle_grace_s, shm_size_mib=iso.mps_shm_size_mib))


def serve(settings: AgentSettings, *, stop: threading.Event | None = None) -> int:
    """Serve until SIGTERM or SIGINT (or `stop`); the daemons keep running after it (the next run adopts them)."""
    stop = stop or threading.Event()
    control = control_finder(settings, lambda: settings.cri.driver_root)
    service = isolation.MpsDaemonService(daemons_here(settings, control), socket_path(settings))

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    service.start()
    if control() is None:
        log.warning("%s not found under the driver root %s (host root %s): no MPS daemon can start until it is",
                    isolation.mps_finding.CONTROL, settings.cri.driver_root, settings.cri.host_root)
    stop.wait()
    service.close()
    log.info("MPS daemon service stopped; its daemons keep serving their clients")
    return 0
