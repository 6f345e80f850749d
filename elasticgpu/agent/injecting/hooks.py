"""What a front (the CRI proxy, agent/cri; the NRI plugin, agent/nri) asks of the injection core
around container calls, and how it is told no. The calls are in plain values: each front
translates its wire format (CRI protobuf, NRI's messages) into `injection.ContainerRequest` and
`RuntimeContainer`, and the one `injection.ContainerEdit` it gets back into its own answer.

    CreateContainer:  prepared = hooks.prepare_create(request)   # may raise Refused
                      the front applies prepared.edit (None: untouched) to what the runtime creates
                      ok    -> hooks.created(prepared, container_id)
                      error -> hooks.create_failed(prepared, code)
    RemoveContainer:  ok -> hooks.removed(container_id)

(NRI tells the plugin the container's id in its CreateContainer: that front calls `created`
right after `prepare_create`; a creation that fails after the plugin answered reaches it as a
RemoveContainer, and one lost with the runtime is settled by the next reconcile.)

`prepare_create` is where injection happens and the ledger row is written `started` (before the
runtime is called); `created` completes the row with the container id. A crash between the two
leaves a `started` row that the agent reconciles with ListContainers at its next start:

    front start:        hooks.attach_runtime(list_containers)   # the hooks may list containers
                        hooks.reconcile(containers, starting=True), retried with backoff until it
                        succeeds (claims are refused as retryable until then; the rest passes)
    RemovePodSandbox:   forward; ok -> hooks.reconcile(containers, starting=False) (the sandbox
                        took its containers with it without a RemoveContainer each)
    every minute:       hooks.reconcile(containers, starting=False) (what a lost write or an
                        unanswered CreateContainer left open is settled)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import grpc

from elasticgpu.agent.injecting.refused import Refused as Refused  # hooks.Refused, as the fronts name it

if TYPE_CHECKING:
    from elasticgpu.agent.injecting import injection


@dataclass
class PreparedCreate:
    """A container request after the core: the one edit the front applies, and the hook's own note."""

    edit: injection.ContainerEdit | None = None  # None: create the container as asked (nothing to re-encode)
    token: Any = None  # whatever the hook needs in created/create_failed (e.g. a ledger row id)
    details: dict[str, str] = field(default_factory=dict)  # for logs: claim, devices, ...


@dataclass(frozen=True, kw_only=True)
class RuntimeContainer:
    """A container as the runtime lists it, in plain values (each front translates its own listing)."""

    id: str
    name: str  # the container's name in its pod (kubelet's metadata name)
    labels: Mapping[str, str]  # kubelet's io.kubernetes.* labels among them (the pod's uid, name, namespace)
    annotations: Mapping[str, str]  # the container's, the agent's elasticgpu.io/claim among them
    created_at: int = 0  # nanoseconds since the epoch (0: unknown); the newest of a pod's containers wins
    exited: bool = False  # it ran and stopped: it holds no card (card_sharing.holds_card)
    env: Mapping[str, str] | None = None  # its environment when the listing carries it (NRI), else None

    @property
    def pod_uid(self) -> str:
        """kubelet's pod uid label, or empty."""
        return self.labels.get("io.kubernetes.pod.uid", "")


class ContainerHooks(Protocol):
    """The agent's side of the proxy's two interception points (see the module docstring)."""

    def prepare_create(self, request: injection.ContainerRequest) -> PreparedCreate:
        """Decide and record a CreateContainer before the runtime acts on it; raise Refused to refuse it."""
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

    def attach_runtime(self, list_containers: Callable[[], Sequence[RuntimeContainer]]) -> None:
        """Receive the front's way to list the runtime's containers."""
        ...

    def reconcile(self, containers: Sequence[RuntimeContainer], *, starting: bool) -> None:
        """Match what the hooks recorded against the runtime's containers. `starting`: no
        CreateContainer is in flight, so half-done records can be completed or undone too.
        `containers` was listed before the call: hooks that can list the runtime themselves
        (attach_runtime) list again under their own lock, or a container created in between would
        look gone."""
        ...


class PassThrough:
    """Hooks that change nothing: the front becomes a plain forwarder."""

    def prepare_create(self, request: injection.ContainerRequest) -> PreparedCreate:
        """Create as asked."""
        return PreparedCreate()

    def created(self, prepared: PreparedCreate, container_id: str) -> None:
        """Nothing to complete."""

    def create_failed(self, prepared: PreparedCreate, code: grpc.StatusCode) -> None:
        """Nothing to undo."""

    def removed(self, container_id: str) -> None:
        """Nothing to release."""

    def attach_runtime(self, list_containers: Callable[[], Sequence[RuntimeContainer]]) -> None:
        """Nothing to list."""

    def reconcile(self, containers: Sequence[RuntimeContainer], *, starting: bool) -> None:
        """Nothing to match."""


class FollowingHooks:
    """The hooks another part owns and may replace (the agent's CRI hook makes new ones each time its proxy
    restarts): every call goes to the current ones, so a front never keeps hooks that were closed. While
    there are none, `meanwhile` answers (a claim's container refused as retryable, the rest decided
    without a ledger); what is lost meanwhile (a removal) is settled by the next hooks' start-up
    reconciliation. The front's way of listing containers is given to each new hooks object before it is
    used (`follow`)."""

    def __init__(
        self, current: Callable[[], ContainerHooks | None], *,
        meanwhile: Callable[[injection.ContainerRequest], PreparedCreate],
    ) -> None:  # fmt: skip
        """`current`: the hooks now (None: none yet, or between a failure and a restart); `meanwhile`: the
        answer to a request while there are none (raises Refused to refuse it)."""
        self._current = current
        self._meanwhile = meanwhile
        self._list_containers: Callable[[], Sequence[RuntimeContainer]] | None = None
        self._attached: ContainerHooks | None = None

    def follow(self) -> None:
        """Give the front's listing to new hooks now (their start-up reconciliation needs it), not only at
        the next call: call it periodically."""
        self._hooks()

    def _hooks(self) -> ContainerHooks | None:
        found = self._current()
        if found is not None and found is not self._attached and self._list_containers is not None:
            found.attach_runtime(self._list_containers)
            self._attached = found
        return found

    def prepare_create(self, request: injection.ContainerRequest) -> PreparedCreate:
        """The current hooks' decision (with the hooks that made it, for `created` and `create_failed`)."""
        found = self._hooks()
        if found is None:
            return self._meanwhile(request)
        prepared = found.prepare_create(request)
        return PreparedCreate(edit=prepared.edit, token=(found, prepared), details=prepared.details)

    def created(self, prepared: PreparedCreate, container_id: str) -> None:
        """To the hooks that prepared it."""
        if prepared.token is not None:
            made_by, inner = prepared.token
            made_by.created(inner, container_id)

    def create_failed(self, prepared: PreparedCreate, code: grpc.StatusCode) -> None:
        """To the hooks that prepared it."""
        if prepared.token is not None:
            made_by, inner = prepared.token
            made_by.create_failed(inner, code)

    def removed(self, container_id: str) -> None:
        """To the current hooks (none: their start-up reconciliation releases it)."""
        if (found := self._hooks()) is not None:
            found.removed(container_id)

    def attach_runtime(self, list_containers: Callable[[], Sequence[RuntimeContainer]]) -> None:
        """Kept, and given to the current hooks and to each that replaces them."""
        self._list_containers = list_containers
        self._attached = None
        self._hooks()

    def reconcile(self, containers: Sequence[RuntimeContainer], *, starting: bool) -> None:
        """The current hooks' (none: nothing recorded can be matched now)."""
        if (found := self._hooks()) is not None:
            found.reconcile(containers, starting=starting)
