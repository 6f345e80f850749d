"""The NRI plugin as the agent's supervised child: started, watched, started again with backoff.

The plugin (nri-plugin/main.go) exits when it loses the runtime's connection (containerd
restarted), when a synchronize gets no answer, or when the agent, its parent, is gone; as NRI's
sample plugins do, it never retries in place. `PluginProcess.run` starts it again after
`first_backoff_s`, doubling to `longest_backoff_s` while it keeps failing within `healthy_after_s`.
While no plugin is registered the runtime creates containers untouched (NRI fails open): the
next plugin's synchronize finds the claim containers made meanwhile (serving.py).

The child is started with subprocess's own fork/exec (no preexec_fn: the agent has loaded grpc,
whose threads make a Python function between fork and exec unsafe), in its own session so that a
signal to the agent's terminal does not reach it; its output goes to the agent's.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class PluginSettings:
    """How to run the plugin."""

    binary: str
    """The plugin's executable (nri-plugin/build.sh builds it; the image ships it next to the agent)."""
    nri_socket: Path
    """The runtime's NRI socket (--nri-socket; containerd's default /var/run/nri/nri.sock)."""
    agent_socket: Path
    """The agent's socket the plugin asks (serving.FrontServer)."""
    name: str = "elasticgpu"
    index: str = "10"
    """NRI's order among plugins: a device injector early, before plugins that read devices."""
    timeout_s: float = 1.5
    """How long the plugin waits for the agent's answer (below containerd's plugin_request_timeout, 2 s)."""
    first_backoff_s: float = 0.5
    longest_backoff_s: float = 30.0
    healthy_after_s: float = 60.0
    """A run this long resets the backoff."""

    def command(self) -> list[str]:
        """The plugin's command line."""
        return [self.binary, "-nri-socket", str(self.nri_socket), "-agent-socket", str(self.agent_socket),
                "-name", self.name, "-idx", self.index, "-timeout", f"{int(self.timeout_s * 1000)}ms"]


class PluginProcess:
    """The plugin, kept running (see the module docstring)."""

    def __init__(self, settings: PluginSettings, *, unregistered: Callable[[], None] = lambda: None) -> None:
        """`unregistered`: called before each start and after each exit of the plugin (it is not registered
        with the runtime then; the front's next synchronize says it is again)."""
        self.settings = settings
        self._unregistered = unregistered
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        """How many times the plugin was started (for tests and metrics)."""
        self._lock = threading.Lock()

    def run(self, stop: threading.Event) -> None:
        """Start the plugin and start it again whenever it exits, until `stop`; then end it."""
        failures = 0
        while not stop.is_set():
            started = time.monotonic()
            self._unregistered()
            try:
                with self._lock:
                    self.process = subprocess.Popen(self.settings.command(), start_new_session=True)
                    self.starts += 1
            except OSError as e:
                log.warning("the NRI plugin %s cannot be started (%s); no claim reaches a container until it "
                            "runs", self.settings.binary, e)
            else:
                while not stop.is_set() and self.process.poll() is None:
                    stop.wait(0.2)
                self._unregistered()
                if stop.is_set():
                    break
                log.warning("the NRI plugin exited with %s; starting it again", self.process.returncode)
            failures = 0 if time.monotonic() - started >= self.settings.healthy_after_s else failures + 1
            stop.wait(min(self.settings.longest_backoff_s, self.settings.first_backoff_s * 2 ** max(0, failures - 1)))
        self.terminate()
        self._unregistered()

    def terminate(self) -> None:
        """End the plugin (SIGTERM, then SIGKILL after 5 s)."""
        with self._lock:
            process = self.process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
