"""A no-op agent for the NRI plugin (bench/nri_hook.py's `nri-noop` path): the same Go plugin,
registered with the runtime and relaying every event as one JSON line, answered `{}` (no
adjustment) at once. What it costs over no plugin is the runtime's NRI round trip (ttrpc to the
plugin, the whole Container in protojson to the agent and back) with no decision in it.

    python bench/nri_noop_agent.py <nri socket> <agent socket> <plugin>

Prints `synchronized` once the plugin registered; runs until SIGTERM.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from elasticgpu.agent.nri import FrontServer, PluginProcess, PluginSettings


class NoopFront:
    """Answers every request of the plugin with nothing to change."""

    def __init__(self) -> None:
        self.synchronized = threading.Event()

    def handle(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """No adjustment, no error."""
        if message.get("op") == "synchronize":
            self.synchronized.set()
        return {}


def main(argv: list[str]) -> None:
    nri_socket, agent_socket, plugin = argv[:3]
    front = NoopFront()
    server = FrontServer(front, Path(agent_socket)).start()  # type: ignore[arg-type]  # duck-typed front
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    process = PluginProcess(PluginSettings(binary=plugin, nri_socket=Path(nri_socket), agent_socket=Path(agent_socket)))
    thread = threading.Thread(target=process.run, args=(stop,), daemon=True)
    thread.start()
    if front.synchronized.wait(30):
        print("synchronized", flush=True)
    stop.wait()
    thread.join(10)
    server.close()


if __name__ == "__main__":
    main(sys.argv[1:])
