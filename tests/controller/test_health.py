"""What an operator sees of a running controller: `/healthz`, `/readyz` and `/metrics` over real
HTTP (`health.py`, `metrics.py`), and the log lines of `--log-format plain|json` (`logs.py`)."""

from __future__ import annotations

import io
import json
import logging
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from elasticgpu.controller.metrics import ControllerMetrics
from elasticgpu.controller.process.health import HealthServer
from elasticgpu.logs import configure_logging


def get(port: int, path: str) -> tuple[int, str, str]:
    """(status, body, content type) of GET http://127.0.0.1:port/path, any status."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode(), r.headers["Content-Type"]
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(), err.headers["Content-Type"]


class Liveness:
    """Shaped like the controller's liveness object: `alive()` and a `reason`."""

    def __init__(self) -> None:
        self.dead_thread: str | None = None

    def alive(self) -> bool:
        return self.dead_thread is None

    @property
    def reason(self) -> str:
        return f"thread {self.dead_thread} died" if self.dead_thread else ""


@pytest.fixture
def served() -> Iterator[tuple[HealthServer, Liveness, dict[str, bool], ControllerMetrics]]:
    liveness = Liveness()
    state = {"ready": False, "leader_ok": True}
    metrics = ControllerMetrics()
    server = HealthServer(
        liveness={"workers": liveness,
                  "leaderElection": lambda: (state["leader_ok"], "Lease not renewed for 20s")},
        readiness={"picture": lambda: (state["ready"], "picture not listed yet")},
        registry=metrics.registry, host="127.0.0.1", port=0,
    )
    with server:
        yield server, liveness, state, metrics


def test_healthz_follows_the_liveness_checks(served: tuple[HealthServer, Liveness, dict[str, bool],
                                                            ControllerMetrics]) -> None:
    server, liveness, state, _ = served
    assert get(server.port, "/healthz")[:2] == (200, "ok\n")
    status, body, _ = get(server.port, "/healthz?verbose")
    assert status == 200 and "[+]workers ok" in body and "[+]leaderElection ok" in body
    liveness.dead_thread = "binder"
    status, body, _ = get(server.port, "/healthz")
    assert status == 500
    assert "[-]workers failed: thread binder died" in body and "[+]leaderElection ok" in body
    state["leader_ok"] = False
    status, body, _ = get(server.port, "/livez")
    assert status == 500 and "[-]leaderElection failed: Lease not renewed for 20s" in body
    liveness.dead_thread = None
    state["leader_ok"] = True
    assert get(server.port, "/healthz")[0] == 200


def test_a_check_that_raises_fails_the_probe(served: tuple[HealthServer, Liveness, dict[str, bool],
                                                             ControllerMetrics]) -> None:
    server, *_ = served

    def broken() -> tuple[bool, str]:
        raise RuntimeError("lock poisoned")

    server.liveness["broken"] = broken
    status, body, _ = get(server.port, "/healthz")
    assert status == 500 and "[-]broken failed: check raised RuntimeError: lock poisoned" in body


def test_readyz_follows_the_readiness_checks(served: tuple[HealthServer, Liveness, dict[str, bool],
                                                            ControllerMetrics]) -> None:
    server, _, state, _ = served
    status, body, _ = get(server.port, "/readyz")
    assert status == 503 and "[-]picture failed: picture not listed yet" in body
    state["ready"] = True
    assert get(server.port, "/readyz")[:2] == (200, "ok\n")
    assert get(server.port, "/nothing")[0] == 404


def test_metrics_are_scraped_in_the_prometheus_format(served: tuple[HealthServer, Liveness, dict[str, bool],
                                                                     ControllerMetrics]) -> None:
    server, _, _, metrics = served
    depth = [7]
    metrics.watch_queue(lambda: depth[0])
    metrics.bound(mode="dynamic")
    metrics.bound(mode="dynamic")
    metrics.bound(mode="static")
    metrics.provisioned()
    metrics.released()
    metrics.conflict(resource="gpus")
    metrics.api_error(code=503, verb="patch")
    metrics.api_error(code=None, verb="watch")
    metrics.observe_sync(kind="claim", seconds=0.0003)
    metrics.observe_sync(kind="claim", seconds=0.2, outcome="requeued")
    metrics.leading(True)
    status, body, content_type = get(server.port, "/metrics")
    assert status == 200 and content_type.startswith("text/plain; version=")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(body) for s in family.samples}
    assert samples[("elasticgpu_claims_bound_total", (("mode", "dynamic"),))] == 2
    assert samples[("elasticgpu_claims_bound_total", (("mode", "static"),))] == 1
    assert samples[("elasticgpu_elasticgpus_provisioned_total", ())] == 1
    assert samples[("elasticgpu_elasticgpus_released_total", ())] == 1
    assert samples[("elasticgpu_conflicts_total", (("resource", "gpus"),))] == 1
    assert samples[("elasticgpu_api_errors_total", (("code", "503"), ("verb", "patch")))] == 1
    assert samples[("elasticgpu_api_errors_total", (("code", "none"), ("verb", "watch")))] == 1
    assert samples[("elasticgpu_work_queue_depth", ())] == 7
    assert samples[("elasticgpu_sync_duration_seconds_count", (("kind", "claim"), ("outcome", "ok")))] == 1
    assert samples[("elasticgpu_sync_duration_seconds_bucket",
                    (("kind", "claim"), ("le", "0.0005"), ("outcome", "ok")))] == 1
    assert samples[("elasticgpu_sync_duration_seconds_bucket",
                    (("kind", "claim"), ("le", "0.1"), ("outcome", "requeued")))] == 0
    assert samples[("elasticgpu_leader", ())] == 1
    assert samples[("process_resident_memory_bytes", ())] > 0
    depth[0] = 0  # read at each scrape, not when set
    _, body, _ = get(server.port, "/metrics")
    assert "elasticgpu_work_queue_depth 0.0" in body


def test_two_controllers_in_one_process_keep_separate_figures() -> None:
    first, second = ControllerMetrics(process=False), ControllerMetrics(process=False)
    first.provisioned()
    assert first.registry.get_sample_value("elasticgpu_elasticgpus_provisioned_total") == 1
    assert second.registry.get_sample_value("elasticgpu_elasticgpus_provisioned_total") == 0


def test_a_taken_port_fails_at_start() -> None:
    with HealthServer(host="127.0.0.1", port=0) as first, pytest.raises(OSError):
        HealthServer(host="127.0.0.1", port=first.port).start()


@pytest.fixture
def root_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)


def _log_lines(log_format: str) -> list[str]:
    handler = configure_logging(level="info", log_format=log_format)  # type: ignore[arg-type]
    stream = io.StringIO()
    handler.setStream(stream)  # type: ignore[attr-defined]
    logger = logging.getLogger("elasticgpu.controller.test")
    logger.debug("not shown at info")
    logger.info("bound %s", "ns/c1", extra={"claim": "ns/c1", "elasticGPU": "egpu-1", "attempt": 2})
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        logger.exception("sync failed", extra={"claim": "ns/c2", "when": object()})
    return stream.getvalue().splitlines()


def test_json_logs_are_one_object_per_line(root_logging: None) -> None:
    lines = _log_lines("json")
    first = json.loads(lines[0])
    assert set(first) == {"time", "level", "logger", "message", "claim", "elasticGPU", "attempt"}
    assert first["time"].endswith("Z") and first["time"][10] == "T"
    assert (first["level"], first["logger"], first["message"]) == ("INFO", "elasticgpu.controller.test", "bound ns/c1")
    assert (first["claim"], first["elasticGPU"], first["attempt"]) == ("ns/c1", "egpu-1", 2)
    assert len(lines) == 2, "a traceback must stay inside its line"
    second = json.loads(lines[1])
    assert second["level"] == "ERROR" and second["claim"] == "ns/c2"
    assert second["when"].startswith("<object object")  # not serialisable: written as str()
    assert "ValueError: bad\nvalue" in second["exception"]


def test_plain_logs_keep_their_format_and_show_extra_fields(root_logging: None) -> None:
    lines = _log_lines("plain")
    assert " level=INFO logger=elasticgpu.controller.test bound ns/c1 claim=ns/c1 elasticGPU=egpu-1 attempt=2" \
        in lines[0]
    assert "sync failed claim=ns/c2" in lines[1] and lines[-1] == "value"
    with pytest.raises(ValueError, match="--log-format 'yaml'"):
        configure_logging(log_format="yaml")  # type: ignore[arg-type]
