"""kopf wiring (watch engine "kopf"): watches feed the controller's picture; one worker thread decides.

The default engine is the controller's own list+watch (`watching.py`), which costs a third of
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
import gc
import logging
import threading
import time
from typing import Any

import kopf

from elasticgpu.api import names
from elasticgpu.controller.kube import KubeApi
from elasticgpu.controller.reconciling import Controller

logger = logging.getLogger(__name__)

WATCHED = (
    ("claim", names.GROUP, names.VERSION, names.PLURAL_CLAIM),
    ("egpu", names.GROUP, names.VERSION, names.PLURAL_ELASTIC_GPU),
    ("gpu", names.GROUP, names.VERSION, names.PLURAL_GPU),
    ("class", names.GROUP, names.VERSION, names.PLURAL_CLASS),
    ("pod", "", "v1", "pods"),
)


def build_registry(controller: Controller, kube: KubeApi, stop: threading.Event) -> kopf.OperatorRegistry:
    """A kopf registry whose handlers feed `controller`; startup rebuilds, then starts the threads."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        configuration = kube._api.configuration
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

        # async: kopf runs it on its event loop; a sync handler would cost a thread hop per event.
        async def handler(event: dict[str, Any], _kind: str = kind, **_: Any) -> None:
            body = event.get("object")
            if isinstance(body, dict):
                controller.observe(_kind, event.get("type"), body)

        kopf.on.event(group, version, plural, registry=registry, id=f"observe-{kind}")(handler)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.enabled = False  # our Events are written by EventRecorder
        settings.watching.server_timeout = 300
        settings.persistence.finalizer = "elasticgpu.io/kopf"  # never added: no on.delete handlers
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, controller.rebuild)
        take_over_full_collections()
        collect_and_freeze()
        threading.Thread(target=controller.run_worker, args=(stop,), name="binder", daemon=True).start()
        threading.Thread(target=resync_loop, args=(controller, stop), name="resync", daemon=True).start()
        logger.info("controller ready: %d GPUs, picture rebuilt", len(controller.ledger.gpu_names()))

    @kopf.on.cleanup(registry=registry)
    def cleanup(**_: Any) -> None:
        stop.set()

    return registry


def take_over_full_collections() -> None:
    """Stop the cyclic garbage collector's automatic full collections (`collect_and_freeze`
    freezes the survivors at every resync instead).

    The picture (tens of thousands of models and bodies) is long-lived and acyclic, yet every
    automatic full collection walked all of it: pauses of 180-240 ms with 3,000 claims, every
    few seconds while claims arrived (`bench/binding.py`, measured with gc callbacks), and they
    were the whole p99 at low load. Young collections (generations 0 and 1) run as before."""
    young, middle, _full = gc.get_threshold()
    gc.set_threshold(young, middle, 1_000_000)


def collect_and_freeze() -> None:
    """A young collection, then `gc.freeze`: what is alive now is never walked again. (A full
    collection here cost 200 ms after a burst of 1,500 claims: the stall the resync must not
    be.) The price: a reference cycle that outlives two young collections is never reclaimed.
    The picture holds none (plain dicts and pydantic models, replaced by new versions);
    `tests/controller/test_garbage.py` fails if binding starts to leave cycles behind."""
    gc.collect(1)
    gc.freeze()


def resync_loop(controller: Controller, stop: threading.Event) -> None:
    """Resync every `settings.resync.interval_s`, relisting every `relist_interval_s`, until
    `stop` is set (both watch engines use it)."""
    interval = controller.settings.resync.interval_s
    relist_every = controller.settings.resync.relist_interval_s
    last_relist = time.monotonic()
    while not stop.wait(interval):
        relist = time.monotonic() - last_relist >= relist_every
        try:
            controller.resync(relist=relist)
            if relist:
                last_relist = time.monotonic()
            collect_and_freeze()
        except Exception:  # a failed resync must not end the loop; the next one retries
            logger.exception("resync failed; retrying in %.0fs", interval)
