"""The early start of the client watch engine: bind new standalone claims while the rest of the
cluster is still being listed (issue 49: start to first bind 89 s at 40,000 cards / 50,000
claims, 64 s of it listing every kind before the first bind).

1. List what a safe placement reads (`Informer.list_cards`: nodes, GPUs, classes, quotas), then
   the claims that wait (`waiting_claims.WaitingClaims`: `status.phase!=Bound`, queued in front, so
   a claim made before or at the start is found; every claim where the server cannot select), and
   watch those kinds from there (every claim, from the waiting list's resourceVersion).
2. List the rest behind (`Informer.list_claims`: ElasticGPUs, every claim, pods, namespaces, on
   its own thread), then watch it, then open the gate: the keys it held flow as after a full start.
3. Take the Lease and start the worker behind the gate (`early_gate.EarlyGate`): until the
   picture is whole it syncs only claims whose bind reads nothing but the cards.

The resync (repair), the ResourceClaim feed and node autoscaling start only once the picture is
whole (`starting.start_threads`): the repair frees reservations whose ElasticGPU it does not know
and marks claims Lost whose ElasticGPU is missing, which with ElasticGPUs not listed yet would be
every one of them. A standby does all of this before it leads; if its picture is whole by then,
the gate is open and it starts as before. A kill -9 at any point leaves only the writes of
finished steps, each a complete bind step (the reservation with its precondition is the commit
point), which the next leader takes in from its lists."""

from __future__ import annotations

import logging
import threading
import time

from elasticgpu.controller.flow.machinery.early_gate import EarlyGate
from elasticgpu.controller.flow.machinery.informer import Listed
from elasticgpu.controller.flow.machinery.waiting_claims import Fetched, WaitingClaims
from elasticgpu.controller.process import starting
from elasticgpu.controller.process.operability import Operability
from elasticgpu.controller.process.reconciling import Controller

logger = logging.getLogger(__name__)

EARLY_KINDS = ("gpu", "class", "node", "quota", "claim")
"""The kinds listed and watched in the early phase."""
LATE_KINDS = ("egpu", "pod", "namespace")
"""The kinds watched once their full list is merged."""


def run(controller: Controller, operability: Operability, stop: threading.Event) -> None:
    """Start early (see the module docstring) and run until `stop` is set (blocking)."""
    began = time.monotonic()
    gate = EarlyGate(picture=controller.picture, queue=controller.queue)
    controller.worker.gate = gate
    informer = controller.informer
    waiting = WaitingClaims(kube=informer.kube, picture=controller.picture, queue=controller.queue,
                            namespace=informer.namespace)
    logger.info("listing the cluster, the cards first")
    split: list[float] = []
    cards = starting.listing(stop, lambda: _list_cards(controller, waiting, split))
    if cards is None:
        return
    _watch(controller, stop, cards, EARLY_KINDS)
    logger.info("listed the cards in %.1fs and %d %s in %.1fs more (%d GPUs); binding new standalone claims while"
                " the rest is listed", split[-2], waiting.count,
                "claims (all: no selector)" if waiting.complete else "waiting claims", split[-1],
                len(controller.ledger.gpu_names()))
    # The full claim list goes behind unless the early phase had to take it (the server cannot
    # select); the claim watch runs already, from the waiting list's resourceVersion.
    rest = cards if waiting.complete else {kind: at for kind, at in cards.items() if kind != "claim"}
    whole = threading.Event()
    lister = threading.Thread(target=_list_the_rest, args=(controller, gate, rest, stop, whole, began),
                              name="first-list", daemon=True)
    lister.start()
    if not operability.lead(stop):
        return
    starting.start_worker(controller, stop)
    while not whole.wait(0.5):
        if stop.is_set():
            return
    controller.worker.gate = None
    starting.start_threads(controller, stop, worker=False)
    stop.wait()


def _list_cards(controller: Controller, waiting: WaitingClaims, split: list[float]) -> Listed:
    """The cards' lists merged, then the waiting claims' (queued): their versions; the seconds of
    each appended to `split` (the log's figures: the claims' is the wait after the cards). The
    claims are fetched beside the cards, on a connection of their own: the server answers one
    while this process takes in the other (bench/early_lists.py: 0.84x and 0.91x the time of one after the
    other with 3,000 waiting claims at 12,000 cards), and taken in after them (bind order reads
    the classes)."""
    began = time.monotonic()
    fetched: list[Fetched | BaseException] = []

    def fetch() -> None:
        try:
            fetched.append(waiting.fetch())
        except BaseException as err:  # said by `starting.listing`, which lists again from the top
            fetched.append(err)

    beside = threading.Thread(target=fetch, name="first-list-claims", daemon=True)
    beside.start()
    try:
        listed = controller.informer.list_cards()
    finally:
        beside.join()  # bounded: each page waits at most 60 s, a failing one is tried PAGE_RETRIES times
    split.append(time.monotonic() - began)
    if isinstance(fetched[0], BaseException):
        raise fetched[0]
    claims_version = waiting.take_in(fetched[0])
    split.append(time.monotonic() - began - split[-1])
    return {**listed, "claim": claims_version}


def _list_the_rest(controller: Controller, gate: EarlyGate, cards: Listed, stop: threading.Event,
                   whole: threading.Event, began: float) -> None:
    """List ElasticGPUs, claims (unless `cards` has their version), pods and namespaces (retrying
    until it works), open the gate, watch them (not the claims: watched from the early phase), set
    `whole`."""
    informer = controller.informer
    opened: list[int] = []
    # The gate opens once the lists are merged, before their keys are queued: the worker must not
    # take ~30,000 of them (at 8,000 cards) through the gate only to have them held and queued again.
    listed = starting.listing(stop, lambda: informer.list_claims(cards, start=True,
                                                                 merged=lambda: opened.append(gate.open())))
    if listed is None:
        return
    released = sum(opened)
    try:
        _watch(controller, stop, listed, LATE_KINDS)
    except Exception as err:  # a bug: never run on gated, without a resync; stop and restart whole
        logger.error("the first list could not finish (a bug?); stopping: %s", err, exc_info=err)
        stop.set()
        return
    logger.info("listed the cluster in %.1fs (%d GPUs); watching it (%d keys waited for the whole picture)",
                time.monotonic() - began, len(controller.ledger.gpu_names()), released)
    whole.set()


def _watch(controller: Controller, stop: threading.Event, listed: Listed, kinds: tuple[str, ...]) -> None:
    for thread in controller.informer.start(stop, timeout_s=controller.settings.watch.timeout_s, listed=listed,
                                            kinds=kinds):
        controller.liveness.track(thread)
