"""The leader keeps its Lease while the rest of its process is busy (issue 49 item 2: a leader lost
its Lease twice during a 16,000-card fill, "not renewed for 7.5s"), on the real test API server
reached through a relay that answers slowly, as a loaded server does:

- a renewal is one PUT (not a read and a write), on a connection of its own, begun a retry period
  after the previous attempt *began*: with every answer 2 s late and the binder's requests and a
  large list's parsing filling the process, renewals stay within the 6 s deadline;
- a Lease request that hangs gives up after its timeout, once: urllib3's retries (three more,
  each with the whole timeout) no longer run a renewal on past the renew deadline.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest
import yaml
from kubernetes import client
from kubernetes import config as kube_config

from elasticgpu.controller import errors
from elasticgpu.controller.edge import leasing
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.edge.leader import KubernetesLeases, LeaderElector, LeaderSettings, LeaseClient
from tests.controller.slow_relay import SlowRelay

SETTINGS = {"lease_duration_s": 8.0, "renew_deadline_s": 6.0, "retry_period_s": 0.25}
"""Short periods with a 6 s deadline: three times the relay's delay, so the new renewal (2 x the
delay) keeps 2 s for a loaded machine's own slowness (at load 38 a 0.6 s-late answer took 1.5 s
here), while the old one (4 x the delay and more) cannot make it."""

SLOW_S = 2.0
"""How late the relay forwards each answer of the server (a loaded server): a read and a write
begun 0.25 s after the previous renewal ended need 4 x 2 + 0.25 = 8.25 s from one renewal's start
to the next one's end, past the 6 s deadline; one write a retry period after the previous began,
2 x 2 = 4 s."""


@pytest.fixture
def slow(kube_cluster: Any, tmp_path: Path) -> Iterator[tuple[client.Configuration, SlowRelay]]:
    """A kubernetes client Configuration that reaches the API server through a `SlowRelay`."""
    config = yaml.safe_load(Path(kube_cluster.kubeconfig).read_text())
    context = next(c for c in config["contexts"] if c["name"] == config["current-context"])["context"]
    entry = next(c for c in config["clusters"] if c["name"] == context["cluster"])["cluster"]
    url = urlsplit(entry["server"])
    relay = SlowRelay((url.hostname or "127.0.0.1", url.port or 443))
    entry["server"] = f"{url.scheme}://127.0.0.1:{relay.port}{url.path}"
    entry.setdefault("tls-server-name", url.hostname)
    path = tmp_path / "slow-kubeconfig"
    path.write_text(yaml.safe_dump(config))
    configuration = client.Configuration()
    kube_config.load_kube_config(config_file=str(path), client_configuration=configuration)
    try:
        yield configuration, relay
    finally:
        relay.close()


class Recorded:
    """A LeaseClient that records when each successful write was sent (monotonic)."""

    def __init__(self, real: LeaseClient) -> None:
        self.real = real
        self.written: list[float] = []

    def get(self, namespace: str, name: str, *, timeout_s: float) -> dict[str, Any] | None:
        return self.real.get(namespace, name, timeout_s=timeout_s)

    def create(self, namespace: str, body: dict[str, Any], *, timeout_s: float) -> dict[str, Any]:
        sent = time.monotonic()
        created = self.real.create(namespace, body, timeout_s=timeout_s)
        self.written.append(sent)
        return created

    def replace(self, namespace: str, name: str, body: dict[str, Any], *, timeout_s: float) -> dict[str, Any]:
        sent = time.monotonic()
        replaced = self.real.replace(namespace, name, body, timeout_s=timeout_s)
        self.written.append(sent)
        return replaced


def _big_list(count: int) -> list[bytes]:
    """Pages of 500 claims as the server sends them, `count` in all (the picture's first list)."""
    claim = {"apiVersion": "elasticgpu.io/v1", "kind": "ElasticGPUClaim",
             "metadata": {"namespace": "fleet", "resourceVersion": "1", "uid": "0" * 36,
                          "labels": {"team": "a"}, "annotations": {"note": "x" * 200}},
             "spec": {"elasticGPUClassName": "fleet", "resources": {"requests": {"core": 25, "memory": "10Gi"}}},
             "status": {"phase": "Bound", "elasticGPUName": "egpu", "allocated": {"core": 25, "memory": "10Gi"}}}
    pages = []
    for start in range(0, count, 500):
        items = [{**claim, "metadata": {**claim["metadata"], "name": f"claim-{i:06d}"}}
                 for i in range(start, min(count, start + 500))]
        pages.append(orjson.dumps({"kind": "List", "metadata": {"resourceVersion": "1"}, "items": items}))
    return pages


def _busy(kube: KubeApi, namespace: str, stop: threading.Event, pages: list[bytes]) -> list[threading.Thread]:
    """The rest of a leader at work: eight threads with slow requests in flight on the binder's
    client, and one parsing a 20,000-claim list page by page, over and over."""
    def requests() -> None:
        while not stop.is_set():
            with contextlib.suppress(errors.ApiError, errors.NotFound):
                kube._call("GET", f"/api/v1/namespaces/{namespace}", timeout_s=10.0)

    def parsing() -> None:
        while not stop.is_set():
            for page in pages:
                items = orjson.loads(page)["items"]
                # the picture's own walk over each object (Python bytecode, as the binder's)
                sum(len(str(item["metadata"])) for item in items)

    threads = [threading.Thread(target=requests, daemon=True) for _ in range(8)]
    threads.append(threading.Thread(target=parsing, daemon=True))
    for thread in threads:
        thread.start()
    return threads


def test_a_busy_leader_with_a_slow_server_renews_within_the_deadline(
        slow: tuple[client.Configuration, SlowRelay], namespace: str) -> None:
    configuration, relay = slow
    leases = Recorded(leasing.own_leases(configuration))
    settings = LeaderSettings(namespace=namespace, name="renew-under-load", **SETTINGS)
    renewals: list[tuple[float, float]] = []
    leader = LeaderElector(leases, settings, identity="a", on_renew=lambda took, late: renewals.append((took, late)))
    stop, lost, busy = threading.Event(), threading.Event(), threading.Event()
    kube = KubeApi(client.ApiClient(configuration))
    assert leader.acquire(stop)
    leader.keep(stop, on_lost=lost.set)
    relay.delay_s = SLOW_S
    began = time.monotonic()
    threads = _busy(kube, namespace, busy, _big_list(20_000))
    try:
        # Three renew deadlines, busy and slow all along.
        lost.wait(3 * settings.renew_deadline_s)
        ended = time.monotonic()
    finally:
        busy.set()
        relay.delay_s = 0.0
        stop.set()
        for thread in threads:
            thread.join(timeout=15)
        kube.close()
    written = [at for at in leases.written if at >= began - settings.renew_deadline_s]
    gaps = [b - a for a, b in zip(written, [*written[1:], ended], strict=True)]
    summary = (f"writes {len(written)}, longest gap between renewals {max(gaps):.2f}s, attempts "
               f"(took, began late) {[(round(t, 2), round(lt, 2)) for t, lt in renewals]}")
    print(summary)  # the figures, with -s
    assert not lost.is_set(), f"the leader lost its Lease: {summary}"
    assert max(gaps) < settings.renew_deadline_s, summary
    assert leader.leading or stop.is_set()


def test_a_hung_lease_request_gives_up_once_at_its_timeout(slow: tuple[client.Configuration, SlowRelay],
                                                           namespace: str) -> None:
    """The proxy path (`KubernetesLeases.on`) and the transport path: a request with a 0.5 s
    timeout to a server that answers nothing for 5 s gives up within about 0.5 s (urllib3
    retried it three more times, each with the whole timeout: 2 s, past a renew deadline the
    request had been cut to)."""
    configuration, relay = slow
    for leases in (KubernetesLeases.on(configuration), leasing.own_leases(configuration)):
        assert leases.get(namespace, "absent", timeout_s=4.0) is None  # connected and answering
        relay.delay_s = 5.0
        started = time.monotonic()
        try:
            with pytest.raises(errors.ApiUnavailable):
                leases.get(namespace, "absent", timeout_s=0.5)
            took = time.monotonic() - started
        finally:
            relay.delay_s = 0.0
            relay.cut()  # the held connections go; new ones answer at once
        assert took < 1.2, f"{type(leases).__name__}: a 0.5 s request gave up after {took:.1f}s"
