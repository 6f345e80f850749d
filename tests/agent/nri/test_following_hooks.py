"""hooks.FollowingHooks: the NRI front follows the claim hooks the CRI hook replaces at each restart of its
proxy, never keeping closed ones (issue 34)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import grpc
import pytest

from elasticgpu.agent.injecting import hooks, injection

pytestmark = pytest.mark.timeout(30)


class Recording(hooks.PassThrough):
    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[tuple[str, object]] = []
        self.listing: Callable[[], Sequence[hooks.RuntimeContainer]] | None = None

    def prepare_create(self, request: injection.ContainerRequest) -> hooks.PreparedCreate:
        self.calls.append(("prepare", request.container))
        return hooks.PreparedCreate(token=self.name)

    def created(self, prepared: hooks.PreparedCreate, container_id: str) -> None:
        self.calls.append(("created", (prepared.token, container_id)))

    def create_failed(self, prepared: hooks.PreparedCreate, code: grpc.StatusCode) -> None:
        self.calls.append(("failed", (prepared.token, code)))

    def removed(self, container_id: str) -> None:
        self.calls.append(("removed", container_id))

    def attach_runtime(self, list_containers: Callable[[], Sequence[hooks.RuntimeContainer]]) -> None:
        self.listing = list_containers


def request(container: str) -> injection.ContainerRequest:
    return injection.ContainerRequest(pod=injection.PodRef("ns", "p", "uid"), pod_annotations={}, container=container,
                                      envs=[], cdi_devices=[], annotations={})  # fmt: skip


def test_calls_go_to_the_current_hooks_and_each_new_one_gets_the_listing() -> None:
    current: list[Recording | None] = [None]

    def meanwhile(r: injection.ContainerRequest) -> hooks.PreparedCreate:
        if r.container == "claimed":
            raise hooks.Refused("restarting", code=grpc.StatusCode.UNAVAILABLE)
        return hooks.PreparedCreate()

    following = hooks.FollowingHooks(lambda: current[0], meanwhile=meanwhile)
    listing: Callable[[], Sequence[hooks.RuntimeContainer]] = list
    following.attach_runtime(listing)
    with pytest.raises(hooks.Refused):  # no hooks yet: meanwhile answers
        following.prepare_create(request("claimed"))
    assert following.prepare_create(request("plain")).token is None
    following.removed("gone")  # nothing to release it in: the next hooks' reconciliation does

    old, new = Recording("old"), Recording("new")
    current[0] = old
    prepared = following.prepare_create(request("a"))
    assert old.listing is listing
    current[0] = new  # the proxy restarted: new hooks, the old ones closed
    following.created(prepared, "c1")  # to the hooks that prepared it
    following.removed("c0")
    assert following.prepare_create(request("b")).token is not None
    assert new.listing is listing
    assert old.calls == [("prepare", "a"), ("created", ("old", "c1"))]
    assert new.calls == [("removed", "c0"), ("prepare", "b")]
