"""The fault proxy itself, against the real test API server with the kubernetes client: what it
passes through is intact, and the faults it injects happen, at the configured rates, with the
effects each one promises (a status answered for an unsaved write, a saved write answered 500,
a connection closed or left silent, a watch cut or stalled)."""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from tests.faults.proxy import FaultPlan, FaultProxy, classify, fault_proxy

Proxied = tuple[FaultProxy, client.CoreV1Api, client.CoreV1Api]


@pytest.fixture
def proxied(kube_cluster: Any, api_client: client.ApiClient, tmp_path: Path) -> Iterator[Proxied]:
    """(proxy, CoreV1Api through the proxy, CoreV1Api straight to the server); the proxied
    client does not retry, so that each fault reaches the test as it happened."""
    with fault_proxy(kube_cluster, directory=tmp_path) as (proxy, kubeconfig):
        configuration = client.Configuration()
        config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
        configuration.retries = False
        through = client.ApiClient(configuration)
        try:
            yield proxy, client.CoreV1Api(through), client.CoreV1Api(api_client)
        finally:
            through.close()


def configmap(name: str, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def exists(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    try:
        core.read_namespaced_config_map(name, namespace)
        return True
    except ApiException as err:
        if err.status == 404:
            return False
        raise


@pytest.mark.parametrize(("method", "target", "verb"), [
    ("GET", "/api/v1/namespaces/ns/configmaps/a", "get"),
    ("GET", "/api/v1/namespaces/ns/configmaps", "list"),
    ("GET", "/api/v1/configmaps?limit=500", "list"),
    ("GET", "/api/v1/namespaces/ns", "get"),
    ("GET", "/api/v1/namespaces", "list"),
    ("GET", "/apis/elasticgpu.io/v1alpha1/gpus/g1/status", "get"),
    ("GET", "/apis/elasticgpu.io/v1alpha1/namespaces/ns/elasticgpuclaims?watch=true&resourceVersion=5", "watch"),
    ("GET", "/api/v1/watch/namespaces/ns/pods", "watch"),
    ("GET", "/version", "get"),
    ("POST", "/api/v1/namespaces/ns/events", "create"),
    ("PUT", "/apis/elasticgpu.io/v1alpha1/gpus/g1/status", "update"),
    ("PATCH", "/apis/elasticgpu.io/v1alpha1/namespaces/ns/elasticgpuclaims/c/status", "patch"),
    ("DELETE", "/apis/elasticgpu.io/v1alpha1/elasticgpus/e", "delete"),
])
def test_requests_are_classified_by_verb(method: str, target: str, verb: str) -> None:
    assert classify(method, target) == verb


def test_a_plan_is_checked() -> None:
    with pytest.raises(ValueError, match="unknown faults"):
        FaultPlan(rates={"418": 0.1})
    with pytest.raises(ValueError, match="unknown"):
        FaultPlan(verbs={"get-ish": {"500": 0.1}})
    with pytest.raises(ValueError, match=r"rates for create add up to 1\.200"):
        FaultPlan(rates={"500": 0.6}, verbs={"write": {"503": 0.6}})
    plan = FaultPlan(rates={"500": 0.1}, verbs={"write": {"409": 0.2}, "patch": {"500": 0.0, "drop": 0.1}})
    assert plan.rates_for("get") == {"500": 0.1}
    assert plan.rates_for("create") == {"500": 0.1, "409": 0.2}
    assert plan.rates_for("patch") == {"409": 0.2, "drop": 0.1}


def test_pass_through_is_intact(proxied: Proxied, namespace: str) -> None:
    proxy, through, direct = proxied
    events: list[tuple[str, str]] = []
    started = threading.Event()

    def watch_them() -> None:
        stream = watch.Watch()
        started.set()
        for event in stream.stream(through.list_namespaced_config_map, namespace, timeout_seconds=10,
                                   _request_timeout=15):
            events.append((event["type"], event["object"].metadata.name))
            if event["type"] == "DELETED":
                stream.stop()

    watcher = threading.Thread(target=watch_them, daemon=True)
    watcher.start()
    started.wait(5)
    time.sleep(0.5)  # the watch is open (a later creation shows as ADDED either way)
    created = through.create_namespaced_config_map(namespace, configmap("a", key="v" * 100_000))
    assert created.data["key"] == "v" * 100_000  # a large body, both ways
    assert direct.read_namespaced_config_map("a", namespace).to_dict() == \
        through.read_namespaced_config_map("a", namespace).to_dict()
    through.patch_namespaced_config_map("a", namespace, {"data": {"other": "x"}})
    body = through.read_namespaced_config_map("a", namespace)
    body.data["key"] = "w"
    through.replace_namespaced_config_map("a", namespace, body)
    stale = body  # its resourceVersion is now old: the server's own 409 comes through
    with pytest.raises(ApiException) as conflict:
        through.replace_namespaced_config_map("a", namespace, stale)
    assert conflict.value.status == 409 and "fault proxy" not in str(conflict.value.body)
    assert [c.metadata.name for c in through.list_namespaced_config_map(namespace).items] == ["a"]
    through.delete_namespaced_config_map("a", namespace)
    assert not exists(direct, namespace, "a")
    watcher.join(timeout=15)
    assert not watcher.is_alive()
    assert events == [("ADDED", "a"), ("MODIFIED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]
    assert proxy.count() == 0
    assert proxy.requests["watch"] == 1 and proxy.requests["update"] == 2 and proxy.requests["create"] == 1


def _outcome(call: Any) -> str:
    try:
        call()
        return "ok"
    except ApiException as err:
        return str(err.status)
    except urllib3.exceptions.HTTPError as err:
        return type(err).__name__


def test_status_faults_come_at_their_rates_and_only_on_their_verbs(proxied: Proxied, namespace: str) -> None:
    proxy, through, direct = proxied
    direct.create_namespaced_config_map(namespace, configmap("a", key="v"))
    plan = FaultPlan(seed=7, verbs={"get": {"404": 0.2, "503": 0.1, "500": 0.05}})
    proxy.set_plan(plan)
    n = 400
    outcomes = [_outcome(lambda: through.read_namespaced_config_map("a", namespace)) for _ in range(n)]
    seen = Counter(outcomes)
    assert {code: seen[code] for code in ("404", "503", "500")} == \
        {code: proxy.count(code, "get") for code in ("404", "503", "500")}, proxy.summary()
    assert seen["ok"] + seen["404"] + seen["503"] + seen["500"] == n
    for code, rate in plan.rates_for("get").items():
        sigma = math.sqrt(n * rate * (1 - rate))
        assert abs(seen[code] - n * rate) < 4 * sigma, (code, seen[code], n * rate)
    # Lists have no faults in this plan.
    assert {_outcome(lambda: through.list_namespaced_config_map(namespace)) for _ in range(40)} == {"ok"}
    # The same seed gives the same sequence (one client thread).
    proxy.set_plan(plan)
    again = [_outcome(lambda: through.read_namespaced_config_map("a", namespace)) for _ in range(n)]
    assert again == outcomes
    # An injected answer is a Kubernetes Status the client parses like the server's own.
    proxy.set_plan(FaultPlan(verbs={"get": {"422": 1.0}}))
    with pytest.raises(ApiException) as invalid:
        through.read_namespaced_config_map("a", namespace)
    assert invalid.value.status == 422 and '"reason": "Invalid"' in invalid.value.body


@pytest.mark.parametrize(("fault", "outcome", "saved"), [
    ("409", "409", False),
    ("503", "503", False),
    ("500-after", "500", True),
    ("drop", "ProtocolError", False),
    ("drop-after", "ProtocolError", True),
])
def test_write_faults_save_or_not_as_they_promise(proxied: Proxied, namespace: str, fault: str, outcome: str,
                                                  saved: bool) -> None:
    proxy, through, direct = proxied
    proxy.set_plan(FaultPlan(verbs={"create": {fault: 1.0}}))
    assert _outcome(lambda: through.create_namespaced_config_map(namespace, configmap("w", k="v"))) == outcome
    assert exists(direct, namespace, "w") is saved
    assert proxy.count(fault, "create") == 1 and proxy.count() == 1
    # The connection (if it survived) and the proxy still serve what has no fault.
    assert _outcome(lambda: through.read_namespaced_config_map("w", namespace)) == ("ok" if saved else "404")


def test_slow_answers_are_slow(proxied: Proxied, namespace: str) -> None:
    proxy, through, _ = proxied
    proxy.set_plan(FaultPlan(verbs={"list": {"slow": 1.0}}, slow_s=(0.6, 0.6)))
    start = time.monotonic()
    through.list_namespaced_config_map(namespace)
    assert time.monotonic() - start >= 0.6
    assert proxy.count("slow", "list") == 1


def test_half_open_request_gets_no_answer_until_the_client_gives_up(proxied: Proxied, namespace: str) -> None:
    proxy, through, _ = proxied
    proxy.set_plan(FaultPlan(verbs={"list": {"half-open": 1.0}}))
    start = time.monotonic()
    assert _outcome(lambda: through.list_namespaced_config_map(namespace, _request_timeout=1.0)) \
        == "ReadTimeoutError"
    assert 1.0 <= time.monotonic() - start < 5.0


def _watch_events(through: client.CoreV1Api, namespace: str, read_timeout_s: float
                  ) -> tuple[list[str], str, float]:
    """Names the watch delivered, how it ended and when (seconds after it opened)."""
    names: list[str] = []
    start = time.monotonic()
    try:
        for event in watch.Watch().stream(through.list_namespaced_config_map, namespace, timeout_seconds=60,
                                          _request_timeout=(5, read_timeout_s)):
            names.append(event["object"].metadata.name)
        ending = "closed"
    except urllib3.exceptions.HTTPError as err:
        ending = type(err).__name__
    return names, ending, time.monotonic() - start


@pytest.mark.parametrize(("fault", "ending"), [("drop-after", "ProtocolError"), ("half-open", "ReadTimeoutError")])
def test_a_watch_is_cut_or_goes_silent(proxied: Proxied, namespace: str, fault: str, ending: str) -> None:
    proxy, through, direct = proxied
    proxy.set_plan(FaultPlan(verbs={"watch": {fault: 1.0}}, cut_after_s=(1.5, 1.5)))
    stop = threading.Event()

    def create_some() -> None:  # one object every 0.25 s, before and after the cut
        for i in range(16):
            if stop.wait(0.25):
                return
            direct.create_namespaced_config_map(namespace, configmap(f"c{i}"))

    creator = threading.Thread(target=create_some, daemon=True)
    creator.start()
    try:
        names, how, after_s = _watch_events(through, namespace, read_timeout_s=2.0)
    finally:
        stop.set()
        creator.join(timeout=10)
    assert how in (ending, "closed") if fault == "drop-after" else how == ending
    assert names and names == [f"c{i}" for i in range(len(names))], names  # relayed in order until the cut
    assert len(names) <= 7, names  # ... and nothing after it (objects kept coming every 0.25 s)
    if fault == "drop-after":
        assert 1.4 <= after_s < 4.0
    else:
        assert 2.5 <= after_s < 6.0  # the cut, then the client's read timeout after the last event
    assert proxy.count(fault, "watch") == 1
