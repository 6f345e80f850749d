"""A stress run, not a test (pytest collects no file of this name): threads still inside requests
on one `Transport` while another thread closes it again and again, and other threads opening
fresh TLS connections of their own meanwhile (a test's teardown after a controller stopped).
Prints how many of those other requests failed, by error: with a close that frees descriptors in
use, the other connections' TLS streams mix (DECRYPTION_FAILED_OR_BAD_RECORD_MAC,
UNEXPECTED_MESSAGE, WRONG_VERSION_NUMBER); `tests/controller/test_transport_close.py` is the
deterministic test of the rule.

    .venv/bin/python -m tests.controller.transport_close_stress 15
"""

from __future__ import annotations

import collections
import datetime
import random
import socket
import ssl
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from cryptography.x509.oid import ExtendedKeyUsageOID

from elasticgpu import certificate_authority as ca
from elasticgpu.controller.edge.transport import Transport

BODY = b"x" * 200_000
"""An answer of several TLS records and reads."""


def _server(context: ssl.SSLContext) -> int:
    """A TLS HTTP server on loopback, a thread per connection; /slow answers within 50 ms."""
    listener = socket.create_server(("127.0.0.1", 0))

    def answer(raw: socket.socket) -> None:
        try:
            conn = context.wrap_socket(raw, server_side=True)
        except OSError:
            return
        with conn:
            buffered = b""
            while True:
                try:
                    while b"\r\n\r\n" not in buffered:
                        if not (data := conn.recv(65536)):
                            return
                        buffered += data
                    head, _, buffered = buffered.partition(b"\r\n\r\n")
                    if b"/slow" in head.split(b"\r\n")[0]:
                        time.sleep(random.uniform(0.0, 0.05))  # a delay, not a secret
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY)
                except OSError:
                    return

    def serve() -> None:
        while True:
            raw, _ = listener.accept()
            threading.Thread(target=answer, args=(raw,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return int(listener.getsockname()[1])


def main(seconds: float) -> None:
    now = datetime.datetime.now(datetime.UTC)
    validity = ca.Validity(now - datetime.timedelta(minutes=5), now + datetime.timedelta(hours=1))
    authority = ca.new_ca("stress-ca", validity)
    leaf = ca.issue(authority, ca.subject("127.0.0.1"), usage=ExtendedKeyUsageOID.SERVER_AUTH,
                    hosts=["127.0.0.1"], validity=validity)
    folder = Path(tempfile.mkdtemp(prefix="transport-close-"))
    (folder / "ca.pem").write_bytes(authority.cert_pem())
    (folder / "cert.pem").write_bytes(leaf.cert_pem())
    (folder / "key.pem").write_bytes(leaf.key_pem())
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(folder / "cert.pem", folder / "key.pem")
    port = _server(context)
    configuration = SimpleNamespace(host=f"https://127.0.0.1:{port}", ssl_ca_cert=str(folder / "ca.pem"),
                                    verify_ssl=True, assert_hostname=None, cert_file=None, key_file=None,
                                    tls_server_name=None, auth_settings=dict)
    closed = Transport(configuration)
    stop = threading.Event()
    answered: collections.Counter[str] = collections.Counter()
    failed: collections.Counter[str] = collections.Counter()

    def straggler() -> None:  # a worker still syncing on the client being closed
        while not stop.is_set():
            try:
                closed.request("GET", "/slow", body=None, content_type="", timeout_s=5)
                answered["straggler"] += 1
            except Exception as err:  # counted: ending with the close is expected
                failed[f"straggler {type(err).__name__}"] += 1

    def other() -> None:  # a teardown's requests on a client of its own, fresh connections
        while not stop.is_set():
            own = Transport(configuration)
            try:
                status, data = own.request("GET", "/fast", body=None, content_type="", timeout_s=5)
                if status == 200 and data == BODY:
                    answered["other"] += 1
                else:
                    failed["other: a wrong answer"] += 1
            except Exception as err:  # counted: each is the bug
                failed[f"other {type(err).__name__}: {str(err)[:70]}"] += 1
            finally:
                own.close()

    threads = [threading.Thread(target=target, daemon=True) for target in (straggler,) * 3 + (other,) * 3]
    for thread in threads:
        thread.start()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        stop.wait(random.uniform(0.001, 0.02))
        closed.close()
    stop.set()
    for thread in threads:
        thread.join(10.0)
    print(f"answered: {dict(answered)}")
    print(f"failed: {dict(failed)}")
    print(f"other requests failed: {sum(n for k, n in failed.items() if k.startswith('other'))}")


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 15.0)
