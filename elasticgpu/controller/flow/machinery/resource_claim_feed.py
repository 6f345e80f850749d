"""The ResourceClaim feed: which cards DRA holds, for the owner move DRA -> ElasticGPU (docs/dra.md).

It lists and watches `resource.k8s.io/v1` ResourceClaims cluster-wide and keeps, per card of our
DRA driver (pool = node, index), the claims whose `status.allocation` names it
(`elasticgpu.api.dra_names.allocated_cards`). Nothing else of a claim is kept. A card's holders are
`known` only while the claims were read completely: after a list, and while its watch goes on.
A failed list or watch makes every card unknown until the next list works (the owner move then
waits: not knowing is not "nothing holds it"). A server that does not serve the DRA API (404) has
no ResourceClaims at all, so every card is known free; it is asked again every `recheck_s`.

When a claim's cards change, the GPU keys of those cards are queued (their owner sync may now
flip). No lock is held while calling the API.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from elasticgpu.api import dra_names
from elasticgpu.controller import errors
from elasticgpu.controller.decisions.owner_move import DraHolders
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.flow.machinery.liveness import Liveness

logger = logging.getLogger(__name__)

Body = dict[str, Any]
Card = tuple[str, int]
"""(pool, card index) of a device of our driver."""
PATH = "/apis/resource.k8s.io/v1/resourceclaims"
FORBIDDEN = ("the controller may not list or watch resourceclaims.resource.k8s.io (403): a card moving from DRA"
             " back to ElasticGPU waits until it may; give the controller's ClusterRole list and watch on"
             " resourceclaims of the group resource.k8s.io (the chart does)")


class ResourceClaimFeed:
    """Cards held by ResourceClaims (see the module docstring)."""

    def __init__(self, *, kube: KubeApi, on_cards: Callable[[set[Card] | None], None],
                 liveness: Liveness | None = None, recheck_s: float = 30.0) -> None:
        """`on_cards` is told the cards whose holders changed (None: every card, whose being known changed)."""
        self.kube = kube
        self.on_cards = on_cards
        self.liveness = liveness
        self.recheck_s = recheck_s
        self._lock = threading.Lock()
        self._claims: dict[str, frozenset[Card]] = {}
        self._known = False
        self._why = "not listed yet"

    # -- reading -----------------------------------------------------------------------------------

    def holders(self, pool: str, index: int) -> DraHolders:
        """What DRA holds of card `index` of pool `pool` (a node's name)."""
        card = (pool, index)
        with self._lock:
            if not self._known:
                return DraHolders(known=False, why_unknown=self._why)
            held = sorted(key for key, cards in self._claims.items() if card in cards)
        return DraHolders(known=True, claims=held)

    # -- taking in ---------------------------------------------------------------------------------

    def replace(self, items: list[Body]) -> None:
        """A complete list: the claims are these (and known from now on)."""
        fresh = {_key(body): frozenset(dra_names.allocated_cards(body)) for body in items}
        fresh = {key: cards for key, cards in fresh.items() if cards}
        with self._lock:
            before: set[Card] = set().union(*self._claims.values())
            was_known = self._known
            self._claims, self._known, self._why = fresh, True, ""
        after: set[Card] = set().union(*fresh.values())
        self.on_cards(before | after if was_known else None)

    def observe(self, event_type: str | None, body: Body) -> None:
        """One watch event of a ResourceClaim."""
        key = _key(body)
        cards = frozenset() if event_type == "DELETED" else frozenset(dra_names.allocated_cards(body))
        with self._lock:
            before = self._claims.get(key, frozenset())
            if cards:
                self._claims[key] = cards
            else:
                self._claims.pop(key, None)
        if before != cards:
            self.on_cards(set(before | cards))

    def unknown(self, why: str) -> None:
        """The claims cannot be read now: every card's holders are unknown until a list works."""
        with self._lock:
            was_known, self._known, self._why = self._known, False, why
        if was_known:
            self.on_cards(None)  # every card: their moves now wait (the message says why)

    # -- the loop ----------------------------------------------------------------------------------

    def run(self, stop: threading.Event, *, timeout_s: int = 60) -> None:
        """List, then watch, until `stop` is set (blocking: run it on its own thread). Never ends on a failure."""
        backoff, said = 0.5, ""
        while not stop.is_set():
            self._step()
            try:
                items, version = self.kube.list_collection(PATH)
            except errors.NotFound:
                # No DRA API on this server: no ResourceClaim can hold anything. Ask again later.
                self.replace([])
                said = self._say("", said)
                stop.wait(self.recheck_s)
                continue
            except Exception as err:  # never ends the loop
                self.unknown(_why(err))
                said = self._say(_why(err), said, err=err)
                stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            self.replace(items)
            said = self._say("", said)
            backoff = 0.5
            try:
                for event in self.kube.watch(PATH, resource_version=version, timeout_s=timeout_s):
                    if stop.is_set():
                        return
                    self._step()
                    if event.get("type") == "ERROR":
                        break  # 410 Gone or another failure: list again
                    if event.get("type") != "BOOKMARK":
                        self.observe(event.get("type"), event.get("object") or {})
            except Exception as err:  # list again; until then the cards are unknown
                self.unknown(_why(err))
                said = self._say(_why(err), said, err=err)
                stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _step(self) -> None:
        if self.liveness is not None:
            self.liveness.step("watch-resourceclaim")

    @staticmethod
    def _say(why: str, said: str, *, err: Exception | None = None) -> str:
        """Log a failure once per reason (and once when it works again); returns the reason now said."""
        if why == said:
            return said
        if not why:
            logger.info("ResourceClaims are read again")
        elif isinstance(err, errors.ApiUnavailable) and err.status == 0:
            logger.debug("ResourceClaims: no answer (%s); retrying", why)
        else:
            logger.warning("ResourceClaims cannot be read (%s); cards moving from DRA wait", why)
        return why


def _key(body: Body) -> str:
    meta = body.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _why(err: Exception) -> str:
    if isinstance(err, errors.ApiError) and err.status == 403:
        return FORBIDDEN
    return f"{type(err).__name__}: {err}"
