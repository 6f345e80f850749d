"""A fault-injecting HTTPS proxy between a component under test and the test API server.

    component --TLS (proxy's certificate)--> FaultProxy --TLS (client certificate)--> API server

The proxy terminates TLS with a certificate of its own (a kubeconfig written by
`write_kubeconfig` trusts it), reads each HTTP/1.1 request, classifies it by RBAC verb (get,
list, watch, create, update, patch, delete) and, drawing from one seeded random generator,
either forwards it untouched or injects one fault:

    "404" "409" "410" "422" "429" "500" "503"
                  answered by the proxy with a Kubernetes Status of that code; the request never
                  reaches the server (for a write: nothing was saved)
    "500-after"   forwarded, then answered 500 instead of the server's answer (for a write: it
                  WAS saved, and the client is told it failed: the ambiguous case)
    "slow"        forwarded after a pause drawn from `FaultPlan.slow_s`
    "drop"        the connection is closed before forwarding (no answer, nothing saved)
    "drop-after"  forwarded, then the connection is closed instead of answering (saved, no
                  answer); a watch is relayed for a while (`FaultPlan.cut_after_s`), then closed
    "half-open"   nothing is answered and the connection stays open, silent, until the client
                  closes it (a peer that vanished without a FIN); a watch is relayed for a while,
                  then goes silent the same way

Rates are per fault and per verb (`FaultPlan`); every decision is counted (`FaultProxy.injected`,
`FaultProxy.requests`). With one client thread the sequence of decisions is reproducible from the
seed; with several, the order requests arrive in decides which draw each gets.

Everything is HTTP-level: a TCP relay cannot tell a watch from a write, nor answer a 409. The
connection faults (drop, half-open) are real socket behaviour all the same.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import http.client
import http.server
import json
import random
import re
import select
import socket
import socketserver
import ssl
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

VERBS = ("get", "list", "watch", "create", "update", "patch", "delete")
GROUPS = {"read": ("get", "list"), "write": ("create", "update", "patch", "delete"), "watch": ("watch",)}
"""Verb groups a plan may give rates for; a verb's own entry wins over its group's."""
STATUS_REASONS = {403: "Forbidden", 404: "NotFound", 409: "Conflict", 410: "Expired", 422: "Invalid",
                  429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable"}
FAULTS = (*(str(code) for code in STATUS_REASONS), "500-after", "slow", "drop", "drop-after", "half-open")
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection", "te",
               "trailer", "upgrade"}


@dataclass(frozen=True, kw_only=True)
class FaultPlan:
    """Which faults to inject, how often, and how they behave. Rates are probabilities per
    request (0..1; for one verb their sum at most 1). `rates` apply to every verb; `verbs` adds
    or overrides rates by group ("read", "write", "watch") and then by verb ("patch")."""

    seed: int = 0
    rates: Mapping[str, float] = field(default_factory=dict)
    verbs: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    slow_s: tuple[float, float] = (0.5, 2.0)
    """Seconds a "slow" request is held before it is forwarded (uniform in this range)."""
    cut_after_s: tuple[float, float] = (0.5, 5.0)
    """Seconds a watch is relayed before "drop-after" closes it or "half-open" silences it."""
    paths: tuple[str, ...] = ()
    """Regular expressions, each searched (`re.search`) in "VERB PATH" (the path without the
    query, e.g. "list /apis/elasticgpu.io/v1alpha1/elasticgpuquotas"): when given, only the
    requests that match one draw a fault; every other one is forwarded untouched."""

    def __post_init__(self) -> None:
        for scope, table in [("rates", self.rates), *((f"verbs[{k}]", v) for k, v in self.verbs.items())]:
            unknown = set(table) - set(FAULTS)
            if unknown:
                raise ValueError(f"FaultPlan.{scope}: unknown faults {sorted(unknown)}; known: {FAULTS}")
        unknown_verbs = set(self.verbs) - set(VERBS) - set(GROUPS)
        if unknown_verbs:
            raise ValueError(f"FaultPlan.verbs: unknown {sorted(unknown_verbs)}; use {VERBS} or {tuple(GROUPS)}")
        for verb in VERBS:
            total = sum(self.rates_for(verb).values())
            if total > 1.0 + 1e-9:
                raise ValueError(f"FaultPlan: the rates for {verb} add up to {total:.3f} > 1")

    def rates_for(self, verb: str) -> dict[str, float]:
        """The rate of each fault for `verb`: `rates`, then its group's, then its own entry."""
        merged = dict(self.rates)
        for group, members in GROUPS.items():
            if verb in members:
                merged.update(self.verbs.get(group, {}))
        merged.update(self.verbs.get(verb, {}))
        return {fault: rate for fault, rate in merged.items() if rate > 0}


def classify(method: str, target: str) -> str:
    """The RBAC verb of a request to the Kubernetes API (`target`: path and query)."""
    url = urlsplit(target)
    method = method.upper()
    if method == "GET":
        if parse_qs(url.query).get("watch", ["false"])[0] in ("true", "1"):
            return "watch"
        segments = [s for s in url.path.split("/") if s]
        if segments[:1] == ["api"]:
            rest = segments[2:]
        elif segments[:1] == ["apis"]:
            rest = segments[3:]
        else:
            return "get"  # /version, /openapi, /healthz: not resources
        if rest[:1] == ["watch"]:
            return "watch"
        if len(rest) >= 3 and rest[0] == "namespaces":
            rest = rest[2:]  # a namespaced resource (a namespace itself stays as is)
        return "list" if len(rest) == 1 else "get"
    return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method, method.lower())


@dataclass(frozen=True)
class Decision:
    verb: str
    fault: str | None  # None: forwarded untouched
    pause_s: float = 0.0  # "slow": the hold; watch "drop-after"/"half-open": the relayed time


class FaultProxy:
    """The proxy; `start()` listens on a free loopback port (`url`), `stop()` closes everything."""

    def __init__(self, *, upstream: str, upstream_context: ssl.SSLContext, plan: FaultPlan | None = None,
                 server_cert: Path, server_key: Path) -> None:
        """`upstream`: the API server's URL; `upstream_context`: TLS to it (CA and client
        certificate); `server_cert`/`server_key`: what the proxy presents to its clients."""
        url = urlsplit(upstream)
        self.upstream_host = url.hostname or "127.0.0.1"
        self.upstream_port = url.port or 443
        self.upstream_context = upstream_context
        self._server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._server_context.load_cert_chain(str(server_cert), str(server_key))
        self._server_context.set_alpn_protocols(["http/1.1"])
        self._lock = threading.Lock()
        self._plan = plan or FaultPlan()
        self._rng = random.Random(self._plan.seed)
        self.requests: Counter[str] = Counter()
        """Requests seen, by verb."""
        self.injected: Counter[tuple[str, str]] = Counter()
        """Faults injected, by (verb, fault)."""
        self.journal: deque[tuple[float, str, str, str]] = deque(maxlen=100_000)
        """Each fault injected: (wall time, verb, fault, path), for a failing test's diagnosis."""
        self.seen: set[tuple[str, str]] = set()
        self.by_target: Counter[str] = Counter()
        """Requests by "VERB PATH" (the path without its query)."""
        """Every distinct (verb, path with query) requested: what a component asked of the API
        server (tests/deploy checks it against the RBAC rules of the manifests)."""
        self.stopping = threading.Event()
        self._handlers: set[_Handler] = set()
        self._server: _Server | None = None

    # -- plan and counters -------------------------------------------------------------------
    @property
    def plan(self) -> FaultPlan:
        return self._plan

    def set_plan(self, plan: FaultPlan) -> None:
        """Inject by `plan` from now on (its seed restarts the random sequence)."""
        with self._lock:
            self._plan, self._rng = plan, random.Random(plan.seed)

    def decide(self, verb: str, path: str = "") -> Decision:
        """Draw the fate of one request of `verb` to `path` (and count it)."""
        with self._lock:
            plan, rng = self._plan, self._rng
            self.requests[verb] += 1
            self.seen.add((verb, path))
            draw, fault = rng.random(), None
            target = f"{verb} {path.split('?')[0]}"
            self.by_target[target] += 1
            aimed = not plan.paths or any(re.search(pattern, target) for pattern in plan.paths)
            for name, rate in sorted(plan.rates_for(verb).items()) if aimed else ():
                if draw < rate:
                    fault = name
                    break
                draw -= rate
            pause = 0.0
            if fault == "slow":
                pause = rng.uniform(*plan.slow_s)
            elif fault in ("drop-after", "half-open") and verb == "watch":
                pause = rng.uniform(*plan.cut_after_s)
            if fault is not None:
                self.injected[(verb, fault)] += 1
                self.journal.append((time.time(), verb, fault, path.split("?")[0]))
            return Decision(verb, fault, pause)

    def count(self, fault: str | None = None, verb: str | None = None) -> int:
        """Faults injected so far, all or of one fault and/or verb."""
        with self._lock:
            return sum(n for (v, f), n in self.injected.items()
                       if (fault is None or f == fault) and (verb is None or v == verb))

    def write_journal(self, path: Path) -> Path:
        """Write the journal of injected faults to `path`, one per line (UTC time, verb, fault, path)."""
        with self._lock:
            entries = list(self.journal)
        path.write_text("".join(
            f"{datetime.datetime.fromtimestamp(at, datetime.UTC).strftime('%H:%M:%S.%f')[:-3]} {verb} {fault} {p}\n"
            for at, verb, fault, p in entries))
        return path

    def summary(self) -> str:
        """Requests and injected faults by verb, one line (for logs and failure messages)."""
        with self._lock:
            faults = ", ".join(f"{v} {f}: {n}" for (v, f), n in sorted(self.injected.items()))
            return f"requests {dict(sorted(self.requests.items()))}; injected {faults or 'nothing'}"

    # -- serving -----------------------------------------------------------------------------
    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("FaultProxy.url: not started")
        return f"https://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FaultProxy:
        """Listen on a free loopback port and serve in daemon threads; returns self."""
        owner = self

        class Handler(_Handler):
            proxy = owner

        self._server = _Server(("127.0.0.1", 0), Handler, self)
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                         name="fault-proxy", daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop accepting, then close every connection (half-open ones included)."""
        self.stopping.set()
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        with self._lock:
            handlers, self._handlers = list(self._handlers), set()
        for handler in handlers:
            handler.abort()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _track(self, handler: _Handler, add: bool) -> None:
        with self._lock:
            (self._handlers.add if add else self._handlers.discard)(handler)


class _Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type[_Handler], proxy: FaultProxy) -> None:
        self.proxy = proxy
        super().__init__(address, handler)

    def get_request(self) -> tuple[Any, Any]:
        sock, address = self.socket.accept()
        # Headers and body leave in separate writes: without NODELAY, Nagle's algorithm and the
        # client's delayed ACK add 40 ms to every answer.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # The TLS handshake happens in the connection's own thread (Handler.setup), so a slow
        # client never holds up the accept loop.
        return self.proxy._server_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that vanished mid-handshake or mid-request is part of the game here


class _Handler(http.server.BaseHTTPRequestHandler):
    proxy: FaultProxy
    protocol_version = "HTTP/1.1"
    upstream: http.client.HTTPSConnection | None = None

    def setup(self) -> None:
        self.request.settimeout(30)
        self.request.do_handshake()
        self.request.settimeout(None)
        self.proxy._track(self, True)
        super().setup()

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        self.proxy._track(self, False)
        self._close_upstream()

    def abort(self) -> None:
        """Close both sides at once (the proxy stops): blocked reads and holds end."""
        upstream = self.upstream
        for sock in (self.request, upstream.sock if upstream is not None else None):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # thousands of requests per test: quiet

    def do_GET(self) -> None:
        self._handle()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    # -- one request ---------------------------------------------------------------------------
    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        verb = classify(self.command, self.path)
        decision = self.proxy.decide(verb, self.path)
        fault = decision.fault
        if fault is not None and fault[:1].isdigit() and fault != "500-after":
            self._status(int(fault), verb)
            return
        if fault == "drop":
            self.close_connection = True
            return
        if fault == "half-open" and verb != "watch":
            self._hold_silent()
            return
        if fault == "slow" and self.proxy.stopping.wait(decision.pause_s):
            self.close_connection = True
            return
        try:
            response = self._forward(body)
        except (OSError, http.client.HTTPException):
            self._close_upstream()
            self.close_connection = True  # the server is unreachable: so is the proxy
            return
        if verb == "watch" and fault in ("drop-after", "half-open"):
            self._relay(response, cut_after_s=decision.pause_s, then_silent=fault == "half-open")
            return
        if fault == "drop-after":
            response.read()
            self._close_upstream()
            self.close_connection = True
            return
        if fault == "500-after":
            response.read()
            self._status(500, verb)
            return
        self._relay(response)

    def _forward(self, body: bytes | None) -> http.client.HTTPResponse:
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP and k.lower() != "host"}
        if body is not None:
            headers["Content-Length"] = str(len(body))
        for attempt in (0, 1):
            reused = self.upstream is not None
            if self.upstream is None:
                self.upstream = http.client.HTTPSConnection(
                    self.proxy.upstream_host, self.proxy.upstream_port, context=self.proxy.upstream_context,
                    timeout=330)  # a watch may be quiet for its whole timeoutSeconds (at most 300 here)
            try:
                self.upstream.request(self.command, self.path, body=body, headers=headers)
                return self.upstream.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ssl.SSLEOFError):
                self._close_upstream()  # the server closed an idle keep-alive connection: once more
                if not reused or attempt:
                    raise
        raise AssertionError("unreachable")

    def _relay(self, response: http.client.HTTPResponse, *, cut_after_s: float | None = None,
               then_silent: bool = False) -> None:
        """Send the server's answer on, streaming (a watch is relayed event by event). With
        `cut_after_s`, the relay stops after that long: the connection is closed, or, with
        `then_silent`, held open without a byte more."""
        self.send_response_only(response.status, response.reason)
        for key, value in response.getheaders():
            if key.lower() not in _HOP_BY_HOP and key.lower() not in ("date", "server"):
                self.send_header(key, value)
        length = response.getheader("Content-Length")
        chunked = length is None
        self.send_header("Transfer-Encoding", "chunked") if chunked else self.send_header("Content-Length", length)
        if response.will_close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        cut = threading.Event()
        timer = None
        if cut_after_s is not None:
            upstream = self.upstream

            def fire() -> None:
                cut.set()
                if upstream is not None and upstream.sock is not None:
                    with contextlib.suppress(OSError):
                        upstream.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked read below

            timer = threading.Timer(cut_after_s, fire)
            timer.daemon = True
            timer.start()
        try:
            if not chunked and cut_after_s is None:
                # All at once: read1 never marks a Content-Length answer as done (http.client),
                # and the connection would refuse the next request.
                self.wfile.write(response.read())
            while chunked and not cut.is_set():
                data = response.read1(65536)
                if cut.is_set():
                    break
                if not data:
                    if chunked:
                        self.wfile.write(b"0\r\n\r\n")
                    break
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
        except (OSError, http.client.HTTPException):
            if not cut.is_set():  # the server or the client went away: so does this connection
                self._close_upstream()
                self.close_connection = True
                return
        finally:
            if timer is not None:
                timer.cancel()
        if cut.is_set():
            self._close_upstream()
            if then_silent:
                self._hold_silent()
            self.close_connection = True
        elif response.will_close:
            self._close_upstream()

    def _status(self, code: int, verb: str) -> None:
        status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": code,
                  "reason": STATUS_REASONS[code],
                  "message": f"fault proxy: injected {code} on {verb} {self.path.split('?')[0]}"}
        data = json.dumps(status).encode()
        self.send_response_only(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if code == 429:
            self.send_header("Retry-After", "1")
        self.end_headers()
        self.wfile.write(data)

    def _hold_silent(self) -> None:
        """Answer nothing and keep the connection open until the client closes it (or the proxy
        stops): what a client sees when the peer vanished without closing."""
        self.close_connection = True
        sock = self.request
        # poll, not select: select refuses descriptors past 1024, which a long test process reaches,
        # and the ValueError closed the connection (a ProtocolError where a read timeout was due).
        waiting = select.poll()
        waiting.register(sock, select.POLLIN)
        while not self.proxy.stopping.is_set():
            try:
                if waiting.poll(500) and not sock.recv(65536):
                    return  # the client gave up and closed
            except OSError:
                return

    def _close_upstream(self) -> None:
        upstream, self.upstream = self.upstream, None
        if upstream is not None:
            upstream.close()


def write_kubeconfig(source: Path, proxy: FaultProxy, ca_file: Path, target: Path) -> Path:
    """A copy of kubeconfig `source` whose current cluster is reached through `proxy` (trusting
    the proxy's CA `ca_file`); the user's credentials are kept (the proxy ignores them and uses
    its own upstream certificate). Returns `target`."""
    config = yaml.safe_load(source.read_text())
    context = next(c for c in config["contexts"] if c["name"] == config["current-context"])["context"]
    cluster = next(c for c in config["clusters"] if c["name"] == context["cluster"])["cluster"]
    cluster["server"] = proxy.url
    cluster.pop("certificate-authority", None)
    cluster["certificate-authority-data"] = base64.b64encode(ca_file.read_bytes()).decode()
    target.write_text(yaml.safe_dump(config))
    target.chmod(0o600)
    return target


@contextlib.contextmanager
def fault_proxy(cluster: Any, plan: FaultPlan | None = None, *, directory: Path | None = None
                ) -> Iterator[tuple[FaultProxy, Path]]:
    """A started proxy in front of the local test cluster (`tests.kube_cluster.TestCluster`) and a
    kubeconfig that goes through it; both gone on exit."""
    from tests.kube_cluster import _write_certs

    with tempfile.TemporaryDirectory(prefix="fault-proxy-", dir=directory) as tmp:
        certs = _write_certs(Path(tmp))  # a CA of the proxy's own and a certificate for 127.0.0.1
        proxy = FaultProxy(upstream=cluster.server, upstream_context=cluster.ssl_context(), plan=plan,
                           server_cert=certs["server.crt"], server_key=certs["server.key"])
        with proxy:
            kubeconfig = write_kubeconfig(Path(cluster.kubeconfig), proxy, certs["ca.crt"],
                                          Path(tmp) / "kubeconfig")
            yield proxy, kubeconfig


def wait_for(predicate: Any, *, timeout_s: float, what: str) -> None:
    """Poll `predicate()` every 50 ms until it is true; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.05)
