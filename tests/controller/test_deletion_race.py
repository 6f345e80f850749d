"""A deletion a fresh list implies (what the picture holds and the list lacks: deleted while no watch
ran) against a watch event that lands meanwhile, on the real local API server.

A watch that starts over with a list (`Informer._start_over`) and the periodic relist by metadata
(`MetadataRelist`) decide what the list lacks, then take those deletions in. Before, the two steps
were apart: an event another thread took in between (the name created again, with a new uid and a
newer resourceVersion; a copy newer than the list) was undone by the deletion, and the picture
lacked a live object until the next relist, minutes later (a GPU's capacity unseen, a claim not
served). Now the deletion is checked again under the picture's lock with the change.

Every moment the event can land is enumerated: each outermost release of the picture's lock by the
taker-in (`release_points`), one run each; the last run, whose event never lands, shows the
deletion itself is still taken in.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.flow.machinery.metadata_relist import MetadataRelist
from elasticgpu.controller.process.reconciling import Controller
from tests.binding import objects as o
from tests.binding.conftest import Cluster, new_controller
from tests.controller.release_points import ReleasePoints, probed

Body = dict[str, Any]
MOMENTS_AT_MOST = 400
"""Release points enumerated at most (a relist of every kind has a few dozen)."""


def _create(cluster: Cluster, kind: str, name: str) -> Body:
    if kind == "claim":
        return cluster.claim(o.claim(name, cores=10, memory="1Gi"))
    return cluster.gpu(o.gpu(name, node=f"{cluster.prefix}-node"))


def _delete(kube: KubeApi, cluster: Cluster, kind: str, name: str) -> None:
    if kind == "claim":
        kube.delete_claim(cluster.namespace, name)
    else:
        kube.delete_gpu(name)


def _key(cluster: Cluster, kind: str, name: str) -> tuple[str, str]:
    return (cluster.namespace, name) if kind == "claim" else ("", name)


def _enumerate(controller: Controller, cluster: Cluster, kind: str, event: str,
               take_in: Callable[[int, str], Callable[[], object]]) -> int:
    """For each moment `at` (1, 2, ...): the picture holds an object the server no longer has, and
    `take_in(at, name)` returns the taking-in of a list that lacks it; meanwhile, at `at`, the watch
    delivers the event (the name created again; a copy newer than the list). Asserts the event
    survives; the last run (no event: `at` past every moment) that the deletion is taken in.
    Returns how many moments there were."""
    kube, picture, informer = cluster.kube, controller.picture, controller.informer
    deadline = time.monotonic() + 120
    for at in range(1, MOMENTS_AT_MOST):
        assert time.monotonic() < deadline, f"enumerating {at} moments took longer than 120 s"
        name = f"{cluster.prefix}-race-{at}"
        first = _create(cluster, kind, name)
        informer.observe(kind, "ADDED", first)
        _delete(kube, cluster, kind, name)  # straight to the server: no watch runs
        landed: list[Body] = []

        def land(name: str = name, first: Body = first, landed: list[Body] = landed) -> None:
            if event == "created again":
                body = _create(cluster, kind, name)  # a new uid, a resourceVersion newer than the list
            else:  # the same incarnation, newer than the list (a write answer, the relist's GET)
                body = {**first, "metadata": {**first["metadata"], "resourceVersion": str(1 << 40)}}
            informer.observe(kind, "ADDED" if event == "created again" else "MODIFIED", body)
            landed.append(body)

        probe = ReleasePoints(picture.lock, at=at, land=land)
        probed(picture, probe, take_in(at, name))
        held = picture.held_version(kind, _key(cluster, kind, name))
        if not probe.landed:  # past the last moment: nothing came, the deletion is taken in
            assert held is None, f"the {kind} deleted while no watch ran is still in the picture: {held}"
            return at - 1
        meta = landed[0]["metadata"]
        assert held == (meta["resourceVersion"], meta["uid"]), (
            f"the {kind} {event} (resourceVersion {meta['resourceVersion']}), taken in at moment {at} of"
            f" {probe.released}, was undone by the deletion the list implied: the picture holds {held}")
        # Gone again, as its watch would say: the next run's list and picture are as small as this one's.
        if event == "created again":
            _delete(kube, cluster, kind, name)
        informer.observe(kind, "DELETED", landed[0])
    raise AssertionError(f"more than {MOMENTS_AT_MOST} moments")


@pytest.mark.parametrize("event", ["created again", "newer copy"])
@pytest.mark.parametrize("kind", ["claim", "gpu"])
def test_an_event_between_a_start_overs_check_and_delete_survives(cluster: Cluster, kube: KubeApi, kind: str,
                                                                    event: str) -> None:
    """A watch that starts over with a list (a 410, a long outage): old code lost the event landing
    after the check (`Picture.unlisted`), moment 1 of 2."""
    controller = new_controller(kube, cluster.namespace)
    path = kube.collection_path(kind, cluster.namespace)

    def take_in(at: int, name: str) -> Callable[[], object]:
        items, list_version = kube.list_collection(path)
        return lambda: controller.informer._start_over(kind, items, list_version)

    assert _enumerate(controller, cluster, kind, event, take_in) >= 2


@pytest.mark.parametrize("event", ["created again", "newer copy"])
def test_an_event_between_a_relists_check_and_delete_survives(cluster: Cluster, kube: KubeApi, event: str) -> None:
    """The periodic relist by metadata, every kind listed: old code lost the event landing after its
    last check (`Picture.held_version`) and before the deletion, moment 7 of 21."""
    controller = new_controller(kube, cluster.namespace)
    relist = MetadataRelist(informer=controller.informer)
    assert _enumerate(controller, cluster, "gpu", event, lambda at, name: relist.relist) >= 2


def test_a_newer_copy_survives_the_relist_replacing_an_incarnation(cluster: Cluster, kube: KubeApi) -> None:
    """A claim deleted and created again while no watch ran: the relist reads the new one whole and
    takes the held one in as deleted, then the new one as added. A watch event of the new one newer
    than that read (a change after the GET), landing before the deletion, must survive. Old code
    took in as deleted whatever the picture held of the name by then: the newer copy itself, whose
    version, buried, then refused the copy the relist had read (moment 14 of 22: the picture held
    no claim of that name until the next relist)."""
    controller = new_controller(kube, cluster.namespace)
    informer, picture = controller.informer, controller.picture
    relist = MetadataRelist(informer=controller.informer)
    deadline = time.monotonic() + 120
    for at in range(1, MOMENTS_AT_MOST):
        assert time.monotonic() < deadline, f"enumerating {at} moments took longer than 120 s"
        name = f"{cluster.prefix}-again-{at}"
        informer.observe("claim", "ADDED", _create(cluster, "claim", name))
        kube.delete_claim(cluster.namespace, name)  # straight to the server: no watch runs
        again = _create(cluster, "claim", name)
        landed: list[Body] = []

        def land(name: str = name, landed: list[Body] = landed) -> None:
            body = kube.patch_claim(cluster.namespace, name, {"metadata": {"labels": {"changed": "after"}}})
            informer.observe("claim", "MODIFIED", body)
            landed.append(body)

        probe = ReleasePoints(picture.lock, at=at, land=land)
        probed(picture, probe, relist.relist)
        held = picture.held_version("claim", (cluster.namespace, name))
        if not probe.landed:  # past the last moment: the relist alone replaced the incarnation
            assert held == (again["metadata"]["resourceVersion"], again["metadata"]["uid"]), held
            assert at > 2
            return
        meta = landed[0]["metadata"]
        assert held == (meta["resourceVersion"], meta["uid"]), (
            f"the change of the claim created again (resourceVersion {meta['resourceVersion']}), taken in at"
            f" moment {at} of {probe.released}, was undone by the relist: the picture holds {held}")
        kube.delete_claim(cluster.namespace, name)  # gone, as its watch would say: the next run is as small
        informer.observe("claim", "DELETED", landed[0])
    raise AssertionError(f"more than {MOMENTS_AT_MOST} moments")
