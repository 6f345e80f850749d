"""A `relay.Relay` that answers late, as a loaded API server does: each block of the server's
answers is held for `delay_s` before it is forwarded (requests go through at once)."""

from __future__ import annotations

import contextlib
import socket
import time

from tests.controller.relay import Relay


class SlowRelay(Relay):
    """A `Relay` that holds each block of the server's answers for `delay_s` first (0: none)."""

    delay_s = 0.0

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            from_server = source.getpeername()[1] == self._target[1]
            while data := source.recv(65536):
                if source in self._silenced or sink in self._silenced:
                    continue  # half-open, as `Relay.silence` makes it
                if from_server and self.delay_s:
                    time.sleep(self.delay_s)  # bounded: one answer's lateness
                sink.sendall(data)
        if source in self._silenced or sink in self._silenced:
            return
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
