"""The waiting claims, listed alone: what a fresh start's early phase needs of the claims.

The early gate (`early_gate.py`) passes only new or Pending standalone claims until the picture is
whole, so the early phase needs only the claims that wait, not every Bound one: at 40,000 cards /
50,000 claims the full claim list was ~25 s of the 39 s from start to first bind (issue 49 item 2,
bench/README.md). The claim CRD declares `status.phase` selectable (`selectableFields`, beta and
on in Kubernetes 1.31, GA in 1.32), so the list asks for `status.phase!=Bound`: the server filters its watch cache,
and a claim made before the process started is still found (only a list finds it).

The list's resourceVersion is where the claim watch starts, unfiltered: a filtered watch would
report a claim that becomes Bound as DELETED (it leaves the selection), and the filtered list's
resourceVersion is a valid point for an unfiltered watch, so no claim made or changed after the
list is missed. The full claim list follows behind, with ElasticGPUs and pods (`Informer.list_claims`),
and is merged before the gate opens: every Bound claim is in the picture before anything may touch
one, and a list copy older than what the watch delivered meanwhile is not taken
(`Picture.merge_claim_list` keeps the newer copy).

A server that cannot select on the field (the CRD applied without `selectableFields`, or
Kubernetes 1.31 with its beta CustomResourceFieldSelectors off: 400 "field label not supported")
gets the full list here, as before, said once.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from elasticgpu.controller import errors
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.flow.machinery.workqueue import WorkQueue
from elasticgpu.controller.picture.picture import Body, Picture

logger = logging.getLogger(__name__)

SELECTOR = "status.phase!=Bound"
"""The claims the early phase lists: every claim not Bound (new, Pending, Lost)."""
PAGE_SIZE = 500
PAGE_RETRIES = 5
"""Failed attempts in a row at one page (a 5xx, a dropped connection) before the list gives up and
the start lists again from the top (`starting.listing`)."""
FALLBACK = ("the API server cannot select claims by status.phase (the ElasticGPUClaim CRD lacks selectableFields,"
            " or Kubernetes 1.31 runs with CustomResourceFieldSelectors off): the start lists every claim before it"
            " binds, slower on a big cluster; apply the CRDs of this release (kubectl apply --server-side -f crds/)")


@dataclass(frozen=True)
class Fetched:
    """One list of the claims, not taken in yet."""

    claims: list[Body]
    version: str
    complete: bool
    """Every claim (the server could not select), not only the waiting ones."""


class WaitingClaims:
    """Lists the claims that wait into the picture and queues them; see the module docstring."""

    def __init__(self, *, kube: KubeApi, picture: Picture, queue: WorkQueue, namespace: str | None) -> None:
        self.kube = kube
        self.picture = picture
        self.queue = queue
        self.namespace = namespace
        self.complete = False
        """Whether the last `list_waiting` took in every claim (the server could not select): the full
        claim list behind is then not needed."""
        self.count = 0
        """How many claims the last `list_waiting` took in."""
        self._rejected = ""
        """The server's answer to the selector, once it refused it (said once, not asked again)."""

    def list_waiting(self) -> str:
        """List the claims that wait (every claim where the server cannot select), take them into
        the picture, queue the waiting ones (front lane, in bind order); the list's resourceVersion,
        the point to watch every claim from."""
        return self.take_in(self.fetch())

    def fetch(self) -> Fetched:
        """The claims that wait (every claim where the server cannot select: `complete`) and the
        list's resourceVersion, not taken in yet: `process/early_start.py` fetches them on a thread
        of their own beside the cards (bench/early_lists.py, 3,000 waiting claims at 12,000 cards:
        0.84x and 0.91x the time of one after the other in two runs) and takes them in after."""
        path = self.kube.collection_path("claim", self.namespace)
        if not self._rejected:
            try:
                claims, version = self._selected(path)
                return Fetched(claims, version, complete=False)
            except errors.Rejected as err:
                self._rejected = str(err)
                logger.info("%s: %s", FALLBACK, err)
        claims, version = self.kube.list_collection(path)
        return Fetched(claims, version, complete=True)

    def take_in(self, fetched: Fetched) -> str:
        """Take `fetched` into the picture and queue the claims that wait (in bind order, which reads
        the classes: after the cards); the list's resourceVersion."""
        self.complete, self.count = fetched.complete, len(fetched.claims)
        if fetched.complete:
            self.picture.merge_claim_list(fetched.claims, fetched.version)
        else:
            # Not a merge: the picture holds nothing the selection left out, and a claim missing from
            # it is Bound (the full list behind brings it), not gone.
            for body in fetched.claims:
                self.picture.put_claim(body)
        self.picture.quotas.saw(int(fetched.version) if fetched.version.isdigit() else None)
        for key in self.picture.pending_claim_keys():
            self.queue.add(key)
        return fetched.version

    def _selected(self, path: str) -> tuple[list[Body], str]:
        """Every claim of `SELECTOR`, page by page; a page that fails is asked again with the same
        continue token (the list resumes where it broke: nothing doubled, nothing skipped), a
        continue token that expired (410) starts the list over. Rejected: the server cannot select."""
        items: list[Body] = []
        token = ""
        version = ""
        failures = 0
        while True:
            try:
                page, version, following = self.kube.list_page(path, field_selector=SELECTOR, limit=PAGE_SIZE,
                                                                token=token)
            except errors.ApiUnavailable as err:
                failures += 1
                if failures > PAGE_RETRIES:
                    raise
                if err.status == 410:
                    # The snapshot the token continues was compacted (the server compacts every 5
                    # minutes: a long list at scale meets it): nothing failed, the list starts over
                    # at once. Still counted: a list that never outruns compaction gives up.
                    logger.info("the list of the waiting claims expired after %d claims (%s); listing them again"
                                " from the top", len(items), err)
                    items, token = [], ""
                    continue
                (logger.warning if failures == 1 else logger.debug)(
                    "list of the waiting claims failed after %d claims; asking for that page again: %s",
                    len(items), err)
                time.sleep(min(0.25 * 2 ** failures, 4.0))  # bounded: PAGE_RETRIES attempts, ~8 s in all
                continue
            failures = 0
            items.extend(page)
            if not following:
                return items, version
            token = following
