"""kopf wiring (watch engine "kopf"): kopf's watches feed the controller's picture.

The default engine is the controller's own list+watch (`informer.py`), which costs a third of
the CPU per event; this one is kept for clusters where kopf's login and reconnect handling are
wanted, and as the benchmark's baseline.

kopf is used for what it is good at here: watching (with re-listing, backoff and login) and the
process's lifecycle. Its per-object handler machinery (progress annotations, retries, patches)
is not used: the `on.event` handlers only hand the raw object to `Controller.observe`, which is
cheap, and the decisions run in batches off the event loop on the worker thread. Startup lists
everything (`Controller.rebuild`) before the worker binds anything.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, cast

import kopf

from elasticgpu.api import names
from elasticgpu.controller.edge.kube import WATCH_READ_MARGIN_S
from elasticgpu.controller.process import starting
from elasticgpu.controller.process.reconciling import Controller

WATCHED = (
    ("claim", names.GROUP, names.VERSION, names.PLURAL_CLAIM),
    ("egpu", names.GROUP, names.VERSION, names.PLURAL_ELASTIC_GPU),
    ("gpu", names.GROUP, names.VERSION, names.PLURAL_GPU),
    ("class", names.GROUP, names.VERSION, names.PLURAL_CLASS),
    ("pod", "", "v1", "pods"),
    ("node", "", "v1", "nodes"),  # allocatable, taints, labels: WaitForFirstConsumer placement
    ("namespace", "", "v1", "namespaces"),  # the FairShare weight annotation
    ("quota", names.GROUP, names.VERSION, names.PLURAL_QUOTA),  # which namespaces have one
)


def _feeder(controller: Controller, kind: str) -> Callable[..., Coroutine[Any, Any, None]]:
    """The `on.event` handler that hands each raw object of `kind` to the picture."""

    # async: kopf runs it on its event loop; a sync handler would cost a thread hop per event.
    async def handler(*, event: kopf.RawEvent, **_: Any) -> None:
        body = event.get("object")
        if isinstance(body, dict):  # a RawBody is the plain dict of the wire form
            controller.observe(kind, event.get("type"), cast(dict[str, Any], body))

    return handler


def build_registry(controller: Controller, stop: threading.Event) -> kopf.OperatorRegistry:
    """A kopf registry whose handlers feed `controller`; startup rebuilds, then starts the threads."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        configuration = controller.kube.configuration
        token = configuration.api_key.get("authorization") or configuration.api_key.get("BearerToken")
        scheme = None
        if token and " " in token:
            scheme, token = token.split(" ", 1)
        return kopf.ConnectionInfo(
            server=configuration.host,
            ca_path=configuration.ssl_ca_cert,
            insecure=not configuration.verify_ssl,
            certificate_path=configuration.cert_file,
            private_key_path=configuration.key_file,
            scheme=scheme,
            token=token,
        )

    for kind, group, version, plural in WATCHED:
        kopf.on.event(group, version, plural, registry=registry, id=f"observe-{kind}")(_feeder(controller, kind))

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.enabled = False  # our Events are written by EventRecorder
        settings.watching.server_timeout = 300
        # a half-open connection must not stall a kind until the next relist
        settings.watching.client_timeout = 300 + WATCH_READ_MARGIN_S
        settings.watching.connect_timeout = 10
        settings.persistence.finalizer = "elasticgpu.io/kopf"  # never added: no on.delete handlers
        loop = asyncio.get_running_loop()
        if await loop.run_in_executor(None, starting.first_list, controller, stop) is not None:
            starting.start_threads(controller, stop)

    @kopf.on.cleanup(registry=registry)
    def cleanup(**_: Any) -> None:
        stop.set()

    return registry
