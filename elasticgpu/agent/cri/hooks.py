"""What the CRI proxy asks of the agent around container calls, and how it is told no.

The proxy (proxy.py) forwards every call untouched except these two points:

    CreateContainer:  prepared = hooks.prepare_create(request)   # may raise Refused
                      forward prepared.request
                      ok    -> hooks.created(prepared, container_id)
                      error -> hooks.create_failed(prepared, code)
    RemoveContainer:  forward; ok -> hooks.removed(container_id)

`prepare_create` is where injection happens and the ledger row is written `started` (before the
runtime is called); `created` completes the row with the container id. A crash between the two
leaves a `started` row that the agent reconciles with ListContainers at its next start:

    proxy start:        hooks.attach_runtime(list_containers)   # the hooks may list containers
                        hooks.reconcile(containers, starting=True), retried with backoff until it
                        succeeds (claims are refused as retryable until then; the rest passes)
    RemovePodSandbox:   forward; ok -> hooks.reconcile(containers, starting=False) (the sandbox
                        took its containers with it without a RemoveContainer each)
    every minute:       hooks.reconcile(containers, starting=False) (what a lost write or an
                        unanswered CreateContainer left open is settled)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc


class Refused(Exception):
    """A CreateContainer the agent refuses: the gRPC status kubelet gets, and text for the user.

    kubelet shows `message` as the container's CreateContainerError and retries with backoff,
    so the message says what to fix (FAILED_PRECONDITION) or that it will pass by itself
    (UNAVAILABLE: the agent is still starting).
    """

    def __init__(self, message: str, *, code: grpc.StatusCode = grpc.StatusCode.FAILED_PRECONDITION) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


@dataclass
class PreparedCreate:
    """A CreateContainerRequest after the hook: what to forward, and the hook's own note."""

    request: Any  # api.pb.CreateContainerRequest, possibly rewritten
    token: Any = None  # whatever the hook needs in created/create_failed (e.g. a ledger row id)
    changed: bool = False  # False: forward the caller's original bytes (nothing to re-encode)
    details: dict[str, str] = field(default_factory=dict)  # for logs: claim, devices, ...


class ContainerHooks(Protocol):
    """The agent's side of the proxy's two interception points (see the module docstring)."""

    def prepare_create(self, request: Any) -> PreparedCreate:
        """Decide and record a CreateContainer before it is forwarded; raise Refused to refuse it."""
        ...

    def created(self, prepared: PreparedCreate, container_id: str) -> None:
        """The runtime created the container: complete what prepare_create started."""
        ...

    def create_failed(self, prepared: PreparedCreate, code: grpc.StatusCode) -> None:
        """The runtime refused or the call failed with `code`: undo what prepare_create started.
        DEADLINE_EXCEEDED, CANCELLED and UNAVAILABLE leave it open whether the runtime made the
        container; the hooks settle that against ListContainers later."""
        ...

    def removed(self, container_id: str) -> None:
        """The runtime removed the container: release what it held."""
        ...

    def attach_runtime(self, list_containers: Callable[[], Sequence[Any]]) -> None:
        """Receive the proxy's way to list the runtime's containers (api.pb.Container each)."""
        ...

    def reconcile(self, containers: Sequence[Any], *, starting: bool) -> None:
        """Match what the hooks recorded against the runtime's containers. `starting`: no
        CreateContainer is in flight, so half-done records can be completed or undone too.
        `containers` was listed before the call: hooks that can list the runtime themselves
        (attach_runtime) list again under their own lock, or a container created in between would
        look gone."""
        ...


class PassThrough:
    """Hooks that change nothing: the proxy becomes a plain forwarder."""

    def prepare_create(self, request: Any) -> PreparedCreate:
        """Forward as is."""
        return PreparedCreate(request=request)

    def created(self, prepared: PreparedCreate, container_id: str) -> None:
        """Nothing to complete."""

    def create_failed(self, prepared: PreparedCreate, code: grpc.StatusCode) -> None:
        """Nothing to undo."""

    def removed(self, container_id: str) -> None:
        """Nothing to release."""

    def attach_runtime(self, list_containers: Callable[[], Sequence[Any]]) -> None:
        """Nothing to list."""

    def reconcile(self, containers: Sequence[Any], *, starting: bool) -> None:
        """Nothing to match."""
